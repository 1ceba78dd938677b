"""Tuned PyTorch's training images/s for CNN_MNIST, every case of the
device bundle in one process (one CUDA start, one data load), to set beside
the trainer's epoch lines at the same batch size and precision.

    python benches/pytorch/gpu_suite.py --budget 120

Every case is the tuned mode of train_throughput.py (the training images
resident on the GPU as uint8, each step gathering a random batch there,
cudnn.benchmark on), in one of three precisions:

  f32   TF32 off for matmuls and cuDNN, as `trainer` computes;
  tf32  TF32 on for both (`trainer --tf32`);
  bf16  forward under torch.autocast(dtype=torch.bfloat16), float32 weights
        and Adam, no loss scaling (`trainer --bf16`);

and with one of four ways to run the step:

  adam     torch.optim.Adam as a user writes it (its default foreach path);
  fused    Adam(fused=True): one kernel for the whole update;
  graph    fused Adam (capturable) and the whole step captured once as a CUDA
           graph, then replayed (the batch copied into its static input);
  compile  torch.compile(model) with fused Adam (compilation in the warm-up,
           printed apart).

Cases run in order of value: adam and fused at batch 64, 256 and 512 in each
precision, then graph and compile at batch 512, bf16 first; a case is
skipped once --budget seconds have passed. Each case times --reps rounds of
--steps steps after --warmup untimed ones, one line per round, so the
report shows the spread:

    torch 2.11.0 on-device bf16 fused batch 512 rep 2: 301234 img/s (1.70 ms/step over 200 steps)
"""
import argparse
import time

import torch
import torch.nn.functional as F

from cnn_mnist import CNN_MNIST
from train_throughput import load_train, on_device_batches

PRECISIONS = ["f32", "tf32", "bf16"]


def cases():
    """(precision, how, batch) in the order they are worth running."""
    for batch in (64, 256, 512):
        for precision in PRECISIONS:
            for how in ("adam", "fused"):
                yield precision, how, batch
    for how in ("graph", "compile"):
        for precision in ("bf16", "tf32", "f32"):
            yield precision, how, 512


def set_precision(precision):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"


def make_step(how, precision, batches, device):
    """A function that runs one training step, and the model it trains."""
    torch.manual_seed(0)
    model = CNN_MNIST().to(device)
    model.train()
    bf16 = precision == "bf16"
    if how == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True,
                               capturable=how == "graph")
    net = torch.compile(model) if how == "compile" else model

    def forward_backward(x, y):
        # The autocast cache must be off inside a CUDA graph capture.
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16,
                            cache_enabled=how != "graph"):
            loss = F.cross_entropy(net(x), y)
        loss.backward()

    if how != "graph":
        def step():
            x, y = next(batches)
            opt.zero_grad(set_to_none=True)
            forward_backward(x, y)
            opt.step()
        return step

    static_x, static_y = (t.clone() for t in next(batches))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before capture, as PyTorch asks
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            forward_backward(static_x, static_y)
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        forward_backward(static_x, static_y)
        opt.step()

    def replay():
        x, y = next(batches)
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
    return replay


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--budget", type=float, default=120, help="seconds for all cases")
    p.add_argument("--steps", type=int, default=200, help="timed steps per round")
    p.add_argument("--reps", type=int, default=3, help="timed rounds per case")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    a = p.parse_args()
    deadline = time.monotonic() + a.budget
    if not torch.cuda.is_available():
        raise SystemExit("error: no GPU that torch sees: this suite times PyTorch on a GPU")
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    torch.backends.cudnn.benchmark = True
    images, labels = load_train(a.data_dir)
    print(f"# torch {torch.__version__} on {name}, cuDNN {torch.backends.cudnn.version()}, "
          f"{a.reps} x {a.steps} steps per case after {a.warmup}", flush=True)
    for precision, how, batch in cases():
        label = f"torch {torch.__version__} on-device {precision} {how} batch {batch}"
        # A compile takes some 20 s: only with a margin left.
        if time.monotonic() > deadline - (30 if how == "compile" else 0):
            print(f"{label}: skipped, out of time (--budget {a.budget:.0f})", flush=True)
            continue
        set_precision(precision)
        batches = on_device_batches(images, labels, batch, device)
        try:
            began = time.perf_counter()
            step = make_step(how, precision, batches, device)
            for _ in range(a.warmup):
                step()
            torch.cuda.synchronize()
            if how == "compile":
                print(f"{label}: compiled and warmed up in "
                      f"{time.perf_counter() - began:.1f} s", flush=True)
            for rep in range(1, a.reps + 1):
                start = time.perf_counter()
                for _ in range(a.steps):
                    step()
                torch.cuda.synchronize()
                secs = time.perf_counter() - start
                print(f"{label} rep {rep}: {a.steps * batch / secs:.0f} img/s "
                      f"({secs / a.steps * 1e3:.2f} ms/step over {a.steps} steps)", flush=True)
        except Exception as e:  # one case failing leaves the others
            print(f"{label}: failed: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
