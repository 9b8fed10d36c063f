"""The bad-input catalogue: every case ends in one line `error: ...`, the documented exit code
(2 for bad input, 130 when interrupted), no traceback, and no output file left behind."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

import memplan
from memplan.cli import main

DATA = os.path.join(os.path.dirname(__file__), "data", "user_models.py")
BC = {
    "n_bias_update": 22,
    "manual_weight_idx": [21, 24],
    "weight_update_ratio": [1, 0.25],
    "weight_select_criteria": "magnitude+",
    "pw1_weight_only": False,
}


class RunsCode:
    """Unpickling this would call os.system: weights_only loading must refuse it."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/memplan-pwned",))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    good = d / "scheme.json"
    main_rc = None
    try:
        main(["search", "mcunet-5fps", "--budget", "60KB", "--out", str(good)])
    except SystemExit as exc:
        main_rc = exc.code
    assert main_rc == 0 and good.exists()
    scheme = json.loads(good.read_text())
    f = {
        "empty": d / "empty.json",
        "truncated": d / "truncated.json",
        "version": d / "version.json",
        "other_model": d / "other.json",
        "bad_ratio": d / "ratio.json",
        "bad_layer": d / "layer.json",
        "bc_range": d / "bc.json",
        "notjson": d / "notjson.json",
        "profile_trunc": d / "profile.json",
        "weights_txt": d / "weights.pt",
        "weights_list": d / "list.pt",
        "weights_evil": d / "evil.pt",
        "unreadable": d / "unreadable.pt",
        "npz_bad": d / "bad.npz",
        "scheme_48": d / "scheme48.json",
        "fisher": d / "fisher.json",
    }
    f["empty"].write_text("")
    f["truncated"].write_text(good.read_text()[: len(good.read_text()) // 2])
    f["version"].write_text(json.dumps({**scheme, "schema_version": 99}))
    f["other_model"].write_text(json.dumps({**scheme, "fingerprint": "0000000000000000"}))
    f["bad_ratio"].write_text(json.dumps({**scheme, "weight_updates": [{**scheme["weight_updates"][0], "ratio": 1.5}]}))
    f["bad_layer"].write_text(
        json.dumps({**scheme, "weight_updates": [{**scheme["weight_updates"][0], "layer": "nope"}]})
    )
    f["bc_range"].write_text(json.dumps({**BC, "manual_weight_idx": [5, 24]}))
    f["notjson"].write_text("{not json")
    f["profile_trunc"].write_text(open("profiles/mcunet-5fps-digits.json").read()[:500])
    f["weights_txt"].write_text("hello")
    torch.save([1, 2, 3], f["weights_list"])
    with open(f["weights_evil"], "wb") as fh:
        pickle.dump(RunsCode(), fh)
    torch.save({"x": torch.zeros(1)}, f["unreadable"])
    os.chmod(f["unreadable"], 0)
    f["npz_bad"].write_bytes(b"PK\x03\x04 broken")
    shipped = json.loads(open(memplan.shipped_scheme("mcunet-5fps-50KB")).read())
    f["scheme_48"].write_text(json.dumps({**shipped, "input_shape": [3, 48, 48]}))  # the fingerprint has no shape
    grid = json.loads(open("profiles/mcunet-5fps-digits.json").read())
    f["fisher"].write_text(
        json.dumps({**grid, "estimator": "fisher", "units": "empirical Fisher (summed squared grads)"})
    )
    cap = memplan.capture("mcunet-5fps", resolution=64, method="tinytl-lb")  # TinyTL-L+B: lite residual branches
    lite = memplan.Scheme.from_plan(cap.graph, memplan.make_plan(cap.graph, "tinytl-lb"), model="mcunet-5fps")
    lite = json.loads(lite.model_dump_json())
    added = lite["added_modules"][0]
    for key, entry in (
        ("lite_edited", {**added, "options": {**added["options"], "lite_kernel": 3}}),  # builds other branches
        ("lite_unknown", {**added, "architecture": "nope"}),
        ("lite_legacy", {"lite_residual": True}),  # free-form, as version 3 allowed it
    ):
        f[key] = d / f"{key}.json"
        f[key].write_text(json.dumps({**lite, "added_modules": [entry]}))
    f["dir"] = d
    return f


def cases(f):
    out = str(f["dir"] / "out.json")
    return [
        (["profile", "mobilenetv9"], "unknown model"),
        (["profile", f"{DATA}:Broken"], "has no attribute"),
        (["profile", "tests/data/missing.py:Net"], "no such file"),
        (["profile", f"{DATA}:NeedsArgs"], "needs arguments"),
        (["profile", f"{DATA}:Untraceable", "-r", "16"], "--leaf Gate"),
        (["profile", f"{DATA}:TupleOut", "-r", "8", "--output", "5"], "no entry"),
        (["search", "--budget", "-1KB"], "-1KB"),
        (["search", "--budget", "1e999"], "too large"),
        (["search", "--budget", "abc"], "cannot read"),
        (["search", "--budget", "100 XB"], "unknown size unit"),
        (["search", "--budget", "100KB", "--select", "nope"], "unknown channel selection"),
        (["search", "--budget", "100KB", "--select", "importance"], "per-channel importance"),
        (["search", "--budget", "10B"], "budget"),
        (["search", "--budget", "100KB", "--profile", str(f["profile_trunc"])], "profile"),
        (["search", "--budget", "100KB", "--profile", str(f["notjson"])], "JSON"),
        (["search", "--target", "toaster"], "toaster"),
        (["search", "--budget", "100KB", "--method", "magic"], "unknown search method"),
        (["search", "--budget", "100KB", "--out", "/nonexistent/dir/s.json"], "does not exist"),
        (["search", "--budget", "100KB", "--validate", "0"], "at least 1 searched candidate"),
        (["search", "--budget", "100KB", "--validate", "2", "--validate-lrs", "0.01,-1"], "must be positive"),
        (["search", "--budget", "100KB", "--validate", "2", "--validate-seeds", "0,0"], "must be distinct"),
        (["search", "--budget", "100KB", "--validate", "2", "--validate-lrs", "1e-2/momentum=0.9"], "unknown param"),
        (["search", "--budget", "100KB", "--validate", "2", "--validate-lrs", "weight=1e-3"], "need a bare rate"),
        (["search", "--budget", "100KB", "--validate", "2", "--validate-workers", "0"], "must be a positive integer"),
        (["search", "--budget", "100KB", "--validate", "2", "--validate-executor", "mpi"], "unknown executor"),
        (["search", "--budget", "100KB", "--validate", "2", "--validate-seeds", "a"], "cannot read --validate-seeds"),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["empty"])], "empty"),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["truncated"])], "JSON"),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["version"])], "schema_version"),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["other_model"])], "layer table differs"),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["bad_ratio"])], "ratio"),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["bad_layer"])], "nope"),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["bc_range"])], "5"),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", "/nonexistent.json"], "nonexistent"),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["lite_edited"])], "lite_residual layers differ"),
        (
            ["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["lite_unknown"])],
            "architecture transform 'nope'",
        ),
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["lite_legacy"])], "added_modules"),
        (
            ["profile", "resnet18", "-m", "sparse", "--scheme", str(f["truncated"]).replace("truncated", "scheme")],
            "layer table differs",
        ),
        (["contrib", "minilearn-cifar10", "--data", "nowhere.npz", "--out", out], "nowhere"),
        (["contrib", "minilearn-cifar10", "--data", str(f["npz_bad"]), "--out", out], "npz"),
        (
            ["contrib", "minilearn-cifar10", "--data", "digits", "--weights", str(f["weights_txt"]), "--out", out],
            "weights",
        ),
        (
            ["contrib", "minilearn-cifar10", "--data", "digits", "--weights", str(f["weights_list"]), "--out", out],
            "state_dict",
        ),
        (
            ["contrib", "minilearn-cifar10", "--data", "digits", "--weights", str(f["weights_evil"]), "--out", out],
            "weights",
        ),
        (
            ["contrib", "minilearn-cifar10", "--data", "digits", "--weights", "/nonexistent.pt", "--out", out],
            "nonexistent",
        ),
        (["contrib", "minilearn-cifar10", "--data", "digits", "--executor", "slurm", "--out", out], "slurm"),
        (["contrib", "minilearn-cifar10", "--data", "digits", "--estimator", "nope", "--out", out], "estimator"),
        (["contrib", "minilearn-cifar10", "--data", "digits", "--batches", "0", "--out", out], "batches"),
        (["contrib", "minilearn-cifar10", "--data", "digits", "--split-seed", "-1", "--out", out], "seed"),
        (["profile", "mcunet-5fps", "--json", "/nonexistent/dir/p.json"], "does not exist"),
        (["verify", "mcunet-5fps", "--steps", "0"], "--steps"),
        (["compare", "mcunet-5fps", "--methods", "full,lastk:x"], "lastk:x"),
        # issue 27: a model without a shipped profile names --profile and the command that makes one
        (["search", f"{DATA}:TinyNet", "--budget", "100KB", "-r", "32"], "--profile profile.json"),
        (["search", f"{DATA}:TinyNet", "--budget", "100KB", "-r", "32"], "memplan contrib"),
        # a shipped scheme is taken by name; a name that is neither is one line listing the shipped ones
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", "mcunet-5fps-9KB"], "mcunet-5fps-100KB"),
        # mobiletl's options are -o key=value (as `memplan methods` lists them), not flags
        (["profile", "mobilenetv3-small", "-m", "mobiletl", "--full-norms", "true"], "no such option"),
        # a model sized for 32x32 does not run at the assumed 224 px: the error says it was assumed
        (["profile", f"{DATA}:Cifar"], "traced at the assumed 3x224x224 (give --input-shape"),
    ]


def test_catalogue_has_at_least_30_cases(files):
    assert len(cases(files)) >= 30


def test_every_bad_input_is_one_line_exit_2_no_traceback_no_output(files, capsys):
    out = files["dir"] / "out.json"
    problems = []
    for args, needle in cases(files):
        with pytest.raises(SystemExit) as exc:
            main(args)
        cap = capsys.readouterr()
        lines = [line for line in cap.err.splitlines() if line.strip()]
        ok = (
            exc.value.code == 2
            and len(lines) == 1
            and lines[0].startswith("error: ")
            and needle.lower() in lines[0].lower()
            and "Traceback" not in cap.err + cap.out
            and not out.exists()
            and not [p for p in os.listdir(files["dir"]) if p.endswith(".tmp")]
        )
        if not ok:
            problems.append((args[:4], exc.value.code, cap.err.strip()[-300:]))
    assert not problems, "\n".join(map(str, problems))
    assert not os.path.exists("/tmp/memplan-pwned")


def test_ctrl_c_during_contrib_exits_130_without_partial_profile(tmp_path):
    out = tmp_path / "p.json"
    # SIGINT handled the default way in the child, as in a terminal: a CI job started in the
    # background (``cmd &``, nohup) inherits an ignored SIGINT, and Python keeps it ignored
    proc = subprocess.Popen(
        [sys.executable, "-m", "memplan", "contrib", "minilearn-cifar10", "--data", "digits", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MEMPLAN_NUM_THREADS": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    time.sleep(6)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 130, err
    assert lines[-1] == "error: interrupted" and "Traceback" not in err
    assert not out.exists()


# ----------------------------------------------------------------------------- the CLI tells the truth
# issue 27: what a new user's first hour met besides errors. Each row: arguments, then texts that must
# appear in stdout / stderr (whitespace and line wrapping ignored) and texts that must not; exit 0.
def truths(f) -> list[tuple[list[str], list[str], list[str], list[str]]]:
    from memplan.modes import MODES

    return [
        (["--version"], [f"memplan {memplan.__version__}"], [], []),
        # options are spelt as the command line takes them: flags where profile has one, else -o key=VALUE, once
        (
            ["methods"],
            ["mobiletl --blocks -o full_norms=VALUE -o train_main=VALUE", "minilearn -o cut=VALUE --samples"],
            [],
            ["--full-norms", "--cut"],
        ),
        (["profile", "--help"], list(MODES), [], []),
        (["compare", "--help"], list(MODES), [], []),
        # a file model without --input-shape: which shape was assumed
        (["profile", f"{DATA}:TinyNet"], ["input 3x224x224"], ["warning:", "assumed 3x224x224", "--input-shape"], []),
        # the given shape is the one used, by the lite residual transform too
        (
            ["profile", f"{DATA}:Cifar", "--input-shape", "3,32,32", "-m", "tinytl-l"],
            ["input 3x32x32"],
            [],
            ["warning"],
        ),
        (
            ["profile", f"{DATA}:Cifar", "--input-shape", "3,32,32", "-o", "lite=true"],
            ["input 3x32x32"],
            [],
            ["warning"],
        ),
        # a scheme's recorded input shape (48 px here; the zoo's is 128), and a shipped scheme by name
        (["profile", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["scheme_48"])], ["input 3x48x48"], [], []),
        (
            ["verify", "mcunet-5fps", "-m", "sparse", "--scheme", str(f["scheme_48"]), "--steps", "1"],
            ["input 2x3x48x48"],
            [],
            [],
        ),
        (
            ["profile", "mcunet-5fps", "-m", "sparse", "--scheme", "mcunet-5fps-100KB"],
            ["mcunet-5fps-100KB.json", "input 3x128x128"],
            [],
            [],
        ),
        # search: classifier only and why (the README quotes this), the budget's convention, the
        # scheme's applied / pytorch cost at the training batch, and how to save it
        (
            ["search", "--budget", "100KB"],
            [
                "scheme (exact): biases of the last",
                "budget convention: tinytraining mode",
                "at the profile's training batch 64: applied mode",
                "stm32f746: training peak",
                "not saved: add --out",
            ],
            [],
            ["biases of the last 0 convs"],
        ),
    ]


def _flat(text: str) -> str:
    return re.sub(r"-\s+(?=\w)", "-", " ".join(text.split()))  # rich / click wrap lines, also at hyphens


def test_the_cli_tells_the_truth(files, capsys):
    problems = []
    for args, out_has, err_has, absent in truths(files):
        with pytest.raises(SystemExit) as exc:
            main(args)
        cap = capsys.readouterr()
        out, err = _flat(cap.out), _flat(cap.err)
        missing = [t for t in out_has if _flat(t) not in out] + [t for t in err_has if _flat(t) not in err]
        present = [t for t in absent if t in out + err]
        if exc.value.code != 0 or missing or present:
            problems.append((args[:5], exc.value.code, missing, present, cap.err.strip()[-300:]))
    assert not problems, "\n".join(map(str, problems))


def test_search_plot_axis_names_the_profile_units(files):
    """A fisher profile's entries are no Δacc: the Figure 13 axis says what they are."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from memplan.render.figures import _figure13
    from memplan.search.run import run_search

    labels = {}
    for name, path in (("grid", "profiles/mcunet-5fps-digits.json"), ("fisher", files["fisher"])):
        r = run_search("mcunet-5fps", "100KB", profile_path=path, curves=True, generations=2, population=6)
        fig, ax = plt.subplots()
        _figure13(ax, r)
        labels[name] = ax.get_ylabel()
        plt.close(fig)
    assert labels["grid"] == "best summed Δacc, objective lcb"
    assert "Δacc" not in labels["fisher"] and "empirical Fisher" in labels["fisher"]
