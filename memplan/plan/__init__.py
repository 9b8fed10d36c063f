"""Plans: what trains under a strategy (:mod:`.plan`), the sparse-update scheme format
(:mod:`.scheme`), its mapping to a plan (:mod:`.convert`) and tiny-training's
``backward_config`` (:mod:`.tinytraining`)."""

from .convert import NORM_MODES, fingerprint, scheme_to_plan
from .plan import FROZEN, OpView, Plan, Train, grad_flow, updated_weight_numel
from .scheme import (SCHEMA_VERSION, Provenance, Scheme, WeightUpdate, load_scheme, new_provenance, schema_json,
                     scheme_from_dict, shipped_scheme)
from .tinytraining import BackwardFlags, is_backward_config

__all__ = ["NORM_MODES", "fingerprint", "scheme_to_plan", "FROZEN", "OpView", "Plan", "Train", "grad_flow",
           "updated_weight_numel", "SCHEMA_VERSION", "Provenance", "Scheme", "WeightUpdate", "load_scheme",
           "new_provenance", "schema_json", "scheme_from_dict", "shipped_scheme", "BackwardFlags", "is_backward_config"]
