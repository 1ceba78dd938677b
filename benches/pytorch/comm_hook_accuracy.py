"""PyTorch's own communication hooks on CNN_MNIST, the anchor of the
trainer's --comm-hook figures in docs/scaling.md: --world-size processes
train under DistributedDataParallel over gloo on the CPU (the tutorial's
setup: DistributedSampler shuffled by --seed, batch --batch-size per rank,
Adam lr 1e-3, dropout on) with the hook registered, and rank 0 prints each
epoch's test accuracy and the bytes the hook's collectives carry per step.

    python benches/pytorch/comm_hook_accuracy.py --hook powersgd:1:50 --epochs 2

--hook is the trainer's spelling: none, bf16, fp16, powersgd:RANK[:START]
(PowerSGDState with matrix_approximation_rank RANK, start_powerSGD_iter
START, error feedback and warm start, PyTorch's defaults otherwise). The
seeds match the trainer's where the two can: the data order is
DistributedSampler's, as the trainer's sampler mirrors it; the initial
weights and dropout masks are torch's own draws, not the trainer's.
"""
import argparse
import os
import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

from cnn_mnist import CNN_MNIST
from train_throughput import read_idx

DATA = "/usr/share/datasets/fashion-mnist"


def load(data_dir, split):
    images = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"), 0x803, 16)
    labels = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"), 0x801, 8)
    x = torch.from_numpy(images.reshape(-1, 1, 28, 28)).float().div_(255)
    return x, torch.from_numpy(labels.astype(np.int64))


class Counting:
    """Adds up the bytes of the tensors all-reduced (the hooks call
    `dist.all_reduce` through the module); a ring all-reduce sends 2(n-1)/n
    of them from each rank."""

    def __init__(self):
        self.bytes = 0
        self.all_reduce = dist.all_reduce
        dist.all_reduce = self.counted

    def counted(self, tensor, *args, **kwargs):
        self.bytes += tensor.numel() * tensor.element_size()
        return self.all_reduce(tensor, *args, **kwargs)


def hook_of(spec, pg):
    if spec == "none":
        return default_hooks.allreduce_hook, pg
    if spec in ("bf16", "fp16"):
        hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
        return hook[spec], pg
    parts = spec.split(":")
    if parts[0] != "powersgd" or len(parts) not in (2, 3):
        raise SystemExit(f"--hook {spec}: expected none, bf16, fp16 or powersgd:RANK[:START]")
    state = psgd.PowerSGDState(
        process_group=pg,
        matrix_approximation_rank=int(parts[1]),
        start_powerSGD_iter=int(parts[2]) if len(parts) == 3 else 1000,
    )
    return psgd.powerSGD_hook, state


def rank_main(rank, a, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.world_size)
    torch.manual_seed(a.seed)
    (x, y), (tx, ty) = load(a.data_dir, "train"), load(a.data_dir, "t10k")
    # One bucket: PowerSGD's hook issues its second all-reduce from a
    # future's callback, and with two buckets over gloo the ranks can issue
    # those callbacks' collectives in different orders (a collective
    # mismatch, seen here with torch 2.15).
    model = torch.nn.parallel.DistributedDataParallel(CNN_MNIST(), bucket_cap_mb=100)
    hook, state = hook_of(a.hook, dist.group.WORLD)
    counting = Counting()
    model.register_comm_hook(state, hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    sampler = torch.utils.data.DistributedSampler(
        range(len(y)), num_replicas=a.world_size, rank=rank, shuffle=True, seed=a.seed
    )
    for epoch in range(1, a.epochs + 1):
        sampler.set_epoch(epoch - 1)
        order = torch.tensor(list(sampler))
        model.train()
        counting.bytes, steps = 0, 0
        for start in range(0, len(order), a.batch_size)[:a.max_steps]:
            idx = order[start:start + a.batch_size]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
            steps += 1
        model.eval()
        with torch.no_grad():
            correct = (model.module(tx).argmax(1) == ty).sum().item()
        if rank == 0:
            print(f"torch {torch.__version__} {a.hook} world {a.world_size}: epoch {epoch} "
                  f"test_acc {correct / len(ty):.4f}, "
                  f"{counting.bytes / steps:.0f} bytes all-reduced per step", flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hook", default="none")
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, help="per epoch, for a quick look")
    p.add_argument("--data-dir", default=DATA)
    a = p.parse_args()
    mp.spawn(rank_main, args=(a, free_port()), nprocs=a.world_size)


if __name__ == "__main__":
    main()
