"""Plans: what trains under a strategy (:mod:`.plan`), the sparse-update scheme format
(:mod:`.scheme`), its mapping to a plan (:mod:`.convert`), what a scheme records about where it
was planned (:mod:`.recorded`) and tiny-training's ``backward_config`` (:mod:`.tinytraining`).

The scheme format is built on pydantic, which costs a noticeable part of a cold start; its
names load on first use (module ``__getattr__``), so commands that read no scheme never
import it.
"""

from importlib import import_module
from typing import Any

from .convert import NORM_MODES, NormSetting, added_fingerprint, fingerprint, is_added, scheme_to_plan
from .plan import FROZEN, OpView, Plan, Train, grad_flow, updated_weight_numel

#: names of the pydantic-based modules, loaded on first use
LAZY = {
    **dict.fromkeys(
        (
            "SCHEMA_VERSION",
            "AddedModule",
            "EXECUTION_VERSION",
            "Provenance",
            "Scheme",
            "WeightUpdate",
            "load_scheme",
            "new_provenance",
            "schema_json",
            "scheme_from_dict",
            "shipped_scheme",
            "Training",
        ),
        "scheme",
    ),
    **dict.fromkeys(("Margin", "TestAccuracy", "Validation"), "evidence"),
    **dict.fromkeys(("BackwardFlags", "is_backward_config"), "tinytraining"),
    "Execution": "execution",
}


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(import_module(f"{__name__}.{LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "NORM_MODES",
    "NormSetting",
    "added_fingerprint",
    "is_added",
    "fingerprint",
    "scheme_to_plan",
    "FROZEN",
    "OpView",
    "Plan",
    "Train",
    "grad_flow",
    "updated_weight_numel",
    *LAZY,
]
