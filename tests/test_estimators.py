"""Contribution estimators (memplan.contrib.estimators) against independent computations.

The fisher and rgn estimators are checked on a network whose gradients have a closed form: a
1x1 conv on 1x1 inputs (a linear layer) -> eval-mode BatchNorm (an affine map, the conv's bias
carrier) -> linear classifier with softmax cross-entropy. The expected gradients are written out
by hand in numpy float64 (chain rule through the softmax, the classifier, the BN scale), never by
autograd or by memplan. The probe and grid estimators are checked for what they run; the whole
command on a tiny model end to end.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from memplan.contrib import load_profile, run_contrib
from memplan.contrib.data import Data
from memplan.contrib.estimators import ESTIMATORS, Env, probe_protocol
from memplan.contrib.protocol import Protocol, grid
from memplan.graph import conv_table
from memplan.graph.capture import capture_graph
from memplan.nn.lean import select_channels

torch.set_num_threads(1)

C, D, K, N, BS = 6, 5, 3, 40, 8  # input channels, conv outputs, classes, images, batch size


class LinearNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(C, D, 1, bias=False)
        self.bn = nn.BatchNorm2d(D)
        self.classifier = nn.Linear(D, K)

    def forward(self, x):
        return self.classifier(self.bn(self.conv(x)).flatten(1))


def setup(seed: int = 0):
    torch.manual_seed(seed)
    net = LinearNet()
    with torch.no_grad():
        net.bn.weight.uniform_(0.5, 1.5)
        net.bn.bias.normal_()
        net.bn.running_mean.normal_()
        net.bn.running_var.uniform_(0.5, 2.0)
    net.eval()
    x = torch.randn(N, C, 1, 1)
    y = torch.randint(0, K, (N,))
    data = Data("toy", "toy", x, y, x[:8], y[:8], K)
    graph = capture_graph(net, (1, C, 1, 1))
    layers = conv_table(graph)
    protocol = Protocol(batch_size=BS, ratios=(0.5, 1.0))
    env = Env(
        net=net,
        seen=data,
        layers=layers,
        specs=grid(layers, protocol),
        protocol=protocol,
        batches=3,
        context=None,  # the gradient estimators run nothing
        run_grid=None,
    )
    return env, net, x, y


def hand_gradients(net: LinearNet, x: torch.Tensor, y: torch.Tensor) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per batch of the estimator's draw (seed 0 permutation, batches of BS): (dL/dW_conv [D, C],
    dL/dbeta [D]) of the batch-mean cross-entropy, by the chain rule in float64."""
    W = net.conv.weight.detach().double().numpy()[:, :, 0, 0]
    gamma, beta = net.bn.weight.detach().double().numpy(), net.bn.bias.detach().double().numpy()
    mu, var = net.bn.running_mean.double().numpy(), net.bn.running_var.double().numpy()
    scale = gamma / np.sqrt(var + net.bn.eps)
    Wc, bc = net.classifier.weight.detach().double().numpy(), net.classifier.bias.detach().double().numpy()
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0)).numpy()
    out = []
    for b in range(3):
        idx = order[b * BS : (b + 1) * BS]
        xb = x.double().numpy()[idx, :, 0, 0]
        z = xb @ W.T
        h = (z - mu) * scale + beta
        logits = h @ Wc.T + bc
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        onehot = np.eye(K)[y.numpy()[idx]]
        d_logits = (p - onehot) / len(idx)
        d_h = d_logits @ Wc
        d_beta = d_h.sum(0)
        d_z = d_h * scale
        d_W = d_z.T @ xb
        out.append((d_W, d_beta))
    return out


def test_fisher_matches_the_hand_computed_fisher_of_a_linear_layer():
    env, net, x, y = setup()
    est = ESTIMATORS["fisher"].fn(env)
    grads = hand_gradients(net, x, y)
    bias_batches = [float((gb**2).sum()) for _, gb in grads]
    assert est.bias[1] == pytest.approx(np.mean(bias_batches), rel=1e-6)
    assert est.bias_se[1] == pytest.approx(np.std(bias_batches, ddof=1) / np.sqrt(3), rel=1e-6)
    per_channel = np.mean([(gw**2).sum(0) for gw, _ in grads], axis=0)  # [C]: summed over the conv's outputs
    assert est.channel_importance["conv"] == pytest.approx(per_channel.tolist(), rel=1e-6)
    half = select_channels(net.conv.weight, 1, 0.5, "magnitude+").numpy()
    assert est.weight["conv"][0.5] == pytest.approx(per_channel[half].sum(), rel=1e-6)
    assert est.weight["conv"][1.0] == pytest.approx(per_channel.sum(), rel=1e-6)


def test_rgn_matches_hand_computed_relative_gradient_norms():
    env, net, x, y = setup(1)
    est = ESTIMATORS["rgn"].fn(env)
    grads = hand_gradients(net, x, y)
    beta = net.bn.bias.detach().double().numpy()
    W = net.conv.weight.detach().double().numpy()
    assert est.bias[1] == pytest.approx(np.mean([np.linalg.norm(gb) / np.linalg.norm(beta) for _, gb in grads]))
    full = [np.linalg.norm(gw) / np.linalg.norm(W) for gw, _ in grads]
    assert est.weight["conv"][1.0] == pytest.approx(np.mean(full), rel=1e-6)
    half = select_channels(net.conv.weight, 1, 0.5, "magnitude+").numpy()
    part = [np.linalg.norm(gw[:, half]) / np.linalg.norm(W) for gw, _ in grads]
    assert est.weight["conv"][0.5] == pytest.approx(np.mean(part), rel=1e-6)


def test_gradient_estimators_leave_the_model_as_they_found_it():
    env, net, _, _ = setup()
    before = {n: (p.detach().clone(), p.requires_grad) for n, p in net.named_parameters()}
    net.classifier.weight.requires_grad_(False)
    flags = {n: p.requires_grad for n, p in net.named_parameters()}
    ESTIMATORS["fisher"].fn(env)
    for n, p in net.named_parameters():
        assert torch.equal(p, before[n][0]) and p.requires_grad == flags[n] and p.grad is None


def test_probe_runs_the_grid_shortened():
    env, _, _, _ = setup()
    seen = {}

    def context(data, protocol):
        seen["images"], seen["protocol"] = data.x_train.shape[0], protocol
        return "ctx"

    def run_grid(ctx, specs):
        seen["specs"] = specs
        raise StopIteration  # what ran is all this test asks

    env.context, env.run_grid = context, run_grid
    with pytest.raises(StopIteration):
        ESTIMATORS["probe"].fn(env)
    assert seen["images"] == min(N, env.batches * BS)
    assert seen["protocol"].epochs == 1 and seen["protocol"] == probe_protocol(env.protocol)
    assert seen["specs"] == env.specs


def test_fisher_profile_end_to_end_and_searchable(tmp_path: Path, capsys):
    from tests.test_contrib import make_npz, tiny_model

    npz = make_npz(tmp_path / "toy.npz")
    out = tmp_path / "fisher.json"
    prof = run_contrib(
        tiny_model(), data=str(npz), out=out, estimator="fisher", batches=2, validation=2, seeds=(0,), progress=True
    )
    # every step that can take long shows progress (issue 27: 21 s with no output)
    err = " ".join(capsys.readouterr().err.split())
    steps = ("done contrib: data, model, backbone weights", "done contrib: linear probe (20 epochs)", "mini-batches")
    for step in steps:
        assert step in err, err
    again = load_profile(out)
    assert again.estimator == "fisher" and "Fisher" in again.units and again.runs == []
    assert set(again.channel_importance) == {c.name for c in again.layers}
    assert again.bias == prof.bias and all(v >= 0 for v in again.bias.values())
    assert json.loads(out.read_text())["schema_version"] == 3


def test_search_consumes_an_estimate_in_its_own_units_and_ranks_channels_by_it(tmp_path: Path):
    from memplan.errors import MemplanError
    from memplan.search import run_search
    from tests.test_contrib import make_npz, tiny_model

    npz = make_npz(tmp_path / "toy.npz")
    out = tmp_path / "fisher.json"
    prof = run_contrib(tiny_model(), data=str(npz), out=out, estimator="fisher", batches=2, validation=2, seeds=(0,))
    kw = dict(profile_path=out, resolution=8, classes=3, objective="mean")
    r = run_search(tiny_model(), "1MB", **kw)
    assert r.summed_delta_acc is None and r.units == prof.units  # never called Δacc
    s = r.scheme
    assert s.summed_delta_acc is None and s.summed_estimate == pytest.approx(r.summed)
    assert s.provenance.estimator == "fisher"
    assert s.weight_updates, "a 1 MB budget on this model trains some weight"
    ranked = run_search(tiny_model(), "1MB", select="importance", **kw).scheme
    assert [(w.conv_index, w.ratio) for w in ranked.weight_updates] == [
        (w.conv_index, w.ratio) for w in s.weight_updates
    ]
    for w in ranked.weight_updates:
        scores = prof.channel_importance[w.layer]
        n = len(w.channels)
        best = sorted(range(len(scores)), key=lambda c: (-scores[c], c))[:n]  # top n, ties to the lower index
        assert w.select == "importance" and list(w.channels) == sorted(best)
        assert w.importance_source.startswith("fisher:")
    grid_like = prof.model_copy(update={"channel_importance": {}})
    with pytest.raises(MemplanError, match="per-channel importance"):
        run_search(tiny_model(), "1MB", profile=grid_like, resolution=8, classes=3, select="importance")
