"""The new user's path (issue 40), start to finish, on a model of one's own that takes 1 x 28 x 28
grey images and outputs another class count than the data's: profile -> contrib measure (cheap:
the Fisher estimator on a small synthetic .npz) -> search with a validation stage -> verify ->
apply_scheme -> training code that reproduces the validated accuracy (``memplan.train``).

Every memory number here is checked by ``memplan verify`` against ``saved_tensors_hooks`` (its
exit code), never copied from memplan's own output; accuracies are compared between two trainings
that should be the same computation (the validation stage's and ``memplan.train``'s).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import typer

import memplan
from memplan.cli import app, main
from memplan.errors import BadOption, MemplanError, SchemeError
from memplan.models import recorded_shape
from memplan.models.loading import import_attr

ROOT = Path(__file__).resolve().parents[1]

MODEL_SOURCE = '''
import torch.nn as nn


class GreyNet(nn.Module):
    """1 x 28 x 28 grey images; 10 outputs unless told otherwise (no num_classes argument)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(16, classes)

    def forward(self, x):
        return self.classifier(self.pool(self.features(x)).flatten(1))


def grey_net():
    return GreyNet()


class ConvHead(nn.Module):
    """A fully convolutional classifier: no nn.Linear memplan could replace."""

    def __init__(self):
        super().__init__()
        self.body = nn.Conv2d(1, 10, 3)

    def forward(self, x):
        return self.body(x).mean((2, 3))
'''


def _images(rng: np.random.Generator, n: int, labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """n grey 28 x 28 uint8 images of 4 classes (a bright band marks the class), N x H x W."""
    y = rng.integers(0, 4, n) if labels is None else labels
    x = rng.integers(0, 96, (n, 28, 28), dtype=np.uint8)
    for i, c in enumerate(y):
        x[i, 7 * c : 7 * c + 7, 4:24] = 255
    return x, y


def _npz(path: Path, seed: int = 0, shuffle_labels: bool = False) -> Path:
    rng = np.random.default_rng(seed)
    x_train, y_train = _images(rng, 240)
    x_test, y_test = _images(rng, 80)
    if shuffle_labels:  # labels unrelated to the images: no probe can beat chance
        y_train, y_test = rng.integers(0, 4, 240), rng.integers(0, 4, 80)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def run(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> dict:
    """The user's folder: the model file, the data, a contribution profile and a validated scheme
    (the CLI, as the tutorial runs it)."""
    folder = tmp_path_factory.mktemp("user")
    model_file = folder / "grey_net.py"
    model_file.write_text(MODEL_SOURCE)
    spec = f"{model_file}:GreyNet"
    data = _npz(folder / "grey.npz")
    profile, scheme = folder / "grey-profile.json", folder / "grey-scheme.json"
    for step, args in {
        "contrib": ["contrib", "measure", spec, "--data", str(data), "--estimator", "fisher", "--out", str(profile)],
        "search": [
            *("search", spec, "--profile", str(profile), "--budget", "20kb", "--out", str(scheme)),
            *("--validate", "1", "--validate-lrs", "0.0125,0.0025", "--validate-dir", str(folder / "stage")),
        ],
    }.items():
        with pytest.raises(SystemExit) as exc:
            main(args)
        assert exc.value.code == 0, step
    return {"folder": folder, "spec": spec, "data": data, "profile": profile, "scheme": scheme}


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MEMPLAN_NUM_THREADS": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "memplan", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


# ----------------------------------------------------------------------------- 1. the recorded input shape


def test_recorded_shape_keeps_channels():
    assert recorded_shape(None, 32) is None
    assert recorded_shape([1, 28, 28]) == (1, 28, 28)
    assert recorded_shape([1, 28, 28], 28) == (1, 28, 28)
    assert recorded_shape([1, 28, 28], 32) == (1, 32, 32)
    assert recorded_shape([3, 28, 40], 40) == (3, 28, 40)  # a side equal to the recorded one keeps the shape


def test_profile_the_grey_model_checked_against_a_real_run(user, capsys):
    """Step 1: the profile at the model's own 1 x 28 x 28; --check compares the prediction with a real
    forward + loss under saved_tensors_hooks (exit 1 on a difference)."""
    args = ["profile", user["spec"], "--input-shape", "1,28,28", "--method", "bias", "--check"]
    code, out, _ = run(args, capsys)
    assert code == 0 and "input 1x28x28" in one_line(out)


def test_profile_and_scheme_record_the_grey_shape(user):
    prof = json.loads(user["profile"].read_text())
    scheme = memplan.load_scheme(user["scheme"])
    assert prof["input_shape"] == [1, 28, 28] and prof["dataset"]["classes"] == 4
    assert scheme.input_shape == [1, 28, 28]
    assert scheme.validation is not None and scheme.training is not None


def test_search_costs_at_the_profile_shape(user, capsys):
    code, out, _ = run(["search", user["spec"], "--profile", str(user["profile"]), "--budget", "20kb"], capsys)
    text = one_line(out)
    assert code == 0 and "input 1x28x28" in text
    assert "kb read as kB (bytes, not bits)" in text  # how 20kb was read, said
    res = memplan.search.run_search(user["spec"], "20KB", profile_path=user["profile"], resolution=32)
    assert res.input_shape == [1, 32, 32]  # -r keeps the profile's channel count


@pytest.mark.parametrize(
    "shape_args,shape", [(["-r", "32"], [4, 1, 32, 32]), (["--input-shape", "1,24,24"], [4, 1, 24, 24])]
)
def test_verify_honours_the_scheme_channels(user, shape_args, shape):
    """verify's exit code is its check against saved_tensors_hooks: 0 = measured = predicted."""
    done = _cli(
        ["verify", user["spec"], "--method", "sparse", "--scheme", str(user["scheme"]), "--batch", "4", *shape_args]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = memplan.verify.verify(
        user["spec"], "sparse", scheme=str(user["scheme"]), batch=4, steps=1, **_shape_kwargs(shape_args)
    )
    assert report.input_shape == shape and report.ok


def _shape_kwargs(args: list[str]) -> dict:
    if args[0] == "-r":
        return {"resolution": int(args[1])}
    return {"input_shape": tuple(int(v) for v in args[1].split(","))}


def test_profile_with_scheme_keeps_its_channels(user):
    p = memplan.profile(user["spec"], "sparse", scheme=str(user["scheme"]), resolution=32)
    assert p.input_shape[1:] == [1, 32, 32]
    p = memplan.profile(user["spec"], "sparse", scheme=str(user["scheme"]))
    assert p.input_shape[1:] == [1, 28, 28]


# ----------------------------------------------------------------------------- 2. another model's scheme


def test_another_models_scheme_says_so_before_the_shape(user):
    done = _cli(["profile", user["spec"], "--method", "sparse", "--scheme", "mcunet-5fps-100KB"])
    line = one_line(done.stderr + done.stdout)
    assert done.returncode == 2 and "Traceback" not in line
    assert line.startswith("error: scheme was planned for mcunet-5fps")
    shipped = memplan.shipped_scheme("mcunet-5fps-100KB")
    module = memplan.models.resolve(user["spec"]).model
    with pytest.raises(SchemeError, match="^scheme was planned for mcunet-5fps"):
        memplan.apply_scheme(module, memplan.load_scheme(shipped))
    with pytest.raises(SchemeError, match="^scheme was planned for mcunet-5fps"):
        memplan.verify.verify(user["spec"], "sparse", scheme=str(shipped), batch=2, steps=1)
    with pytest.raises(SchemeError, match="planned for mcunet-5fps"):  # the shape given: the fingerprint says it
        memplan.profile(user["spec"], "sparse", scheme=str(shipped), input_shape=(1, 28, 28))


def test_another_models_profile_says_so(user):
    lite0 = ROOT / "memplan" / "data" / "profiles" / "efficientnet-lite0-fashion-mnist.json"
    with pytest.raises(MemplanError, match="^the contribution profile was measured on efficientnet-lite0"):
        memplan.search.run_search(user["spec"], "20KB", profile_path=lite0)


# ----------------------------------------------------------------------------- 3. another class count


def test_a_class_without_num_classes_is_reheaded(user):
    cap = memplan.capture(user["spec"], (1, 28, 28), classes=4)
    plain = memplan.capture(user["spec"], (1, 28, 28))
    assert cap.classes == 4 and cap.model.classifier.out_features == 4 and plain.classes == 10
    assert memplan.plan.fingerprint(cap.graph) == memplan.plan.fingerprint(plain.graph)  # the backbone is the same
    assert json.loads(user["profile"].read_text())["dataset"]["classes"] == 4  # contrib measured it re-headed


def test_a_head_that_cannot_be_replaced_is_one_line(user):
    spec = user["spec"].replace(":GreyNet", ":ConvHead")
    with pytest.raises(BadOption, match="num_classes"):
        memplan.capture(spec, (1, 28, 28), classes=4)


def test_a_module_of_another_class_count_says_what_to_give(user):
    module = memplan.models.resolve(user["spec"]).model  # a module, not a spec: memplan does not change it
    with pytest.raises(MemplanError, match="outputs 10 classes.*4 outputs"):
        memplan.contrib.run_contrib(module, data=str(user["data"]), estimator="fisher")


# ----------------------------------------------------------------------------- 4. the linear probe on the console


def test_chance_level_probe_warns_and_shows_its_time(tmp_path, capsys):
    model_file = tmp_path / "grey_net.py"
    model_file.write_text(MODEL_SOURCE)
    data = _npz(tmp_path / "noise.npz", seed=1, shuffle_labels=True)
    out = tmp_path / "p.json"
    args = ["contrib", "measure", f"{model_file}:GreyNet", "--data", str(data), "--estimator", "fisher"]
    code, text, _ = run([*args, "--out", str(out)], capsys)
    text = one_line(text)
    prof = memplan.contrib.load_profile(out)
    assert code == 0
    assert f"after a linear probe of {prof.timing['probe_wall_s']:.1f} s at {prof.probe_accuracy:.2f}%" in text
    assert "warning: the linear probe reaches" in text and "chance level (25.0%)" in text


def test_probe_warning_threshold(user):
    from memplan.contrib.profile import probe_warning

    prof = memplan.contrib.load_profile(user["profile"])
    n = prof.dataset["validation"]
    margin = max(2 * (25 * 75 / n) ** 0.5, 7.5)  # two SE of a chance guess, or a tenth of the way to 100%
    assert probe_warning(prof.model_copy(update={"probe_accuracy": 25.0 + margin - 0.01})) is not None
    assert probe_warning(prof.model_copy(update={"probe_accuracy": 25.0 + margin + 0.01})) is None


# ----------------------------------------------------------------------------- 5. training code = the validated setup


def test_training_code_reproduces_the_validated_accuracy(user):
    """prepare -> apply_scheme -> fit_scheme -> accuracy, per seed of the scheme's validation: the
    same preprocessing and head give the stage's accuracy (within its SE; here to 0.01 point)."""
    scheme = memplan.load_scheme(user["scheme"])
    torch.manual_seed(0)  # contrib built the model as built after seed 0
    own = import_attr(user["spec"])(classes=4)  # the user's own model, with the data's class count
    ready = memplan.train.prepare(user["profile"], own, scheme=scheme)
    assert ready.head.endswith("grey-profile.head.pt")
    accs = []
    for seed in scheme.validation.seeds:
        model = memplan.apply_scheme(copy.deepcopy(ready.model), scheme)
        memplan.train.fit_scheme(model, scheme, ready.data.x_train, ready.data.y_train, seed=seed)
        accs.append(memplan.train.accuracy(model, ready.data.x_val, ready.data.y_val))
    mean = sum(accs) / len(accs)
    assert ready.model is own and own.classifier.out_features == 4
    assert abs(mean - scheme.validation.accuracy) <= max(scheme.validation.se, 0.01)
    assert abs(mean - scheme.validation.accuracy) < 0.01  # the same computation, up to float order


def test_prepare_standardises_new_images_as_the_runs_did(user):
    torch.manual_seed(0)
    ready = memplan.train.prepare(user["profile"], import_attr(user["spec"])())  # 10 outputs: re-headed to 4
    assert ready.model.classifier.out_features == 4
    raw = np.load(user["data"])
    x = ready.transform(raw["x_test"])  # the test split is kept whole (no test_per_class)
    assert x.shape[1:] == (1, 28, 28) and torch.allclose(x, ready.data.x_test, atol=1e-6)
    mean = ready.data.x_train.mean((0, 2, 3))
    assert torch.allclose(mean, torch.zeros_like(mean), atol=1e-5)  # standardised with the training split's moments


def test_prepare_refuses_another_backbone_and_a_scheme_without_training(user):
    other = import_attr(user["spec"])(classes=4)
    with torch.no_grad():
        other.features[0].weight.add_(1.0)
    with pytest.raises(BadOption, match="backbone weights"):
        memplan.train.prepare(user["profile"], other)
    scheme = memplan.load_scheme(user["scheme"]).model_copy(update={"training": None})
    with pytest.raises(BadOption, match="records no training"):
        memplan.train.fit_scheme(other, scheme, torch.zeros(2, 1, 28, 28), torch.zeros(2, dtype=torch.long))


def test_apply_scheme_at_the_recorded_shape_trains_the_scheme(user):
    """apply_scheme traces at the scheme's 1 x 28 x 28; one real step changes exactly what it trains."""
    scheme = memplan.load_scheme(user["scheme"])
    model = memplan.apply_scheme(import_attr(user["spec"])(classes=4), scheme)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and "classifier.weight" in trained
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = memplan.train.make_optimizer(model, scheme=scheme)
    memplan.train.fit(model, opt, torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3]), steps=1)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed <= trained


# ----------------------------------------------------------------------------- 6. small truths


def test_budget_units_say_how_they_were_read():
    from memplan.search import budget_convention

    assert budget_convention("100KB") == budget_convention("100kB") == "1000-based (kB, MB, GB; KB read as kB)"
    assert budget_convention("100kb").endswith("kb read as kB (bytes, not bits)")
    assert budget_convention("1mb").endswith("mb read as MB (bytes, not bits)")
    assert budget_convention("100KiB") == "1024-based (KiB, MiB, GiB)"


def test_models_table_shows_the_extra_literally():
    from rich.console import Console

    from memplan.render.tables import print_models

    out = Console(record=True, width=300)
    row = {"name": "x[y]", "input_shape": [3, 8, 8], "classes": 2, "params": 1, "macs": 1, "blocks": 0}
    print_models([{**row, "description": "weights via pip install 'memplan[imagenet]'"}], out)
    text = out.export_text()
    assert "'memplan[imagenet]'" in text and "x[y]" in text


def _section(text: str, title: str) -> str:
    return text.split(title, 1)[1]


def test_readme_train_it_runs_outside_the_repository(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_readme import read_blocks

    train_it = _section((ROOT / "README.md").read_text(encoding="utf-8"), "**3. Train it.**")
    block = next(b for b in read_blocks(train_it) if b.language == "python")
    assert "shipped_scheme(" in block.code
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", block.code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_readme_validate_command_parses():
    """The README's validated-row command: the model first, then the flags the table's rows used."""
    text = one_line((ROOT / "README.md").read_text(encoding="utf-8"))
    command = re.search(r"`(memplan search [^`]*--validate 2)`", text).group(1)
    args = command.replace(" B ", " 30MB ").split()[1:]
    assert args[1] == "efficientnet-lite0"
    for flag in ("--mode applied", "--batch 32", "--optimizer adam", "--profile"):
        assert flag in command
    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("memplan", list(args), resilient_parsing=False)
    sub = cmd.get_command(ctx, args[0])
    sub.make_context("search", args[1:], parent=ctx)  # parses: every flag exists, the model is positional


def test_docs_small_truths():
    accounting = (ROOT / "docs" / "concepts" / "accounting.md").read_text(encoding="utf-8")
    first = _section(accounting, "## Memory components, FLOPs and units").strip().splitlines()[0]
    assert first.startswith("Memory components (all integers in bytes)")
    assert "mkdocs-typer2" not in (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    arch = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    row = next(line for line in arch.splitlines() if line.startswith("| option shared by commands"))
    assert "`options.py`" in row


def test_contrib_validate_costs_at_the_profile_shape(user):
    """``contrib validate``'s budgets and costing capture at the runs' 1 x 28 x 28, not 3 channels."""
    from memplan.search.additivity import costing_shape, default_budgets

    prof = memplan.contrib.load_profile(user["profile"])
    assert costing_shape(prof) == (1, 28, 28)
    assert len(default_budgets(prof)) == 4
