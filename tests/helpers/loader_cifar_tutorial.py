"""The shape of PyTorch's CIFAR-10 tutorial (an unguarded script: no
``if __name__ == "__main__":``, a per-item Dataset, ``DataLoader(...,
shuffle=True, num_workers=2)``), on random 3x16x16 images instead of the
download. tests/test_loader_workers.py runs it under ``mpirun -n 2``: each
rank forks its two loader workers, which must never touch MPI. With
``INIT_MPI=1`` in the environment the ranks initialise MPI first (as a DDP
program has by then) and agree on the loss at the end."""
import os

import numpy as np

import spmdnet as torch
import spmdnet.nn as nn
import spmdnet.nn.functional as F
import spmdnet.optim as optim


class RandomImages(torch.utils.data.Dataset):
    def __init__(self, n):
        rng = np.random.default_rng(0)
        self.images = rng.random((n, 3, 16, 16), dtype=np.float32)
        self.labels = rng.integers(0, 10, n)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        assert info is not None and info.num_workers == 2, "not loaded by a worker"
        return (self.images[i] - 0.5) / 0.5, int(self.labels[i])


if os.environ.get("INIT_MPI") == "1":
    world = torch.distributed.init()
batch_size = 4
trainset = RandomImages(64)
trainloader = torch.utils.data.DataLoader(trainset, batch_size=batch_size, shuffle=True,
                                          num_workers=2)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(6 * 6 * 6, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


net = Net()
criterion = nn.CrossEntropyLoss()
optimizer = optim.SGD(net.parameters(), lr=0.001, momentum=0.9)

for epoch in range(2):
    running_loss, seen = 0.0, 0
    for i, data in enumerate(trainloader, 0):  # noqa: B007 - the tutorial's loop
        inputs, labels = data
        optimizer.zero_grad()
        outputs = net(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
        seen += len(labels)
    print(f"[{epoch + 1}] loss: {running_loss / (i + 1):.3f} samples: {seen}")
if os.environ.get("INIT_MPI") == "1":  # MPI still works after the workers came and went
    losses = torch.distributed.allreduce(np.array([running_loss]), "max")
    print(f"ranks: {world.size} max loss {losses[0]:.3f}")
print("Finished Training")
