"""Fashion-MNIST made small enough to travel to a lent GPU with one protocol's backbone.

The device tool carries at most 64 MiB; Fashion-MNIST's training images alone are 26 MB
compressed. A protocol reads 3,500 of the 60,000 (its validation images and its training subset),
and which ones depends only on the labels and the seed (``memplan.contrib.data.core.prepare``). So
this writes the four idx files with every training image the protocol never reads set to zero
(runs of zeros compress to almost nothing), the labels and the test split as they are: about 7 MB.
Before writing, it checks that the task built from the new files is the task built from the
originals, tensor for tensor (``data_digest``): a checkpoint's identity names that digest, so a
device reading the new files writes runs of the same task.

    python benchmarks/device_data.py PROTOCOL.json DEST   # the folder transfer_device.sh prepare fills
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from memplan.contrib.checkpoint import data_digest
from memplan.contrib.data import core
from memplan.contrib.data.fashion_mnist import FASHION_MNIST_FILES, _idx_file, fashion_mnist_dir, read_idx
from memplan.contrib.data.sources import load_data


def read_indices(labels: np.ndarray, validation: int | None, train_per_class: int | None) -> np.ndarray:
    """The training images a task with these options reads (validation, then training subset; seed 0,
    as ``memplan.contrib.setup.build_setup`` loads a task), sorted."""
    val_idx, rest = core._per_class(labels, validation, 0, "validation")
    train_idx = rest[core._keep(labels[rest], train_per_class, 1, "train_per_class")]
    return np.sort(np.concatenate([val_idx, train_idx]))


def write_idx(path: Path, a: np.ndarray) -> None:
    """``a`` (uint8) as a gzip-compressed idx file: magic ``0 0 8 ndim``, the sizes, the bytes."""
    head = bytes([0, 0, 0x08, a.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in a.shape)
    path.write_bytes(gzip.compress(head + np.ascontiguousarray(a, np.uint8).tobytes(), mtime=0))


def task_digest(folder: Path, p: dict) -> str:
    """``data_digest`` of the protocol's task read from the idx files in ``folder``."""
    os.environ["MEMPLAN_FASHION_MNIST"] = str(folder)
    try:
        shape = (3, p["resolution"], p["resolution"])
        return data_digest(
            load_data(
                "fashion-mnist",
                shape,
                p.get("train_per_class"),
                validation=p.get("validation"),
                test_per_class=p.get("test_per_class"),
            )
        )
    finally:
        del os.environ["MEMPLAN_FASHION_MNIST"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("protocol", type=Path)
    ap.add_argument("dest", type=Path)
    a = ap.parse_args(argv)
    p = json.loads(a.protocol.read_text())
    if p.get("data") != "fashion-mnist":
        sys.exit(f"device_data: {a.protocol} reads {p.get('data')!r}, not fashion-mnist")
    src = fashion_mnist_dir()
    images, labels = (read_idx(_idx_file(src, f)) for f in FASHION_MNIST_FILES[:2])
    kept = np.zeros(len(labels), bool)
    kept[read_indices(labels, p.get("validation"), p.get("train_per_class"))] = True
    images = np.where(kept[:, None, None], images, 0).astype(np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        new = Path(tmp)
        write_idx(new / (FASHION_MNIST_FILES[0] + ".gz"), images)
        for f in FASHION_MNIST_FILES[1:]:
            shutil.copy(_idx_file(src, f), new / _idx_file(src, f).name)
        if task_digest(new, p) != task_digest(src, p):
            sys.exit("device_data: the task from the reduced files differs from the original's")
        a.dest.mkdir(parents=True, exist_ok=True)
        for f in new.iterdir():
            shutil.copy(f, a.dest / f.name)
    size = sum(f.stat().st_size for f in a.dest.iterdir())
    print(f"{a.dest}: {int(kept.sum())} of {len(labels)} training images kept, {size:,} bytes, same task digest")


if __name__ == "__main__":
    main()
