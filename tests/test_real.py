"""Issue 13: real transfer learning. Data sources (idx reader, Fashion-MNIST, validation split), the
honest protocol (Δacc on a validation split, the test split only for final evaluations), run /
costing resolutions and the search's warning, the tinytraining optimizer-state and
gradient-accumulation options against hand-computed bits, the additivity statistics, and the
shipped real-weights profile and schemes.

Small and synthetic throughout (a tiny idx fixture written here, the 3-conv MiniLearn net);
checks that need Debian's dataset-fashion-mnist or the ImageNet weights skip without them.
"""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

from memplan.api import capture, profile_captured
from memplan.cli import main
from memplan.contrib import load_profile, run_contrib
from memplan.contrib.data import BadData, RawTask, load_data, prepare, read_idx
from memplan.contrib.data.fashion_mnist import FASHION_MNIST_FILES, fashion_mnist_dir
from memplan.errors import BadOption, MemplanError
from memplan.modes import get_mode
from memplan.plan import Scheme, WeightUpdate, fingerprint
from memplan.search.agreement import ceiling, correlations

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "memplan" / "data" / "profiles"
SCHEMES = ROOT / "memplan" / "data" / "schemes"


# ----------------------------------------------------------------------------- idx / Fashion-MNIST
def write_idx(path: Path, arr: np.ndarray, gz: bool = True) -> Path:
    """An idx file written by hand: magic 0 0 0x08 ndim, big-endian uint32 sizes, uint8 data."""
    raw = (
        bytes([0, 0, 0x08, arr.ndim])
        + b"".join(struct.pack(">I", d) for d in arr.shape)
        + arr.astype(np.uint8).tobytes()
    )
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def fake_fashion(root: Path, n_train: int = 40, n_test: int = 20, classes: int = 4) -> Path:
    rng = np.random.default_rng(0)
    arrays = [
        rng.integers(0, 256, (n_train, 28, 28)),
        np.arange(n_train) % classes,
        rng.integers(0, 256, (n_test, 28, 28)),
        np.arange(n_test) % classes,
    ]
    for stem, arr in zip(FASHION_MNIST_FILES, arrays):
        write_idx(root / (stem + ".gz"), arr)
    return root


def test_read_idx_by_hand(tmp_path):
    arr = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    assert np.array_equal(read_idx(write_idx(tmp_path / "a-idx3-ubyte.gz", arr)), arr)
    assert np.array_equal(read_idx(write_idx(tmp_path / "b-idx3-ubyte", arr, gz=False)), arr)
    labels = np.array([3, 1, 4, 1, 5])
    assert read_idx(write_idx(tmp_path / "l-idx1-ubyte", labels, gz=False)).tolist() == [3, 1, 4, 1, 5]
    (tmp_path / "bad").write_bytes(b"\x01\x02\x08\x01" + b"\x00" * 8)
    with pytest.raises(BadData, match="bad magic"):
        read_idx(tmp_path / "bad")
    truncated = tmp_path / "short-idx1-ubyte"
    truncated.write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 10) + b"\x00" * 3)
    with pytest.raises(BadData, match="header says 10"):
        read_idx(truncated)


def test_fashion_mnist_source_and_validation_split(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPLAN_FASHION_MNIST", str(fake_fashion(tmp_path)))
    data = load_data("fashion-mnist", (3, 32, 32), 3, validation=2, test_per_class=4)
    assert data.x_train.shape == (12, 3, 32, 32) and data.x_val.shape == (8, 3, 32, 32)
    assert data.x_test.shape == (16, 3, 32, 32) and data.classes == 4
    for y, n in ((data.y_train, 3), (data.y_val, 2), (data.y_test, 4)):
        assert torch.bincount(y).tolist() == [n] * 4
    # the validation images come from the training split and are disjoint from the kept training images
    raw = read_idx(tmp_path / "train-images-idx3-ubyte.gz")
    same = prepare(
        RawTask("f", "", raw, np.arange(40) % 4, raw[:4], np.arange(4)), (1, 28, 28), validation=2, train_per_class=3
    )
    train_rows = {bytes(x.numpy().tobytes()) for x in same.x_train}
    assert not any(bytes(x.numpy().tobytes()) in train_rows for x in same.x_val)
    assert data.validation_task().x_test is data.x_val  # what contribution runs see: no test split
    monkeypatch.setenv("MEMPLAN_FASHION_MNIST", str(tmp_path / "missing"))
    monkeypatch.setattr("memplan.contrib.data.fashion_mnist.FASHION_MNIST_DIRS", ())
    with pytest.raises(BadData, match="dataset-fashion-mnist"):
        load_data("fashion-mnist", (1, 28, 28))


def test_validation_options_are_checked(tmp_path):
    raw = RawTask(
        "t", "", np.zeros((10, 4, 4), np.uint8), np.arange(10) % 2, np.zeros((4, 4, 4), np.uint8), np.arange(4) % 2
    )
    assert prepare(raw, None, validation=0.4).x_val.shape[0] == 4  # 2 of each class's 5
    for bad in (5, 1.5, -1, True):
        with pytest.raises(BadData):
            prepare(raw, None, validation=bad)


def test_real_fashion_mnist_when_installed():
    try:
        fashion_mnist_dir()
    except BadData:
        pytest.skip("apt-get install dataset-fashion-mnist")
    data = load_data("fashion-mnist", (1, 28, 28), 5, validation=5, test_per_class=5)
    assert data.classes == 10 and data.x_train.shape == (50, 1, 28, 28) and data.x_test.shape == (50, 1, 28, 28)


# ----------------------------------------------------------------------------- the honest protocol
TINY_GRID = dict(seeds=(0,), epochs=1, batch_size=8, probe_epochs=2, ratios=(1.0,), bias_ks=(1,), weight_layers=1)


def make_npz(path: Path, n: int = 24, side: int = 32, classes: int = 3) -> Path:
    rng = np.random.default_rng(0)

    def split(m):
        y = np.arange(m) % classes
        x = rng.normal(0, 0.3, (m, 3, side, side)).astype(np.float32)
        for i, c in enumerate(y):
            x[i, :, (c * side) // classes : (c * side) // classes + side // classes] += 1.0
        return x, y

    (xtr, ytr), (xte, yte) = split(n), split(n)
    np.savez(path, x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    return path


def tiny_profile(tmp_path: Path, model: str = "minilearn-cifar10", **protocol) -> tuple[Path, Path]:
    """A 30-image task (``tmp_path/task.npz``) and a tiny grid profile of ``model`` on it
    (``tmp_path/profile.json``, 4 validation images per class; ``protocol`` changes ``TINY_GRID``):
    what the validation-stage tests search from."""
    npz = make_npz(tmp_path / "task.npz", n=30)
    profile = tmp_path / "profile.json"
    run_contrib(model, data=str(npz), out=profile, validation=4, **{**TINY_GRID, **protocol})
    return npz, profile


def test_runs_are_measured_on_the_validation_split(tmp_path):
    npz = make_npz(tmp_path / "task.npz", n=30)
    prof = run_contrib(
        "minilearn-cifar10", data=str(npz), out=tmp_path / "p.json", validation=4, costing_resolution=64, **TINY_GRID
    )
    assert prof.evaluated_on == "validation" and prof.dataset["validation"] == 12 and prof.dataset["train"] == 18
    assert prof.resolution.runs == 32 and prof.resolution.costing == 64
    assert "validation split" in prof.description
    # every accuracy is a multiple of 1/12 (12 validation images), none of 1/30 (the test split) only
    for r in prof.runs:
        assert all(abs(a * 12 / 100 - round(a * 12 / 100)) < 1e-9 for a in r.accuracy)
    # a final evaluation rebuilds the same setup and refuses other data
    from memplan.contrib.setup import setup_of

    assert setup_of(prof).dataset["digest"] == prof.dataset["digest"]
    arrays = dict(np.load(npz))
    np.savez(npz, **{**arrays, "x_test": arrays["x_test"] + 1.0})
    with pytest.raises(MemplanError, match="differs from what the profile was measured on"):
        setup_of(prof)


def test_search_warns_when_runs_and_costing_resolutions_differ(tmp_path):
    from memplan.search import run_search

    shipped = PROFILES / "mcunet-5fps-digits.json"  # runs at 32 px
    at_128 = run_search("mcunet-5fps", "100KB", profile_path=shipped, resolution=128)
    assert any("3x32x32" in w and "3x128x128" in w for w in at_128.warnings)
    assert not run_search("mcunet-5fps", "20KB", profile_path=shipped, resolution=32).warnings


# ----------------------------------------------------------------------------- tinytraining options
class TwoConv(nn.Module):
    """conv 3->8 (3x3) -> BN -> ReLU -> conv 8->16 (1x1) -> BN -> ReLU -> mean -> fc 16->4, at 8x8."""

    def __init__(self, num_classes: int = 4):
        super().__init__()
        self.c0, self.b0 = nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8)
        self.c1, self.b1 = nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.b0(self.c0(x)).relu()
        return self.fc(self.b1(self.c1(x)).relu().mean((2, 3)))


def _tt(optimizer="sgd", **mode_options):
    cap = capture(TwoConv(), input_shape=(3, 8, 8))
    scheme = Scheme(
        model="two",
        fingerprint=fingerprint(cap.graph),
        input_shape=[3, 8, 8],
        bias_update=1,
        weight_updates=[WeightUpdate(layer="c1", conv_index=1, ratio=0.5)],
        mode="tinytraining",
    )
    return profile_captured(
        cap, "sparse", mode="tinytraining", scheme=scheme, optimizer=optimizer, mode_options=mode_options
    )


def test_tinytraining_optimizer_state_and_accumulation_by_hand():
    # The 256KB paper's convention by hand: classifier input 16 x 8 = 128 bits; c1's bias (the BN
    # shift): 1-bit mask of 16x8x8 = 1024 bits + 16 x 32 = 512 bits; c1's weight at 1/2: 4 of 8
    # input channels kept, 8x8x4 x 8 = 2048 bits, and a 16x4 weight copy x 8 = 512 bits.
    base = 128 + 1024 + 512 + 2048 + 512
    updated_weights, updated_biases = 16 * 4, 16
    sgd = _tt()
    assert sgd.extras["tinytraining"]["total_bits"] == base and sgd.totals.total_bytes == base // 8
    # momentum, buffer quantised like its parameter: the update memory (512 + 512 bits) doubles
    mom = _tt("sgd-momentum")
    assert mom.extras["tinytraining"]["optimizer_state_bits"] == updated_weights * 8 + updated_biases * 32 == 1024
    assert mom.totals.optimizer_bytes == 128 and mom.totals.total_bytes == (base + 1024) // 8
    # an fp32 buffer: an int8 weight costs 8 + 32 = 40 bits, 5x its copy
    fp32 = _tt("sgd-momentum", state_bits=32)
    assert fp32.extras["tinytraining"]["optimizer_state_bits"] == updated_weights * 32 + updated_biases * 32 == 2560
    assert (512 + updated_weights * 32) / 512 == 5
    # Adam: two buffers (the paper's "3x")
    assert _tt("adam").extras["tinytraining"]["optimizer_state_bits"] == 2 * 1024
    # gradient accumulation: a 32-bit accumulator per updated element
    acc = _tt(grad_accumulation=True)
    assert acc.totals.gradient_bytes == (updated_weights + updated_biases) * 32 // 8 == 320
    assert acc.totals.total_bytes == base // 8 + 320
    assert _tt(grad_accumulation=True, accumulation_bits=16).totals.gradient_bytes == 160


def test_tinytraining_momentum_doubles_the_update_memory_of_the_papers_scheme():
    cap = capture("mcunet-5fps", resolution=128, classes=10)
    cfg = {
        "n_bias_update": 22,
        "manual_weight_idx": [21, 24, 27, 30, 36, 39],
        "weight_update_ratio": [1, 1, 1, 1, 0.125, 0.25],
    }
    scheme = Scheme.from_backward_config(cfg, graph=cap.graph)
    plain = profile_captured(cap, "sparse", mode="tinytraining", scheme=scheme).extras["tinytraining"]
    mom = profile_captured(cap, "sparse", mode="tinytraining", scheme=scheme, optimizer="sgd-momentum").extras[
        "tinytraining"
    ]
    assert round(plain["total_kib"], 1) == 99.8  # the paper's "100KB" scheme
    assert mom["optimizer_state_bits"] == plain["weight_bits"]
    assert mom["total_bits"] == plain["activation_bits"] + 2 * plain["weight_bits"]


def test_mode_options_are_checked():
    with pytest.raises(MemplanError, match="unknown tinytraining option"):
        get_mode("tinytraining").configure(momentum_bits=8)
    with pytest.raises(MemplanError, match="bits"):
        get_mode("tinytraining").configure(state_bits=0)
    with pytest.raises(MemplanError, match="takes no options"):
        get_mode("ideal").configure(state_bits=8)
    assert get_mode("tinytraining").state_bits is None  # the registered instance is untouched


def test_cli_mode_options(capsys):
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "profile",
                "mcunet-5fps",
                "--method",
                "bias",
                "--mode",
                "tinytraining",
                "--optimizer",
                "sgd-momentum",
                "-O",
                "state_bits=32",
                "--json",
                "-",
            ]
        )
    assert exc.value.code == 0
    p = json.loads(capsys.readouterr().out)
    assert p["totals"]["optimizer_bytes"] > 0 and p["extras"]["tinytraining"]["state_bits"] == 32
    with pytest.raises(SystemExit) as exc:
        main(["profile", "mcunet-5fps", "--mode", "tinytraining", "-O", "nope"])
    assert exc.value.code == 2 and "error:" in capsys.readouterr().err


# ----------------------------------------------------------------------------- additivity statistics
def test_correlations_against_definitions():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    out = correlations(x, [2 * v + 1 for v in x], bootstrap=200)
    assert out["pearson"] == pytest.approx(1.0) and out["spearman"] == pytest.approx(1.0)
    assert out["pearson_ci"][0] == pytest.approx(1.0)
    y = [1.0, 3.0, 2.0, 5.0, 4.0]  # Spearman by hand: d = (0, -1, 1, -1, 1), 1 - 6 * 4 / (5 * 24) = 0.8
    out = correlations(x, y, bootstrap=500, seed=1)
    assert out["spearman"] == pytest.approx(0.8)
    xm, ym = np.mean(x), np.mean(y)
    r = sum((a - xm) * (b - ym) for a, b in zip(x, y)) / np.sqrt(
        sum((a - xm) ** 2 for a in x) * sum((b - ym) ** 2 for b in y)
    )
    assert out["pearson"] == pytest.approx(r)
    assert out["pearson_ci"][0] <= out["pearson"] <= out["pearson_ci"][1]


def test_ceiling_from_seed_agreement_by_hand():
    ref = [80.0, 81.0]
    # seed 1 ranks the schemes as seed 0 does except one swap: Spearman 0.8 (as above); a repeated
    # scheme counts once; Spearman-Brown for 2 seeds: 2 * 0.8 / 1.8
    acc = [[81.0, 82.0], [82.0, 84.0], [83.0, 83.0], [84.0, 86.0], [85.0, 85.0], [81.0, 82.0]]
    out = ceiling(ref, dict(zip("abcdea", acc)))  # scheme a fits two budgets
    assert out["schemes"] == 5 and out["seeds"] == 2
    assert out["seed_spearman"] == pytest.approx(0.8)
    assert out["reliability"] == pytest.approx(1.6 / 1.8)
    assert out["ceiling"] == pytest.approx(np.sqrt(1.6 / 1.8))
    disagree = dict(zip("abc", [[81.0, 86.0], [82.0, 85.0], [83.0, 84.0]]))  # the seeds disagree entirely
    reversed_ = ceiling(ref, disagree)
    assert reversed_["seed_spearman"] == pytest.approx(-1.0) and reversed_["ceiling"] == 0.0
    assert ceiling([80.0], dict(zip("abc", [[81.0], [82.0], [83.0]]))) is None  # one seed: no agreement to measure
    assert ceiling(ref, {"a": [81.0, 82.0], "b": [82.0, 84.0]}) is None  # two schemes


def test_collapsed_schemes_are_named_and_correlated_apart():
    from memplan.search.additivity import Point
    from memplan.search.agreement import noise_readings

    ref = [80.0, 82.0]

    def point(summed, acc):
        return Point("random", 1000, f"s{summed}", 1, [], 100, summed, acc, sum(acc) / 2 - 81.0)

    points = [point(1.0, [81.0, 83.0]), point(2.0, [82.0, 84.0]), point(3.0, [83.0, 85.0])]
    points += [point(9.0, [10.0, 84.0])]  # a seed at chance, 70 points below classifier only's worst seed
    bound, stable, notes = noise_readings(ref, points, 100, 0)
    assert stable["schemes"] == 3 and stable["spearman"] == pytest.approx(1.0)  # the rising three alone
    assert any("1 scheme(s)" in n and "10.0%" in n for n in notes)
    assert bound["schemes"] == 3 and bound == stable["ceiling"]  # the ceiling is the stable schemes'
    assert bound == ceiling(ref, {p.candidate: p.accuracy for p in points[:3]})
    assert noise_readings(ref, points[:3], 100, 0)[1] is None  # nothing collapsed: no separate correlation


def test_ceiling_bounds_a_predictor_that_knows_the_expected_gains():
    """Simulated schemes with known expected gains and seed noise: the correlation of the expected
    gains with the measured 3-seed mean, averaged over draws, is what the ceiling estimates."""
    from scipy import stats

    rng = np.random.default_rng(0)
    best, bound = [], []
    for _ in range(300):
        truth = rng.normal(0.0, 1.0, 40)
        acc = truth[:, None] + rng.normal(0.0, 1.2, (40, 3))
        best.append(stats.spearmanr(truth, acc.mean(1))[0])
        bound.append(ceiling([0.0, 0.0, 0.0], dict(enumerate(acc.tolist())))["ceiling"])
    assert np.mean(bound) == pytest.approx(np.mean(best), abs=0.04)
    assert 0.6 < np.mean(best) < 0.9  # the regime the check is for: noise comparable to the spread


def test_validate_end_to_end_on_a_tiny_profile(tmp_path):
    from memplan.search.additivity import default_budgets, validate_profile

    npz = make_npz(tmp_path / "task.npz", n=30)
    prof = run_contrib(
        "minilearn-cifar10",
        data=str(npz),
        out=tmp_path / "p.json",
        validation=4,
        seeds=(0,),
        epochs=1,
        batch_size=8,
        probe_epochs=2,
        ratios=(0.5, 1.0),
    )
    check = validate_profile(tmp_path / "p.json", ["2KB", "8KB"], per_budget=2, bootstrap=100)
    assert len(check.points) >= 4 and all(p.memory_bytes <= p.budget_bytes for p in check.points)
    assert -1 <= check.pearson <= 1 or np.isnan(check.pearson)
    assert {p.kind for p in check.points} <= {"random", "searched"}
    assert load_profile(tmp_path / "p.json").evaluated_on == "validation" and prof.protocol.seeds == (0,)
    budgets = default_budgets(prof)
    assert len(budgets) == 4 and budgets == sorted(budgets) and budgets[0] < budgets[-1]


def test_validate_resumes_from_its_checkpoint_and_correlates_every_objective(tmp_path, monkeypatch):
    from memplan.contrib.runner import SchemeRun
    from memplan.search.additivity import validate_profile

    npz = make_npz(tmp_path / "task.npz", n=30)
    run_contrib(
        "minilearn-cifar10",
        data=str(npz),
        out=tmp_path / "p.json",
        validation=4,
        seeds=(0, 1),
        epochs=1,
        batch_size=8,
        probe_epochs=2,
        ratios=(0.5, 1.0),
    )
    ckpt = tmp_path / "v.runs.jsonl"
    first = validate_profile(tmp_path / "p.json", ["2KB", "8KB"], per_budget=2, bootstrap=50, checkpoint=ckpt)
    # standard errors exist (2 seeds): every objective is correlated, each value its scheme's sum under it
    assert set(first.by_objective) == {"mean", "lcb", "shrink"}
    assert all(p.objectives["mean"] == pytest.approx(p.summed) for p in first.points)
    assert all(p.objectives["lcb"] <= p.objectives["mean"] + 1e-9 for p in first.points)
    # two workers train the same runs to the same accuracies, seed for seed
    pooled = validate_profile(tmp_path / "p.json", ["2KB", "8KB"], per_budget=2, bootstrap=50, workers=2)
    assert [p.accuracy for p in pooled.points] == [p.accuracy for p in first.points]
    assert pooled.reference_accuracy == first.reference_accuracy
    # a rerun trains nothing: every scheme comes from the checkpoint, with the same accuracies
    monkeypatch.setattr(SchemeRun, "run_on", lambda *a, **k: pytest.fail("trained again"))
    again = validate_profile(tmp_path / "p.json", ["2KB", "8KB"], per_budget=2, bootstrap=50, checkpoint=ckpt)
    assert [p.accuracy for p in again.points] == [p.accuracy for p in first.points]


def test_validate_refuses_too_few_schemes_before_training(tmp_path, monkeypatch):
    from memplan.contrib.final import Evaluator
    from memplan.search.additivity import validate_profile

    npz = make_npz(tmp_path / "task.npz", n=30)
    run_contrib("minilearn-cifar10", data=str(npz), out=tmp_path / "p.json", validation=4, **TINY_GRID)
    monkeypatch.setattr(Evaluator, "__init__", lambda *a, **k: pytest.fail("trained before refusing"))
    with pytest.raises(BadOption, match="a correlation needs at least 3"):
        validate_profile(tmp_path / "p.json", ["8KB"], per_budget=1, searched=False)
    with pytest.raises(BadOption, match="workers must be a positive integer"):
        validate_profile(tmp_path / "p.json", ["8KB"], per_budget=5, workers=0)
    with pytest.raises(BadOption, match="an address applies only to the ray executor"):
        validate_profile(tmp_path / "p.json", ["8KB"], per_budget=5, workers=2, address="10.0.0.1:6379")
