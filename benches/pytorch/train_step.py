"""PyTorch's figure for the same measurement as `benches/benches/train_step.rs`:
median time of a full training step (forward, loss, backward, Adam) of
CNN_MNIST on the CPU, batch already in memory, dropout on.

    python benches/pytorch/train_step.py --threads 1 --batch-size 64 --steps 100
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CNN_MNIST(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return self.fc2(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = CNN_MNIST()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(a.batch_size, 1, 28, 28)
    y = torch.randint(0, 10, (a.batch_size,))
    times = []
    for i in range(a.warmup + a.steps):
        t = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
    med = statistics.median(times)
    print(f"torch {torch.__version__}: threads {a.threads} batch {a.batch_size} "
          f"median {med * 1e3:.2f} ms  {a.batch_size / med:.0f} img/s")


if __name__ == "__main__":
    main()
