"""Datasets for contribution analysis: the task record and its preparation (:mod:`.core`) and the
registry of offline sources (:mod:`.sources`)."""

from .core import DEFAULT_VALIDATION, BadData, Data, RawTask, Validation, fit_to, make_data, prepare, split_per_class
from .sources import (
    NPZ_KEYS,
    PRETRAIN_DIGITS,
    SOURCES,
    TRANSFER_DIGITS,
    Source,
    digits,
    digits_arrays,
    digits_raw,
    fashion_mnist_dir,
    load_data,
    read_idx,
)

__all__ = [
    "DEFAULT_VALIDATION",
    "BadData",
    "Data",
    "RawTask",
    "Validation",
    "fit_to",
    "make_data",
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
    "fashion_mnist_dir",
    "load_data",
    "read_idx",
]
