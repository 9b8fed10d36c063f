"""Datasets for contribution analysis: the task record and its preparation (:mod:`.core`) and the
registry of offline sources (:mod:`.sources`; the sources themselves in :mod:`.digits`,
:mod:`.fashion_mnist`, :mod:`.cifar10` and :mod:`.files`)."""

from .cifar10 import cifar10_dir, read_jpeg_npz
from .core import (
    DEFAULT_VALIDATION,
    BadData,
    Data,
    RawTask,
    Validation,
    fit_to,
    make_data,
    model_input,
    prepare,
    split_per_class,
)
from .digits import PRETRAIN_DIGITS, TRANSFER_DIGITS, digits, digits_arrays, digits_raw
from .fashion_mnist import fashion_mnist_dir, read_idx
from .files import NPZ_KEYS
from .sources import SOURCES, Source, load_data

# the sources register on import, above, in the order they are tried: cifar10, digits, fashion-mnist, npz,
# image folder, module:factory

__all__ = [
    "DEFAULT_VALIDATION",
    "BadData",
    "Data",
    "RawTask",
    "Validation",
    "fit_to",
    "make_data",
    "model_input",
    "prepare",
    "split_per_class",
    "NPZ_KEYS",
    "PRETRAIN_DIGITS",
    "SOURCES",
    "TRANSFER_DIGITS",
    "Source",
    "digits",
    "digits_arrays",
    "digits_raw",
    "cifar10_dir",
    "fashion_mnist_dir",
    "read_jpeg_npz",
    "load_data",
    "read_idx",
]
