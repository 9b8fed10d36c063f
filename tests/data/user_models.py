"""Models used by the CLI tests (loaded as tests/data/user_models.py:attr)."""

import torch
import torch.nn as nn


class TinyNet(nn.Module):
    def __init__(self, num_classes: int = 4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


def tiny_factory():
    return TinyNet(3)


class NeedsArgs(nn.Module):
    def __init__(self, width):
        super().__init__()


class Gate(nn.Module):
    """Data-dependent control flow: fx cannot trace it."""

    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


class Untraceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.gate = Gate()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.gate(self.conv(x)).mean((2, 3)))


class TupleOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        y = self.fc(x.mean((2, 3)))
        return y, y


NOT_A_MODEL = 42


class CifarBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1)
        self.bn = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 1)

    def forward(self, x):
        return self.conv2(self.bn(self.conv1(x)).relu())


class Cifar(nn.Module):
    """A CNN sized for 32x32 inputs: its classifier reads the flattened 8x8 map, so it runs at no other size."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.blocks = nn.Sequential(CifarBlock(3, 16, 1), CifarBlock(16, 32, 2), CifarBlock(32, 32, 2))
        self.fc = nn.Linear(32 * 8 * 8, num_classes)

    def forward(self, x):
        return self.fc(self.blocks(x).flatten(1))
