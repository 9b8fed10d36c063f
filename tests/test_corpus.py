"""The real-client corpus (tests/corpus.py): models from packages nobody at memplan wrote.

For each model x full / last / norm / bias / lastk, at batch 2 x 3x32x32 (``corpus.check_pair``):

1. ``pytorch``-mode saved bytes == ``saved_tensors_hooks`` on a real CPU step (loss included),
   byte-exact; a pair that is not exact must at least be flagged (ops listed as observed / unknown);
2. forward FLOPs == FlopCounterMode; backward grad-input + grad-weight == FlopCounterMode with the
   group-aware ``convolution_backward`` formula;
3. after ``memplan.apply_strategy`` on a copy: eval outputs bit-identical (``torch.equal``) to plain
   PyTorch's under the same plan (same ``requires_grad`` flags), the train-mode loss (same dropout
   draw) identical and trainable gradients allclose to plain autograd's, and the ``applied``
   prediction == saved-tensor hooks on the applied model.

By default one model per family runs (``corpus.ONE_PER_FAMILY``); the whole corpus (about 120
models) runs with ``pytest -m slow`` (CI runs that once). Models marked heavy are skipped there
with the measured reason. A model whose capture raises fails with the error. The corpus packages
are not part of ``.[test]`` (they declare torchvision, which has no CPU build for this torch):
``pip install --no-deps -r requirements-corpus.txt``; without them these tests skip and say so.
"""

from __future__ import annotations

import traceback

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from . import corpus
from .helpers import predicted_and_measured

_cache: dict[str, tuple] = {}


def captured(entry: corpus.Entry):
    """(base model, graph) of ``entry``, captured once per model. Kept: the default selection and the
    last other model (params run model-major; the largest models hold gigabytes). Capture errors
    fail the test."""
    if entry.id not in _cache:
        keep = {e.id for e in corpus.ONE_PER_FAMILY}
        for key in [k for k in _cache if k not in keep]:
            del _cache[key]
        base = entry.build()
        try:
            _cache[entry.id] = (base, corpus.capture_entry(base, entry.shape), None)
        except Exception as exc:
            _cache[entry.id] = (base, None, exc)
    base, graph, exc = _cache[entry.id]
    if exc is not None:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        pytest.fail(f"{entry.id}: capture failed: {corpus.one_line(exc)}\n{trace}", pytrace=False)
    return base, graph


def _need(entry_or_family) -> None:
    fam = entry_or_family if isinstance(entry_or_family, str) else entry_or_family.family
    if fam in corpus.MISSING:
        pytest.skip(f"corpus package missing ({corpus.INSTALL}): {corpus.MISSING[fam]}")


def check(entry: corpus.Entry, method: str) -> None:
    _need(entry)
    base, graph = captured(entry)
    r = corpus.check_pair(base, graph, entry.shape, method, entry.name, raise_errors=True)
    where = f"{entry.id} / {method} [{graph.capture} capture]"
    # 1. saved bytes: exact, or not exact and flagged in the report
    assert r.bytes_exact or r.flagged, (
        f"{where}: pytorch mode predicts {r.predicted_bytes} B, saved_tensors_hooks measured {r.measured_bytes} B "
        f"({100 * r.rel_error:+.3f}%) and nothing is flagged (no observed / unknown ops)"
    )
    # 2. FLOPs
    assert r.predicted_fwd_flops == r.measured_fwd_flops, f"{where}: forward FLOPs"
    assert r.predicted_bwd_flops == r.measured_bwd_flops, f"{where}: backward FLOPs (grad-input + grad-weight)"
    # 3. apply_strategy
    assert r.eval_identical, f"{where}: eval outputs changed by apply_strategy (max |diff| {r.eval_max_diff:.3g})"
    assert r.loss_identical, f"{where}: train-mode loss after apply_strategy differs from plain autograd's"
    assert r.grads_close, f"{where}: gradients after apply_strategy differ from plain autograd's: {r.grad_mismatch}"
    assert r.applied_predicted == r.applied_measured, (
        f"{where}: applied mode predicts {r.applied_predicted} B, measured {r.applied_measured} B"
    )


# ----------------------------------------------------------------------------- default: one per family
def _missing(family: str):
    return pytest.param(
        None,
        None,
        id=f"{family}-missing",
        marks=pytest.mark.skip(reason=f"corpus package missing ({corpus.INSTALL}): {corpus.MISSING[family]}"),
    )


@pytest.mark.parametrize(
    "entry,method",
    [pytest.param(e, m, id=f"{e.id}-{m}") for e in corpus.ONE_PER_FAMILY for m in corpus.STRATEGIES]
    + [_missing(f) for f in corpus.MISSING],
)
def test_one_per_family(entry, method):
    check(entry, method)


# ----------------------------------------------------------------------------- slow: the whole corpus
def _slow_selected(config) -> bool:
    return "slow" in (config.getoption("markexpr") or "")


def pytest_generate_tests(metafunc):
    """The whole corpus only when ``-m slow`` selects it (about 600 items); otherwise one skipped
    placeholder, so that a default run lists one line instead of 600 skips."""
    if metafunc.function.__name__ != "test_whole_corpus":
        return
    if not _slow_selected(metafunc.config):
        metafunc.parametrize(
            "entry,method",
            [
                pytest.param(
                    None,
                    None,
                    id="whole-corpus",
                    marks=pytest.mark.skip(reason="whole corpus (~120 models x 5 strategies): select it with -m slow"),
                )
            ],
        )
        return
    params = [_missing(f) for f in corpus.MISSING]
    for e in corpus.entries():
        for m in corpus.STRATEGIES:
            marks = [pytest.mark.skip(reason=f"heavy: {e.note}")] if e.heavy else []
            params.append(pytest.param(e, m, id=f"{e.id}-{m}", marks=marks))
    metafunc.parametrize("entry,method", params)


@pytest.mark.slow
def test_whole_corpus(entry, method):
    check(entry, method)


# ----------------------------------------------------------------------------- the corpus itself
def test_registry():
    """Every family is importable and holds what the issue names (never silently empty)."""
    if corpus.MISSING:
        pytest.skip(f"corpus packages missing ({corpus.INSTALL}): {corpus.MISSING}")
    ge = __import__("geffnet.gen_efficientnet", fromlist=["__all__"])
    mv3 = __import__("geffnet.mobilenetv3", fromlist=["__all__"])
    constructors = {n for n in [*ge.__all__, *mv3.__all__] if n == n.lower()}
    assert {e.name for e in corpus.CORPUS["geffnet"]} == constructors and len(constructors) == 97
    assert [e.name for e in corpus.CORPUS["efficientnet_pytorch"]] == [f"efficientnet-b{i}" for i in range(4)]
    assert [e.name for e in corpus.CORPUS["efficientnet_lite_pytorch"]] == [f"efficientnet-lite{i}" for i in range(5)]
    assert len(corpus.CORPUS["ofa"]) == 13 and len(corpus.CORPUS["mcunet"]) == 2
    assert [e.family for e in corpus.ONE_PER_FAMILY] == corpus.FAMILIES
    a, b = corpus.get("OFAMobileNetV3-sampled").build(), corpus.get("OFAMobileNetV3-sampled").build()
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))  # seeded


def _conv_macs(model: torch.nn.Module, resolution: int) -> tuple[int, int]:
    """(number of conv calls, conv MACs) of one forward at batch 1, by FlopCounterMode."""
    calls = []
    hooks = [
        m.register_forward_hook(lambda *_: calls.append(1)) for m in model.modules() if isinstance(m, torch.nn.Conv2d)
    ]
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model.eval()(torch.zeros(1, 3, resolution, resolution))
    for h in hooks:
        h.remove()
    return len(calls), fc.get_flop_counts()["Global"][torch.ops.aten.convolution] // 2


def test_mcunet_configs_match_the_reference_architectures():
    """/work/shared/reference/architectures.md: MCUNet-5FPS has 42 convs, 22.45M conv MACs at 128 px
    and 475,232 feature-extractor params; mbv2-w0.35: 51 convs, 17M MACs / 0.25M params (paper;
    memplan's zoo builds 16.65M conv MACs and 250,208 params)."""
    _need("mcunet")
    net = corpus.get("mcunet-5fps").build()
    convs, macs = _conv_macs(net, 128)
    backbone = sum(p.numel() for n, p in net.named_parameters() if not n.startswith("classifier"))
    assert (convs, backbone) == (42, 475_232) and round(macs / 1e6, 2) == 22.45
    assert net.classifier.linear.in_features == 160
    mbv2 = corpus.get("mbv2-w0.35").build()
    convs, macs = _conv_macs(mbv2, 128)
    backbone = sum(p.numel() for n, p in mbv2.named_parameters() if not n.startswith("classifier"))
    assert (convs, backbone) == (51, 250_208) and round(macs / 1e6, 2) == 16.65
    assert mbv2.feature_mix_layer is None and mbv2.classifier.linear.in_features == 112


@pytest.mark.parametrize("entry", [pytest.param(e, id=e.id) for e in corpus.ONE_PER_FAMILY])
def test_shared_graph_equals_the_helper(entry):
    """check_pair reuses one capture across strategies; tests/helpers.py's predicted_and_measured
    captures afresh: both give the same prediction and measurement."""
    _need(entry)
    base, graph = captured(entry)
    r = corpus.check_pair(base, graph, entry.shape, "bias", entry.name, apply_checks=False, raise_errors=True)
    prof, measured = predicted_and_measured(entry.build(), entry.shape, "bias", {})
    assert (prof.totals.saved_activation_bytes, measured.bytes) == (r.predicted_bytes, r.measured_bytes)
