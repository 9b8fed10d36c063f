"""The ``fashion-mnist`` source: Fashion-MNIST from its four idx files."""

from __future__ import annotations

import gzip
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .core import BadData, RawTask
from .sources import source

FASHION_MNIST_DIRS = ("/usr/share/datasets/fashion-mnist",)  # Debian's dataset-fashion-mnist
FASHION_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_IDX_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """An idx file (LeCun's MNIST format; gzip-compressed when the name ends in .gz): magic
    ``0x00 0x00 <dtype> <ndim>``, ndim big-endian uint32 sizes, then the data, C order."""
    p = Path(path)
    try:
        raw = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise BadData(f"cannot read idx file {p}: {exc}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise BadData(f"{p} is not an idx file (bad magic number)")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    start, count = 4 + 4 * ndim, int(np.prod(dims)) if dims else 0
    if len(raw) != start + count * dtype.itemsize:
        raise BadData(f"{p} holds {len(raw) - start} data bytes; its header says {count * dtype.itemsize}")
    return np.frombuffer(raw, dtype, count, start).reshape(dims).astype(dtype.newbyteorder("="))


def fashion_mnist_dir() -> Path:
    """Where the Fashion-MNIST idx files are: ``$MEMPLAN_FASHION_MNIST``, else Debian's location."""
    env = os.environ.get("MEMPLAN_FASHION_MNIST", "").strip()
    for d in ([env] if env else []) + list(FASHION_MNIST_DIRS):
        if all(idx_file(Path(d), f) is not None for f in FASHION_MNIST_FILES):
            return Path(d)
    where = env or FASHION_MNIST_DIRS[0]
    raise BadData(
        f"Fashion-MNIST idx files not found in {where}",
        "apt-get install dataset-fashion-mnist, or set MEMPLAN_FASHION_MNIST to a folder holding them",
    )


def idx_file(d: Path, stem: str) -> Path | None:
    """The idx file ``stem`` in ``d``, gzip-compressed or not (None: neither is there)."""
    return next((d / n for n in (stem + ".gz", stem) if (d / n).is_file()), None)


@source(
    "fashion-mnist",
    lambda spec: spec == "fashion-mnist",
)
def fashion_mnist(spec: str, sample_shape: Sequence[int] | None) -> RawTask:
    d = fashion_mnist_dir()
    xtr, ytr, xte, yte = (read_idx(idx_file(d, f)) for f in FASHION_MNIST_FILES)
    desc = (
        f"Fashion-MNIST (Xiao et al. 2017) from {d}: {len(ytr)} train / {len(yte)} test 28x28 grey images, "
        f"10 classes ({', '.join(FASHION_MNIST_CLASSES)})"
    )
    return RawTask("fashion-mnist", desc, xtr, ytr, xte, yte)
