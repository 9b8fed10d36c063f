"""The scheme's execution choices (schema version 5, ``memplan.plan.scheme.Scheme.execution``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Execution(BaseModel):
    """How the step runs, where that changes neither what trains nor the gradients (schema
    version 5): ``recompute``, segments each a run of consecutive blocks (module qualnames of the
    model's blocks, ``LayerGraph.blocks``) whose forward the backward recomputes; ``apply_scheme``
    runs each under non-reentrant ``torch.utils.checkpoint`` (``memplan.nn.recompute``) and the
    accounting counts it so (``memplan.graph.execution``). ``micro_batches``: M, gradient
    accumulation: the scheme's ``batch`` trained as M micro-batches of ``batch / M`` whose
    gradients add up before one optimizer step (``memplan.train.fit_scheme``; the accounting counts
    one micro-batch's activations, ``memplan.accounting.microbatch``); only where no norm
    normalises with its batch's statistics (``memplan.plan.convert.scheme_to_plan`` refuses it
    otherwise), since the gradients are then those of the whole batch."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    recompute: list[list[str]] = Field(
        default_factory=list,
        description="segments recomputed in the backward, each a list of consecutive block names, e.g. "
        '[["_blocks.0", "_blocks.1"], ["_blocks.2"]]',
    )

    micro_batches: int = Field(
        1,
        ge=1,
        description="gradient accumulation: the batch trained as this many micro-batches whose gradients add up "
        "before one optimizer step (1: the whole batch at once); needs every norm in eval mode",
    )

    @model_validator(mode="after")
    def _segments(self) -> Execution:
        if any(not seg for seg in self.recompute):
            raise ValueError("a recompute segment names no block")
        return self
