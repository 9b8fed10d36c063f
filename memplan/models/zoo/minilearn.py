"""The three small CNNs of MiniLearn (Profentzas et al., "MiniLearn: On-Device Learning for
Low-Power IoT Devices", EWSN 2022, Table 1), pre-trained nets for KWS, CIFAR-10 and WISDM.

Table 1 lists per layer a shape, MACs (millions, 2 decimals) and output bytes (int8, so
bytes = elements). Conv and FC layers carry biases and are followed by ReLU (the authors'
CMSIS-NN code applies ``arm_relu_q7`` after every conv); no BatchNorm; the head is
flatten -> FC (no global pooling). The nets are fixed-size: only the default input fits
the flatten -> FC head.

What the table gives and how each net matches it:

* KWS, input (62, 12, 1) MFCC map (62 frames x 12 coefficients): 5x5 conv 16 (58, 8, 16)
  0.19M, maxpool 2x1 (29, 8, 16), 3x3 conv 32 (27, 6, 32) 0.75M, maxpool 2x1 (13, 6, 32),
  3x3 conv 64 (11, 4, 64) 0.81M, 3x3 conv 32 (9, 2, 32) 0.33M, FC (576, 35). The layers are
  labelled "Conv1D" but every shape needs 2-D kernels, so they are ``nn.Conv2d``. All
  output sizes and the four conv MAC figures match (185,600 / 746,496 / 811,008 /
  331,776). The FC row says 0.03M; 576 x 35 = 20,160 (0.02M).
* CIFAR-10, input (32, 32, 3): 3x3 conv 32 (30, 30, 32), maxpool 2 (15, 15, 32), 3x3 conv
  32 (13, 13, 32), maxpool 2 (6, 6, 32), 3x3 conv 32 (4, 4, 32), FC (512, 10), as in the
  authors' ``parameters.h``. All output sizes match. The table's MACs (1.55M, 1.11M,
  0.73M, FC 0.03M) fit no conv with these shapes: the shapes give 777,600, 1,557,504,
  147,456 and 5,120 (the first figure equals 2 x 777,600, i.e. FLOPs).
* WISDM, input (90, 3, 1): 90 time steps x 3 accelerometer axes. The authors' network
  (``MiniLearn-on-HAR/src/parameters.h``) treats the 90 steps as input channels: three
  1x1 ``Conv1d`` (90->32, 32->32, 32->32) over the 3 axes, flatten (96), then the table's
  FC (96, 128) and FC (128, 6). For this net the table's "Shape" column is the weight
  shape (90, 32, 1) of conv1 (copied to conv2 / conv3) and its 2,880 "Output" is conv1's
  weight count (90 x 32); no other reading gives the FC its 96 inputs. The MAC column
  reads 0.03M on every row; the whole net has 27,840 MACs (about 0.03M).
"""

from __future__ import annotations

import torch
from torch import nn

from .blocks import init_weights


class MiniLearnCNN(nn.Module):
    """``features`` (conv / ReLU / maxpool) -> flatten -> [hidden FC + ReLU] -> classifier."""

    def __init__(self, features: nn.Sequential, in_features: int, num_classes: int, hidden: int | None = None):
        super().__init__()
        self.features = features
        self.flatten = nn.Flatten(1)
        self.fc = None if hidden is None else nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(inplace=False))
        self.classifier = nn.Linear(in_features if hidden is None else hidden, num_classes)
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.flatten(self.features(x))
        if self.fc is not None:
            x = self.fc(x)
        return self.classifier(x)


def _relu() -> nn.ReLU:
    return nn.ReLU(inplace=False)


def minilearn_kws(num_classes: int = 35) -> MiniLearnCNN:
    """KWS net; input (1, 62, 12) (channels, frames, MFCC coefficients)."""
    features = nn.Sequential(
        nn.Conv2d(1, 16, 5), _relu(), nn.MaxPool2d((2, 1)),
        nn.Conv2d(16, 32, 3), _relu(), nn.MaxPool2d((2, 1)),
        nn.Conv2d(32, 64, 3), _relu(),
        nn.Conv2d(64, 32, 3), _relu(),
    )  # fmt: skip
    return MiniLearnCNN(features, 9 * 2 * 32, num_classes)


def minilearn_cifar10(num_classes: int = 10) -> MiniLearnCNN:
    """CIFAR-10 net; input (3, 32, 32)."""
    features = nn.Sequential(
        nn.Conv2d(3, 32, 3), _relu(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3), _relu(), nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3), _relu(),
    )  # fmt: skip
    return MiniLearnCNN(features, 4 * 4 * 32, num_classes)


def minilearn_wisdm(num_classes: int = 6) -> MiniLearnCNN:
    """WISDM-HAR net; input (90, 3) (time steps as channels, 3 axes as the conv length)."""
    features = nn.Sequential(
        nn.Conv1d(90, 32, 1), _relu(),
        nn.Conv1d(32, 32, 1), _relu(),
        nn.Conv1d(32, 32, 1), _relu(),
    )  # fmt: skip
    return MiniLearnCNN(features, 32 * 3, num_classes, hidden=128)
