"""Smoke test of benchmarks/peers.py's core on one tiny depthwise model, with whichever peer
profilers are installed. FLOPs are checked against a hand count written out here."""

import pytest

from .helpers import load_benchmark


@pytest.fixture(scope="module")
def peers():
    return load_benchmark("peers")


# DepthwiseNet(width=8), batch 2, 16 px -> 8 x 8 after the stride-2 stem. MACs per layer:
STEM = 2 * 8 * 8 * 8 * 3 * 3 * 3  # out numel x C_in x k^2
DEPTHWISE = 4 * (2 * 8 * 8 * 8 * 7 * 7)  # four 7x7 depthwise: out numel x 1 x k^2
GROUPED = 2 * 8 * 8 * 8 * 1 * 3 * 3  # 8 groups over 8 channels: C_in / groups = 1
CLASSIFIER = 2 * 8 * 100
FORWARD_FLOPS = 2 * (STEM + DEPTHWISE + GROUPED + CLASSIFIER)
# full: every weight gradient (= its forward) + every input gradient except the stem's (image)
FULL_BACKWARD = FORWARD_FLOPS + 2 * (DEPTHWISE + GROUPED + CLASSIFIER)
LAST_BACKWARD = 2 * CLASSIFIER  # classifier weight gradient only


def test_core_on_tiny_depthwise_model(peers):
    case = peers.Case("tiny-depthwise", lambda: peers.DepthwiseNet(width=8), 2, 16)
    installed = peers.available_peers()
    rows = peers.run_case(case, ("full", "last"), installed)
    by = {(r.method, r.tool): r for r in rows}
    assert {r.tool for r in rows} == {"truth", "memplan", *(p.name for p in installed)}

    for method, backward in (("full", FULL_BACKWARD), ("last", LAST_BACKWARD)):
        truth, mine = by[(method, "truth")].estimate, by[(method, "memplan")].estimate
        assert (truth.forward_flops, truth.backward_flops) == (FORWARD_FLOPS, backward)  # the harness is right
        assert (mine.forward_flops, mine.backward_flops) == (FORWARD_FLOPS, backward)
        assert mine.activation_bytes == truth.activation_bytes  # saved-tensor hooks, to the byte
        assert by[(method, "memplan")].errors["activation_bytes"] == 0

    # FlopCounterMode (always there: it is torch's) over-counts depthwise weight gradients x groups
    fcm = by[("full", "FlopCounterMode")]
    assert fcm.estimate.forward_flops == FORWARD_FLOPS
    assert fcm.estimate.backward_flops == FULL_BACKWARD + 2 * (DEPTHWISE + GROUPED) * (8 - 1)

    text = peers.render_text(rows)
    assert "memplan" in text and "exact" in text
    settings = {
        "torch": "torch",
        "threads": 1,
        "batch": 2,
        "classes": 100,
        "seconds": 1.0,
        "resolutions": {case.name: 16},
    }
    md = peers.render_markdown(rows, installed, settings)
    assert md.count("| tiny-depthwise |") == len(rows)
