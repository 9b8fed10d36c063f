"""The transformer corpus (tests/transformers_corpus.py): ViTs, windowed / hierarchical
transformers and hybrids from Hugging Face ``transformers``, built from configs (no download).

For each model x full / bias / norm / last at two resolutions, batch 2:

1. ``pytorch``-mode saved bytes == ``saved_tensors_hooks`` on a real CPU forward + loss (the
   independent measurement, ``memplan.verify.measure.saved_bytes``), byte-exact;
2. forward / backward FLOPs == FlopCounterMode (with torch's SDPA formulas for the CPU flash kernel,
   which FlopCounterMode counts as 0, and the group-aware convolution backward);
3. ``memplan.check`` (``--check``: a real CPU run of the model) agrees;
4. after ``memplan.apply_strategy`` on a copy (the CNN corpus's checks, ``tests/corpus.check_pair``):
   eval outputs bit-identical (``torch.equal``) to plain PyTorch's under the same plan, the
   train-mode loss identical and gradients close to plain autograd's, and the ``applied`` mode's
   prediction == saved_tensors_hooks on the applied model. Modules without a lean version
   (LayerNorm, GELU, attention) are left as they are.

A capture failure fails. By default one model per group at the first resolution runs; the whole
corpus runs with ``pytest -m slow`` (benchmarks/transformers_corpus.py records its results).
Also here: the SDPA rules against saved_tensors_hooks over the kernel's cases (flash and math
fallback, masks, dropout, which inputs need a gradient), a check that fails when a rule is wrong,
and capture of a model that reads a module-level cache.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memplan
from memplan.accounting.engine import compute
from memplan.apply import apply_plain
from memplan.check import check
from memplan.costs.observe import flop_counter
from memplan.graph.capture import capture_graph
from memplan.modes import get_mode
from memplan.strategies import make_plan
from memplan.verify.measure import model_modules, saved_bytes

from . import corpus, transformers_corpus as tc

STRATEGIES = ("full", "bias", "norm", "last")
pytestmark = pytest.mark.skipif(bool(tc.MISSING), reason=f"transformers missing: {tc.MISSING}")


def measured_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    with flop_counter() as fwd:
        loss = F.cross_entropy(model(x), y)
    with flop_counter() as bwd:
        if loss.requires_grad:
            loss.backward()
    model.zero_grad(set_to_none=True)
    return fwd.get_total_flops(), bwd.get_total_flops()


def pair_problems(r: corpus.PairResult, where: str) -> list[str]:
    """What is off in one checked pair (empty: exact). Apply-stage problems read ``apply: ...``."""
    problems = []
    if not r.bytes_exact:
        problems.append(f"{where}: predicted {r.predicted_bytes} B, measured {r.measured_bytes} B")
    if not r.flops_exact:
        problems.append(
            f"{where}: FLOPs predicted {r.predicted_fwd_flops} / {r.predicted_bwd_flops}, "
            f"measured {r.measured_fwd_flops} / {r.measured_bwd_flops}"
        )
    if r.check_differing or r.check_observed != r.measured_bytes or "check" in r.errors:
        problems.append(
            f"{where}: --check observed {r.check_observed}, measured {r.measured_bytes}: "
            f"{r.check_differing[:2] or r.errors.get('check')}"
        )
    if r.eval_identical is None and r.applied_predicted is None and not r.errors:
        return problems  # apply checks not asked for
    apply = []
    if not r.eval_identical:
        apply.append(f"eval outputs changed (max |diff| {r.eval_max_diff})")
    if not r.loss_identical:
        apply.append("train-mode loss differs from plain autograd's")
    if not r.grads_close:
        apply.append(f"gradients differ: {r.grad_mismatch}")
    if not r.applied_exact:
        apply.append(f"applied mode predicts {r.applied_predicted} B, measured {r.applied_measured} B")
    apply += [f"{stage}: {err}" for stage, err in r.errors.items() if stage != "check"]
    return problems + [f"{where}: apply: {p}" for p in apply]


def check_model(
    entry: tc.TEntry, resolution: int, methods=STRATEGIES, *, apply: bool = True, results: list | None = None
) -> list[str]:
    """Problems found on ``entry`` at ``resolution`` (empty: every pair exact). Per strategy
    (``tests/corpus.check_pair``, the CNN corpus's checks): ``pytorch``-mode saved bytes ==
    saved_tensors_hooks, FLOPs == FlopCounterMode (with the SDPA formulas), ``--check`` observes the
    measurement and agrees; with ``apply``: after ``memplan.apply_strategy`` on a copy, eval outputs
    bit-identical to plain PyTorch's under the same plan (no_grad and autograd on), the train-mode
    loss identical and gradients close to plain autograd's, and the ``applied`` prediction == the
    saved_tensors_hooks measurement of the applied model. ``results`` collects the PairResults."""
    torch.manual_seed(0)
    base = entry.build(resolution)
    shape = entry.shape(resolution)
    graph = capture_graph(copy.deepcopy(base), shape)  # a capture failure raises: a failure, not a skip
    problems = []
    for method in methods:
        r = corpus.check_pair(
            base, graph, shape, method, entry.name, raise_errors=True, apply_checks=apply, flops=measured_flops
        )
        problems += pair_problems(r, f"{entry.name}@{resolution}/{method}")
        if results is not None:
            results.append(r)
    return problems


@pytest.mark.parametrize("entry", tc.ONE_PER_GROUP, ids=lambda e: e.name)
def test_one_per_group(entry):
    assert check_model(entry, entry.resolutions[0]) == []


def _slow_params():
    return [pytest.param(e, r, id=f"{e.name}@{r}") for e in tc.ENTRIES for r in e.resolutions]


@pytest.mark.slow
@pytest.mark.parametrize("entry,resolution", _slow_params())
def test_whole_corpus(entry, resolution):
    assert check_model(entry, resolution) == []


def test_corpus_size():
    """At least 25 models, each at two resolutions (the issue's floor)."""
    assert len(tc.ENTRIES) >= 25 and all(len(set(e.resolutions)) == 2 for e in tc.ENTRIES)


# ----------------------------------------------------------------------------- SDPA rules
class Attention(nn.Module):
    """q, k, v projections + F.scaled_dot_product_attention in the layouts models use."""

    def __init__(self, layout: str, mask: str | None, dropout: float, causal: bool, heads: int = 2, dim: int = 16):
        super().__init__()
        self.layout, self.mask, self.dropout, self.causal, self.heads = layout, mask, dropout, causal, heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.bias = nn.Parameter(torch.randn(heads, 5, 5) * 0.1)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        b, n, c = x.shape[0], 5, x.shape[1] * x.shape[2] * x.shape[3] // 5
        t = self.norm(x.reshape(b, n, c))
        qkv = self.qkv(t)
        if self.layout == "fused":  # timm: reshape + permute + unbind (non-dense q, k, v)
            q, k, v = qkv.reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        else:  # transformers: view + transpose per projection
            q, k, v = (p.view(b, n, self.heads, c // self.heads).transpose(1, 2) for p in qkv.chunk(3, -1))
        mask = None
        if self.mask == "param":  # a relative position bias: a mask from a parameter
            mask = self.bias.unsqueeze(0)
        elif self.mask == "bool":
            mask = torch.ones(n, n, dtype=torch.bool).tril()
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )
        return self.head(out.transpose(1, 2).reshape(b, n, c).mean(1))


SDPA_CASES = [
    ("split", None, 0.0, False),
    ("fused", None, 0.0, False),
    ("split", "param", 0.0, False),
    ("split", "bool", 0.0, False),
    ("split", None, 0.1, False),
    ("fused", None, 0.0, True),
]


@pytest.mark.parametrize("case", SDPA_CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("method", ("full", "bias", "norm", "last"))
def test_sdpa_rules_match_saved_tensor_hooks(case, method):
    """Flash and math kernels (a mask from a trained parameter and dropout take the math fallback),
    every strategy: predicted saved bytes == saved_tensors_hooks on the CPU, FLOPs == FlopCounterMode."""
    torch.manual_seed(0)
    model = Attention(*case)
    shape = (2, 1, 5, 16)
    graph = capture_graph(copy.deepcopy(model), shape)
    plan = make_plan(graph, method)
    prof = compute(graph, plan, get_mode("pytorch"))
    assert not prof.unknown_ops and not any("attention" in k for k in prof.observed_ops)  # costed by the rule
    model_modules(model, graph)
    apply_plain(model, graph, plan)
    x, y = torch.randn(shape), torch.randint(0, 10, (2,))
    torch.manual_seed(3)
    assert prof.totals.saved_activation_bytes == saved_bytes(model, x, y, backward=True).bytes
    model.zero_grad(set_to_none=True)
    fwd, bwd = measured_flops(model, x, y)
    t = prof.totals
    assert (t.forward_flops, t.backward_grad_input_flops + t.backward_grad_weight_flops) == (fwd, bwd)


def test_check_fails_when_a_rule_is_wrong(monkeypatch):
    """--check watches the real CPU run: with the flash rule made to forget its logsumexp, the check
    disagrees and names the attention node and the (batch, heads, L) float32 tensor it saved."""
    import memplan.modes.pytorch as pt

    model = Attention("split", None, 0.0, False)
    graph = capture_graph(copy.deepcopy(model), (2, 1, 5, 16))
    plan = make_plan(graph, "full")
    assert check(model, graph, plan).agrees
    right = pt.pytorch.rules["sdpa"]
    monkeypatch.setitem(pt.pytorch.rules._items, "sdpa", lambda op: [s for s in right(op) if s.what != "logsumexp"])
    result = check(model, graph, plan)
    assert not result.agrees and result.observed - result.predicted == 2 * 2 * 5 * 4
    row = result.differing[0]
    assert any("scaled_dot_product_attention" in i for i in row.predicted_items)
    assert any("(2, 2, 5) float32 80 B" in i for i in row.observed_items)


def test_apply_check_fails_when_the_applied_rule_is_wrong(monkeypatch):
    """The apply stage can fail: with the ``applied`` conv rule made to forget that FrozenConv keeps
    nothing (it predicts what PyTorch's conv keeps), DeiT bias-only reports the patch embedding's
    input image (2 x 3 x 32 x 32 float32) as predicted but not measured."""
    import memplan.modes.applied as ap
    import memplan.modes.pytorch as pt

    monkeypatch.setitem(ap.applied.rules._items, "conv", pt.pytorch.rules["conv"])
    problems = check_model(tc.BY_NAME["deit"], 32, ("bias",))
    assert len(problems) == 1 and ": apply: applied mode predicts" in problems[0]
    predicted, measured = (int(w) for w in problems[0].split() if w.isdigit())
    assert predicted - measured == 2 * 3 * 32 * 32 * 4


# ----------------------------------------------------------------------------- history-independent capture
_INDEX_CACHE: dict[int, torch.Tensor] = {}


def _index(n: int) -> torch.Tensor:
    """A module-level cache filled on first use (as some libraries build relative position indices)."""
    if n not in _INDEX_CACHE:
        _INDEX_CACHE[n] = torch.arange(n * n).view(n, n)
    return _INDEX_CACHE[n]


class CachedIndex(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(17 * 17))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        n = int(x.shape[-1]) + 9  # a Python int from a shape: symbolic tracing fails, capture records
        bias = self.table[_index(n).view(-1)].view(n, n)
        return self.fc((x.flatten(2)[:, 0, :n] @ bias)[:, :16])


def test_capture_does_not_depend_on_history():
    """A second profile of a new instance, and a profile after a real forward, both capture; the
    cached index is a constant of the graph, and what an op saves of it is counted whether or not
    the cache was filled before capture (Hugging Face BEiT's relative position index is such an
    LRU-cached tensor: a second BEiT built in one process was 33,800 B under). Each prediction
    equals saved_tensors_hooks on a real run and --check agrees each time."""
    _INDEX_CACHE.clear()
    first = memplan.profile(CachedIndex(), "full", batch=2, input_shape=(3, 8, 8), check=True)
    second = memplan.profile(CachedIndex(), "full", batch=2, input_shape=(3, 8, 8), check=True)
    _INDEX_CACHE.clear()
    CachedIndex()(torch.randn(2, 3, 8, 8))
    after = memplan.profile(CachedIndex(), "full", batch=2, input_shape=(3, 8, 8), check=True)
    x, y = torch.randn(2, 3, 8, 8), torch.zeros(2, dtype=torch.long)
    measured = saved_bytes(CachedIndex(), x, y, backward=True).bytes
    for p in (first, second, after):
        assert p.capture == "recorded" and p.check["differing"] == []
        assert p.totals.saved_activation_bytes == p.check["observed"] == measured


def test_beit_twice_in_one_process():
    """BEiT's relative position index is cached across instances (an LRU cache on the class): the
    first capture computes it, later ones read it as a constant. Both predictions are the measurement."""
    entry = tc.BY_NAME["beit"]
    for _ in range(2):
        model = entry.build(32)
        graph = capture_graph(copy.deepcopy(model), entry.shape(32))
        plan = make_plan(graph, "full")
        predicted = compute(graph, plan, get_mode("pytorch")).totals.saved_activation_bytes
        model_modules(model, graph)
        apply_plain(model, graph, plan)
        x, y = corpus.data(entry.shape(32))
        torch.manual_seed(3)
        assert predicted == saved_bytes(model, x, y, backward=True).bytes
