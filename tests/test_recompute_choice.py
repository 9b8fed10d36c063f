"""Recomputed segments as an execution choice (issue 38, item 6): ``Plan.recompute`` /
``memplan.graph.execution.with_recompute`` in the accounting, ``memplan.nn.recompute`` on the real
model. On the zoo's EfficientNet-Lite0 (a real training step on the CPU):

* the gradients, the loss and the running statistics are bit-identical with and without the
  recomputed segments (same seed, so dropout draws the same mask);
* the saved activations measured with ``saved_tensors_hooks`` (unique storages) equal the
  prediction, with and without the segments, plain PyTorch (``pytorch`` mode) and memplan-applied
  (``applied`` mode);
* the recomputed FLOPs equal ``FlopCounterMode``'s count of a real step minus the step without;
* a scheme records them (schema version 5; without them still version 4), ``apply_scheme``
  realises them; ``memplan verify`` confirms the saving on a real step;
* bad segments are refused in one line.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import memplan
from memplan.accounting.engine import compute
from memplan.api import capture
from memplan.apply import apply_plain, apply_plan, apply_scheme
from memplan.cli import main
from memplan.errors import MemplanError, SchemeError
from memplan.graph.execution import with_recompute
from memplan.modes import get_mode
from memplan.nn.recompute import SEGMENT_ATTR, recompute_segments, restore_segments
from memplan.plan import Execution, Scheme, load_scheme, scheme_from_dict, scheme_to_plan
from memplan.strategies import make_plan
from memplan.verify import verify
from memplan.verify.measure import saved_bytes

from .helpers import real_model

torch.set_num_threads(1)
SHAPE = (2, 3, 32, 32)
SEGMENTS = (("_blocks.0", "_blocks.1"), ("_blocks.3",), ("_blocks.5", "_blocks.6", "_blocks.7"))


@pytest.fixture(scope="module")
def lite0():
    model = real_model("efficientnet-lite0")
    return model, capture(copy.deepcopy(model), batch=SHAPE[0], input_shape=SHAPE[1:]).graph


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(SHAPE, generator=g), torch.randint(0, 10, (SHAPE[0],), generator=g)


def _step(model, x, y):
    """Loss, the gradients and the buffers after one forward + backward (dropout seeded)."""
    torch.manual_seed(7)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, {n: b.clone() for n, b in model.named_buffers()}


@pytest.mark.parametrize("method", ["full", "mobiletl"])
def test_same_gradients(lite0, method):
    model, graph = lite0
    plan = make_plan(graph, method)
    runs = []
    for segments in ((), SEGMENTS):
        m = copy.deepcopy(model)
        apply_plain(m, graph, plan)
        recompute_segments(m, segments)
        runs.append(_step(m, *_batch()))
    (loss0, grads0, bufs0), (loss1, grads1, bufs1) = runs
    assert torch.equal(loss0, loss1)
    assert grads0.keys() == grads1.keys() and grads0
    assert all(torch.equal(grads0[n], grads1[n]) for n in grads0)
    assert all(torch.equal(bufs0[n], bufs1[n]) for n in bufs0)  # running statistics updated once


# plain flags (apply_plain) express a sparse plan's frozen norm scales only as the applied setup
# does, so the pytorch setup is checked on full fine-tuning, the applied one on every plan
@pytest.mark.parametrize(
    ("method", "mode"), [("full", "pytorch"), ("full", "applied"), ("bias", "applied"), ("mobiletl", "applied")]
)
def test_saved_bytes_measured(lite0, method, mode):
    model, graph = lite0
    x, y = _batch()
    measured, predicted = [], []
    for segments in ((), SEGMENTS):
        plan = replace(make_plan(graph, method), recompute=segments)
        m = copy.deepcopy(model)
        if mode == "pytorch":
            recompute_segments(apply_plain(m, graph, plan), segments)
        else:
            apply_plan(m, plan, capture(m, batch=SHAPE[0], input_shape=SHAPE[1:]).graph)
        measured.append(saved_bytes(m, x, y).bytes)
        predicted.append(compute(graph, plan, get_mode(mode)).totals.saved_activation_bytes)
    assert measured == predicted
    if method == "full":
        assert measured[1] < measured[0]


def test_recomputed_flops(lite0):
    model, graph = lite0
    plan = make_plan(graph, "full")
    counted = []
    for segments in ((), SEGMENTS):
        m = copy.deepcopy(model)
        recompute_segments(apply_plain(m, graph, plan), segments)
        x, y = _batch()
        with FlopCounterMode(display=False) as fc:
            F.cross_entropy(m(x), y).backward()
        counted.append(fc.get_total_flops())
    totals = compute(graph, replace(plan, recompute=SEGMENTS), get_mode("pytorch")).totals
    assert totals.recompute_flops > 0
    assert counted[1] - counted[0] == totals.recompute_flops


def test_restore_and_names(lite0):
    model, graph = lite0
    m = recompute_segments(copy.deepcopy(model), SEGMENTS)
    assert m.state_dict().keys() == model.state_dict().keys()
    twin = copy.deepcopy(m)  # its segments run its own blocks
    first = twin.get_submodule("_blocks.0")
    assert first.forward.__self__ is first and twin.get_submodule("_blocks.1") in first.__dict__[SEGMENT_ATTR][1]
    m.eval(), twin.eval()
    x, _ = _batch()
    assert torch.equal(m(x), twin(x)) and torch.equal(m(x), copy.deepcopy(model).eval()(x))
    restore_segments(m)
    assert all("forward" not in b.__dict__ for b in m.modules())


def test_refused(lite0):
    model, graph = lite0
    with pytest.raises(MemplanError, match="no block"):
        with_recompute(graph, [["features.9"]])
    with pytest.raises(MemplanError, match="consecutive"):
        with_recompute(graph, [["_blocks.0", "_blocks.2"]])
    with pytest.raises(MemplanError, match="two segments"):
        with_recompute(graph, [["_blocks.0"], ["_blocks.0", "_blocks.1"]])
    with pytest.raises(MemplanError, match="consecutive children"):
        recompute_segments(copy.deepcopy(model), [["_blocks.0", "_blocks.2"]])


def test_scheme_records_execution(lite0, tmp_path):
    model, graph = lite0
    plan = replace(make_plan(graph, "mobiletl"), recompute=SEGMENTS)
    scheme = Scheme.from_plan(graph, plan, mode="applied")
    assert scheme.execution.recompute == [list(s) for s in SEGMENTS]
    scheme.save(tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["schema_version"] == 5 and data["execution"]["recompute"][0] == ["_blocks.0", "_blocks.1"]
    loaded = load_scheme(tmp_path / "s.json")
    assert scheme_to_plan(graph, loaded).recompute == SEGMENTS
    # without execution choices: a version 4 document, as before
    plain = Scheme.from_plan(graph, make_plan(graph, "mobiletl"), mode="applied")
    plain.save(tmp_path / "p.json")
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["schema_version"] == 4 and "execution" not in data
    assert scheme_to_plan(graph, load_scheme(tmp_path / "p.json")).recompute == ()
    # an older version with the new field, and a segment that is no run of blocks, are refused
    with pytest.raises(SchemeError, match="schema_version 5"):
        scheme_from_dict({**data, "execution": {"recompute": [["_blocks.0"]]}})
    bad = scheme.model_copy(update={"execution": Execution(recompute=[["_blocks.0", "_blocks.4"]])})
    with pytest.raises(SchemeError, match="consecutive"):
        scheme_to_plan(graph, bad)


def test_apply_scheme_realises_execution(lite0, tmp_path):
    """``apply_scheme`` runs the segments; ``memplan.profile`` of the scheme file predicts what the
    applied model's real step saves."""
    model, graph = lite0
    scheme = Scheme.from_plan(graph, replace(make_plan(graph, "bias"), recompute=SEGMENTS), mode="applied")
    scheme.save(tmp_path / "s.json")
    applied = apply_scheme(copy.deepcopy(model), load_scheme(tmp_path / "s.json"), None)
    assert "forward" in applied.get_submodule("_blocks.0").__dict__
    assert "forward" not in applied.get_submodule("_blocks.2").__dict__
    prof = memplan.profile(
        copy.deepcopy(model),
        method="sparse",
        scheme=str(tmp_path / "s.json"),
        input_shape=SHAPE[1:],
        batch=SHAPE[0],
        mode="applied",
    )
    assert prof.totals.recompute_flops > 0
    assert saved_bytes(applied, *_batch()).bytes == prof.totals.saved_activation_bytes


def test_verify_confirms_the_saving(lite0, tmp_path, capsys):
    """``memplan verify`` of a scheme with recomputed segments: in both setups the measured saved
    bytes, with and without the segments, are the predicted ones, so is the saving; the CLI says so."""
    model, graph = lite0
    path = tmp_path / "full.json"
    Scheme.from_plan(graph, replace(make_plan(graph, "full"), recompute=SEGMENTS), mode="applied").save(path)
    report = verify(model, "sparse", batch=SHAPE[0], scheme=str(path), steps=1)
    assert report.ok
    for r in (report.pytorch, report.applied):
        predicted, measured = r.without_recompute
        assert (predicted, measured - r.measured_saved) == (measured, predicted - r.predicted_saved)
        assert measured > r.measured_saved
    with pytest.raises(SystemExit) as exc:
        main(["verify", "efficientnet-lite0", "--method", "sparse", "-o", f"scheme={path}", "-b", "2", "--steps", "1"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "saved by recomputation" in out and "ok" in out
