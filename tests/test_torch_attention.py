"""The torch.nn attention corpus (tests/torch_attention_corpus.py): ``nn.MultiheadAttention`` and
the ``nn.Transformer`` layers, beside the Hugging Face corpus (tests/test_transformers.py), with
the same checks per model x full / bias / norm / last, batch 2 (``tests/corpus.check_pair``):

1. ``pytorch``-mode saved bytes == ``saved_tensors_hooks`` on a real CPU forward + loss, byte-exact;
2. forward / backward FLOPs == FlopCounterMode (with torch's SDPA formulas);
3. ``memplan.check`` (``--check``, a real CPU run) observes the measurement and agrees;
4. after ``memplan.apply_strategy`` on a copy: eval outputs bit-identical to plain PyTorch's (in
   no_grad, where the encoder's fast path runs, and with autograd on), the train-mode loss identical
   and gradients close, and the ``applied`` prediction == saved_tensors_hooks on the applied model.

These modules are captured through their parts (``graph.composite.is_composite_module``): no part of
them is observed whole, so the kernel a part runs (the fused SDPA kernel of ``need_weights=False``)
comes from the rule that asks torch, and their parameters (LayerNorms, in-projection biases) are the
strategies' to train. By default a fast selection runs; the whole corpus with ``pytest -m slow``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import memplan
from memplan.accounting.engine import compute
from memplan.graph.capture import capture_graph
from memplan.modes import get_mode
from memplan.strategies import make_plan

from . import corpus, torch_attention_corpus as ac
from .test_transformers import measured_flops, pair_problems

STRATEGIES = ("full", "bias", "norm", "last")
#: what must never be one observed node: the modules and the attention function (ops without a rule
#: inside them, mask building or baddbmm, are observed alone, exactly)
WHOLE = {"MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer", "TransformerEncoder"}
WHOLE |= {"TransformerDecoder", "Transformer", "multi_head_attention_forward", "scaled_dot_product_attention"}


def check_entry(entry: ac.AEntry, methods=STRATEGIES) -> list[str]:
    """Problems found on ``entry`` (empty: every pair exact, see the module docstring)."""
    base = entry.build()
    graph = capture_graph(copy.deepcopy(base), ac.SHAPE)
    problems = []
    for method in methods:
        r = corpus.check_pair(base, graph, ac.SHAPE, method, entry.name, raise_errors=True, flops=measured_flops)
        problems += pair_problems(r, f"{entry.name}/{method}")
        observed = set(r.observed_ops or {}) & WHOLE
        if observed or r.unknown_ops:
            problems.append(f"{entry.name}/{method}: observed whole {observed}, unknown {r.unknown_ops}")
    return problems


@pytest.mark.parametrize("entry", ac.FAST, ids=lambda e: e.name)
def test_fast_selection(entry):
    assert check_entry(entry) == []


@pytest.mark.slow
@pytest.mark.parametrize("entry", ac.ENTRIES, ids=lambda e: e.name)
def test_whole_corpus(entry):
    assert check_entry(entry) == []


def _kernel(model: nn.Module) -> str:
    graph = capture_graph(copy.deepcopy(model), ac.SHAPE)
    sdpa = [n for n in graph.nodes if n.kind == "sdpa"]
    return "sdpa" if sdpa else "math"


def test_need_weights_picks_the_kernel():
    """need_weights=False runs F.scaled_dot_product_attention (whose CPU kernel the rule asks torch
    for); need_weights=True the math path (matmul, softmax) that returns the attention weights."""
    assert _kernel(ac.BY_NAME["mha"].build()) == "sdpa"
    assert _kernel(ac.BY_NAME["mha-weights"].build()) == "math"


def test_norm_trains_the_layer_norms_inside():
    """norm on an encoder trains the LayerNorms inside its layers (2 per layer + the final one):
    the plan sees them, so the prediction covers what training them saves (the issue: 612 B
    predicted where about 400-530 kB were saved, the layers being one opaque node)."""
    model = ac.BY_NAME["encoder-prenorm-gelu"].build()
    graph = capture_graph(copy.deepcopy(model), ac.SHAPE)
    plan = make_plan(graph, "norm")
    norms = [n for n in graph.nodes if n.kind == "layernorm" and plan.of(n).weight > 0]
    assert len(norms) == 5
    prof = compute(graph, plan, get_mode("pytorch"))
    assert prof.totals.saved_activation_bytes > 10 * 228  # far more than the head's input alone


def test_profile_check_agrees():
    """``memplan.profile(..., check=True)`` on the hybrid (conv stem + nn.MultiheadAttention): the
    real run and the prediction agree, and both equal the independent measurement."""
    model = ac.BY_NAME["hybrid"].build()
    prof = memplan.profile(copy.deepcopy(model), "bias", batch=2, input_shape=ac.SHAPE[1:], check=True)
    assert prof.check["differing"] == [] and prof.check["observed"] == prof.totals.saved_activation_bytes


@pytest.mark.parametrize("name", ("mha", "mha-weights"))
def test_a_module_kept_whole_is_observed_with_the_cpu_kernel(name):
    """nn.MultiheadAttention named a leaf is one node costed by observation. Replayed on meta, its
    attention would run the math kernel; where the CPU runs the flash one (need_weights=False) the
    replay moves to the CPU (``costs.observe.CpuKernels``), so the observation is still exact."""
    base = ac.BY_NAME[name].build()
    graph = capture_graph(copy.deepcopy(base), ac.SHAPE, leaf_modules=["MultiheadAttention"])
    for method in ("full", "bias"):
        r = corpus.check_pair(base, graph, ac.SHAPE, method, name, raise_errors=True, apply_checks=False)
        assert r.observed_ops == {"MultiheadAttention": 1}
        assert r.predicted_bytes == r.measured_bytes == r.check_observed
    devices = {o.device for o in graph.observed.values()}
    assert devices == ({"cpu"} if name == "mha" else {"meta"})


def test_check_sees_16_bytes(monkeypatch):
    """``--check`` is byte-exact: with the pytorch rule of the loss made to forget its int64 target
    (2 x 8 = 16 B), the check on the hybrid disagrees by exactly 16 B and names the loss's scope."""
    import memplan.modes.pytorch as pt
    from memplan.check import check

    model = ac.BY_NAME["hybrid"].build()
    graph = capture_graph(copy.deepcopy(model), ac.SHAPE)
    plan = make_plan(graph, "bias")
    assert check(copy.deepcopy(model), graph, plan).agrees
    right = pt.pytorch.rules["cross_entropy"]
    forgetful = lambda op: [s for s in right(op) if s.what != "target"]  # noqa: E731
    monkeypatch.setitem(pt.pytorch.rules._items, "cross_entropy", forgetful)
    result = check(copy.deepcopy(model), graph, plan)
    assert not result.agrees and result.observed - result.predicted == 16
    assert [(r.module, r.observed - r.predicted) for r in result.differing] == [("", 16)]


@pytest.mark.parametrize("method", ("full", "norm"))
def test_fast_paths_are_not_taken_while_training(method):
    """The encoder layer's and nn.MultiheadAttention's fast paths (``torch._transformer_encoder_layer_fwd``,
    ``torch._native_multi_head_attention``) run only in eval mode without autograd, where nothing is
    saved. In eval mode with parameters that train (no dropout to tell the modes apart), the real run
    takes the regular path and saves what the prediction (captured in train mode) says."""
    from memplan.apply import apply_plain
    from memplan.verify.measure import model_modules, saved_bytes

    base = ac.BY_NAME["encoder-gelu-module"].build()
    graph = capture_graph(copy.deepcopy(base), ac.SHAPE)
    plan = make_plan(graph, method)
    predicted = compute(graph, plan, get_mode("pytorch")).totals.saved_activation_bytes
    model = copy.deepcopy(base)
    model_modules(model, graph)
    apply_plain(model, graph, plan).eval()
    x, y = corpus.data(ac.SHAPE)
    assert saved_bytes(model, x, y, backward=True).bytes == predicted
    with torch.no_grad():  # the fast path: nothing saved, and the same outputs
        assert torch.allclose(model(x), apply_plain(copy.deepcopy(model), graph, plan)(x).detach(), atol=1e-5)
