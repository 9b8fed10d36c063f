"""The sources read from the user's files and code: an ``.npz``, an image folder, and
``module:factory``."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from ...errors import MemplanError
from ...models.loading import import_attr
from .core import BadData, RawTask, split_per_class
from .sources import source

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")
NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _is_npz(spec: str) -> bool:
    return spec.endswith(".npz") or Path(spec).is_file()


@source("npz", _is_npz)
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


@source("folder", lambda spec: Path(spec).is_dir())
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
