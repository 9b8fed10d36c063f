"""The transfer benchmark's second data set, CIFAR-10, as a data source of ``memplan.contrib.data``
(a ``file.py:factory`` spec: ``--data benchmarks/transfer_data.py:cifar10``, from the repo root).

The files are the shared offline copy (``../shared/datasets/cifar10/``, its README): one ``.npz``
per split holding ``jpeg`` (every image's JPEG bytes one after another), ``offsets`` (n + 1
int64: image i is ``jpeg[offsets[i]:offsets[i + 1]]``) and ``labels`` (uint8, class index:
airplane, automobile, bird, cat, deer, dog, frog, horse, ship, truck). :func:`cifar10` decodes
them with Pillow into the four arrays an npz source has (uint8 N x 32 x 32 x 3 images); the
contribution data layer then carves the validation split, takes the per-class subsets and resizes
to the model's input, as for any source. The folder is ``$MEMPLAN_CIFAR10``, else
``<repo>/../shared/datasets/cifar10``. Nothing downloads.

When ``memplan.contrib.data`` gets a CIFAR-10 source of its own, the protocol's ``data`` names it
instead and this adapter goes.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FILES = {"train": "cifar10-train-jpeg.npz", "test": "cifar10-test-jpeg.npz"}
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def folder() -> Path:
    """Where the files are: ``$MEMPLAN_CIFAR10`` or ``<repo>/../shared/datasets/cifar10``."""
    return Path(os.environ.get("MEMPLAN_CIFAR10") or ROOT.parent / "shared" / "datasets" / "cifar10")


def read_jpeg_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 N x H x W x 3, labels int64 N) of one split file (module docstring)."""
    from PIL import Image

    with np.load(path, allow_pickle=False) as z:
        jpeg, offsets, labels = z["jpeg"], z["offsets"], z["labels"]
    if len(offsets) != len(labels) + 1 or offsets[0] != 0 or offsets[-1] != len(jpeg):
        raise ValueError(f"{path}: offsets do not cut jpeg into {len(labels)} images")
    raw = jpeg.tobytes()
    images = [
        np.asarray(Image.open(io.BytesIO(raw[a:b])).convert("RGB"))
        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())
    ]
    return np.stack(images), labels.astype(np.int64)


def cifar10() -> dict[str, np.ndarray]:
    """CIFAR-10's train and test splits as ``x_train, y_train, x_test, y_test`` (a factory of
    ``memplan.contrib.data``: it names the folder in its error when a file is missing)."""
    where = folder()
    missing = [name for name in FILES.values() if not (where / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{', '.join(missing)} not in {where} (set MEMPLAN_CIFAR10 to the folder)")
    x_train, y_train = read_jpeg_npz(where / FILES["train"])
    x_test, y_test = read_jpeg_npz(where / FILES["test"])
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
