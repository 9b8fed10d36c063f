"""Cost records as plain data: per-layer and total costs, the profile, and what the accounting
modes return (:class:`Saved` per op, :class:`Summary` per step).

All sizes are in bytes, all counts are integers, FLOPs = 2 x MACs (``memplan.costs.flops``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..names import DEFAULT_SCHEDULE

#: node kinds left out of ``Profile.layers`` (shape queries, the graph's input and output)
HIDDEN_KINDS = frozenset({"meta", "input", "output"})


@dataclass(frozen=True)
class Saved:
    """One tensor kept for backward: ``storage`` is a storage id, or None for a private tensor."""

    nbytes: int
    storage: int | None = None
    what: str = ""


@dataclass
class Summary:
    """A mode's whole-step figures: ``Totals.total_bytes`` / ``peak_bytes`` and where the peak is."""

    total_bytes: int
    peak_bytes: int
    peak_index: int  # node index of the peak
    peak_phase: str  # "forward" or "backward"
    at: list[int]  # per node: bytes in use while it runs (``LayerCost.peak_bytes``)
    extras: dict[str, Any] = field(default_factory=dict)  # merged into Profile.extras


@dataclass
class Costs:
    """Additive cost fields, per layer and in total (bytes, counts, FLOPs = 2 x MACs)."""

    params: int = 0
    trainable_params: int = 0
    macs: int = 0
    forward_flops: int = 0  # 2 x MACs of conv / linear / matmul
    forward_other_flops: int = 0  # norms, activations, adds, multiplies, pooling, loss
    backward_flops: int = 0  # conv / linear / matmul: grad-input + grad-weight + grad-bias
    backward_grad_input_flops: int = 0
    backward_grad_weight_flops: int = 0
    backward_grad_bias_flops: int = 0
    backward_other_flops: int = 0  # backward of the "other" ops incl. norm affine grads
    recompute_flops: int = 0  # conv / linear / matmul forward run again in the backward (activation checkpointing)
    recompute_other_flops: int = 0  # the "other" ops run again in the backward (activation checkpointing)
    saved_activation_bytes: int = 0
    weight_bytes: int = 0
    gradient_bytes: int = 0
    optimizer_bytes: int = 0

    def add(self, other: Costs) -> None:
        for f in fields(Costs):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class LayerCost(Costs):
    name: str = ""
    kind: str = ""
    target: str = ""
    output_shape: list[int] = field(default_factory=list)
    block: str | None = None
    grad_input: bool = False  # an input of this op needs a gradient
    grad_weight: float = 0.0  # fraction of the weight updated
    grad_bias: bool = False
    saved: list[str] = field(default_factory=list)  # what is kept, e.g. "input 802816 B"
    total_bytes: int = 0  # this layer's weights + gradients + optimizer state + saved activations
    peak_bytes: int = 0  # memory in use while this op runs (forward or backward) in the simulated step


@dataclass
class Totals(Costs):
    total_bytes: int = 0  # weights + gradients + optimizer state + saved activations (+ mode extras)
    peak_bytes: int = 0  # peak of the simulated training step


@dataclass
class Profile:
    """The answer to "what does fine-tuning this model with this strategy cost"."""

    model: str
    method: str
    mode: str
    batch: int
    resolution: int | None
    classes: int
    input_shape: list[int]
    optimizer: str
    frozen_bits: int
    options: dict[str, Any]
    totals: Totals
    layers: list[LayerCost]
    peak_layer: str
    peak_phase: str  # "forward" or "backward"
    unknown_ops: dict[str, int]  # ops that could not be costed exactly (bounded), by target
    observed_ops: dict[str, int] = field(default_factory=dict)  # ops costed by observation, by target
    capture: str = "symbolic"  # how the model was captured: "symbolic" (torch.fx) or "recorded" (eager on meta)
    check: dict[str, Any] | None = None  # memplan.check result when asked: predicted / observed bytes, differing
    schedule: str = DEFAULT_SCHEDULE  # training step of the simulated peak (memplan.costs.peak.SCHEDULES)
    # kernel workspaces in the peak: status calibrated | partial | missing | not modelled, source (machine),
    # configs (distinct kernel configurations), missing (those without a calibration entry)
    workspace: dict[str, Any] = field(default_factory=dict)
    extras: dict[str, Any] = field(default_factory=dict)  # mode- / strategy-specific figures
    conventions: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def layer(self, name: str) -> LayerCost:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)


CONVENTIONS = {
    "flops": "FLOPs = 2 x MACs for conv/linear/matmul (forward_flops, backward_flops); norms, "
    "activations, adds, multiplies, pooling and the loss are in *_other_flops",
    "bytes": "integers in bytes; printed kB/MB are 1000-based, KiB/MiB 1024-based",
}
