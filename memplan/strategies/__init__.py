"""Fine-tuning strategies by name (see ``base`` for the registry)."""

from .base import (STRATEGIES, Strategy, full_train, get_strategy, lastk_start, make_plan, split_options, strategy,
                   transform_model)

__all__ = ["STRATEGIES", "Strategy", "full_train", "get_strategy", "lastk_start", "make_plan", "split_options",
           "strategy", "transform_model"]
