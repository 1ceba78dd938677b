"""PyTorch's figure for the same measurement as `benches/benches/train_step.rs`:
median time of a full training step (forward, loss, backward, Adam) of
CNN_MNIST on the CPU, batch already in memory, dropout on.

    python benches/pytorch/train_step.py --threads 1 --batch-size 64 --steps 100
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from cnn_mnist import CNN_MNIST


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
