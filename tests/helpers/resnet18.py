"""torchvision's ResNet-18 at full width (BasicBlock, 64-128-256-512
channels, 7x7/2 stem, 3x3/2 max-pool, adaptive average pool, Linear), in
spmdnet, with PyTorch's parameter names, and seeded weights that a script
outside the project can make the same way (``seeded_state``)."""
import numpy as np

import spmdnet as sn
from spmdnet import nn

WIDTHS = (64, 128, 256, 512)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes=1000, widths=WIDTHS):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        cin = widths[0]
        for i, cout in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, cout, stride),
                                                         BasicBlock(cout, cout, 1)))
            cin = cout
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(sn.flatten(self.avgpool(x), 1))


def seeded_state(model, seed=0):
    """A state dict for ``model`` drawn from ``numpy.random.default_rng(seed)``
    in ``state_dict()`` order (the generator of tests/fixtures/torch_files/
    resnet18_full.pt draws the same, in torchvision's same order): weights
    of fan-in F normal / sqrt(F), 1-D affine parameters and running means
    normal · 0.1 (+1 for BatchNorm weights), running variances uniform on
    [0.5, 1.5), ``num_batches_tracked`` kept."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, value in model.state_dict().items():
        shape = tuple(value.shape)
        if name.endswith("num_batches_tracked"):
            a = value
        elif name.endswith("running_var"):
            a = rng.uniform(0.5, 1.5, shape)
        elif len(shape) > 1:
            a = rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
        else:
            a = rng.standard_normal(shape) * 0.1
            if name.endswith("weight"):
                a = a + 1.0
        state[name] = a if a is value else sn.tensor(a)
    return state
