"""Mixed precision on the setups users prepare themselves (issue 38: ``--amp`` with activation
checkpointing and ``--method as-is``): predicted saved bytes and FLOPs (``pytorch`` mode) against
one real CPU step of the same model under the same ``torch.autocast``, measured with
``saved_tensors_hooks`` and ``FlopCounterMode`` (``tests/test_setups.py``'s ``real_step``).

Under autocast a checkpointed segment's input is often the output of a conv or linear layer, whose
module call the autocast pass rewrites as its functional form (``memplan.graph.autocast``): the
segment must keep that tensor, in the autocast dtype."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import memplan
from memplan.accounting.engine import compute
from memplan.graph.capture import StepRun, capture_graph
from memplan.modes import get_mode
from memplan.strategies import as_prepared, make_plan

from . import setups_corpus as C
from .test_setups import _setup, real_step, step_flops

torch.set_num_threads(1)


class ConvIntoCheckpoint(nn.Module):
    """A stem conv whose output goes straight into a checkpointed block (reentrant or not)."""

    def __init__(self, reentrant: bool):
        super().__init__()
        self.reentrant = reentrant
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.fc = nn.Linear(8, C.CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = checkpoint(self.block, self.stem(x), use_reentrant=self.reentrant)
        return self.fc(x.mean((2, 3)))


@pytest.mark.parametrize(
    "name",
    ["rescnn-checkpoint", "rescnn-checkpoint-reentrant", "sequential-4-segments", "rescnn-checkpoint-as-is"],
)
def test_checkpointed_setups_under_bf16_are_exact(name):
    s = _setup(name)
    model = s.build()
    graph = capture_graph(model, C.SHAPE, step=StepRun(own_modes=as_prepared(s.method), amp=torch.bfloat16))
    assert graph.checkpoints and all(seg.inputs for seg in graph.checkpoints)
    prof = compute(graph, make_plan(graph, s.method), get_mode("pytorch"), calibration=None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        saved, flops, grads = real_step(model)
    t = prof.totals
    assert (t.saved_activation_bytes, step_flops(prof), t.gradient_bytes) == (saved, flops, grads)
    assert t.recompute_flops > 0


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_conv_output_into_a_segment_is_kept_in_bf16(reentrant):
    model = ConvIntoCheckpoint(reentrant)
    graph = capture_graph(model, C.SHAPE, step=StepRun(amp=torch.bfloat16))
    (segment,) = graph.checkpoints
    assert [graph.nodes[i].name for i in segment.inputs] == ["stem"]
    prof = compute(graph, make_plan(graph, "full"), get_mode("pytorch"), calibration=None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        saved, flops, grads = real_step(model)
    t = prof.totals
    assert (t.saved_activation_bytes, step_flops(prof), t.gradient_bytes) == (saved, flops, grads)


def test_check_agrees_under_amp_with_checkpointing():
    """``--check`` (its own real run at batch 2, under the same autocast) agrees."""
    prof = memplan.profile(
        C.ResCNN(reentrant=False), "full", input_shape=C.SHAPE[1:], batch=2, amp="bf16", check=True, calibration=None
    )
    assert prof.check["predicted"] == prof.check["observed"] and not prof.check["differing"]
    assert prof.extras["amp"] == "bf16" and "activation checkpointing" in prof.extras
