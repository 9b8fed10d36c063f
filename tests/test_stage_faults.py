"""The validation stage of ``memplan search --validate`` under faults (issue 40, item 8), and its
one library call (``memplan.search.command.search_and_validate``): a bad folder, executor or
checkpoint is refused in one line before any work; two runs on one folder train every run once;
one seed says it has no error bar; a model given as ``file.py:attr`` trains on pool workers; a
kill during an output write leaves no temporary file once the output is written again; without
``--out`` the validated scheme is written where the output says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from memplan.cli import main
from memplan.contrib.checkpoint import Checkpoint
from memplan.errors import MemplanError
from memplan.io import write_text
from memplan.plan import load_scheme
from memplan.search.stage import CHECKPOINT, RUN_FIELDS

from .test_real import make_npz, tiny_profile

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "MEMPLAN_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}

TINY_NET = """
import torch.nn as nn


class TinyNet(nn.Module):
    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.b1 = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.b2 = nn.BatchNorm2d(8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.b1(self.c1(x)).relu()
        x = self.b2(self.c2(x)).relu()
        return self.fc(self.pool(x).flatten(1))
"""


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    return tiny_profile(tmp_path_factory.mktemp("stage"), seeds=(0, 1))[1]


def stage_args(profile: Path, folder: Path, *more: str) -> list[str]:
    """``memplan search`` with a cheap validation stage (one searched candidate, one rate)."""
    return [
        "search", "minilearn-cifar10", "--budget", "30KB", "--profile", str(profile), "--validate", "1",
        "--validate-lrs", "0.01", "--validate-dir", str(folder), *more,
    ]  # fmt: skip


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``memplan ARGS`` in this process."""
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def one_line_error(code: int, err: str, needle: str) -> bool:
    lines = [line for line in err.splitlines() if line.strip()]
    return code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]


def test_without_out_the_validated_scheme_is_written_in_the_folder_and_said_where(profile, tmp_path, capsys):
    folder = tmp_path / "val"
    code, out, err = run_cli(stage_args(profile, folder, "--validate-seeds", "0"), capsys)
    assert code == 0, err
    written = folder / "minilearn-cifar10-30KB.scheme.json"
    assert f"validated scheme written to {written}" in " ".join(out.split())
    scheme = load_scheme(written)
    assert scheme.validation is not None and scheme.training is not None and scheme.validation.seeds == [0]
    # one seed: no "± 0.00" as if it were a measured standard error; it says there is none
    assert "± 0.00" not in out and "no error bar" in out


def test_validate_dir_naming_a_file_is_one_line(profile, tmp_path, capsys):
    file = tmp_path / "not-a-folder"
    file.write_text("x")
    code, _, err = run_cli(stage_args(profile, file), capsys)
    assert one_line_error(code, err, "is a file, not a folder"), err
    assert file.read_text() == "x"


def test_an_unknown_choice_rule_is_one_line_before_any_work(profile, tmp_path, capsys):
    folder = tmp_path / "val"
    code, _, err = run_cli([*stage_args(profile, folder), "--validate-rule", "luck"], capsys)
    assert one_line_error(code, err, "unknown choice rule 'luck'"), err
    assert not (folder / CHECKPOINT).exists()


def test_an_unknown_size_rule_is_one_line_before_any_work(profile, tmp_path, capsys):
    folder = tmp_path / "val"
    code, _, err = run_cli([*stage_args(profile, folder), "--validate-sizes", "every"], capsys)
    assert one_line_error(code, err, "unknown size rule 'every'"), err
    assert "ladder" in err and not (folder / CHECKPOINT).exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_missing_ray_is_refused_before_any_work(profile, tmp_path, capsys, monkeypatch, workers):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    from memplan.search import run as search_run

    searched = []
    monkeypatch.setattr(search_run, "_start", lambda *a: searched.append(a))  # any search would be recorded
    folder = tmp_path / "val"
    args = stage_args(profile, folder, "--validate-executor", "ray", "--validate-workers", workers)
    code, _, err = run_cli(args, capsys)
    assert one_line_error(code, err, "needs ray"), err
    assert not searched and not folder.exists()


def test_read_only_checkpoint_is_refused_before_training(profile, tmp_path, capsys, monkeypatch):
    folder = tmp_path / "val"
    code, _, err = run_cli(stage_args(profile, folder, "--validate-seeds", "0"), capsys)
    assert code == 0, err
    ckpt = folder / CHECKPOINT
    before = ckpt.read_bytes()
    ckpt.chmod(0o444)
    from memplan.contrib.runner import SchemeRun

    trained = []
    monkeypatch.setattr(SchemeRun, "run_on", lambda self, worker: trained.append(self.id))
    # a second seed needs new runs: refused before the first one trains (none is lost)
    code, _, err = run_cli(stage_args(profile, folder, "--validate-seeds", "0,1"), capsys)
    assert one_line_error(code, err, f"cannot write checkpoint {ckpt}"), err
    assert not trained and ckpt.read_bytes() == before


BAD_LINES = [
    ("[1, 2]", "a JSON list, not an object"),
    ('"text"', "a JSON str, not an object"),
    ('{"run": 5}', 'not a {"run": {...}} record'),
    ('{"run": {"accuracy": 50.0, "final_loss": 0.5}}', "'id'"),
    ('{"run": {"id": "x", "accuracy": "high", "final_loss": 0.5}}', "'accuracy'"),
    ('{"run": {"id": "x", "accuracy": 50.0}}', "'final_loss'"),
    ('{"run": {"id": 3, "accuracy": 50.0, "final_loss": 0.5}}', "'id'"),
    ("{not json", "not JSON"),
]


@pytest.mark.parametrize("line,why", BAD_LINES)
def test_checkpoint_line_of_the_wrong_shape_names_file_and_line(tmp_path, line, why):
    path = tmp_path / CHECKPOINT
    good = json.dumps({"run": {"id": "a", "accuracy": 50.0, "final_loss": 0.5}})
    path.write_text("\n".join([json.dumps({"identity": {"k": 1}}), good, line, good]) + "\n")
    with pytest.raises(MemplanError) as exc:
        Checkpoint(path, {"k": 1}, RUN_FIELDS).finished()
    assert f"checkpoint {path} is corrupt at line 3" in exc.value.message and why in exc.value.message
    header = tmp_path / "header.jsonl"
    header.write_text('{"identity": 3}\n' + good + "\n")
    with pytest.raises(MemplanError, match="at line 1: its identity is not an object"):
        Checkpoint(header, {"k": 1}, RUN_FIELDS).finished()


def test_checkpoint_of_the_wrong_shape_through_the_cli_is_one_line(profile, tmp_path, capsys):
    folder = tmp_path / "val"
    code, _, err = run_cli(stage_args(profile, folder, "--validate-seeds", "0"), capsys)
    assert code == 0, err
    ckpt = folder / CHECKPOINT
    lines = ckpt.read_text().splitlines()
    lines[1] = json.dumps({"run": {"accuracy": 50.0, "final_loss": 0.5}})  # valid JSON, no id
    ckpt.write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(stage_args(profile, folder, "--validate-seeds", "0"), capsys)
    assert one_line_error(code, err, f"checkpoint {ckpt} is corrupt at line 2"), err


def test_two_runs_on_one_folder_train_each_run_once(profile, tmp_path):
    """Two processes at once on one --validate-dir: the folder's lock makes the second wait and
    reuse the first's runs: every run id is trained (written) once, and both choose the same."""
    folder = tmp_path / "val"
    procs = []
    for name in ("a", "b"):
        args = stage_args(profile, folder, "--validate-seeds", "0,1", "--out", str(tmp_path / f"{name}.json"))
        args[args.index("1")] = "2"  # --validate 2
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "memplan", *args], env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err.decode()[-2000:]
    rows = [json.loads(x) for x in (folder / CHECKPOINT).read_text().splitlines()]
    ids = [r["run"]["id"] for r in rows[1:]]
    assert len(rows[0]) == 1 and "identity" in rows[0] and ids and len(ids) == len(set(ids))
    a, b = load_scheme(tmp_path / "a.json"), load_scheme(tmp_path / "b.json")
    assert a.validation == b.validation and a.training == b.training


def test_a_model_given_as_a_file_trains_on_pool_workers(tmp_path, capsys, monkeypatch):
    """``file.py:attr`` (the tutorial's form) with parallel workers: the model's class is defined in
    a module only this process imported; the workers import the file again (contrib measure -j 2,
    then search --validate-workers 2 on that profile)."""
    monkeypatch.setenv("MEMPLAN_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    Path("tiny_net.py").write_text(TINY_NET)
    make_npz(tmp_path / "task.npz", n=30, side=16)
    measure = [
        "contrib", "measure", "tiny_net.py:TinyNet", "--data", "task.npz", "--estimator", "grid", "-j", "2",
        "--seeds", "0", "--epochs", "1", "--batch-size", "8", "--validation", "4", "--out", "profile.json",
    ]  # fmt: skip
    code, out, err = run_cli(measure, capsys)
    assert code == 0 and "Traceback" not in out + err, err
    search = [
        "search", "tiny_net.py:TinyNet", "--budget", "50KB", "--profile", "profile.json", "--validate", "2",
        "--validate-workers", "2", "--validate-lrs", "0.01", "--validate-seeds", "0", "--validate-dir", "val",
        "--out", "scheme.json",
    ]  # fmt: skip
    code, out, err = run_cli(search, capsys)
    assert code == 0 and "Traceback" not in out + err, err
    scheme = load_scheme(tmp_path / "scheme.json")
    assert scheme.validation is not None and scheme.validation.runners_up


def test_a_kill_during_an_output_write_leaves_no_temporary_file(tmp_path):
    """A writer killed (SIGKILL) between writing its temporary file and renaming it leaves
    ``.NAME.PID.XXXX.tmp``; the next write of that output removes it (its writer is gone), never
    another live writer's."""
    target = tmp_path / "scheme.json"
    ready = tmp_path / "ready"
    code = (
        "import os, sys, time; import memplan.io as io\n"
        f"os.fsync = lambda fd: (open({str(ready)!r}, 'w').close(), time.sleep(120))\n"
        f"io.write_text({str(target)!r}, 'partial')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV)
    deadline = time.time() + 60
    while not ready.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert ready.exists()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)

    def temps() -> list[str]:
        return [p for p in os.listdir(tmp_path) if p.startswith(".scheme.json.") and p.endswith(".tmp")]

    assert len(temps()) == 1 and not target.exists()  # the kill left one behind
    live = tmp_path / f".scheme.json.{os.getpid()}.abcd1234.tmp"  # a live writer's (this process)
    live.write_text("")
    write_text(target, "whole")
    assert target.read_text() == "whole" and temps() == [live.name]


def test_one_library_call_reads_the_profile_once(profile, tmp_path, monkeypatch):
    """``search_and_validate``: the search, its further searches, the applied-mode cost and the stage
    all use the one profile read; what it returns is what the command prints and writes."""
    import ast

    from memplan.search.command import search_and_validate
    from memplan.search.options import SearchCommand

    reads = []
    read_text = Path.read_text

    def counted(self, *a, **kw):
        if self.resolve() == profile.resolve():
            reads.append(self)
        return read_text(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", counted)
    opts = SearchCommand.of(
        budget="30KB", profile_path=profile, validate_candidates=2, validate_lrs=("0.01",), validate_seeds=(0,),
        validate_dir=tmp_path / "val", out=tmp_path / "scheme.json",
    )  # fmt: skip
    done = search_and_validate("minilearn-cifar10", opts)
    assert len(reads) == 1
    assert done.out == str(tmp_path / "scheme.json") and load_scheme(done.out) == done.scheme
    assert done.scheme.validation.name == done.validated.chosen.name and done.applied is not None
    assert set(done.applied.totals) == {"applied", "pytorch"} and done.applied.batch == 8  # the profile's batch
    # the command only renders: no function (a search closure) defined inside it
    tree = ast.parse((ROOT / "memplan" / "cli_search.py").read_text())
    (command,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "search"]
    assert not [n for n in ast.walk(command) if isinstance(n, (ast.FunctionDef, ast.Lambda)) and n is not command]


def test_ray_with_one_worker_is_not_ignored(profile, tmp_path, capsys, monkeypatch):
    """``--validate-executor ray --validate-workers 1``: the runs go to the executor (a cluster may
    hold that one worker), not silently into this process. The executor is stood in for by one
    that runs them here and records where it was asked to."""
    from memplan.contrib import executors
    from memplan.search import stage

    asked = []

    def fake_execute(ctx, specs, *, workers, executor, address, key):
        asked.append((executor, workers, len(specs)))
        return executors.run_here(ctx, specs)

    monkeypatch.setattr(stage, "execute", fake_execute)
    code, _, err = run_cli(stage_args(profile, tmp_path / "val", "--validate-executor", "ray"), capsys)
    assert code == 0, err
    assert asked and all(executor == "ray" and workers == 1 for executor, workers, _ in asked)
    ids = [json.loads(x)["run"]["id"] for x in (tmp_path / "val" / CHECKPOINT).read_text().splitlines()[1:]]
    assert sum(n for *_, n in asked) == len(ids) == len(set(ids))


def test_a_read_only_checkpoint_is_refused_by_every_writer(tmp_path):
    """``Checkpoint.writable``: what the stage, contribution analysis and the additivity check call
    before any run trains; a failed append is one line too, never a PermissionError."""
    path = tmp_path / "runs.jsonl"
    ckpt = Checkpoint(path, {"k": 1}, RUN_FIELDS)
    ckpt.writable()  # a new file in a writable folder
    ckpt.start()
    path.chmod(0o444)
    with pytest.raises(MemplanError, match=f"cannot write checkpoint {path}: read-only") as exc:
        ckpt.writable()
    assert "\n" not in str(exc.value)
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(MemplanError, match="cannot write checkpoint"):
        Checkpoint(tmp_path / "dir.jsonl", {}).append({"id": "a"})
