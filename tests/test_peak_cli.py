"""Command line of the peak features: ``memplan calibrate``, ``profile --schedule / --calibration /
--target`` (fits / does not fit), ``search --target`` in the target's mode, the deprecated spelling
``--device`` of ``--target``, and their bad inputs (one line, exit 2)."""

from __future__ import annotations

import json

import pytest

from memplan.cli import main
from memplan.io import shipped

SCHEME = str(shipped("schemes", "mcunet-5fps-100KB.json"))


def run(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_calibrate_then_profile_counts_the_workspaces(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEMPLAN_CACHE", str(tmp_path))
    args = ["profile", "mcunet-5fps", "-m", "bias", "-r", "32", "-b", "2"]
    code, out, _ = run(args, capsys)
    assert code == 0 and "kernel workspaces: missing" in out and "memplan calibrate mcunet-5fps" in out
    code, out, _ = run(
        ["calibrate", "mcunet-5fps", "--methods", "bias", "-r", "32", "-b", "2", "--threads", "1"], capsys
    )
    assert code == 0 and "kernel configurations" in out and str(tmp_path) in out.replace("\n", "")
    code, out, _ = run(
        ["calibrate", "mcunet-5fps", "--methods", "bias", "-r", "32", "-b", "2", "--threads", "1"], capsys
    )
    assert code == 0 and " 0 measured now" in out
    code, out, _ = run(args + ["--json", "-"], capsys)
    data = json.loads(out)
    assert data["workspace"]["status"] == "calibrated" and data["schedule"] == "standard"
    code, out, _ = run(args + ["--calibration", "none", "--schedule", "tte", "--json", "-"], capsys)
    data2 = json.loads(out)
    assert data2["workspace"]["status"] == "not modelled" and data2["schedule"] == "tte"
    assert data2["totals"]["peak_bytes"] <= data["totals"]["peak_bytes"]


def test_profile_device_fits_and_does_not_fit(capsys):
    code, out, _ = run(["profile", "mcunet-5fps", "-m", "sparse", "--scheme", SCHEME, "--target", "stm32f746"], capsys)
    assert code == 0 and "mode mcu" in out and "fits stm32f746" in out and "to spare" in out
    code, out, _ = run(["profile", "mcunet-5fps", "-m", "full", "--target", "stm32f746", "--json", "-"], capsys)
    dev = json.loads(out)["extras"]["device"]
    assert dev["mode"] == "mcu" and not dev["fits"] and dev["margin_bytes"] < 0
    code, out, _ = run(["profile", "mcunet-5fps", "-m", "full", "--target", "stm32f746"], capsys)
    assert "does not fit stm32f746 by" in out
    code, out, _ = run(
        ["profile", "mcunet-5fps", "-m", "bias", "--mode", "tinytraining", "--target", "stm32f746", "--json", "-"],
        capsys,
    )
    dev = json.loads(out)["extras"]["device"]
    assert dev["mode"] == "tinytraining" and "reserve" in dev["budget"]  # an explicit mode is kept


def test_device_is_the_deprecated_spelling_of_target(capsys):
    """``profile`` / ``search --device NAME`` still work as ``--target NAME``, with one warning line."""
    code, out, err = run(["profile", "mcunet-5fps", "-m", "full", "--device", "stm32f746", "--json", "-"], capsys)
    assert code == 0 and json.loads(out)["extras"]["device"]["name"] == "stm32f746"
    assert err.count("\n") == 1 and "deprecated" in err and "--target stm32f746" in err
    code, _, err = run(["search", "--device", "toaster"], capsys)
    assert code == 2 and "deprecated" in err.splitlines()[0] and "unknown device 'toaster'" in err.splitlines()[1]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["profile", "mcunet-5fps", "--schedule", "fast"], "unknown schedule 'fast'"),
        (["profile", "mcunet-5fps", "--calibration", "/nonexistent/cal.json"], "does not exist"),
        (["profile", "mcunet-5fps", "--target", "toaster"], "unknown device 'toaster'"),
        (["profile", "mcunet-5fps", "--target", "stm32f746", "--device", "nrf52840"], "not both"),
        (["calibrate", "mcunet-5fps", "--batch", "0"], "--batch must be a positive integer"),
        (["calibrate", "mcunet-5fps", "--backend", "tpu"], "unknown calibration backend 'tpu'"),
        (["calibrate", "mcunet-5fps", "--threads", "0"], "--threads must be a positive integer"),
        (["calibrate", "no-such-model"], "no-such-model"),
    ],
)
def test_bad_inputs_are_one_line_exit_2(args, needle, capsys):
    code, _, err = run(args, capsys)
    assert code == 2 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_broken_calibration_file_is_one_line(tmp_path, capsys):
    bad = tmp_path / "cal.json"
    bad.write_text('{"version": 99}')
    code, _, err = run(["profile", "mcunet-5fps", "--calibration", str(bad)], capsys)
    assert code == 2 and "unknown format" in err and err.count("\n") == 1


def test_calibrate_keeps_stderr_free_of_profiler_lines(tmp_path):
    """kineto's ``USDT: ... profiler_start`` lines (one pair per torch.profiler session) are not
    memplan's output; a KINETO_LOG_LEVEL the user sets is left alone (and shows them: the check can fail)."""
    import os
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "memplan",
        "calibrate",
        "mcunet-5fps",
        "--methods",
        "bias",
        "-r",
        "32",
        "--threads",
        "1",
    ]
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    err = {}
    for level in (None, "5"):
        extra = {"MEMPLAN_CACHE": str(tmp_path / f"cache-{level}")} | ({"KINETO_LOG_LEVEL": level} if level else {})
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**env, **extra})
        assert done.returncode == 0, done.stderr
        err[level] = done.stderr
    assert "USDT" not in err[None] and "profiler_start" not in err[None]
    assert "USDT" in err["5"]
