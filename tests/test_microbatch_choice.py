"""Micro-batching as an execution choice (issue 38, item 6): ``Plan.micro_batches`` /
``Scheme.execution.micro_batches``, realised by ``memplan.train.fit`` / ``fit_scheme`` (gradient
accumulation). On the zoo's EfficientNet-Lite0 with its norms frozen (eval mode), a real training
step in float64:

* the gradients accumulated over micro-batches equal those of the whole batch (summation order
  differs, so to a tight tolerance), and so do the parameters after ``fit_scheme``'s step;
* the saved activations of one micro-batch, measured with ``saved_tensors_hooks`` (unique
  storages), equal ``compute()``'s prediction for the scheme;
* ``memplan verify`` confirms the saving on a real step (one micro-batch and the whole batch at
  once, each measured);
* a scheme records the count (schema version 5); a count that does not divide the batch, or one
  where a norm normalises with its batch's statistics, is refused in one line.

The head's dropout is put in eval mode where gradients are compared: its masks are random draws,
which no split of the batch reproduces.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import torch

import memplan
from memplan.accounting.engine import compute
from memplan.api import capture
from memplan.apply import apply_scheme
from memplan.cli import main
from memplan.errors import BadOption, SchemeError
from memplan.modes import get_mode
from memplan.plan import Scheme, Training, load_scheme, scheme_from_dict, scheme_to_plan
from memplan.strategies import make_plan
from memplan.train import fit, fit_scheme, make_optimizer
from memplan.verify import verify
from memplan.verify.measure import saved_bytes

from .helpers import real_model

torch.set_num_threads(1)
SHAPE = (3, 32, 32)
BATCH, MICRO = 8, 4


@pytest.fixture(scope="module")
def lite0():
    """The model, its graph at one micro-batch, and a scheme training the last blocks with frozen norms
    in ``MICRO`` micro-batches."""
    model = real_model("efficientnet-lite0")
    graph = capture(copy.deepcopy(model), batch=BATCH // MICRO, input_shape=SHAPE).graph
    plan = replace(make_plan(graph, "lastk"), norm_train=set(), micro_batches=MICRO)
    assert not plan.batch_statistic_norms(graph)
    training = Training(optimizer="sgd", lr=0.1, epochs=1, batch_size=BATCH)
    scheme = Scheme.from_plan(graph, plan, mode="applied", batch=BATCH, training=training)
    return model, graph, scheme


def _data(n: int = BATCH):
    g = torch.Generator().manual_seed(1)
    return torch.randn((n, *SHAPE), generator=g, dtype=torch.float64), torch.randint(0, 10, (n,), generator=g)


def _applied(model, scheme):
    m = apply_scheme(copy.deepcopy(model), scheme).double()
    m.get_submodule("_dropout").eval()
    return m


def test_scheme_records_micro_batches(lite0, tmp_path):
    _, graph, scheme = lite0
    assert scheme.execution.micro_batches == MICRO and scheme.execution.recompute == []
    scheme.save(tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text())
    assert data["schema_version"] == 5 and data["execution"]["micro_batches"] == MICRO
    assert scheme_to_plan(graph, load_scheme(tmp_path / "s.json")).micro_batches == MICRO
    with pytest.raises(SchemeError, match="micro_batches 4 does not divide batch 6"):
        scheme_from_dict({**data, "batch": 6})
    with pytest.raises(SchemeError, match="changes what the model computes") as info:
        scheme_to_plan(graph, scheme.model_copy(update={"norm_modes": {"_bn0": "train"}}))
    assert "\n" not in str(info.value)


def test_accumulated_gradients_equal_the_whole_batch(lite0):
    model, _, scheme = lite0
    x, y = _data()
    grads = []
    for micro in (1, MICRO):
        m = _applied(model, scheme)
        opt = torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.0)
        losses = fit(m, opt, x, y, steps=1, micro_batches=micro)
        grads.append(({n: p.grad for n, p in m.named_parameters() if p.grad is not None}, losses[0]))
    (whole, loss), (accumulated, loss_m) = grads
    assert whole.keys() == accumulated.keys() and len(whole) > 20
    assert loss_m == pytest.approx(loss, rel=1e-12)
    for name, g in whole.items():
        assert torch.allclose(accumulated[name], g, rtol=1e-9, atol=1e-12), name
        assert g.abs().sum() > 0


def test_fit_scheme_steps_as_the_whole_batch(lite0):
    model, _, scheme = lite0
    x, y = _data()
    whole = scheme.model_copy(update={"execution": None})
    after, calls = [], []
    for s in (whole, scheme):
        m = _applied(model, s)
        calls.append([])
        m.register_forward_pre_hook(lambda _, args, seen=calls[-1]: seen.append(args[0].shape[0]))
        fit_scheme(m, s, x, y)
        after.append(dict(m.named_parameters()))
    assert calls == [[BATCH], [BATCH // MICRO] * MICRO]  # one step, as MICRO micro-batches
    moved = 0
    for name, p in after[0].items():
        assert torch.allclose(after[1][name], p, rtol=1e-9, atol=1e-12), name
        moved += not torch.equal(p, model.get_parameter(name).double())
    assert moved > 20
    with pytest.raises(BadOption, match="micro_batches must be a positive integer"):
        fit(model, make_optimizer(model, "sgd", 0.1), x.float(), y, steps=1, micro_batches=0)


def test_one_micro_batch_of_activations_measured(lite0, tmp_path):
    """compute() of the scheme's plan, and ``memplan.profile`` of its file at the whole batch (which
    reads the count the scheme records), predict one micro-batch's saved activations as measured."""
    model, graph, scheme = lite0
    m = apply_scheme(copy.deepcopy(model), scheme)
    predicted = compute(graph, scheme_to_plan(graph, scheme), get_mode("applied")).totals
    x, y = _data(BATCH // MICRO)
    measured = saved_bytes(m, x.float(), y).bytes
    assert measured == predicted.saved_activation_bytes
    scheme.save(tmp_path / "s.json")
    prof = memplan.profile(copy.deepcopy(model), "sparse", scheme=str(tmp_path / "s.json"), batch=BATCH, mode="applied")
    assert prof.totals.saved_activation_bytes == measured and prof.extras["micro_batch"]["micro_batches"] == MICRO
    with pytest.raises(BadOption, match="which do not divide --batch 6"):
        memplan.profile(copy.deepcopy(model), "sparse", scheme=str(tmp_path / "s.json"), batch=6, mode="applied")


def test_verify_confirms_the_saving(lite0, tmp_path, capsys):
    """``memplan verify`` of a scheme in micro-batches: in both setups the measured saved bytes of one
    micro-batch and of the whole batch at once are the predicted ones, so is the saving; the CLI
    says so, and refuses a batch the micro-batches do not divide in one line."""
    model, _, scheme = lite0
    path = tmp_path / "micro.json"
    scheme.save(path)
    report = verify(model, "sparse", batch=BATCH, scheme=str(path), steps=1)
    assert report.ok
    for r in (report.pytorch, report.applied):
        predicted, measured = r.whole_batch
        assert (predicted, measured - r.measured_saved) == (measured, predicted - r.predicted_saved)
        assert measured > 2 * r.measured_saved
    with pytest.raises(BadOption, match="do not divide --batch 6"):
        verify(model, "sparse", batch=6, scheme=str(path), steps=1)
    with pytest.raises(SystemExit) as exc:
        main(["verify", "efficientnet-lite0", "--method", "sparse", "-o", f"scheme={path}", "-b", "8", "--steps", "1"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "saved by micro-batching" in out and "ok" in out
