"""PyTorch's training images/s for CNN_MNIST on FashionMNIST (Adam, lr 1e-3,
cross-entropy, dropout on), to set beside the trainer's epoch lines.

    python benches/pytorch/train_throughput.py --mode reference --batch-size 64
    python benches/pytorch/train_throughput.py --mode on-device --batch-size 512

--mode reference is the classic tutorial loop as written: a Dataset handing
out one sample at a time through transforms.ToTensor() (an exact equivalent
when torchvision is missing), a DataLoader with shuffle=True, num_workers=4
and pin_memory on CUDA, and each batch moved with .to(device).
--mode on-device is what the trainer does: the training images are uploaded
once as uint8, and each step gathers a random index batch and converts it to
float on the device, with no DataLoader; cudnn.benchmark is on. Both modes
keep TF32 off, as the trainer computes in full float32, unless --tf32 turns
it on for matmuls and cuDNN alike (to set beside `trainer --tf32`), or --bf16
runs forward under torch.autocast(dtype=torch.bfloat16): PyTorch's automatic
mixed precision, convolutions and matmuls in bf16 with float32 accumulation,
float32 weights and Adam, no loss scaling (bf16 has float32's range); to set
beside `trainer --bf16`.

Times --steps steps after --warmup untimed ones (synchronizing the GPU around
the timed region) and prints one line.
"""
import argparse
import gzip
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from cnn_mnist import CNN_MNIST

try:
    from torchvision import transforms

    to_tensor = transforms.ToTensor()
except ImportError:  # the same conversion for a uint8 HxW array

    def to_tensor(img):
        return torch.from_numpy(img).unsqueeze(0).float().div(255)


def read_idx(path, magic, header):
    """The payload of a gzip'd IDX file after its header, as (writable) uint8."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise SystemExit(f"{path}: magic {found:#x}, expected {magic:#x}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).copy()


def load_train(data_dir):
    images = read_idx(os.path.join(data_dir, "train-images-idx3-ubyte.gz"), 0x803, 16)
    labels = read_idx(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"), 0x801, 8)
    return images.reshape(-1, 28, 28), labels


class FashionMNIST(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return to_tensor(self.images[i]), int(self.labels[i])


def reference_batches(images, labels, batch_size, device):
    """Endless (x, y) batches, epoch after epoch, as the tutorial loop makes them."""
    loader = torch.utils.data.DataLoader(
        FashionMNIST(images, labels),
        batch_size=batch_size,
        shuffle=True,
        num_workers=4,
        pin_memory=(device.type == "cuda"),
    )
    while True:
        for x, y in loader:
            yield x.to(device), y.to(device)


def on_device_batches(images, labels, batch_size, device):
    """Endless (x, y) batches gathered from the data set resident on the device."""
    images = torch.from_numpy(images).to(device)  # uint8, N x 28 x 28
    labels = torch.from_numpy(labels.astype(np.int64)).to(device)
    while True:
        idx = torch.randint(0, len(labels), (batch_size,), device=device)
        yield images[idx].unsqueeze(1).float().div_(255), labels[idx]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["reference", "on-device"], default="reference")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", choices=["cuda", "cpu"],
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=300, help="timed steps")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--threads", type=int, help="CPU threads [default: torch's]")
    precision = p.add_mutually_exclusive_group()
    precision.add_argument("--tf32", action="store_true",
                           help="TF32 tensor cores for matmuls and convolutions (as trainer --tf32)")
    precision.add_argument("--bf16", action="store_true",
                           help="AMP: forward under torch.autocast to bf16 (as trainer --bf16)")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if cuda else f"cpu ({torch.get_num_threads()} threads)"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        # The same precision as the trainer's: float32, or TF32 with --tf32.
        torch.backends.cuda.matmul.allow_tf32 = a.tf32
        torch.backends.cudnn.allow_tf32 = a.tf32
        # The tuned mode lets cuDNN time its algorithms for these shapes.
        torch.backends.cudnn.benchmark = a.mode == "on-device"

    torch.manual_seed(0)
    images, labels = load_train(a.data_dir)
    batches = {"reference": reference_batches, "on-device": on_device_batches}[a.mode]
    batches = batches(images, labels, a.batch_size, device)
    model = CNN_MNIST().to(device)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        x, y = next(batches)
        opt.zero_grad()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=a.bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return len(y)

    for _ in range(a.warmup):
        step()
    sync()
    start = time.perf_counter()
    seen = sum(step() for _ in range(a.steps))
    sync()
    secs = time.perf_counter() - start
    precision = " tf32" if a.tf32 else " bf16" if a.bf16 else ""
    print(f"torch {torch.__version__} {a.mode}{precision} {name} batch {a.batch_size}: "
          f"{seen / secs:.0f} img/s ({secs / a.steps * 1e3:.2f} ms/step over {a.steps} steps)")


if __name__ == "__main__":
    main()
