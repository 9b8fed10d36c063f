"""Mode ``mcu`` (the Tiny Training Engine's peak SRAM on a microcontroller) against independent
figures: TinyEngine's own generated code, hand-computed buffers and receptive fields, and the 256KB
paper's measured figures (``memplan reproduce``, data file ``tinytraining_measured.json``)."""

from __future__ import annotations

import pytest
import torch.nn as nn

from memplan.accounting.engine import compute
from memplan.api import capture, profile_captured
from memplan.graph.capture import capture_graph
from memplan.modes import get_mode
from memplan.modes.mcu_layout import McuSettings, buffers, patch_stage
from memplan.reproduce import reproduce
from memplan.reproduce.figures import by_key
from memplan.strategies import make_plan

SCHEME_49KB = by_key("tinytraining.repo.mcunet-5fps.sparse.49kb.memory").options["scheme"]


@pytest.fixture(scope="module")
def mcunet():
    return capture("mcunet-5fps", resolution=128, classes=10)


def test_runtime_buffers_equal_tinyengine_codegen(mcunet):
    """TinyEngine's generated code for MCUNet-5FPS at 128 px (tinyengine tests/examples/assets/
    tiny_training/codegen.zip, genModel.h) sizes its buffers SBuffer_size = 8712 (the in-place 3x3
    depthwise conv on 64x64: 2 x 66 x 66) and KBuffer_size = 864 (the stem's 16x3x3x3 weights at 16 bit)."""
    p = profile_captured(mcunet, "sparse", mode="mcu-nopatch", scheme=SCHEME_49KB)
    assert p.extras["mcu"]["static"]["sbuf"] == 8712 and p.extras["mcu"]["static"]["kbuf"] == 864


def test_forward_peak_is_the_first_expand_conv_without_patches(mcunet):
    """Whole tensors: the forward peak is block 1's 1x1 expand conv reading 8x64x64 and writing
    32x64x64 int8 (TinyEngine's layer 3 uses exactly these two buffers), plus the engine's buffers."""
    p = profile_captured(mcunet, "last", mode="mcu-nopatch")
    m = p.extras["mcu"]
    assert m["phase"] == "forward" and m["peak_op"] == "blocks.1.conv.expand.conv"
    assert m["at_peak"]["activations"] == 8 * 64 * 64 + 32 * 64 * 64
    assert p.totals.peak_bytes == 8 * 64 * 64 + 32 * 64 * 64 + sum(m["static"].values())


def test_patch_stage_extents_follow_the_receptive_field():
    """Three stride-2 3x3 convs on 32x32, 2x2 patches: the stage output (4x4) splits into 2x2 patches;
    back through the convs a patch needs (2-1)*2+3 = 5, then 11, then 23 pixels of input."""
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, 2, 1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, 2, 1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, 2, 1),
        nn.ReLU(),
        nn.Conv2d(16, 16, 1),
        nn.Flatten(),
        nn.Linear(256, 10),
    )
    graph = capture_graph(net, (1, 3, 32, 32))
    stage = patch_stage(graph, buffers(graph), McuSettings(patches=2))
    convs = [n for n in graph.nodes if n.kind == "conv"]
    assert stage is not None and stage.end == convs[2].index  # no blocks: the third stride-2 conv closes it
    assert stage.extent[0] == (23, 23)  # the image patch
    assert [stage.extent[c.index] for c in convs[:3]] == [(11, 11), (5, 5), (2, 2)]


def test_schedules_and_modes_are_ordered(mcunet):
    """In-place updates never cost more than keeping every gradient; the peak holds at least
    tinytraining's extra memory; patches never cost more than whole tensors."""
    plan = make_plan(mcunet.graph, "sparse", scheme=SCHEME_49KB)
    tte = compute(mcunet.graph, plan, get_mode("mcu")).totals.peak_bytes
    std = compute(mcunet.graph, plan, get_mode("mcu"), schedule="standard").totals.peak_bytes
    nopatch = compute(mcunet.graph, plan, get_mode("mcu-nopatch")).totals.peak_bytes
    extra = compute(mcunet.graph, plan, get_mode("tinytraining")).totals.total_bytes
    accum = compute(mcunet.graph, plan, get_mode("mcu-accum")).totals.peak_bytes
    assert extra < tte <= std and tte <= nopatch and tte < accum


def test_quick_total_equals_compute(mcunet):
    mode = get_mode("mcu")
    for method, opts in [("bias", {}), ("full", {}), ("sparse", {"scheme": SCHEME_49KB})]:
        plan = make_plan(mcunet.graph, method, **opts)
        p = compute(mcunet.graph, plan, mode)
        assert mode.quick_total(mcunet.graph, plan) == p.totals.peak_bytes == p.totals.total_bytes


# ------------------------------------------------------------------ the paper's measured figures


@pytest.fixture(scope="module")
def measured_rows():
    return {r.key: r for r in reproduce("tinytraining") if r.mode == "mcu"}


def test_fully_stated_measurements_within_10_percent(measured_rows):
    """Figure 10(a)'s full-update peaks (every layer trains: nothing left open) and TinyEngine's own
    PEAK_MEM for the 49kb scheme."""
    stated = [r for r in measured_rows.values() if r.low is None]
    assert {r.key for r in stated} == {
        f"tinytraining.fig10a.{m}.full.memory" for m in ("mbv2-w0.35", "proxylessnas-w0.3", "mcunet-5fps")
    } | {"tinytraining.tinyengine.mcunet-5fps.sparse.49kb.arena"}
    for r in stated:
        assert abs(r.error) <= 0.10, (r.key, r.ours, r.published)


#: a range that misses: MCUNet's reordering saves 3.2x in Figure 10(a) (560 -> 173 KB); memplan's
#: no-reorder step keeps fp32 gradients of the updated weights only, which gives at most 2.7x
KNOWN_OUTSIDE = {"tinytraining.fig10a.mcunet-5fps.reorder.ratio"}


def test_unstated_settings_give_ranges_that_hold_the_published_values(measured_rows):
    ranged = [r for r in measured_rows.values() if r.low is not None]
    assert len(ranged) >= 20
    for r in ranged:
        assert r.low <= r.ours <= r.high and "range over" in r.note
        assert (r.status == "outside range") == (r.key in KNOWN_OUTSIDE), (r.key, r.low, r.published, r.high)
