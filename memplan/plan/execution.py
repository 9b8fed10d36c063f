"""The scheme's execution choices (schema version 5, ``memplan.plan.scheme.Scheme.execution``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Execution(BaseModel):
    """How the step runs, where that changes neither what trains nor the gradients (schema
    version 5): ``recompute``, segments each a run of consecutive blocks (module qualnames of the
    model's blocks, ``LayerGraph.blocks``) whose forward the backward recomputes; ``apply_scheme``
    runs each under non-reentrant ``torch.utils.checkpoint`` (``memplan.nn.recompute``) and the
    accounting counts it so (``memplan.graph.execution``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recompute: list[list[str]] = Field(
        default_factory=list,
        description="segments recomputed in the backward, each a list of consecutive block names, e.g. "
        '[["_blocks.0", "_blocks.1"], ["_blocks.2"]]',
    )

    @model_validator(mode="after")
    def _segments(self) -> Execution:
        if any(not seg for seg in self.recompute):
            raise ValueError("a recompute segment names no block")
        return self
