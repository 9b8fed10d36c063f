"""Datasets for contribution analysis: the task record and the pipeline every source goes through.

A source (``memplan.contrib.data.sources``) reads raw arrays (:class:`RawTask`); :func:`prepare`
then, in this order: checks the labels, carves a *validation* split from the training split
(stratified, seeded; contribution analysis measures Δacc there, so the test split stays for the
final evaluations), keeps ``train_per_class`` training images per class (and ``test_per_class``
test images), converts images to float32 N x C x H x W (uint8 / values > 1 scaled to [0, 1]),
resizes them (bilinear, antialiased) to the model's per-sample shape (grey repeated to 3
channels, RGB averaged to 1 when the model asks) and standardises every split with the
per-channel mean / std of the training images kept, or with the model's own input convention
when it has one (``normalize``: one (mean, std) for every channel, on images in [0, 1]; the
256KB paper's int8 graphs take ``pixel - 127.5``, i.e. (0.5, 1/255)). Subsetting comes before resizing, so a
60,000-image source costs only the images kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ...errors import MemplanError
from ..options import DEFAULT_VALIDATION, Validation  # noqa: F401  (declared with the options; re-exported)


class BadData(MemplanError):
    """``--data`` cannot be read or has the wrong layout."""


@dataclass
class Data:
    """One classification task, ready for the model: float32 N x C x H x W, int64 labels.
    ``x_val`` / ``y_val``: the validation split carved from the training data (None: none)."""

    name: str
    description: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    classes: int
    x_val: Tensor | None = None
    y_val: Tensor | None = None
    mean: Tensor | None = None  # 1 x C x 1 x 1: the per-channel mean and std every split was standardised with
    std: Tensor | None = None  # (those of the training images kept after resizing, or the model's; None: not recorded)

    def summary(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "description": self.description,
            "classes": self.classes,
            "train": int(self.x_train.shape[0]),
            "test": int(self.x_test.shape[0]),
            "sample_shape": list(self.x_train.shape[1:]),
        }
        if self.x_val is not None:
            out["validation"] = int(self.x_val.shape[0])
        return out

    def validation_task(self) -> Data:
        """The task that training-time measurements see: train split + the validation split in
        the evaluation slot (``x_test``); the test split itself is not carried."""
        if self.x_val is None or self.y_val is None:
            raise BadData(f"{self.name} has no validation split")
        return Data(
            self.name,
            self.description + " [evaluated on the validation split]",
            self.x_train,
            self.y_train,
            self.x_val,
            self.y_val,
            self.classes,
            mean=self.mean,
            std=self.std,
        )


@dataclass
class RawTask:
    """What a source reads: images in any layout :func:`prepare` accepts, integer labels."""

    name: str
    description: str
    x_train: Any
    y_train: Any
    x_test: Any
    y_test: Any


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


def _moments(train: Tensor) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std (1 x C x 1 x 1) of N x C x H x W training images."""
    dims = [0, 2, 3]
    return train.mean(dims, keepdim=True), train.std(dims, keepdim=True).clamp_min(1e-6)


def _fixed(normalize: tuple[float, float], channels: int) -> tuple[Tensor, Tensor]:
    """A model's (mean, std) convention as 1 x C x 1 x 1 tensors (the same value for every channel)."""
    mean, std = normalize
    if not std > 0:
        raise BadData(f"the model's input convention needs a positive std, got {std!r}")
    return torch.full((1, channels, 1, 1), float(mean)), torch.full((1, channels, 1, 1), float(std))


def model_input(x: Any, sample_shape: Sequence[int], mean: Tensor, std: Tensor) -> Tensor:
    """Images in any layout :func:`prepare` reads (uint8 or values above 1 scaled by 1/255) as the model
    input of a task: resized to ``sample_shape`` (channels matched) and standardised with ``mean`` /
    ``std`` (a task's :attr:`Data.mean` / :attr:`Data.std`), as :func:`prepare` does every split."""
    return (fit_to(_as_nchw(x, "images"), sample_shape) - mean) / std


def _per_class(labels: np.ndarray, count: Validation | None, seed: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(chosen, rest) indices, sorted: per class the first ``count`` of a seeded permutation (an
    int) or that fraction of the class, rounded (a float in (0, 1)); None chooses nothing."""
    if count is None:
        return np.empty(0, np.int64), np.arange(len(labels))
    if isinstance(count, bool) or not (
        isinstance(count, int) and count >= 0 or isinstance(count, float) and 0 < count < 1
    ):
        raise BadData(f"{what} must be a count >= 0 or a fraction in (0, 1), got {count!r}")
    rng = np.random.default_rng(seed)
    chosen, rest = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n = count if isinstance(count, int) else int(round(len(idx) * count))
        if n >= len(idx):
            raise BadData(f"{what}: class {int(c)} has {len(idx)} images; {n} requested leaves none")
        chosen.append(idx[:n])
        rest.append(idx[n:])
    return np.sort(np.concatenate(chosen)), np.sort(np.concatenate(rest))


def _keep(labels: np.ndarray, per_class: int | None, seed: int, what: str) -> np.ndarray:
    """Indices of at most ``per_class`` images per class (a seeded choice, sorted); None keeps all."""
    if per_class is None:
        return np.arange(len(labels))
    if isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 1:
        raise BadData(f"{what} must be a positive integer, got {per_class!r}")
    rng = np.random.default_rng(seed)
    return np.sort(
        np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:per_class] for c in np.unique(labels)])
    )


def split_indices(
    labels: np.ndarray, validation: Validation | None, train_per_class: int | None, seed: int = 0, name: str = "data"
) -> tuple[np.ndarray, np.ndarray]:
    """(validation, training) indices into a training split with these ``labels``, as
    :func:`prepare` carves them: ``validation`` per class with seed ``seed``, then at most
    ``train_per_class`` per class of the rest with seed ``seed + 1``. They depend on the labels
    alone, not on the images."""
    val_idx, rest = _per_class(labels, validation, seed, f"{name}: validation")
    return val_idx, rest[_keep(labels[rest], train_per_class, seed + 1, f"{name}: train_per_class")]


def _take(x: Any, idx: np.ndarray) -> Any:
    return x[torch.from_numpy(idx)] if isinstance(x, Tensor) else np.asarray(x)[idx]


def prepare(
    raw: RawTask,
    sample_shape: Sequence[int] | None,
    *,
    validation: Validation | None = None,
    train_per_class: int | None = None,
    test_per_class: int | None = None,
    seed: int = 0,
    normalize: tuple[float, float] | None = None,
) -> Data:
    """The task of ``raw`` ready for the model (module docstring): ``validation`` images per class
    (int) or fraction (float) carved from the training split with seed ``seed``; then at most
    ``train_per_class`` / ``test_per_class`` images per class (seeds ``seed + 1`` / ``seed + 2``);
    resized to ``sample_shape`` (None keeps the images' own) and standardised: with ``normalize``
    = (mean, std) of the model's input convention on [0, 1] images, else with the training images'
    per-channel moments."""
    name = raw.name
    n_train, n_test = len(raw.x_train), len(raw.x_test)
    ytr, yte = _as_labels(raw.y_train, n_train, f"{name}: y_train"), _as_labels(raw.y_test, n_test, f"{name}: y_test")
    if n_train == 0 or n_test == 0:
        raise BadData(f"{name}: the train and test splits must both hold samples")
    classes = int(max(ytr.max(), yte.max())) + 1
    if classes < 2:
        raise BadData(f"{name}: needs at least 2 classes")
    labels = ytr.numpy()
    val_idx, train_idx = split_indices(labels, validation, train_per_class, seed, name)
    test_idx = _keep(yte.numpy(), test_per_class, seed + 2, f"{name}: test_per_class")
    xtr = _as_nchw(_take(raw.x_train, train_idx), f"{name}: x_train")
    xte = _as_nchw(_take(raw.x_test, test_idx), f"{name}: x_test")
    xva = _as_nchw(_take(raw.x_train, val_idx), f"{name}: x_train") if len(val_idx) else None
    if sample_shape is None:
        sample_shape = tuple(xtr.shape[1:])
        if tuple(xte.shape[1:]) != sample_shape:
            raise BadData(f"{name}: train images are {tuple(xtr.shape[1:])}, test images {tuple(xte.shape[1:])}")
    elif len(sample_shape) != 3:
        raise BadData(f"{name}: the model's per-sample input shape {tuple(sample_shape)} is not C x H x W")
    sized = [
        fit_to(xtr, sample_shape),
        fit_to(xte, sample_shape),
        *([fit_to(xva, sample_shape)] if xva is not None else []),
    ]
    mean, std = _moments(sized[0]) if normalize is None else _fixed(normalize, sized[0].shape[1])
    parts = [(t - mean) / std for t in sized]
    data = Data(
        name,
        raw.description,
        parts[0],
        ytr[torch.from_numpy(train_idx)],
        parts[1],
        yte[torch.from_numpy(test_idx)],
        classes,
        mean=mean,
        std=std,
    )
    if xva is not None:
        data.x_val, data.y_val = parts[2], ytr[torch.from_numpy(val_idx)]
    return data


def make_data(
    name: str,
    description: str,
    x_train: Any,
    y_train: Any,
    x_test: Any,
    y_test: Any,
    sample_shape: Sequence[int] | None,
) -> Data:
    """Check, convert, resize (to ``sample_shape``; None keeps the images' own) and standardise one
    task, every image kept and no validation split (:func:`prepare` with no subsetting)."""
    return prepare(RawTask(name, description, x_train, y_train, x_test, y_test), sample_shape)


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
