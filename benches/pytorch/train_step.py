"""PyTorch's figure for the same measurement as `benches/benches/train_step.rs`:
median time of a full training step (forward, loss, backward, Adam) of
CNN_MNIST on the CPU, batch already in memory, dropout on.

    python benches/pytorch/train_step.py --threads 1 --batch-size 64 --steps 100
    python benches/pytorch/train_step.py --world-size 2 --threads 1 --steps 100

With --world-size N, N processes on this machine train under
DistributedDataParallel over gloo (the tutorial's CPU setup), --threads
each, --batch-size per rank; rank 0 prints the median step over the ranks'
slowest and images/s for all ranks together.
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from cnn_mnist import CNN_MNIST


def step_times(a, model):
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
    return times


def rank_main(rank, a, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.world_size)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(CNN_MNIST())
    times = torch.tensor(step_times(a, model), dtype=torch.float64)
    # A step ends when the slowest rank's does.
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    if rank == 0:
        report(a, statistics.median(times.tolist()))
    dist.destroy_process_group()


def report(a, med):
    images = a.batch_size * a.world_size
    print(f"torch {torch.__version__}: world {a.world_size} threads {a.threads} "
          f"batch {a.batch_size} median {med * 1e3:.2f} ms  {images / med:.0f} img/s")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--world-size", type=int, default=1)
    a = p.parse_args()
    if a.world_size > 1:
        mp.spawn(rank_main, args=(a, free_port()), nprocs=a.world_size)
        return
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    report(a, statistics.median(step_times(a, CNN_MNIST())))


if __name__ == "__main__":
    main()
