"""The cheap form of benchmarks/transfer.py that CI runs: a tiny task, a few methods (a searched
scheme among them), two seeds. It checks that the pipeline, the checkpoint, the table and the
plot are produced and that a rerun resumes; it asserts no accuracy (those depend on the CPU).
The statistics it reports (Student-t CI, Pareto front) are checked against hand computations.
Every run reads a protocol file (written here, as the committed ones are); the benchmark refuses
to run without one, and no choice is ever made on a test seed."""

import hashlib
import json
import math
import os
import statistics
import sys
from pathlib import Path

import pytest
import torch

from memplan.errors import MemplanError
from memplan.plan import Validation
from memplan.rates import Rates

from .helpers import load_benchmark
from .test_real import tiny_profile

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def transfer():
    return load_benchmark("transfer")


#: the tiny protocol of these tests (``protocol`` changes fields)
TINY = dict(
    model="minilearn-cifar10", weights="none", data="", resolution=32, train_per_class=6, validation=4,
    test_per_class=None, epochs=1, batch_size=8, optimizer="adam", lrs=["0.01"], seeds=[0, 1], val_seeds=[100, 101],
    probe_epochs=1, probe_lr=0.01, profile=None, budgets=[], validate_candidates=2, stage_lrs=["0.01"], widen=0,
    ties="smaller rate", notes=[],
)  # fmt: skip


def protocol(path, **fields) -> str:
    """A protocol file at ``path`` (TINY with ``fields``); its path as text."""
    path.write_text(json.dumps({**TINY, **fields}))
    return str(path)


def test_mean_ci_is_the_student_t_interval(transfer):
    xs = [80.0, 82.0, 84.0]
    mean, half = transfer.mean_ci(xs)
    # t(0.975, df=2) = 4.302652729911275; sample std = 2; n = 3
    assert mean == 82.0 and half == pytest.approx(4.302652729911275 * 2 / math.sqrt(3))
    assert transfer.mean_ci([70.0]) == (70.0, 0.0)


def test_pareto_front_keeps_what_nothing_cheaper_beats(transfer):
    rows = [
        {"name": "a", "memory_bytes": 10, "accuracy_mean": 80.0},
        {"name": "b", "memory_bytes": 20, "accuracy_mean": 79.0},  # dominated by a
        {"name": "c", "memory_bytes": 30, "accuracy_mean": 85.0},
        {"name": "d", "memory_bytes": 30, "accuracy_mean": 84.0},  # dominated by c (same memory)
        {"name": "e", "memory_bytes": 40, "accuracy_mean": 85.0},  # dominated by c (more memory, same accuracy)
    ]
    assert transfer.pareto_front(rows) == ["a", "c"]


def test_methods_whose_names_hold_commas_can_be_chosen(transfer):
    names = {"norm + bias", "norm + bias, running statistics", "norm + bias, re-estimated statistics", "MobileTL"}
    got = transfer.split_names("norm + bias, re-estimated statistics,MobileTL", names)
    assert got == {"norm + bias, re-estimated statistics", "MobileTL"}
    assert transfer.split_names("norm + bias,MobileTL", names) == {"norm + bias", "MobileTL"}
    with pytest.raises(MemplanError, match="unknown method 'nope'"):
        transfer.split_names("MobileTL,nope", names)


def test_the_report_says_why_a_method_is_not_in_the_table(transfer, tmp_path):
    header = {
        "model": "m", "data": "d", "description": "", "optimizer": "adam", "batch": 32, "input": "3x64x64",
        "seeds": [0, 1, 2], "val_seeds": [0, 1], "lrs": ["0.01"], "machine": "x",
    }  # fmt: skip
    a = transfer.parse_args(
        ["--protocol", protocol(tmp_path / "p.json", lrs=["0.01", "0.1"], seeds=[0, 1, 2], val_seeds=[100])]
    )
    method = transfer.strategy_method("full fine-tuning", "full fine-tuning", "full")
    run = lambda lr, seed, diverged, stage="grid": {  # noqa: E731
        transfer.run_id(stage, method.key, Rates.parse(lr), seed): {"accuracy": 50.0, "diverged": diverged}
    }
    assert transfer.left_out(method, a, {}) == "not trained"
    assert transfer.left_out(method, a, run("0.01", 100, False)) == "learning-rate grid under way (1 runs finished)"
    both = run("0.01", 100, True) | run("0.1", 100, True)
    assert transfer.left_out(method, a, both) == "every rate it trained diverged"
    done = run("0.01", 100, False) | run("0.1", 100, True) | run("0.01", 2, False, "final")
    assert transfer.left_out(method, a, done) == "1 of 3 test seeds finished"
    missing = [
        {"name": "full fine-tuning", "memory_bytes": 279_124_196, "status": "not trained"},
        {"name": "validated 30MB", "memory_bytes": None, "status": "its validation stage is not finished"},
    ]
    assert (
        "Not in the table: full fine-tuning (279,124,196 B; not trained); validated 30MB (its validation stage is "
        "not finished)" in transfer.markdown([], header, [], [], missing)
    )


def check_report_rebuilds_rows(transfer, argv: list[str], rows: list[dict]) -> None:
    """``--report`` rebuilds every row from the checkpoint alone, the stage's too (under --methods its
    candidates' runs are keyed as in training, over every method, kept or not)."""
    assert transfer.main([*argv, "--report"])["rows"] == rows
    # each row records what it trains: rebuilt from that alone, it trains the same tensors and costs the
    # same bytes (what a reader of the report, benchmarks/joint_plan.py, rebuilds plans from)
    runs = sys.modules["transfer_runs"]
    run = transfer.start(transfer.parse_args([*argv, "--report"]))
    transfer.choose_methods(run)
    by_name = {m.name: m for m in run.methods}
    graph = run.cap_at(None, 1).graph
    for r in rows:
        rebuilt = runs.method_of(r)
        assert runs.what_trains(rebuilt, graph) == runs.what_trains(by_name[r["name"]], graph)
        assert runs.memory_of(run.cap_at, rebuilt, "adam", 8) == r["memory"]


def check_replay(result: dict) -> None:
    """The replayed rule's row chose by that rule on the stage's runs and is judged apart from the verdicts."""
    replay = next(r for r in result["rows"] if r["name"] == "validated 300KB [rule resolved]")
    assert replay["rule"] == replay["validation"]["rule"] == "resolved" and replay["stage_runs"] > 0
    assert [c["name"] for c in result["replayed_rules"]["resolved"]["comparisons"]] == [replay["name"]]
    assert [c["name"] for c in result["comparisons"]] == ["validated 300KB"]


def test_cheap_form_runs_end_to_end_and_resumes(transfer, tmp_path, monkeypatch):
    npz, profile = tiny_profile(tmp_path, seeds=(0, 1))
    out = tmp_path / "bench"
    points = ["0.001", "0.01", "0.01/weight=0.001"]
    fields = dict(
        data=str(npz), lrs=points, stage_lrs=points, profile=str(profile), budgets=["300KB"], validate_candidates=2
    )
    argv = [
        "--protocol", protocol(tmp_path / "protocol.json", **fields),
        "--methods", "classifier only,bias only,last-1 weights+biases,searched + validated",
        "--out", str(out), "--no-progress",
    ]  # fmt: skip
    result = transfer.main(argv)
    names = {r["name"] for r in result["rows"]}
    # the protocol's rule (absent: best) makes the verdicts; the other rule is replayed on the same runs
    assert names == {
        "classifier only", "bias only", "last-1 weights+biases", "validated 300KB", "validated 300KB [rule resolved]"
    }  # fmt: skip
    assert not result["missing"]
    check_replay(result)
    for r in result["rows"]:
        # a per-family point is its own setting only for a method that trains weights; for the others it is
        # the uniform 0.01 (the weights' rate of a model whose weights are frozen changes nothing)
        trains_weights = r["name"] == "last-1 weights+biases" or bool(r.get("weights"))
        grid = {"0.001", "0.01"} | ({"0.01/weight=0.001"} if trains_weights else set())
        assert len(r["accuracy"]) == 2 and r["lr"] in grid and r["memory_bytes"] > 0
        if not r["name"].startswith("validated 300KB"):
            assert set(r["grid_validation"]) == grid
            # successive halving: every point at the first seed, the better half (at least two) at the second
            assert all(accs for accs in r["grid_validation"].values())
            assert sum(len(accs) == 2 for accs in r["grid_validation"].values()) == 2
        assert r["memory_bytes"] == r["memory"]["applied"] and set(r["memory"]) == {"applied", "tinytraining"}
        assert r["accuracy_std"] == pytest.approx(statistics.stdev(r["accuracy"]))
    chosen = next(r for r in result["rows"] if r["name"] == "validated 300KB")
    assert chosen["memory"]["applied"] <= 300_000 and chosen["chosen"]
    val = chosen["validation"]
    # never worse on validation than a baseline that fits (the stage's guarantee), on the same seeds
    assert all(
        val["accuracy"] >= x["accuracy"] for x in val["runners_up"] if x["baseline"] and x["seeds"] == val["seeds"]
    )
    assert any(x["name"] == "classifier only" for x in val["runners_up"] + [{"name": chosen["chosen"]}])
    assert any("validated 300KB" in v for v in result["verdicts"])
    rows = {r["name"]: r for r in result["rows"]}
    for r in result["rows"]:
        if r["same_runs_as"] is not None:
            assert r["accuracy"] == rows[r["same_runs_as"]]["accuracy"]
    check_report_rebuilds_rows(transfer, argv, result["rows"])
    table = (out / "transfer.md").read_text()
    assert "| method | applied (B) | tinytraining (B) |" in table and "adam" in table
    check_stage_lines(result, Validation(**val), table)
    assert (out / "transfer.png").stat().st_size > 10_000
    assert json.loads((out / "transfer.json").read_text())["rows"] == result["rows"]
    # rerunning trains nothing: every run comes from the checkpoint
    monkeypatch.setattr(transfer.Bench, "run", lambda *a, **k: pytest.fail("trained again"))
    again = transfer.main(argv)
    assert again["rows"] == result["rows"]
    # widening the grid keeps every finished run: only the new rate's grid runs (and the seeds of a
    # method whose best rate changed) train
    calls = []
    monkeypatch.setattr(
        transfer.Bench,
        "run",
        lambda self, m, lr, seed, split: (
            calls.append((lr, split))
            or dict(accuracy=0.0, diverged=True, train_s=0.0, eval_s=0.0, cache_s=0.0, cpu_s=0.0, trainable_params=0)
        ),
    )
    wider = list(argv)
    wider[1] = protocol(tmp_path / "wider.json", **{**fields, "lrs": [*points, "0.1"]})
    key = lambda rows: [(r["name"], r["lr"], r["accuracy"]) for r in rows]  # noqa: E731
    assert key(transfer.main(wider)["rows"]) == key(result["rows"])  # the new rate diverged: same choices
    distinct = [r for r in result["rows"] if r["same_runs_as"] is None]  # a method that trains what another does
    assert calls == [(Rates.uniform(0.1), "validation")] * len(distinct)  # shares its runs
    bad = list(argv)
    bad[bad.index("--methods") + 1] = "magic"
    with pytest.raises(MemplanError, match="unknown method 'magic'"):
        transfer.main(bad)


def check_stage_lines(result: dict, val: Validation, table: str) -> None:
    """The report's stage line gives the chosen scheme's margin over the best baseline, and the line
    after the stages how far validation strays from test over the methods' rows (three here; a
    stage's row is its candidate's runs and does not count again)."""
    margin = val.margin()
    assert margin is None or f"{margin.baseline}: {margin.points:+.2f} ± {margin.se:.2f} points (SE)," in table
    # the split's size, as the report's description of the task counts it
    assert f"{val.images} validation images carved from the training data" in result["description"]
    assert margin is None or f"its {val.images:,} images alone give that difference up to" in table
    strays = result["validation_error"]
    assert strays["rows"] == 3 and f"errs by {strays['sd']:.2f} points (SD)" in table


@pytest.mark.slow
def test_the_stage_trains_tinytl_as_the_benchmarks_tinytl(transfer, tmp_path):
    """A candidate that adds modules (TinyTL's lite residual branches) trains on the transformed
    model, as the benchmark's own TinyTL method: the stage and the baseline share its runs. (Slow:
    the cheaper form that runs by default is tests/test_validate_stage.py's TinyTL validation.)"""
    npz, profile = tiny_profile(tmp_path, "mcunet-5fps", resolution=32)
    out = tmp_path / "bench"
    fields = dict(
        model="mcunet-5fps",
        data=str(npz),
        val_seeds=[100],
        seeds=[0],
        profile=str(profile),
        budgets=["50MB"],
        validate_candidates=1,
    )
    argv = [
        "--protocol", protocol(tmp_path / "protocol.json", **fields), "--methods", "validated 50MB",
        "--out", str(out), "--no-progress",
    ]  # fmt: skip
    transfer.main(argv)  # the stage alone: the TinyTL baseline itself is not run
    ids = [json.loads(x)["run"]["id"] for x in (out / "transfer.runs.jsonl").read_text().splitlines()[1:]]
    assert "grid|TinyTL lite-residual + bias|0.01|100" in ids  # the stage's TinyTL run is the baseline's


def test_a_run_another_process_finished_meanwhile_is_not_trained_again(transfer, tmp_path, monkeypatch):
    """Processes that share a checkpoint (workers; a stage beside a method that trains the same runs)
    read it before every run: a seed another process finished while this one trained is skipped
    (the test seeds are trained from the last: ``transfer_runs.obtain_all``)."""
    npz, _ = tiny_profile(tmp_path)
    out = tmp_path / "bench"
    argv = [
        "--protocol", protocol(tmp_path / "protocol.json", data=str(npz), val_seeds=[100], seeds=[0, 1, 2]),
        "--methods", "classifier only", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    ckpt = out / "transfer.runs.jsonl"
    trained = []

    def run(self, m, lr, seed, split):
        trained.append((split, seed))
        if (split, seed) == ("test", 2):  # meanwhile, another process finishes seed 1
            other = dict(id="final|classifier only|0.01|1", accuracy=50.0, diverged=False, trainable_params=0)
            times = dict(train_s=0.0, eval_s=0.0, cache_s=0.0, cpu_s=0.0)
            with open(ckpt, "a") as f:
                f.write(json.dumps({"run": {**other, **times}}) + "\n")
        return dict(accuracy=40.0, diverged=False, train_s=0.0, eval_s=0.0, cache_s=0.0, cpu_s=0.0, trainable_params=0)

    monkeypatch.setattr(transfer.Bench, "run", run)
    result = transfer.main(argv)
    assert trained == [("validation", 100), ("test", 2), ("test", 0)]
    assert result["rows"][0]["accuracy"] == [40.0, 50.0, 40.0]


#: a process that takes the lock on argv[1] (as memplan.io.exclusive does), says so, then (with argv[2])
#: appends a finished run to the checkpoint argv[2] and leaves, or holds the lock until killed
HOLDER = """
import fcntl, json, sys, time
f = open(sys.argv[1], "a+b")
fcntl.flock(f.fileno(), fcntl.LOCK_EX)
print("held", flush=True)
if len(sys.argv) > 2:
    time.sleep(0.3)
    with open(sys.argv[2], "a") as c:
        c.write(json.dumps({"run": json.loads(sys.argv[3])}) + "\\n")
    sys.exit(0)
time.sleep(60)
"""


def hold(path, *finish):
    """A process holding the claim ``path`` (:data:`HOLDER`), once it holds it."""
    import subprocess
    import sys

    argv = [sys.executable, "-c", HOLDER, str(path), *map(str, finish)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_job_another_live_worker_holds_is_left_to_it(transfer, tmp_path, monkeypatch):
    """Workers take the jobs in turn: a method whose job claim another live process holds is not
    trained here (its runs are that worker's), and the rest are."""
    npz, _ = tiny_profile(tmp_path)
    out = tmp_path / "bench"
    argv = [
        "--protocol", protocol(tmp_path / "protocol.json", data=str(npz), val_seeds=[100], seeds=[0]),
        "--methods", "classifier only,bias only", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    trained = []

    def run(self, m, lr, seed, split):
        trained.append(m.name)
        return dict(accuracy=40.0, diverged=False, train_s=0.0, eval_s=0.0, cache_s=0.0, cpu_s=0.0, trainable_params=0)

    monkeypatch.setattr(transfer.Bench, "run", run)
    (out / "claims").mkdir(parents=True)
    other = hold(out / "claims" / hashlib.sha1(b"job bias only").hexdigest()[:16])
    try:
        result = transfer.main(argv)
    finally:
        other.kill()
        other.wait()
    assert set(trained) == {"classifier only"} and [r["name"] for r in result["rows"]] == ["classifier only"]


def test_job_order_completes_each_budget_before_the_next(transfer):
    """Budget by budget, the smallest first (whatever order the protocol lists them in): the methods
    that fit it and no smaller one, then its stage; a budget without a stage has only its methods;
    the methods that fit no budget last, each group in the methods' order."""
    from types import SimpleNamespace

    own = [SimpleNamespace(name=n) for n in ("full", "head", "mid", "small", "big")]
    applied = {"full": 90_000, "head": 10, "mid": 25_000, "small": 12, "big": 31_000}
    names = lambda jobs: [j if isinstance(j, str) else j.name for j in jobs]  # noqa: E731
    assert names(transfer.job_order(own, applied, ["30kB", "20B", "25kB"], ["20B", "30kB"])) == [
        "head", "small", "20B", "mid", "30kB", "full", "big"]  # fmt: skip
    assert names(transfer.job_order(own, applied, [], [])) == ["full", "head", "mid", "small", "big"]
    assert names(transfer.job_order(own, applied, ["30kB", "20B"], ["30kB"], rest=False)) == [
        "head", "small", "mid", "30kB"]  # fmt: skip


def test_jobs_run_the_methods_that_fit_then_the_stages_then_the_rest(transfer, tmp_path, monkeypatch):
    """The verdicts' work first: the methods that fit the budget, then its stage and its row, then
    the methods that fit no budget (full fine-tuning at 300 KB), which --verdicts-only leaves for a
    later run."""
    npz, profile = tiny_profile(tmp_path)
    fields = dict(data=str(npz), profile=str(profile), budgets=["300KB"], val_seeds=[100], seeds=[0])
    argv = [
        "--protocol", protocol(tmp_path / "protocol.json", **fields),
        "--methods", "full fine-tuning,classifier only,searched + validated", "--out", str(tmp_path / "b"),
        "--no-progress",
    ]  # fmt: skip
    order = []

    def run(self, m, lr, seed, split):
        kind = "stage" if m.name.startswith("candidate") or m.name.startswith("validated") else m.name
        order.append(kind) if not order or order[-1] != kind else None
        return dict(accuracy=40.0, diverged=False, train_s=0.0, eval_s=0.0, cache_s=0.0, cpu_s=0.0, trainable_params=0)

    monkeypatch.setattr(transfer.Bench, "run", run)
    transfer.main([*argv, "--verdicts-only"])  # the verdict's jobs alone
    assert order[0] == "classifier only" and "stage" in order and "full fine-tuning" not in order
    transfer.main(argv)  # then the rest
    assert order[-1] == "full fine-tuning" and order.count("classifier only") == 1


def test_two_workers_train_every_run_once(tmp_path):
    """``--workers 2``: two processes of the benchmark on one checkpoint, each taking the next job;
    every run is in the checkpoint once and every method has its row."""
    import subprocess
    import sys

    npz, _ = tiny_profile(tmp_path)
    out = tmp_path / "bench"
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "transfer.py"
    argv = [
        "--protocol", protocol(tmp_path / "protocol.json", data=str(npz), val_seeds=[100], seeds=[0, 1]),
        "--methods", "classifier only,bias only,last-1 weights+biases", "--out", str(out), "--no-progress",
        "--workers", "2",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = [json.loads(line)["run"]["id"] for line in (out / "transfer.runs.jsonl").read_text().splitlines()[1:]]
    assert len(ids) == len(set(ids)) == 3 * 3  # per method: one grid point at one seed, two test seeds
    rows = json.loads((out / "transfer.json").read_text())["rows"]
    assert {r["name"] for r in rows} == {"classifier only", "bias only", "last-1 weights+biases"}


def test_a_run_another_live_process_claimed_is_waited_for_and_a_dead_ones_claim_taken_over(transfer, tmp_path):
    """Two processes never train one run at once: a run another live process has claimed is read
    from the checkpoint once that process records it (never trained here); the claim of a process
    that died is taken over; a finished run's claim is free again."""
    import sys

    from memplan.contrib.checkpoint import Checkpoint
    from memplan.io import exclusive

    runs = sys.modules["transfer_runs"]
    ckpt = Checkpoint(tmp_path / "transfer.runs.jsonl", {"x": 1})
    ckpt.start()
    run = runs.Run(None, None, None, ckpt, {}, 0.0)
    times = dict(train_s=0.0, eval_s=0.0, cache_s=0.0, cpu_s=0.0, trainable_params=0)
    trained = []

    def train(acc):
        def go():
            trained.append(acc)
            return dict(accuracy=acc, diverged=False, **times)

        return go

    record = json.dumps({"id": "a", "accuracy": 50.0, "diverged": False, **times})
    other = hold(runs.claim_path(run, "a"), ckpt.path, record)  # records "a" after 0.3 s, then leaves
    assert runs.obtain(run, "a", train(40.0))["accuracy"] == 50.0
    assert other.wait() == 0
    dead = hold(runs.claim_path(run, "b"))
    dead.kill()
    dead.wait()
    assert runs.obtain(run, "b", train(60.0))["accuracy"] == 60.0
    assert trained == [60.0]
    assert [r["id"] for r in ckpt.finished().values()] == ["a", "b"]
    for rid in ("a", "b"):
        with exclusive(runs.claim_path(run, rid), wait=False) as free:
            assert free


TIMES = dict(train_s=0.0, eval_s=0.0, cache_s=0.0, cpu_s=0.0, trainable_params=0)  # a fake run's timings


def test_processes_on_one_stage_rung_split_it_without_waiting(transfer, tmp_path, monkeypatch):
    """A stage and its replay under another rule (each a job of its own worker) walk the same
    rungs: before the halving reads a rung, each trains, from the rung's end, the runs that neither
    the checkpoint has nor another live process holds, and waits for none; a report (which trains
    nothing) trains none."""
    from types import SimpleNamespace

    from memplan.contrib.checkpoint import Checkpoint

    runs = sys.modules["transfer_runs"]
    ckpt = Checkpoint(tmp_path / "transfer.runs.jsonl", {"x": 1})
    ckpt.start()
    task = SimpleNamespace(name="t", y_val=[0])
    protocol = SimpleNamespace(optimizer="adam", epochs=1, batch_size=2)
    run = runs.Run(None, SimpleNamespace(task=task, head=None), protocol, ckpt, {}, 0.0)
    trained = []

    def train(m, lr, seed, split):
        trained.append((m.key, split))
        return dict(accuracy=50.0, diverged=False, **TIMES)

    trainer = runs.BenchTrainer(run, SimpleNamespace(run=train), None)
    monkeypatch.setattr(trainer, "method", lambda candidate: SimpleNamespace(key=candidate))
    lr = Rates.of("1e-3")
    rung = [(candidate, lr, 101) for candidate in "abcde"]
    rid = {c: runs.run_id("grid", c, lr, 101) for c in "abcde"}
    runs.record(run, rid["a"], dict(accuracy=40.0, diverged=False, **TIMES))  # in the checkpoint
    other = hold(runs.claim_path(run, rid["d"]))  # another worker is training it
    try:
        trainer.train_missing = False
        trainer.prefetch(rung)
        assert trained == []
        trainer.train_missing = True
        trainer.prefetch(rung)
    finally:
        other.kill()
        other.wait()
    assert trained == [("e", "validation"), ("c", "validation"), ("b", "validation")]
    assert trainer.trained == 3
    assert sorted(ckpt.finished()) == sorted(rid[c] for c in "abce")


def classifier_only(tmp_path) -> tuple[list[str], Path]:
    """(argv, out folder) of a benchmark of classifier only on the tiny profile's data, test seeds
    0-1, validation seed 100: the device tests' setup."""
    npz, _ = tiny_profile(tmp_path)
    out = tmp_path / "bench"
    argv = [
        "--protocol", protocol(tmp_path / "protocol.json", data=str(npz), val_seeds=[100], seeds=[0, 1]),
        "--methods", "classifier only", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    return argv, out


def test_the_protocols_split_seed_carves_the_task(transfer, tmp_path, monkeypatch):
    """A protocol's ``split_seed`` is a fresh replicate: other validation and training images (the
    checkpoint's data digest differs), recorded in its identity and stated in the report."""
    argv, out = classifier_only(tmp_path)
    monkeypatch.setattr(
        transfer.Bench, "run", lambda self, m, lr, seed, split: dict(accuracy=40.0 + seed, diverged=False, **TIMES)
    )
    first = transfer.main(argv)
    fields = {**json.loads(Path(argv[1]).read_text()), "split_seed": 3}
    other = tmp_path / "other"
    argv3 = ["--protocol", protocol(tmp_path / "split3.json", **fields), *argv[2 : argv.index("--out") + 1], str(other)]
    second = transfer.main([*argv3, "--no-progress"])
    header = [(d / "transfer.runs.jsonl").read_text().splitlines()[0] for d in (out, other)]
    identity = [json.loads(line)["identity"]["data"] for line in header]
    assert "split_seed" not in identity[0] and identity[1]["split_seed"] == 3
    assert identity[0]["digest"] != identity[1]["digest"]
    assert "(split seed 0)" in first["description"] and "(split seed 3)" in second["description"]


def test_a_checkpoint_written_elsewhere_is_merged_without_repeats(transfer, tmp_path, monkeypatch):
    """A GPU machine's copy of the checkpoint (the runs it had, then its own, each naming its
    device) merges into this one: the runs this one lacks by id and device are appended, nothing
    trains. Each device's runs are a replicate of their own: the report counts the CPU's, or with
    --runs-of a GPU's; the runs trained on both pair as the device effect; a run the GPU alone
    trained is trained on the CPU before the CPU's report counts it; a checkpoint of another setup
    is refused in one line."""
    argv, out = classifier_only(tmp_path)
    trained = []

    def run(self, m, lr, seed, split):
        trained.append((split, seed))
        return dict(accuracy=40.0 + seed, diverged=False, **TIMES)

    monkeypatch.setattr(transfer.Bench, "run", run)
    ckpt = out / "transfer.runs.jsonl"
    (row,) = transfer.main(argv)["rows"]
    lines = ckpt.read_text().splitlines()
    cpu_runs = [json.loads(x)["run"] for x in lines[1:]]
    finals = sorted(r["id"] for r in cpu_runs if r["id"].startswith("final|"))
    # the GPU replicate: every run again, 2.5 points higher
    extra = [{"run": {**r, "accuracy": r["accuracy"] + 2.5, "device": "NVIDIA H200"}} for r in cpu_runs]
    elsewhere = tmp_path / "gpu.runs.jsonl"
    elsewhere.write_text("\n".join([*lines, *map(json.dumps, extra)]) + "\n")
    trained.clear()
    result = transfer.main([*argv, "--merge", str(elsewhere)])
    assert trained == [] and ckpt.read_text().splitlines() == [*lines, *map(json.dumps, extra)]
    assert result["runs_by_device"] == {"cpu": len(cpu_runs), "NVIDIA H200": len(cpu_runs)}
    assert [r["accuracy_mean"] for r in result["rows"]] == [row["accuracy_mean"]]  # the CPU's runs count
    effect = result["device_effect"]["NVIDIA H200 - cpu"]
    assert effect["runs"] == finals and effect["difference"] == pytest.approx(2.5)
    assert effect["by_method"]["classifier only"]["runs"] == finals
    assert f"NVIDIA H200 - cpu, final runs trained on both ({len(finals)}): +2.50" in (out / "transfer.md").read_text()
    assert result["redone"] == []  # a device pair is not a rerun
    other_choice = {"run": {**extra[-1]["run"], "id": finals[0].replace("|0.", "|9.")}}  # the GPU's own rate
    ckpt.write_text(ckpt.read_text() + json.dumps(other_choice) + "\n")
    assert transfer.main([*argv, "--report"])["redone"] == []  # another replicate's choice: not superseded here
    ckpt.write_text("\n".join(ckpt.read_text().splitlines()[:-1]) + "\n")
    gpu = transfer.main([*argv, "--report", "--runs-of", "NVIDIA H200", "--name", "h200"])
    assert [r["accuracy_mean"] for r in gpu["rows"]] == [row["accuracy_mean"] + 2.5]
    assert (out / "h200.md").is_file() and gpu["counted_device"] == "NVIDIA H200"
    transfer.main([*argv, "--merge", str(elsewhere)])  # again: nothing new
    assert len(ckpt.read_text().splitlines()) == len(lines) + len(extra)
    # a final the GPU alone trained: a CPU process trains it before it counts
    gone = next(x for x in lines if f'"{finals[1]}"' in x)
    ckpt.write_text("\n".join(x for x in ckpt.read_text().splitlines() if x != gone) + "\n")
    again = transfer.main(argv)
    assert trained == [("test", int(finals[1].rsplit("|", 1)[1]))]
    assert [r["accuracy_mean"] for r in again["rows"]] == [row["accuracy_mean"]]
    with pytest.raises(SystemExit):  # counting another device's runs than it trains: only a report
        transfer.main([*argv, "--runs-of", "NVIDIA H200"])
    other = tmp_path / "other.runs.jsonl"
    other.write_text(json.dumps({"identity": {"model": "another"}}) + "\n")
    with pytest.raises(MemplanError, match="another configuration"):
        transfer.main([*argv, "--merge", str(other)])


def test_a_protocol_started_elsewhere_goes_on_here(transfer, tmp_path, monkeypatch):
    """--merge into a folder with no checkpoint yet adopts the other checkpoint and the probe's head
    beside it (a protocol a GPU started): nothing trains, the same runs and head; without the head
    it is refused in one line and nothing is written."""
    argv, out = classifier_only(tmp_path)
    monkeypatch.setattr(
        transfer.Bench, "run", lambda self, m, lr, seed, split: dict(accuracy=40.0 + seed, diverged=False, **TIMES)
    )
    first = transfer.main(argv)
    fresh = tmp_path / "fresh"
    here = [*argv[: argv.index("--out") + 1], str(fresh), *argv[argv.index("--out") + 2 :]]
    monkeypatch.setattr(transfer.Bench, "run", lambda *args: pytest.fail("trained"))
    lone = tmp_path / "lone" / "transfer.runs.jsonl"
    lone.parent.mkdir()
    lone.write_text((out / "transfer.runs.jsonl").read_text())
    with pytest.raises(MemplanError, match="transfer.head.pt is missing"):
        transfer.main([*here, "--merge", str(lone)])
    assert not (fresh / "transfer.runs.jsonl").exists()
    again = transfer.main([*here, "--merge", str(out / "transfer.runs.jsonl")])
    assert (fresh / "transfer.runs.jsonl").read_text() == (out / "transfer.runs.jsonl").read_text()
    heads = [torch.load(d / "transfer.head.pt", weights_only=True) for d in (fresh, out)]
    assert all(torch.equal(heads[0]["head"][k], v) for k, v in heads[1]["head"].items())
    assert again["rows"] == first["rows"] and again["probe_validation_accuracy"] == first["probe_validation_accuracy"]


def test_pairs_of_trains_another_devices_finals_at_its_choices(transfer, tmp_path, monkeypatch):
    """--pairs-of cpu on another device trains exactly the CPU's final runs, at the rate the CPU
    chose, and no grid run: the report pairs them as the device effect; it is refused where it
    names this process's own device or comes with --report."""
    argv, out = classifier_only(tmp_path)
    trained = []

    def run_on(device, shift):
        def run(self, m, lr, seed, split):
            trained.append((split, str(lr), seed))
            return dict(accuracy=40.0 + seed + shift, diverged=False, device=device, **TIMES)

        return run

    monkeypatch.setattr(transfer.Bench, "run", run_on("cpu", 0.0))
    transfer.main(argv)
    cpu_finals = [x for x in trained if x[0] == "test"]
    assert cpu_finals and len(trained) > len(cpu_finals)  # a grid, then the finals
    trained.clear()
    monkeypatch.setattr(transfer, "device_name", lambda device: "GPU X")
    monkeypatch.setattr(transfer.Bench, "run", run_on("GPU X", 1.0))
    result = transfer.main([*argv, "--pairs-of", "cpu"])
    assert trained == cpu_finals
    assert result["device_effect"]["GPU X - cpu"]["difference"] == pytest.approx(1.0)
    trained.clear()
    transfer.main([*argv, "--pairs-of", "cpu"])  # again: nothing left to pair
    assert trained == []
    for bad in (["--pairs-of", "GPU X"], ["--pairs-of", "cpu", "--report"]):
        with pytest.raises(SystemExit):
            transfer.main([*argv, *bad])


def test_gpu_runs_are_fp32_and_say_so(transfer, monkeypatch):
    """A GPU run records its device as the GPU's name and fp32, and trains with TF32 off."""
    runs = load_benchmark("transfer_runs")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert runs.device_name("cuda") == "NVIDIA H200 fp32" and runs.device_name("cpu") == "cpu"
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
        runs.full_precision()
        assert not torch.backends.cudnn.allow_tf32 and not torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def test_which_device_counts(transfer):
    """Each device's records are a replicate of their own: a report or a process counts one
    device's, the last of each id; an id trained on two devices is a pair."""
    proto = load_benchmark("transfer_protocol")
    g, h = "NVIDIA H200", "NVIDIA H100"
    recs = [
        {"id": "a", "accuracy": 1, "device": g},
        {"id": "a", "accuracy": 2},  # the CPU, named by no device
        {"id": "a", "accuracy": 3, "device": g},
        {"id": "b", "accuracy": 4, "device": g},
        {"id": "c", "accuracy": 5, "device": "cpu"},
        {"id": "c", "accuracy": 6, "device": "cpu"},
        {"id": "d", "accuracy": 7, "device": h},
    ]
    acc = lambda done: {k: r["accuracy"] for k, r in done.items()}  # noqa: E731
    assert acc(proto.counted(recs)) == {"a": 2, "c": 6}
    assert acc(proto.counted(recs, g)) == {"a": 3, "b": 4}
    assert acc(proto.counted(recs, h)) == {"d": 7}
    recs.append({"id": "a", "accuracy": 8, "device": h})
    pairs = [(x["accuracy"], y["accuracy"]) for x, y in proto.device_pairs(recs)]
    assert sorted(pairs) == [(2, 3), (2, 8), (8, 3)]  # the CPU first, then by name: H100 before H200


@pytest.mark.parametrize(
    "argv,fields",
    [
        (["--workers", "0"], {}),
        (["--workers", "x"], {}),
        (["--epochs", "3"], {}),  # contradicts the protocol
        (["--seeds", "0,1,2"], {}),
        ([], {"lrs": ["0.01", "-1"]}),
        ([], {"lrs": ["0.01/momentum=0.9"]}),
        ([], {"lrs": ["weight=0.01"]}),
        ([], {"seeds": [0, 0]}),
        ([], {"split_seed": -1}),
        (["--split-seed", "3"], {}),  # contradicts the protocol's 0
        ([], {"seeds": [0, 1], "val_seeds": [1, 2]}),  # a choice would be re-scored on its own seed
        ([], {"profile": "/nonexistent.json"}),
        ([], {"epochs": None}),
        ([], {"surprise": 1}),
        ([], {"ties": "larger rate"}),
        (["--device", "tpu"], {}),
        (["--merge", "/nonexistent.jsonl"], {}),
    ],
)
def test_bad_options_exit_2_before_any_work(transfer, tmp_path, argv, fields, capsys):
    with pytest.raises(SystemExit) as exc:
        transfer.parse_args(["--protocol", protocol(tmp_path / "p.json", **fields), *argv])
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


def test_the_benchmark_refuses_to_run_without_a_protocol(transfer, tmp_path, capsys):
    for argv in ([], ["--protocol", str(tmp_path / "none.json")], ["--protocol", str(tmp_path)]):
        with pytest.raises(SystemExit) as exc:
            transfer.parse_args(argv)
        assert exc.value.code == 2 and "protocol" in capsys.readouterr().err
    path = protocol(tmp_path / "p.json")
    a = transfer.parse_args(["--protocol", path, "--epochs", "1", "--seeds", "0,1"])  # repeating it is fine
    assert a.epochs == 1 and a.seeds == [0, 1] and a.val_seeds == [100, 101]
    assert a.protocol_sha256 == hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_a_validated_row_keeps_its_candidates_runs_when_methods_are_shared_again(monkeypatch):
    """A stage's row records its test runs under the chosen candidate's name; the report process
    rebuilds the methods and shares runs again, and must read them there: a row that trains what
    no earlier method trains keeps its candidate's runs, one that trains a baseline's reads the
    baseline's, and a method naming no runs gets none (or the earlier one it repeats)."""
    runs = load_benchmark("transfer_runs")
    monkeypatch.setattr(runs, "what_trains", lambda m, graph: m.detail["trains"])

    def method(name, trains, runs_as=None):
        return runs.Method(name, "f", None, "bias", detail={"trains": trains}, runs_as=runs_as)

    ms = [
        method("bias only", "b"),
        method("biases of the last 49", "b"),
        method("last-4", "w"),
        method("validated 20MB", "searched", runs_as="candidate abcf"),
        method("validated 15MB", "w", runs_as="last-4"),
    ]
    for _ in range(2):  # sharing again changes nothing
        runs.share_runs(ms, graph=None)
        assert [m.key for m in ms] == ["bias only", "bias only", "last-4", "candidate abcf", "last-4"]
