"""The setups users prepare themselves (issue 38, items 1-2), on the setups corpus
(``tests/setups_corpus.py``, batch 4, 64 px): activation checkpointing in all its forms and hand
freezing (``--method as-is``).

Each number is checked against an independent measurement of one real CPU training step: saved
bytes against ``torch.autograd.graph.saved_tensors_hooks`` (unique storages, parameters and buffers
excluded; what a checkpointed segment's own hooks keep is not seen, exactly as torch keeps it),
FLOPs (forward + backward + the backward's recomputation) against ``FlopCounterMode`` over the whole
step (with the CPU flash-attention formulas, ``memplan.costs.observe.flop_counter``).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memplan
from memplan.accounting import engine
from memplan.accounting.engine import compute
from memplan.cli import main
from memplan.costs.observe import flop_counter
from memplan.graph.capture import StepRun, capture_graph
from memplan.modes import MODES, get_mode
from memplan.strategies import as_prepared, make_plan
from memplan.verify.calibrate import calibrate_graphs
from memplan.verify.measure import step_peak_bytes

from . import setups_corpus as C

torch.set_num_threads(1)
CORPUS = os.path.join(os.path.dirname(__file__), "setups_corpus.py")


def _setup(name: str) -> C.Setup:
    s = next(s for s in C.SETUPS if s.name == name)
    if s.name in C.MISSING:
        pytest.skip(f"{s.name}: {C.MISSING[s.name]}")
    return s


def _batch(shape=C.SHAPE):
    g = torch.Generator().manual_seed(1)
    return torch.randn(shape, generator=g), torch.randint(0, C.CLASSES, (shape[0],), generator=g)


def real_step(model: nn.Module, shape=C.SHAPE) -> tuple[int, int, int]:
    """(saved bytes, FLOPs, gradient bytes) of one real CPU training step of ``model`` as prepared:
    the forward + loss under saved_tensors_hooks (unique storages, parameters and buffers left out),
    the whole step under FlopCounterMode, the parameter gradients it leaves."""
    x, y = _batch(shape)
    own = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}
    kept: list[torch.Tensor] = []  # alive while counting: storage identities are never reused

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        if key not in own:
            seen.setdefault(key, t.untyped_storage().nbytes())
            kept.append(t)
        return t

    model.zero_grad(set_to_none=True)
    with flop_counter() as fc:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
    grads = sum(p.grad.nbytes for p in model.parameters() if p.grad is not None)
    return sum(seen.values()), fc.get_total_flops(), grads


def predicted(model: nn.Module, method: str, mode: str = "pytorch", shape=C.SHAPE):
    graph = capture_graph(model, shape, step=StepRun(own_modes=as_prepared(method)))
    return compute(graph, make_plan(graph, method), get_mode(mode), calibration=None)


def step_flops(prof) -> int:
    t = prof.totals
    return t.forward_flops + t.backward_grad_input_flops + t.backward_grad_weight_flops + t.recompute_flops


@pytest.mark.parametrize("name", [s.name for s in C.SETUPS])
def test_saved_bytes_flops_and_gradients_are_exact(name):
    s = _setup(name)
    model = s.build()
    prof = predicted(model, s.method)
    saved, flops, grads = real_step(model)
    t = prof.totals
    assert (t.saved_activation_bytes, step_flops(prof), t.gradient_bytes) == (saved, flops, grads)
    assert not prof.unknown_ops
    checkpointed = "checkpoint" in name or "segments" in name  # hf-vit-eval: HF checkpoints in train mode only
    assert (t.recompute_flops > 0) == checkpointed
    assert ("activation checkpointing" in prof.extras) == checkpointed


def test_checkpointing_is_what_cuts_the_memory():
    """The same ResCNN without checkpointing saves more; memplan says so too (both measured)."""
    plain, ckpt = C.ResCNN(), C.ResCNN(reentrant=False)
    ckpt.load_state_dict(plain.state_dict())
    assert real_step(plain)[0] == predicted(plain, "full").totals.saved_activation_bytes
    assert real_step(ckpt)[0] < real_step(plain)[0] / 3


@pytest.mark.parametrize(
    "name", ["rescnn-checkpoint", "hf-vit-gradient-checkpointing", "hand-frozen-first-half", "hf-vit-eval-as-is"]
)
def test_self_check_agrees(name):
    """``--check`` (a real run under saved_tensors_hooks at batch 2) agrees, module by module."""
    s = _setup(name)
    prof = memplan.profile(s.build(), method=s.method, input_shape=C.SHAPE[1:], batch=2, check=True)
    assert prof.check["predicted"] == prof.check["observed"] and not prof.check["differing"]


@pytest.mark.parametrize(
    "name,at_recompute",
    [("rescnn-checkpoint", True), ("rescnn-checkpoint-reentrant", True), ("sequential-4-segments", False)],
)
def test_peak_includes_the_recomputation(name, at_recompute, monkeypatch):
    """The simulated step's peak (kernel workspaces calibrated on this machine) is within 5% of one
    real step's allocation replay. Where the peak is in a recomputed segment's backward, without what
    the backward recomputes it would not be (``checkpoint_sequential`` does not checkpoint its last
    segment, where its peak is)."""
    model = _setup(name).build()
    graph = capture_graph(model, C.SHAPE)
    plan = make_plan(graph, "full")
    calibrate_graphs([(graph, plan)])
    x, y = _batch()
    resident = (
        sum(
            {
                t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in [*model.parameters(), *model.buffers()]
            }.values()
        )
        + x.nbytes
        + y.nbytes
    )
    model.zero_grad(set_to_none=True)
    measured = step_peak_bytes(model, x, y)
    with_recompute = compute(graph, plan, get_mode("pytorch")).totals.peak_bytes - resident
    real_recompute = engine.recompute

    def forward_only(*args):
        rc = real_recompute(*args)
        rc.again = []
        return rc

    monkeypatch.setattr(engine, "recompute", forward_only)
    without = compute(graph, plan, get_mode("pytorch")).totals.peak_bytes - resident
    assert abs(with_recompute - measured) <= 0.05 * measured
    assert without < 0.9 * measured if at_recompute else without == with_recompute


def test_reentrant_checkpoint_without_an_input_needing_a_gradient():
    """torch runs such a segment under no_grad: nothing saved, its parameters get no gradient.
    memplan counts that (gradients measured) and says so."""
    model = C.StemCheckpointed()
    prof = predicted(model, "full")
    saved, flops, grads = real_step(model)
    assert (prof.totals.saved_activation_bytes, step_flops(prof), prof.totals.gradient_bytes) == (saved, flops, grads)
    assert all(p.grad is None for p in model.stem.parameters())
    assert "no gradient reaches the parameters of stem" in prof.extras["activation checkpointing"]


def test_nested_checkpoints():
    model = C.Nested()
    prof = predicted(model, "full")
    saved, flops, grads = real_step(model)
    assert (prof.totals.saved_activation_bytes, step_flops(prof), prof.totals.gradient_bytes) == (saved, flops, grads)


def test_selective_checkpointing_is_flagged_with_its_upper_bound():
    """A ``context_fn`` (selective checkpointing) is not modelled: counted as not checkpointed, an
    upper bound of what it saves, and reported as not exact by default (no --check needed)."""
    model = C.Selective()
    prof = predicted(model, "full")
    saved, _, _ = real_step(model)
    assert any("context_fn" in k for k in prof.unknown_ops)
    assert prof.totals.saved_activation_bytes >= saved
    plain = C.ResCNN()
    assert prof.totals.saved_activation_bytes == predicted(plain, "full").totals.saved_activation_bytes


def test_as_is_is_the_model_as_prepared():
    """Trainable parameters and norm modes are the model's own; every mode costs it."""
    model = C.hand_frozen()
    graph = capture_graph(model, C.SHAPE)
    plan = make_plan(graph, "as-is")
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    for name, mode in MODES.items():
        prof = compute(graph, plan, mode, calibration=None)
        assert prof.totals.trainable_params == trainable, name
        assert prof.totals.total_bytes > 0, name
    eval_norms = {q for q, m in model.named_modules() if isinstance(m, nn.BatchNorm2d) and not m.training}
    assert eval_norms and not eval_norms & plan.norm_train
    assert model.blocks[0].a[0].weight.requires_grad is False  # capture leaves the model as it was
    assert not model.stem.training


def test_compare_puts_as_is_beside_the_strategies():
    profiles = memplan.compare(C.hand_frozen(), input_shape=C.SHAPE[1:], batch=4)
    assert profiles[0].method == "as-is" and {"full", "last"} <= {p.method for p in profiles}
    plain = memplan.compare(C.ResCNN(), input_shape=C.SHAPE[1:], batch=4)
    assert "as-is" not in {p.method for p in plain}  # prepared as full training: nothing to add


def test_cli_profiles_a_model_as_prepared(capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            ["profile", f"{CORPUS}:hand_frozen", "--method", "as-is", "--input-shape", "3,64,64", "--batch", "4"]
            + ["--json", "-"]
        )
    out = capsys.readouterr().out
    assert exc.value.code == 0
    data = json.loads(out)
    saved, _, _ = real_step(C.hand_frozen())
    assert data["method"] == "as-is" and data["totals"]["saved_activation_bytes"] == saved
