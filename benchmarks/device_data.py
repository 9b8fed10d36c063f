"""A protocol's data made small enough to travel to a lent GPU with its backbone.

The device tool carries at most 64 MiB. A protocol reads 3,500 of the training images (its
validation images and its training subset), and which ones depends only on the labels and the
seed (``memplan.contrib.data.core.split_indices``, at the seed 0 ``build_setup`` uses). So this
writes the training split with every image the protocol never reads blanked, the labels and the
test split as they are:

* Fashion-MNIST (26 MB of training images): the four idx files, unread images set to zero (runs of
  zeros compress to almost nothing): 6 MB;
* CIFAR-10 (``benchmarks/transfer_data.py``, 46 MB of training JPEGs): the train npz compressed,
  each unread image one black 32x32 JPEG: 11 MB with the test split.

Before writing, it checks that the task built from the new files is the task built from the
originals, tensor for tensor (``data_digest``): a checkpoint's identity names that digest, so a
device reading the new files writes runs of the same task.

    python benchmarks/device_data.py PROTOCOL.json DEST   # the folder transfer_device.sh prepare fills
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import transfer_data

from memplan.contrib.checkpoint import data_digest
from memplan.contrib.data.core import split_indices
from memplan.contrib.data.fashion_mnist import FASHION_MNIST_FILES, fashion_mnist_dir, idx_file, read_idx
from memplan.contrib.data.sources import load_data


def write_idx(path: Path, a: np.ndarray) -> None:
    """``a`` (uint8) as a gzip-compressed idx file: magic ``0 0 8 ndim``, the sizes, the bytes."""
    head = bytes([0, 0, 0x08, a.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in a.shape)
    path.write_bytes(gzip.compress(head + np.ascontiguousarray(a, np.uint8).tobytes(), mtime=0))


def task_digest(spec: str, env: str, folder: Path, p: dict) -> str:
    """``data_digest`` of the protocol's task read (``spec``) from the files in ``folder`` (``env``
    names it to the source)."""
    before = os.environ.get(env)
    os.environ[env] = str(folder)
    try:
        shape = (3, p["resolution"], p["resolution"])
        return data_digest(
            load_data(
                spec,
                shape,
                p.get("train_per_class"),
                validation=p.get("validation"),
                test_per_class=p.get("test_per_class"),
                seed=p.get("split_seed", 0),
            )
        )
    finally:
        if before is None:
            del os.environ[env]
        else:
            os.environ[env] = before


def kept_mask(labels: np.ndarray, p: dict) -> np.ndarray:
    """True for each training image the protocol ``p`` reads."""
    kept = np.zeros(len(labels), bool)
    split = split_indices(labels, p.get("validation"), p.get("train_per_class"), p.get("split_seed", 0))
    kept[np.concatenate(split)] = True
    return kept


def fashion_mnist_files(p: dict, new: Path) -> tuple[Path, int]:
    """Fashion-MNIST's idx files into ``new``, unread training images zeroed; (source folder, kept)."""
    src = fashion_mnist_dir()
    images, labels = (read_idx(idx_file(src, f)) for f in FASHION_MNIST_FILES[:2])
    kept = kept_mask(labels, p)
    write_idx(new / (FASHION_MNIST_FILES[0] + ".gz"), np.where(kept[:, None, None], images, 0).astype(np.uint8))
    for f in FASHION_MNIST_FILES[1:]:
        shutil.copyfile(idx_file(src, f), new / idx_file(src, f).name)
    return src, int(kept.sum())


def black_jpeg() -> bytes:
    """One black 32x32 RGB JPEG (what an unread CIFAR-10 image becomes)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, format="JPEG")
    return buf.getvalue()


def cifar10_files(p: dict, new: Path) -> tuple[Path, int]:
    """CIFAR-10's npz files into ``new``: the train split compressed, each unread image one black
    JPEG; the test split as it is; (source folder, kept)."""
    src = transfer_data.folder()
    with np.load(src / transfer_data.FILES["train"], allow_pickle=False) as z:
        jpeg, offsets, labels = z["jpeg"], z["offsets"], z["labels"]
    kept, black, raw = kept_mask(labels.astype(np.int64), p), black_jpeg(), jpeg.tobytes()
    blobs = [raw[a:b] if k else black for a, b, k in zip(offsets[:-1].tolist(), offsets[1:].tolist(), kept)]
    np.savez_compressed(
        new / transfer_data.FILES["train"],
        jpeg=np.frombuffer(b"".join(blobs), np.uint8),
        offsets=np.cumsum([0, *map(len, blobs)]).astype(np.int64),
        labels=labels,
    )
    shutil.copyfile(src / transfer_data.FILES["test"], new / transfer_data.FILES["test"])
    return src, int(kept.sum())


#: the protocol's ``data`` -> (the variable naming the source's folder, the writer of its files)
SOURCES = {
    "fashion-mnist": ("MEMPLAN_FASHION_MNIST", fashion_mnist_files),
    "benchmarks/transfer_data.py:cifar10": ("MEMPLAN_CIFAR10", cifar10_files),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("protocol", type=Path)
    ap.add_argument("dest", type=Path)
    a = ap.parse_args(argv)
    p = json.loads(a.protocol.read_text())
    if p.get("data") not in SOURCES:
        sys.exit(f"device_data: {a.protocol} reads {p.get('data')!r}; this knows {', '.join(SOURCES)}")
    env, write = SOURCES[p["data"]]
    with tempfile.TemporaryDirectory() as tmp:
        new = Path(tmp)
        src, kept = write(p, new)
        if task_digest(p["data"], env, new, p) != task_digest(p["data"], env, src, p):
            sys.exit("device_data: the task from the reduced files differs from the original's")
        a.dest.mkdir(parents=True, exist_ok=True)
        for f in new.iterdir():
            shutil.copyfile(f, a.dest / f.name)
    size = sum(f.stat().st_size for f in a.dest.iterdir())
    print(f"{a.dest}: {kept} training images kept, {size:,} bytes, the same task")


if __name__ == "__main__":
    main()
