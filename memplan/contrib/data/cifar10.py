"""CIFAR-10 (Krizhevsky, 2009: 50,000 train / 10,000 test 32x32 RGB images, 10 classes), offline,
and the "JPEG npz" layout it ships in: an ``.npz`` (plain ``numpy.savez``, no pickle) with ``jpeg``
(uint8, every image's JPEG bytes one after another), ``offsets`` (int64, n + 1: image i is
``jpeg[offsets[i]:offsets[i+1]]``) and ``labels`` (n class indices).

``--data cifar10`` looks in ``$MEMPLAN_CIFAR10``, then in ``../shared/datasets/cifar10`` beside a
source checkout, for ``cifar10-train-jpeg.npz`` and ``cifar10-test-jpeg.npz``; any folder that holds
one ``*train*.npz`` and one ``*test*.npz`` of this layout is read the same way. An image folder
(``DIR/train/<class>/*.jpg``, ``DIR/test/<class>/*.jpg``) is the ``folder`` source. Decoded
images are cached (uint8, ``$MEMPLAN_CACHE`` or ``~/.cache/memplan``) keyed by the file's size
and modification time.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .core import BadData, RawTask
from .sources import source

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
JPEG_KEYS = ("jpeg", "offsets", "labels")
_CHECKOUT_DIR = Path(__file__).resolve().parents[4] / "shared" / "datasets" / "cifar10"


def cifar10_dir() -> Path:
    """The folder of CIFAR-10's two JPEG npz files (module docstring); a one-line BadData if none."""
    env = os.environ.get("MEMPLAN_CIFAR10", "").strip()
    for d in ([Path(env)] if env else []) + [_CHECKOUT_DIR]:
        if _split_files(d) is not None:
            return d
    raise BadData(
        "CIFAR-10 not found" + (f" in $MEMPLAN_CIFAR10={env}" if env else ""),
        "set MEMPLAN_CIFAR10 to a folder with cifar10-train-jpeg.npz and cifar10-test-jpeg.npz "
        "(or pass an image folder DIR/train/<class>, DIR/test/<class>)",
    )


def _split_files(d: Path) -> tuple[Path, Path] | None:
    if not d.is_dir():
        return None
    train = sorted(d.glob("*train*.npz"))
    test = sorted(d.glob("*test*.npz"))
    return (train[0], test[0]) if len(train) == 1 and len(test) == 1 else None


def _cache_path(path: Path) -> Path:
    root = Path(os.environ.get("MEMPLAN_CACHE", "") or Path.home() / ".cache" / "memplan")
    st = path.stat()
    return root / "jpeg-npz" / f"{path.stem}-{st.st_size}-{int(st.st_mtime)}.npz"


def read_jpeg_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 N x H x W x 3, labels int64) of one JPEG npz (module docstring)."""
    cached = _cache_path(path)
    if cached.is_file():
        with np.load(cached) as z:
            return z["x"], z["y"]
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in JPEG_KEYS if k not in z.files]
            if missing:
                raise BadData(f"{path} lacks {', '.join(missing)}", f"a JPEG npz holds {', '.join(JPEG_KEYS)}")
            jpeg, offsets, labels = (z[k] for k in JPEG_KEYS)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise BadData(f"cannot read {path} as .npz: {exc}") from None
    if offsets.ndim != 1 or len(offsets) != len(labels) + 1 or offsets[-1] != len(jpeg):
        raise BadData(f"{path}: offsets do not index the jpeg bytes ({len(offsets)} offsets, {len(labels)} labels)")
    images = _decode(jpeg, offsets, path)
    _write_cache(cached, images, labels.astype(np.int64))
    return images, labels.astype(np.int64)


def _write_cache(cached: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """Best effort, atomic: a cache that cannot be written is skipped."""
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, x=images, y=labels)
        os.replace(tmp, cached)
    except OSError:
        pass


def _decode(jpeg: np.ndarray, offsets: np.ndarray, path: Path) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    out = []
    for i in range(len(offsets) - 1):
        try:
            with Image.open(io.BytesIO(jpeg[offsets[i] : offsets[i + 1]].tobytes())) as im:
                out.append(np.asarray(im.convert("RGB")))
        except (UnidentifiedImageError, OSError) as exc:
            raise BadData(f"{path}: image {i} is not a readable JPEG ({exc})") from None
    if not out or any(a.shape != out[0].shape for a in out):
        raise BadData(f"{path}: images are missing or not all the same size")
    return np.stack(out)


def _accepts(spec: str) -> bool:
    return spec.lower() in ("cifar10", "cifar-10") or _split_files(Path(spec)) is not None


@source("cifar10", _accepts)
def cifar10(spec: str, sample_shape: Sequence[int] | None) -> RawTask:
    d = cifar10_dir() if spec.lower() in ("cifar10", "cifar-10") else Path(spec)
    train, test = _split_files(d)
    x_train, y_train = read_jpeg_npz(train)
    x_test, y_test = read_jpeg_npz(test)
    return RawTask("cifar10", f"CIFAR-10 as JPEG ({d})", x_train, y_train, x_test, y_test)
