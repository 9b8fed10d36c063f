"""The headline command in the 256KB paper's setting: ``memplan search --budget 100KB`` with no model
searches the int8 mcunet-5fps (+ QAS) from its shipped CIFAR-10 profile, says whether training
fits the STM32F746 (SRAM in ``mcu`` mode, flash), and names the training evidence of a shipped
scheme equal to the one found; EfficientNet-Lite0 keeps its own profile when named."""

from __future__ import annotations

import re

import pytest

from memplan.contrib.profile import load_profile
from memplan.io import shipped
from memplan.models.int8 import int8_model
from memplan.plan import TestAccuracy, Validation, load_scheme
from memplan.render.reports import evidence_line
from memplan.search import command
from memplan.search.inputs import DEFAULT_MODEL, find_profile

from .test_stage_faults import run_cli

INT8_PROFILE = shipped("profiles", "mcunet-5fps-int8-cifar10.json")


def run(args: list[str], capsys) -> tuple[int, str]:
    """(exit code, stdout + stderr) of ``memplan ARGS``."""
    code, out, err = run_cli(args, capsys)
    return code, out + err


def test_the_default_search_is_the_int8_mcu_backbone_on_its_cifar10_profile():
    prof = load_profile(INT8_PROFILE)
    assert DEFAULT_MODEL == prof.model == "mcunet-5fps-int8"
    assert prof.protocol.optimizer == "sgd-qas" and prof.dataset["name"] == "cifar10"
    assert prof.evaluated_on == "validation" and prof.weight  # measured entries, not an empty grid


def test_headline_command_prints_a_sparse_scheme_and_the_stm32f746_fit(capsys):
    code, out = run(["search", "--budget", "100KB"], capsys)
    assert code == 0, out
    text = " ".join(out.split())
    assert "mcunet-5fps-int8" in text and "mcunet-5fps-int8-cifar10.json" in text
    scheme = re.search(r"scheme \(exact\): (.*?) objective", text).group(1)
    assert "weights:" in scheme and "biases of the last" in scheme  # a sparse update, not the classifier alone
    fit = re.search(r"stm32f746: training peak ([\d,]+) B .*? in mcu mode at batch 1 (fits|does NOT fit)", text)
    assert fit is not None, text
    # the frozen model as the mcu mode deploys it: every weight int8, every bias int32, counted here
    # from the model's own parameters
    model = int8_model("mcunet-5fps", 10)
    flash = sum(p.numel() * (4 if name.endswith("bias") else 1) for name, p in model.named_parameters())
    assert f"frozen model {flash:,} B fits its 1,048,576 B flash" in text
    assert "validated by training:" in text  # the shipped evidence, or that there is none


def test_lite0_keeps_its_profile_when_named(capsys):
    code, out = run(["search", "efficientnet-lite0", "--budget", "100KB"], capsys)
    assert code == 0, out
    assert "efficientnet-lite0-fashion-mnist.json" in " ".join(out.split())
    assert "stm32f746" not in out  # Lite0 names no device of its own


def test_shipped_evidence_is_found_for_an_equal_scheme_only(tmp_path, monkeypatch):
    base = load_scheme(shipped("schemes", "mcunet-5fps-100KB.json"))
    evidence = Validation(
        name="row",
        accuracy=70.0,
        se=0.0,
        seeds=[100],
        data="validation split",
        test=TestAccuracy(accuracy=71.0, ci95=0.2, seeds=[0, 1], per_seed=[70.9, 71.1], data="test", where="here"),
    )
    folder = tmp_path / "schemes"
    folder.mkdir()
    base.model_copy(update={"validation": evidence}).save(folder / "validated.json")
    monkeypatch.setattr(command, "shipped", lambda *parts: folder)
    found = command.shipped_validation(base)
    assert found is not None and found.validation.test.accuracy == 71.0
    assert command.shipped_validation(base.model_copy(update={"bias_update": base.bias_update + 1})) is None
    assert "diverged" not in evidence_line(found)
    collapsed = evidence.test.model_copy(update={"per_seed": [70.9, 10.0], "diverged": 1})
    line = evidence_line(found.model_copy(update={"validation": evidence.model_copy(update={"test": collapsed})}))
    assert "1 of 2 test seeds diverged at the chosen rate" in line
    given_up = {"name": "row", "lr": 0.1, "accuracy": 72.5, "seeds": [100], "diverged_test_seeds": [3]}
    gave_up = evidence.model_copy(update={"runners_up": [given_up]})
    line = evidence_line(found.model_copy(update={"validation": gave_up}))
    assert "lr 0.1 (72.50% on validation) given up: test seed 3 diverged there" in line


@pytest.mark.parametrize("name", ["mcunet-5fps-int8"])
def test_the_int8_profile_matches_the_int8_graph(name):
    from memplan.api import capture
    from memplan.plan import fingerprint

    assert find_profile(fingerprint(capture(name, resolution=128, classes=10).graph)) == INT8_PROFILE
