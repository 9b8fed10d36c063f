"""Fine-tuning strategies by name (see ``base`` for the registry)."""

from .base import (STRATEGIES, Strategy, full_train, get_strategy, lastk_start, make_plan, split_options, strategy,
                   transform_model)

__all__ = ["STRATEGIES", "Strategy", "full_train", "get_strategy", "lastk_start", "make_plan", "split_options",
           "strategy", "transform_model"]
from . import sparse as _sparse  # noqa: E402,F401  (registers "sparse")
from . import mobiletl as _mobiletl  # noqa: E402,F401  (registers "mobiletl")
from . import cache_reuse as _cache_reuse  # noqa: E402,F401  (registers "cache-reuse")
from . import tinytl as _tinytl  # noqa: E402,F401  (registers "tinytl-b", "tinytl-l", "tinytl-lb")
from . import minilearn as _minilearn  # noqa: E402,F401  (registers "minilearn")
