"""``--target`` checks flash as well as SRAM: the frozen model as the mode deploys it
(``memplan.accounting.devices.deployed_bytes``) against the device's ``flash_bytes``, in
``profile``'s fit dict and text, and in the search result, its warning and its rendering. The
int8 count is checked against the int8 format's own count (``Int8Net.flash_bytes``, summed over
the real modules), the fp32 count against the real parameters' bytes."""

from __future__ import annotations

import json

import pytest
import torch
from rich.console import Console

import memplan
from memplan.accounting.devices import DEVICES_DIR, deployed_bytes, load_device
from memplan.api import capture
from memplan.cli import main
from memplan.models.int8 import int8_model
from memplan.models.zoo import build
from memplan.render.reports import print_search
from memplan.search import run_search

from .test_search import synthetic_profile

torch.set_num_threads(1)


def test_int8_model_fits_flash_as_the_int8_format_counts_it():
    """mcunet-5fps-int8 on stm32f746 (mode mcu): at 1000 classes every layer is an int8 conv
    (1 B weights, 4 B biases), as ``Int8Net.flash_bytes`` counts; at 10 classes the paper's fp32
    head is stored at 4 B a weight there, 1 B in memplan's int8 convention (3 B less a weight)."""
    p = memplan.profile("mcunet-5fps-int8", "bias", classes=1000, resolution=64, target="stm32f746")
    fit = p.extras["device"]
    assert fit["flash_needed_bytes"] == int8_model("mcunet-5fps", 1000).flash_bytes()
    assert fit["flash_bytes"] == load_device("stm32f746").flash_bytes == 1 << 20 and fit["flash_fits"] is True
    net = int8_model("mcunet-5fps", 10)
    p10 = memplan.profile("mcunet-5fps-int8", "bias", classes=10, resolution=64, target="stm32f746")
    assert p10.extras["device"]["flash_needed_bytes"] == net.flash_bytes() - 3 * net.classifier.weight.numel()
    assert p10.extras["device"]["flash_fits"] is True


def test_fp32_modes_count_the_parameters_own_bytes():
    model = build("mcunet-5fps-fp32", num_classes=10)
    cap = capture("mcunet-5fps-fp32", resolution=64, classes=10)
    assert deployed_bytes(cap.graph, "pytorch") == sum(t.numel() * t.element_size() for t in model.parameters())


def test_efficientnet_lite0_does_not_fit_stm32f746_flash(capsys):
    """4.7M parameters at 1 B (weights) / 4 B (biases, BN shifts) overflow 1 MiB: reported in the
    fit dict and the text, not refused."""
    model = build("efficientnet-lite0", num_classes=10)
    want = sum(t.numel() * (4 if name.endswith("bias") else 1) for name, t in model.named_parameters())
    with pytest.raises(SystemExit) as exc:
        main(["profile", "efficientnet-lite0", "-m", "bias", "-r", "64", "--classes", "10", "--target", "stm32f746",
              "--json", "-"])  # fmt: skip
    assert exc.value.code == 0
    fit = json.loads(capsys.readouterr().out)["extras"]["device"]
    assert fit["flash_needed_bytes"] == want > fit["flash_bytes"] and fit["flash_fits"] is False
    with pytest.raises(SystemExit):
        main(["profile", "efficientnet-lite0", "-m", "bias", "-r", "64", "--classes", "10", "--target", "stm32f746"])
    out = capsys.readouterr().out
    assert "does not fit the" in out and "flash of stm32f746" in out


@pytest.fixture(scope="module")
def int8_profile():
    return synthetic_profile(capture("mcunet-5fps-int8", resolution=128, classes=10).graph)


def test_search_reports_flash_and_warns_when_the_model_does_not_fit(int8_profile, tmp_path):
    kw = dict(profile=int8_profile, classes=10, mode="tinytraining")
    r = run_search("mcunet-5fps-int8", target="stm32f746", **kw)
    net = int8_model("mcunet-5fps", 10)
    needed = net.flash_bytes() - 3 * net.classifier.weight.numel()  # the fp32 head at 1 B a weight
    assert r.flash == {"flash_bytes": 1 << 20, "flash_needed_bytes": needed, "flash_fits": True}
    assert not any("flash" in w for w in r.warnings) and r.to_dict()["flash"] == r.flash
    small = json.loads((DEVICES_DIR / "stm32f746.json").read_text()) | {"name": "small-flash", "flash_bytes": 4096}
    (tmp_path / "small.json").write_text(json.dumps(small))
    s = run_search("mcunet-5fps-int8", target=str(tmp_path / "small.json"), **kw)
    assert s.flash["flash_fits"] is False and s.memory_bytes <= s.budget_bytes  # warned, not refused
    assert any("does not fit the 4096 B flash of small-flash" in w for w in s.warnings)
    console = Console(record=True, width=200)
    print_search(s, console)
    assert "does not fit the 4.1 kB flash of small-flash" in console.export_text()
