"""Fine-tuning strategies by name (see ``base`` for the registry)."""

from .base import (
    DEFAULT_K,
    STRATEGIES,
    TRANSFORMS,
    Strategy,
    Transform,
    add_architecture,
    added_records,
    as_prepared,
    changes_architecture,
    full_train,
    get_strategy,
    lastk_start,
    make_plan,
    positive,
    split_options,
    strategy,
    transform_model,
)

__all__ = [
    "DEFAULT_K",
    "STRATEGIES",
    "TRANSFORMS",
    "Strategy",
    "Transform",
    "add_architecture",
    "added_records",
    "as_prepared",
    "changes_architecture",
    "full_train",
    "get_strategy",
    "lastk_start",
    "make_plan",
    "positive",
    "split_options",
    "strategy",
    "transform_model",
    "architecture",
    "as_is",
    "cache_reuse",
    "minilearn",
    "mobiletl",
    "sparse",
    "tinytl",
]
# each module registers its strategies: sparse, mobiletl, cache-reuse, tinytl-b / -l / -lb, minilearn, as-is;
# architecture registers the transforms every strategy accepts
from . import architecture, as_is, cache_reuse, minilearn, mobiletl, sparse, tinytl
