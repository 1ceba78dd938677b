"""This project against PyTorch on this machine's CPU, in one run: the three
configurations of the CPU-speed goals, each pair run back to back and the
pairs alternated over --rounds, so that a shared machine's drift falls on
both sides. Prints a Markdown table (CPU model, date, commands, per-round
figures, medians and the ratio of medians) to paste into
docs/benchmarks.md.

    cargo build --release -p trainer && cargo bench -p benches --bench train_step --no-run
    /path/to/venv/bin/python benches/pytorch/side_by_side.py --rounds 3

Where there is no cargo (the device bundle), --trainer and --train-step name
the release trainer and the train_step bench executable instead.

| configuration | ours | PyTorch |
|---|---|---|
| 1 rank x 1 thread | train_step bench, median step | train_step.py, median step |
| 1 rank x 2 threads | the same, --threads 2 | the same, --threads 2 |
| 2 ranks x 1 thread | `trainer --world-size 2`: the epoch's images/s over --steps steps (data gather, all-reduce and all) | train_step.py --world-size 2: DDP over gloo, median of the slowest rank's step |

The two-rank comparison is the conservative one for this project: its
figure is a whole epoch's average, PyTorch's the median step on a batch
already in memory.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def run(cmd, cwd=ROOT):
    out = subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)
    return out.stdout


# Set from the command line in main().
ARGS = None


def ours_step(threads, steps):
    bench = [ARGS.train_step] if ARGS.train_step else [
        "cargo", "bench", "-q", "-p", "benches", "--bench", "train_step", "--"]
    cmd = bench + ["--threads", str(threads), "--batch-size", "64", "--steps", str(steps)]
    last = run(cmd).strip().splitlines()[-1].split()
    return float(last[-1])  # threads batch steps median min img/s


def ours_ranks(ranks, steps):
    data = ["--data-dir", ARGS.data_dir] if ARGS.data_dir else []
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "metrics.jsonl")
        run([ARGS.trainer, "--device", "cpu", "--world-size", str(ranks), "--threads", "1",
             "--epochs", "1", "--max-steps", str(steps), "--metrics", metrics] + data)
        with open(metrics) as f:
            return json.loads(f.readline())["img_per_s"]


def torch_step(threads, steps, world=1):
    cmd = [sys.executable, "train_step.py", "--threads", str(threads), "--batch-size", "64",
           "--steps", str(steps), "--world-size", str(world)]
    return float(re.search(r"([0-9.]+) img/s", run(cmd, cwd=HERE)).group(1))


CONFIGS = [
    ("1 rank x 1 thread", lambda s: ours_step(1, s), lambda s: torch_step(1, s)),
    ("1 rank x 2 threads", lambda s: ours_step(2, s), lambda s: torch_step(2, s)),
    ("2 ranks x 1 thread", lambda s: ours_ranks(2, 4 * s), lambda s: torch_step(1, s, world=2)),
]


def cpu_model():
    with open("/proc/cpuinfo") as f:
        info = f.read()
    model = re.search(r"model name\s*:\s*(.*)", info).group(1)
    flags = re.search(r"flags\s*:\s*(.*)", info).group(1).split()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {isa}, {os.cpu_count()} logical CPUs"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=50, help="timed steps per single-rank run")
    p.add_argument("--trainer", default=os.path.join(ROOT, "target", "release", "trainer"),
                   help="the release trainer [default: target/release/trainer]")
    p.add_argument("--train-step", help="the train_step bench executable [default: cargo bench]")
    p.add_argument("--data-dir", help="FashionMNIST for the trainer [default: its own search]")
    global ARGS
    a = ARGS = p.parse_args()
    import torch

    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {cpu_model()}; "
          f"PyTorch {torch.__version__}; batch 64 per rank; images/s per round (ours / PyTorch)\n")
    print("| configuration | rounds (ours / PyTorch) | ours median | PyTorch median | ratio |")
    print("|---|---|---|---|---|")
    for name, ours, theirs in CONFIGS:
        pairs = [(ours(a.steps), theirs(a.steps)) for _ in range(a.rounds)]
        mine = statistics.median(p[0] for p in pairs)
        base = statistics.median(p[1] for p in pairs)
        rounds = ", ".join(f"{o:.0f} / {t:.0f}" for o, t in pairs)
        print(f"| {name} | {rounds} | {mine:.0f} | {base:.0f} | {mine / base:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
