"""torch.distributed all-reduce in nccl-tests' all_reduce_perf table, to set
beside `cargo bench -p benches --bench allreduce -- --transport nccl --ranks 1`
(same sizes, iterations, fill values and columns).

    python benches/pytorch/allreduce_nccl.py                 # one process, one GPU
    torchrun --nproc-per-node 2 benches/pytorch/allreduce_nccl.py
    python benches/pytorch/allreduce_nccl.py --backend gloo --device cpu

float32 sum. torch's all_reduce works in place only, so the out-of-place
column times copying the input into the output and then reducing the output;
the in-place column times all_reduce alone (on zeros, so repeated sums stay
zero). Each size and mode is checked once: rank r fills element i with
(r + 1) * (i % 97), so the sum is exact; mismatches are counted in #wrong and
make the exit status non-zero. Rank 0 prints the table.
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size and mode")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations first")
    a = p.parse_args()
    if a.min_bytes < 4 or a.min_bytes % 4 or a.max_bytes < a.min_bytes:
        p.error("--min-bytes must be a positive multiple of 4 (float32), at most --max-bytes")
    sizes = []
    while (a.min_bytes << len(sizes)) <= a.max_bytes:
        sizes.append(a.min_bytes << len(sizes))

    if "RANK" not in os.environ:  # a single process: world size 1
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        sync = torch.cuda.synchronize
        where = torch.cuda.get_device_name(device)
        dist.init_process_group(a.backend, device_id=device)
    else:
        device = torch.device("cpu")
        sync = lambda: None  # noqa: E731
        where = f"cpu ({torch.get_num_threads()} threads)"
        dist.init_process_group(a.backend)
    rank, n = dist.get_rank(), dist.get_world_size()

    def measure(run, check, result, expected):
        """Mean seconds per call of `run` (over iterations and ranks), and the
        elements of `result` that differ from `expected` after `check`
        (summed over ranks)."""
        for _ in range(a.warmup):
            run()
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(a.iters):
            run()
        sync()
        seconds = (time.perf_counter() - start) / max(a.iters, 1)
        check()
        sync()
        wrong = (result != expected).sum().item()
        stats = torch.tensor([seconds, wrong], dtype=torch.float64, device=device)
        dist.all_reduce(stats)
        return stats[0].item() / n, stats[1].item()

    if rank == 0:
        version = ""
        if a.backend == "nccl":
            version = " NCCL " + ".".join(map(str, torch.cuda.nccl.version()))
        print(f"# torch {torch.__version__} all_reduce_perf: torch.distributed {a.backend}{version}, "
              f"{n} ranks (processes), rank 0 on {where}")
        print("# out-of-place: output.copy_(input) then all_reduce(output), torch having no "
              "out-of-place all_reduce; the time includes the copy")
        print(f"#  minBytes {sizes[0]} maxBytes {sizes[-1]} sizes {len(sizes)}  "
              f"warmup iters: {a.warmup} iters: {a.iters} validation: 1")
        print("#  time is the mean over iterations and ranks")
        print("#")
        e = ""
        print(f"# {e:>10} {e:>12} {e:>6} {e:>6} {e:>6} {'out-of-place':>32}  {'in-place':>32}")
        cols = ("time", "algbw", "busbw", "#wrong")
        print("# {:>10} {:>12} {:>6} {:>6} {:>6} {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}"
              .format("size", "count", "type", "redop", "root", *cols, *cols))
        units = ("(us)", "(GB/s)", "(GB/s)", "")
        print("# {:>10} {:>12} {:>6} {:>6} {:>6} {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}"
              .format("(B)", "(elements)", "", "", "", *units, *units))

    total_wrong, busbws = 0.0, []
    for size in sizes:
        count = size // 4
        pattern = (torch.arange(count, device=device) % 97).float()
        inp = pattern * (rank + 1)
        expected = pattern * (n * (n + 1) // 2)
        out = torch.zeros_like(inp)
        work = torch.zeros_like(inp)

        def out_of_place():
            out.copy_(inp)
            dist.all_reduce(out)

        def reset_and_reduce():
            work.copy_(inp)
            dist.all_reduce(work)

        cells = [measure(out_of_place, lambda: None, out, expected),
                 measure(lambda: dist.all_reduce(work), reset_and_reduce, work, expected)]
        row = []
        for seconds, wrong in cells:
            algbw = size / seconds / 1e9
            busbw = algbw * 2 * (n - 1) / n
            row += [seconds * 1e6, algbw, busbw, f"{wrong:g}"]
            total_wrong += wrong
        busbws.append(busbw)  # in place, for the average
        if rank == 0:
            print("{:>12} {:>12} {:>6} {:>6} {:>6} {:>9.1f} {:>7.2f} {:>7.2f} {:>6}  "
                  "{:>9.1f} {:>7.2f} {:>7.2f} {:>6}".format(size, count, "float", "sum", -1, *row),
                  flush=True)
        del pattern, inp, expected, out, work

    if rank == 0:
        print(f"# Out of bounds values : {total_wrong:g} {'OK' if total_wrong == 0 else 'FAILED'}")
        print(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f} GB/s")
        print("#")
    dist.destroy_process_group()
    sys.exit(0 if total_wrong == 0 else 1)


if __name__ == "__main__":
    main()
