"""CLI: output formats, and bad input -> one-line error, exit code 2, no traceback."""

import json
import os
import subprocess
import sys

import pytest

from memplan.cli import main

DATA = os.path.join(os.path.dirname(__file__), "data", "user_models.py")


def run(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_profile_json_stdout_is_only_json(capsys):
    code, out, err = run(["profile", "mcunet-5fps", "--method", "full", "--json", "-"], capsys)
    assert code == 0
    data = json.loads(out)
    for key in ("model", "method", "mode", "batch", "resolution", "classes", "totals", "layers"):
        assert key in data
    for key in (
        "params",
        "trainable_params",
        "macs",
        "forward_flops",
        "backward_flops",
        "saved_activation_bytes",
        "weight_bytes",
        "gradient_bytes",
        "optimizer_bytes",
        "peak_bytes",
    ):
        assert isinstance(data["totals"][key], int)
        assert key in data["layers"][0]
    assert data["resolution"] == 128 and data["classes"] == 1000
    assert {"name", "kind", "output_shape", "block"} <= set(data["layers"][0])


def test_profile_table_and_csv(tmp_path, capsys):
    csv_path = tmp_path / "layers.csv"
    code, out, err = run(
        ["profile", "resnet18", "-m", "lastk", "-k", "2", "-r", "64", "--per-layer", "--csv", str(csv_path)], capsys
    )
    assert code == 0
    assert "saved activations" in out and "peak" in out and "layer4" not in err
    rows = csv_path.read_text().splitlines()
    assert rows[0].startswith("model,method,mode,name,kind") and len(rows) > 20


def test_compare_lists_one_row_per_strategy(capsys):
    code, out, err = run(["compare", "proxylessnas-mobile", "--classes", "100", "--batch", "8"], capsys)
    assert code == 0
    for method in ("full", "last", "norm", "bias", "lastk(blocks=3)"):
        assert method in out


def test_user_model_from_file_and_factory(capsys):
    code, out, _ = run(["profile", f"{DATA}:TinyNet", "--input-shape", "3,16,16", "--json", "-"], capsys)
    assert code == 0 and json.loads(out)["classes"] == 4
    code, out, _ = run(["profile", f"{DATA}:tiny_factory", "-r", "16", "--json", "-"], capsys)
    assert code == 0 and json.loads(out)["classes"] == 3
    code, out, _ = run(
        ["profile", "tests.data.user_models:TinyNet", "--classes", "6", "-r", "16", "--json", "-"], capsys
    )
    assert code == 0 and json.loads(out)["classes"] == 6


def test_models_lists_the_zoo(capsys):
    code, out, _ = run(["models"], capsys)
    assert code == 0 and "mcunet-5fps" in out and "proxylessnas-mobile" in out


BAD = [
    (["profile", "mobilenetv9"], "unknown model"),
    (["profile", "no_such_pkg.mod:Net"], "cannot import module"),
    (["profile", f"{DATA}:Missing"], "has no attribute"),
    (["profile", "tests/data/nope.py:Net"], "no such file"),
    (["profile", f"{DATA}:NeedsArgs"], "needs arguments"),
    (["profile", f"{DATA}:NOT_A_MODEL"], "not an nn.Module"),
    (["profile", f"{DATA}:Untraceable", "-r", "16"], "--leaf Gate"),
    (["profile", f"{DATA}:TupleOut", "-r", "8", "--output", "5"], "no entry"),
    (["profile", "mcunet-5fps", "--batch", "-1"], "--batch must be a positive integer"),
    (["profile", "mcunet-5fps", "--batch", "abc"], "batch"),
    (["profile", "mcunet-5fps", "--method", "magic"], "unknown method"),
    (["profile", "mcunet-5fps", "--mode", "exact"], "unknown accounting mode"),
    (["profile", "mcunet-5fps", "--optimizer", "lion"], "unknown optimizer"),
    (["profile", "mcunet-5fps", "-m", "lastk", "--blocks", "99"], "out of range"),
    (["profile", "mcunet-5fps", "-m", "lastk", "--blocks", "2", "--layers", "2"], "not both"),
    (["profile", "mcunet-5fps", "-m", "full", "--blocks", "2"], "does not apply"),
    (["profile", "minilearn-kws", "-m", "lastk", "--blocks", "1"], "no blocks"),
    (["profile", "minilearn-cifar10", "--resolution", "20"], "fails on input shape"),
    (["profile", "mcunet-5fps", "--json", "/nonexistent/dir/out.json"], "does not exist"),
    (["profile", "mcunet-5fps", "--input-shape", "3,a"], "--input-shape"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a[1:3]) for a, _ in BAD])
def test_bad_input_one_line_exit_2(args, needle, capsys):
    code, out, err = run(args, capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err


def test_untraceable_message_names_module_and_fix(capsys):
    code, _, err = run(["profile", f"{DATA}:Untraceable", "-r", "16"], capsys)
    assert "module 'gate' (Gate)" in err and "leaf" in err and "user_models.py" in err


def test_console_script_end_to_end(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.run(
        [sys.executable, "-m", "memplan", "profile", "mbv2-w0.35", "-m", "bias", "--json", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["method"] == "bias"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_verify_command_ok(capsys):
    code, out, _ = run(["verify", "mcunet-5fps", "-m", "bias", "-r", "32", "-b", "2", "--steps", "1"], capsys)
    assert code == 0 and "match the predictions" in out


def test_schema_command_prints_json_schema(capsys):
    code, out, _ = run(["schema"], capsys)
    assert code == 0 and json.loads(out)["properties"]["schema_version"]
