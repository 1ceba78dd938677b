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

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file


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
