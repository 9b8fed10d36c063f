"""Norm statistics re-estimated on the target data (norm mode ``reestimate``, issue 26).

The re-estimation (``memplan.train.reestimate_norm_stats``) is compared with the batch statistics
of the data computed by hand (torch's ``momentum=None`` cumulative average: the plain average over
the batches of each batch's mean and unbiased variance, every other module in eval mode); the
scheme's costs with the ``affine`` mode's in every accounting mode; and the contribution runner
re-estimates, then re-fits the linear-probe head, exactly as the two functions do on their own."""

import copy

import pytest
import torch
import torch.nn as nn

from memplan.api import capture, profile_captured
from memplan.apply import apply_scheme
from memplan.contrib.data.core import Data
from memplan.contrib.protocol import Protocol
from memplan.contrib.runner import Context, Worker, first_trained, linear_probe
from memplan.errors import MemplanError, SchemeError
from memplan.modes.base import MODES
from memplan.nn.train import batches_of, reestimate_norm_stats
from memplan.plan import Scheme, scheme_to_plan
from memplan.search.baselines import BASELINES

from .test_baseline_schemes import trained_state
from .test_contrib import tiny_model

torch.set_num_threads(1)


def net() -> nn.Sequential:
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.Dropout(0.5),  # off during the re-estimation: the hand computation has no dropout
        nn.Conv2d(4, 5, 1),
        nn.BatchNorm2d(5),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(5, 2),
    )
    with torch.no_grad():
        for bn in (m[1], m[5]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.5, 0.5)
    return m


def by_hand(m: nn.Sequential, chunks: list[torch.Tensor], first_in_eval: bool = False) -> list[tuple]:
    """(mean, unbiased var) of each BN's input, averaged over the chunks; BN 1 normalises with the
    chunk's statistics (train mode) or, ``first_in_eval``, with its running statistics."""
    stats: list[list[tuple]] = [[], []]
    for x in chunks:
        h1 = m[0](x)
        stats[0].append((h1.mean((0, 2, 3)), h1.var((0, 2, 3), unbiased=True)))
        if first_in_eval:
            mean, var = m[1].running_mean, m[1].running_var
        else:
            mean, var = h1.mean((0, 2, 3)), h1.var((0, 2, 3), unbiased=False)
        y1 = (h1 - mean[:, None, None]) / torch.sqrt(var[:, None, None] + m[1].eps)
        y1 = torch.relu(y1 * m[1].weight[:, None, None] + m[1].bias[:, None, None])
        h2 = m[4](y1)
        stats[1].append((h2.mean((0, 2, 3)), h2.var((0, 2, 3), unbiased=True)))
    return [(torch.stack([s[0] for s in bn]).mean(0), torch.stack([s[1] for s in bn]).mean(0)) for bn in stats]


def test_reestimate_is_the_average_of_the_batch_statistics():
    m = net().train()
    x = torch.randn(30, 3, 6, 6) * 2 + 0.5
    chunks = list(batches_of(x, 10))
    with torch.no_grad():
        expected = by_hand(copy.deepcopy(m), chunks)
    out = reestimate_norm_stats(m, batches_of(x, 10))
    assert out is m and all(mod.training for mod in m.modules())  # flags as they were
    assert m[1].momentum == m[5].momentum == 0.1 and int(m[1].num_batches_tracked) == 3
    for bn, (mean, var) in zip((m[1], m[5]), expected):
        torch.testing.assert_close(bn.running_mean, mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bn.running_var, var, rtol=1e-5, atol=1e-6)
    # equal chunks: the mean is the data's own (the variance is the chunks' mean variance)
    torch.testing.assert_close(m[1].running_mean, m[0](x).mean((0, 2, 3)), rtol=1e-5, atol=1e-6)


def test_reestimate_named_norms_only_the_others_in_eval_mode():
    m = net().eval()
    before = m[1].running_mean.clone()
    x = torch.randn(16, 3, 6, 6)
    with torch.no_grad():
        expected = by_hand(copy.deepcopy(m), list(batches_of(x, 8)), first_in_eval=True)[1]
    reestimate_norm_stats(m, [(c,) for c in batches_of(x, 8)], ["5"])  # the forward's arguments
    assert torch.equal(m[1].running_mean, before) and not any(mod.training for mod in m.modules())
    torch.testing.assert_close(m[5].running_var, expected[1], rtol=1e-5, atol=1e-6)
    with pytest.raises(MemplanError, match="'2' is a ReLU, not a BatchNorm"):
        reestimate_norm_stats(m, [x], ["2"])
    with pytest.raises(MemplanError, match="no module 'nope'"):
        reestimate_norm_stats(m, [x], ["nope"])
    with pytest.raises(MemplanError, match="at least one batch"):
        reestimate_norm_stats(m, [])


@pytest.mark.parametrize("model,res", [("mcunet-5fps", 48), ("efficientnet-lite0", 32)])
def test_reestimated_scheme_costs_affine_in_every_mode(model, res):
    cap = capture(model, resolution=res, batch=2)
    running = BASELINES.choose("norm + bias, running statistics").plan(cap.graph)
    plan = BASELINES.choose("norm + bias, re-estimated statistics").plan(cap.graph)
    scheme, affine = Scheme.from_plan(cap.graph, plan), Scheme.from_plan(cap.graph, running)
    assert set(scheme.norm_modes.values()) == {"reestimate"} and set(affine.norm_modes.values()) == {"affine"}
    assert scheme_to_plan(cap.graph, scheme).reestimate == plan.reestimate != set()
    for mode in MODES:
        a = profile_captured(cap, "sparse", mode=mode, optimizer="adam", scheme=scheme).totals
        b = profile_captured(cap, "sparse", mode=mode, optimizer="adam", scheme=affine).totals
        assert (a.total_bytes, a.peak_bytes, a.saved_activation_bytes) == (
            b.total_bytes,
            b.peak_bytes,
            b.saved_activation_bytes,
        ), mode
    # applied, it trains what affine trains, norms in eval mode (the statistics are the runner's job)
    x, y = copy.deepcopy(cap.model), copy.deepcopy(cap.model)
    assert trained_state(apply_scheme(x, scheme)) == trained_state(apply_scheme(y, affine))


def test_reestimate_needs_running_statistics():
    cap = capture("mcunet-5fps", resolution=48, norm="group")
    plan = BASELINES.choose("norm + bias, re-estimated statistics").plan(cap.graph)
    assert not plan.reestimate  # GroupNorm keeps none: the baseline is the affine one there
    scheme = Scheme.from_plan(cap.graph, plan)
    norm = next(iter(scheme.norm_modes))
    bad = scheme.model_copy(update={"norm_modes": {**scheme.norm_modes, norm: "reestimate"}})
    with pytest.raises(SchemeError, match="groupnorm without running statistics"):
        scheme_to_plan(cap.graph, bad)


def test_worker_reestimates_then_refits_the_probe_head():
    torch.manual_seed(0)
    x, y = torch.randn(24, 3, 8, 8), torch.arange(24) % 3
    data = Data("t", "tiny", x, y, x[:12], y[:12], 3)
    proto = Protocol(seeds=(0,), epochs=1, batch_size=8, probe_epochs=2)
    model = tiny_model()
    linear_probe(model, "classifier", data, proto)
    worker = Worker(Context("tiny", model, data, proto, cache=True))
    plan = BASELINES.choose("norm + bias, re-estimated statistics").plan(worker.graph)
    assert plan.reestimate == {"stem.1", "a.1", "b.1", "c.1"}
    assert first_trained(worker.graph, plan) == "stem.1"
    rec = worker.train_plan(lambda g: plan, first_trained(worker.graph, plan), proto)
    assert len(rec["accuracy"]) == 1
    # the same two steps by hand on a copy of the worker's model
    ref = copy.deepcopy(worker.model)
    reestimate_norm_stats(ref, batches_of(worker.x_train, 8), sorted(plan.reestimate))
    linear_probe(ref, "classifier", data, proto)
    kept = worker.refits[tuple(sorted(plan.reestimate))]
    for name, t in {**dict(ref.named_parameters()), **dict(ref.named_buffers())}.items():
        if name.startswith(("classifier.", "stem.1.", "c.1.")):
            torch.testing.assert_close(kept[name], t, rtol=1e-5, atol=1e-6)
    assert not torch.equal(kept["classifier.weight"], worker.model.classifier.weight)  # re-fit
    assert not torch.equal(kept["c.1.running_mean"], worker.model.c[1].running_mean)  # re-estimated
    again = worker.train_plan(lambda g: plan, first_trained(worker.graph, plan), proto)
    assert again["accuracy"] == rec["accuracy"]  # the stored refit gives the same run
