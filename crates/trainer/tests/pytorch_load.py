"""PyTorch's side of tests/pytorch_load.rs.

usage: pytorch_load.py WORK_DIR

Reads WORK_DIR/model.safetensors (a checkpoint's weights) and WORK_DIR/x.safetensors
(a batch of images), and writes WORK_DIR/out.safetensors with
  ours_logits:  the logits of our weights, loaded with load_state_dict(strict=True);
  torch_logits: the logits of a freshly initialized PyTorch model,
and WORK_DIR/torch_init.safetensors with that model's state_dict, saved the
standard way, for the Rust side to load with --init-from's loader.
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

# The model definition is shared with the PyTorch benchmark.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benches" / "pytorch"))
from cnn_mnist import CNN_MNIST  # noqa: E402


def main(work):
    torch.set_num_threads(1)
    x = load_file(f"{work}/x.safetensors")["x"]
    ours = CNN_MNIST().eval()
    ours.load_state_dict(load_file(f"{work}/model.safetensors"), strict=True)
    torch.manual_seed(0)
    theirs = CNN_MNIST().eval()
    save_file(theirs.state_dict(), f"{work}/torch_init.safetensors")
    with torch.no_grad():
        out = {"ours_logits": ours(x).contiguous(), "torch_logits": theirs(x).contiguous()}
    save_file(out, f"{work}/out.safetensors")


if __name__ == "__main__":
    main(sys.argv[1])
