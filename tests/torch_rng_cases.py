"""The draws compared with PyTorch's (tests/test_torch_rng.py): each case is
``fn(t, seed) -> list of arrays`` written once against the PyTorch API, run
with ``t = spmdnet`` by the tests and with ``t = torch`` (outside the
project) by the script that wrote tests/fixtures/torch_rng/draws.npz (see
that folder's README.md). Sizes straddle 16, where PyTorch's normals switch
from the one-at-a-time path to the blocks of 16."""
import numpy as np

SEEDS = (0, 1, 1234567890123)
CASES = {}
NOT_BITWISE = {"orthogonal": 1e-5}  # LAPACK's QR: PyTorch's and NumPy's agree to rounding


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def arr(x):
    """A host array of a tensor (or of a list of ints)."""
    if hasattr(x, "detach"):
        return np.asarray(x.detach().numpy())
    return np.asarray(x)


@case
def rand(t, seed):
    t.manual_seed(seed)
    out = [t.rand(n) for n in (1, 5, 16, 37)] + [t.rand(n, dtype=t.float64) for n in (3, 20)]
    return [arr(x) for x in out + [t.rand(2, 3, 4)]]


@case
def randn(t, seed):
    t.manual_seed(seed)
    out = []
    for n in (1, 3, 5, 15, 16, 17, 100):  # odd sizes leave a cached normal behind
        out += [t.randn(n), t.randn(n, dtype=t.float64)]
    return [arr(x) for x in out + [t.randn(3, 7)]]


@case
def integers(t, seed):
    t.manual_seed(seed)
    out = [t.randint(3, 20, (50,)), t.randint(7, (4, 3)), t.randint(0, 2**40, (8,)),
           t.randint(-5, 5, (16,))]
    out += [t.randperm(n) for n in (1, 2, 5, 17, 100)]
    return [arr(x) for x in out]


@case
def fills(t, seed):
    t.manual_seed(seed)
    out = []
    for dtype in (t.float32, t.float64):
        for n in (7, 40):
            out.append(t.empty(n, dtype=dtype).uniform_(-0.37, 2.9))
            out.append(t.empty(n, dtype=dtype).normal_(0.3, 2.7))
            out.append(t.empty(n, dtype=dtype).exponential_(1.7))
            out.append(t.empty(n, dtype=dtype).geometric_(0.3))
            out.append(t.empty(n, dtype=dtype).log_normal_(0.3, 0.7))
            out.append(t.empty(n, dtype=dtype).cauchy_(0.3, 0.7))
            out.append(t.empty(n, dtype=dtype).random_())
            out.append(t.empty(n, dtype=dtype).random_(3, 9))
            out.append(t.empty(n, dtype=dtype).bernoulli_(0.3))
    out.append(t.empty(9, dtype=t.int64).random_())
    out.append(t.empty(9, dtype=t.int32).random_())
    return [arr(x) for x in out]


@case
def bernoulli_multinomial(t, seed):
    t.manual_seed(seed)
    probs = t.rand(3, 7)
    weights = t.rand(3, 7, dtype=t.float64)
    out = [t.bernoulli(probs), t.bernoulli(weights), t.bernoulli(probs, 0.25)]
    for w in (probs, weights):
        out += [t.multinomial(w, 5, replacement=True), t.multinomial(w, 4),
                t.multinomial(w, 1), t.multinomial(w, 1, replacement=True),
                t.multinomial(w[0], 7)]
    return [arr(x) for x in out]


@case
def normal_overloads(t, seed):
    t.manual_seed(seed)
    mean, std = t.arange(20.0).reshape(4, 5), t.rand(4, 5)
    out = [t.normal(mean, std), t.normal(mean, 2.0), t.normal(1.5, std),
           t.normal(1.5, 2.0, (4, 5)), t.normal(mean[:1, :3], std[:, :3]),
           t.normal(mean.double(), std.double()), t.normal(0.0, 1.0, (3,))]
    return [arr(x) for x in out]


@case
def mixed_sequence(t, seed):
    """State carries between calls: the cached normal, then other draws."""
    t.manual_seed(seed)
    out = [t.randn(3), t.rand(2), t.randn(5, dtype=t.float64), t.randn(20), t.randint(9, (3,)),
           t.randperm(7), t.randn(1), t.empty(5).normal_(), t.randn(1)]
    return [arr(x) for x in out] + [arr(t.get_rng_state()), np.asarray(t.initial_seed())]


@case
def generators(t, seed):
    g = t.Generator().manual_seed(seed)
    t.manual_seed(seed + 1)
    out = [t.randn(10, generator=g), t.rand(4, generator=g), t.randint(5, (6,), generator=g),
           t.randperm(9, generator=g), t.randn(3)]
    state = g.get_state()
    first = t.rand(5, generator=g)
    g.set_state(state)
    out += [first, t.rand(5, generator=g), t.multinomial(t.rand(6), 3, generator=g),
            t.bernoulli(t.rand(6), generator=g), t.empty(4).normal_(generator=g)]
    return [arr(x) for x in out] + [arr(state), np.asarray(g.initial_seed())]


@case
def init_functions(t, seed):
    t.manual_seed(seed)
    init = t.nn.init
    out = [init.uniform_(t.empty(3, 5), -0.5, 0.5), init.normal_(t.empty(3, 5), 0.1, 2.0),
           init.xavier_uniform_(t.empty(7, 6), gain=1.3), init.xavier_normal_(t.empty(7, 6)),
           init.kaiming_uniform_(t.empty(4, 3, 3, 3), a=5 ** 0.5),
           init.kaiming_normal_(t.empty(8, 5), mode="fan_out", nonlinearity="relu"),
           init.trunc_normal_(t.empty(50), std=0.02), init.trunc_normal_(t.empty(6, 6)),
           init.trunc_normal_(t.empty(30), mean=1.0, std=2.0, a=1.1, b=1.3),
           init.sparse_(t.empty(6, 5), 0.5), init.kaiming_uniform_(t.empty(5, 4,
                                                                          dtype=t.float64))]
    return [arr(x) for x in out]


@case
def orthogonal(t, seed):
    t.manual_seed(seed)
    init = t.nn.init
    return [arr(init.orthogonal_(t.empty(4, 6))), arr(init.orthogonal_(t.empty(6, 3), 2.0)),
            arr(t.rand(3))]


@case
def layer_inits(t, seed):
    t.manual_seed(seed)
    nn = t.nn
    layers = [nn.Linear(5, 3), nn.Conv2d(2, 4, 3), nn.Conv1d(3, 2, 2, bias=False),
              nn.ConvTranspose2d(3, 2, 2), nn.Embedding(10, 4, padding_idx=1),
              nn.LSTM(3, 4, num_layers=2, bidirectional=True), nn.GRU(3, 4), nn.RNN(3, 4),
              nn.LayerNorm(4), nn.BatchNorm2d(3), nn.MultiheadAttention(8, 2),
              nn.TransformerEncoderLayer(8, 2, 16), nn.Linear(4, 2, dtype=t.float64)]
    return [arr(p) for layer in layers for p in layer.parameters()] + [arr(t.rand(2))]


@case
def dropout(t, seed):
    t.manual_seed(seed)
    F = t.nn.functional
    x = t.ones(40)
    out = [F.dropout(x, 0.3), F.dropout(x.double(), 0.5), F.dropout(t.ones(3, 5), 0.1),
           t.nn.Dropout(0.5)(t.ones(4, 17)), F.dropout(x, 0.3, training=False), t.rand(2)]
    return [arr(v) for v in out]


@case
def samplers(t, seed):
    data = t.utils.data
    t.manual_seed(seed)
    ds = data.TensorDataset(t.arange(23))
    out = [list(data.RandomSampler(range(11))), list(data.RandomSampler(range(11))),
           list(data.RandomSampler(range(7), num_samples=17)),
           list(data.RandomSampler(range(7), replacement=True, num_samples=40)),
           list(data.RandomSampler(range(9), generator=t.Generator().manual_seed(seed))),
           list(data.SubsetRandomSampler([10, 20, 30, 40, 50])),
           list(data.WeightedRandomSampler([0.1, 0.5, 2.0, 1.0], 12)),
           list(data.WeightedRandomSampler([0.1, 0.5, 2.0, 1.0], 3, replacement=False))]
    out += [subset.indices for subset in data.random_split(range(10), [3, 7])]
    out += [subset.indices for subset in data.random_split(
        range(12), [0.25, 0.75], generator=t.Generator().manual_seed(seed))]
    loader = data.DataLoader(ds, batch_size=5, shuffle=True)
    for _ in range(2):
        out += [batch[0] for batch in loader]
    loader = data.DataLoader(ds, batch_size=4, shuffle=True,
                             generator=t.Generator().manual_seed(seed + 3))
    out += [batch[0] for batch in loader]
    sampler = data.distributed.DistributedSampler(ds, num_replicas=3, rank=1, seed=seed)
    sampler.set_epoch(2)
    out += [list(sampler), t.rand(3)]
    return [arr(x) for x in out]


def mnist_losses(t, steps_per_epoch=2, epochs=2):
    """PyTorch's examples/mnist, seeded (``manual_seed(1)``), on a fixed
    synthetic batch set (no download): its Net (conv 1->32->64, dropout 0.25
    and 0.5, fc 9216->128->10, log_softmax), Adadelta(lr=1.0), StepLR(gamma
    0.7), a shuffling DataLoader; the loss of every step."""
    nn, F = t.nn, t.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = F.relu(self.conv2(F.relu(self.conv1(x))))
            x = t.flatten(self.dropout1(F.max_pool2d(x, 2)), 1)
            x = self.fc2(self.dropout2(F.relu(self.fc1(x))))
            return F.log_softmax(x, dim=1)

    n = 4 * steps_per_epoch
    grid = np.arange(28, dtype=np.float32) / 28
    images = np.stack([np.sin(7 * grid[:, None] * (k + 1) + 3 * grid[None, :] * k) ** 2
                       for k in range(n)]).astype(np.float32)[:, None]
    images = (images - np.float32(0.1307)) / np.float32(0.3081)
    labels = np.arange(n) % 10
    t.manual_seed(1)
    dataset = t.utils.data.TensorDataset(t.tensor(images), t.tensor(labels))
    loader = t.utils.data.DataLoader(dataset, batch_size=4, shuffle=True)
    model = Net()
    optimizer = t.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = t.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    losses = []
    for _ in range(epochs):
        model.train()
        for data, target in loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        scheduler.step()
    return np.array(losses)
