"""A small ResNet on Fashion-MNIST, written as a researcher writes their own model and data: plain PyTorch,
nothing from bsresearch, and nothing in bsresearch that knows about it.

    bsresearch train --model examples/vision.py:make_model --dataset examples/vision.py:make_data \
        --train-size 4096 --batch-size 64 --lr 0.05 --budget-amount 3

The data: the IDX files of Debian's dataset-fashion-mnist (`make data` installs them into
/usr/share/datasets/fashion-mnist), 60,000 training and 10,000 test images of 28x28 pixels in 10 classes.
`FashionMNIST` is a map-style Dataset that keeps the uint8 pixels and builds each (image, label) item when it
is asked for: the image as float32 (1, 28, 28), standardised with the training set's mean and standard
deviation. Such a Dataset is not a tensor, so the toolkit serves it through torch's DataLoader.

The model: a CIFAR-style ResNet (He et al. 2016) scaled down: a 3x3 convolution stem, three stages of
`blocks` basic blocks (two 3x3 convolutions with BatchNorm, a projected shortcut where the shape changes)
with width, 2 width and 4 width channels, stride 2 between stages, global average pooling and a linear
classifier. Width 16 and one block per stage: 78 k parameters.
"""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

FOLDER = Path("/usr/share/datasets/fashion-mnist")
MEAN, STD = 72.94035223214286, 90.02118235130526  # of the 60,000 training images' pixels (0-255)


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format, gzipped) as an array of unsigned bytes."""
    data = gzip.open(path, "rb").read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


class FashionMNIST(Dataset):
    """One split of Fashion-MNIST; item i is (standardised image (1, 28, 28) float32, label int)."""
    num_classes = 10

    def __init__(self, split: str, folder: str | Path = FOLDER) -> None:
        prefix = "train" if split == "train" else "t10k"
        folder = Path(folder)
        if not (folder / f"{prefix}-images-idx3-ubyte.gz").exists():
            raise FileNotFoundError(f"Fashion-MNIST is not in {folder}: install Debian's dataset-fashion-mnist "
                                    f"(`make data` does, as root), or pass folder")
        self.images = read_idx(folder / f"{prefix}-images-idx3-ubyte.gz")
        self.labels = read_idx(folder / f"{prefix}-labels-idx1-ubyte.gz")

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = (torch.from_numpy(self.images[i].astype(np.float32)) - MEAN) / STD
        return image.unsqueeze(0), int(self.labels[i])


def make_data(folder: str = str(FOLDER)) -> tuple[FashionMNIST, FashionMNIST]:
    return FashionMNIST("train", folder), FashionMNIST("test", folder)


class BasicBlock(nn.Module):
    def __init__(self, channels_in: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.shortcut = nn.Identity() if stride == 1 and channels_in == channels else nn.Sequential(
            nn.Conv2d(channels_in, channels, 1, stride, bias=False), nn.BatchNorm2d(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, width: int = 16, blocks: int = 1, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, channels_in = [], width
        for stage in range(3):
            channels = width * 2 ** stage
            for block in range(blocks):
                layers.append(BasicBlock(channels_in, channels, 2 if stage and not block else 1))
                channels_in = channels
        self.stages = nn.Sequential(*layers)
        self.head = nn.Linear(channels_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))


def make_model(width: int = 16, blocks: int = 1) -> ResNet:
    """images (batch, 1, 28, 28) -> logits (batch, 10)."""
    return ResNet(width, blocks)
