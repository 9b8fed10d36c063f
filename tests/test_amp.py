"""Mixed precision (``--amp``, ``torch.autocast`` in the model's forward): predicted saved bytes
(``pytorch`` mode) against a real CPU step of the same model under the same autocast, measured with
``saved_tensors_hooks`` (unique storages, parameters and buffers excluded), to the byte."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import memplan
from memplan.apply import apply_plain
from memplan.cli import main
from memplan.errors import BadOption
from memplan.strategies import make_plan
from memplan.verify.measure import saved_bytes

from .torch_attention_corpus import ENTRIES as ATTENTION, SHAPE as ATTENTION_SHAPE
from .transformers_corpus import ENTRIES, MISSING

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SHAPE = (3, 8, 8)


class Net(nn.Module):
    """A CNN with a reflect-padded conv (a float32 op under CPU autocast), a BatchNorm, a shared
    input (two convs cast it each) and a residual add of a float32 and a low-precision tensor."""

    def __init__(self, inner: str | None = None):
        super().__init__()
        self.inner = inner
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.left = nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect")
        self.right = nn.Conv2d(8, 8, 1)
        self.head = nn.Sequential(nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def body(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.head(self.left(x) + self.right(x) + x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.inner is None:
            return self.body(x)
        x = self.stem(x)  # outside autocast: float32
        with torch.autocast("cpu", dtype=DTYPES[self.inner]):
            y = self.left(x) + self.right(x)
        return self.head(y.float() + x)


def _measured(model: nn.Module, method: str, amp: str | None, shape: tuple[int, ...], **options) -> tuple[int, int]:
    """(predicted, measured) saved bytes of one training step of ``model`` under ``method``."""
    shape_b = (2, *shape)
    prof = memplan.profile(model, method, batch=2, input_shape=shape, amp=amp, calibration=None, **options)
    graph = memplan.capture(model, batch=2, input_shape=shape, amp=amp).graph
    apply_plain(model, graph, make_plan(graph, method, **options))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(shape_b, generator=g), torch.randint(0, 10, (2,), generator=g)
    with torch.autocast("cpu", dtype=DTYPES.get(amp, torch.bfloat16), enabled=amp is not None):
        measured = saved_bytes(model, x, y).bytes
    return prof.totals.saved_activation_bytes, measured


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
@pytest.mark.parametrize("method", ["full", "bias", "last"])
def test_amp_around_a_cnn_is_byte_exact(amp, method):
    torch.manual_seed(0)
    predicted, measured = _measured(Net(), method, amp, SHAPE)
    assert predicted == measured


@pytest.mark.parametrize("inner", ["bf16", "fp16"])
@pytest.mark.parametrize("method", ["full", "bias"])
def test_autocast_inside_forward_is_byte_exact(inner, method):
    torch.manual_seed(0)
    predicted, measured = _measured(Net(inner), method, None, SHAPE)
    assert predicted == measured


def test_amp_counts_low_precision_copies():
    """The step under bf16 autocast keeps less than the float32 one, and the convs keep their
    bfloat16 weight copies (cast once per weight: the cache), counted as saved activations."""
    torch.manual_seed(0)
    fp32 = memplan.profile(Net(), batch=2, input_shape=SHAPE, calibration=None)
    bf16 = memplan.profile(Net(), batch=2, input_shape=SHAPE, amp="bf16", calibration=None)
    assert bf16.totals.saved_activation_bytes < fp32.totals.saved_activation_bytes
    assert bf16.totals.weight_bytes == fp32.totals.weight_bytes  # the weights stay float32
    assert bf16.extras["amp"] == "bf16" and "amp" not in fp32.extras
    inner = memplan.profile(Net("fp16"), batch=2, input_shape=SHAPE, calibration=None)
    assert inner.extras["amp"] == "in forward"
    stem = bf16.layer("stem.0")
    assert f"weight {8 * 3 * 3 * 3 * 2} B" in stem.saved and stem.kind == "conv"


class Twice(nn.Module):
    """One linear layer applied twice: under autocast its weight is cast once when it requires grad
    (the cast cache, one copy both uses keep) and at each use when it is frozen (two copies)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.shared, self.fc = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.shared(torch.relu(self.shared(self.stem(x)))))


@pytest.mark.parametrize("method", ["full", "bias"])
def test_the_weight_cast_cache(method):
    torch.manual_seed(0)
    predicted, measured = _measured(Twice(), method, "bf16", (8,))
    assert predicted == measured
    layers = memplan.profile(Twice(), method, batch=2, input_shape=(8,), amp="bf16", calibration=None).layers
    shared = 8 * 8 * 2  # bytes of the shared weight's bfloat16 copy
    copies = [s for layer in layers for s in layer.saved if s.startswith("weight") and s.endswith(f" {shared} B")]
    assert len(copies) == (1 if method == "full" else 2)  # bias: the frozen weight's copy at each use


def _vit(inner: bool) -> nn.Module:
    vit = next(e for e in ENTRIES if e.name == "vit").build(32).train()
    if not inner:
        return vit

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = vit

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.model(x)

    return Inner()


@pytest.mark.skipif(bool(MISSING), reason=MISSING)
@pytest.mark.parametrize("inner", [False, True], ids=["around", "inside"])
@pytest.mark.parametrize("method", ["full", "bias"])
def test_amp_on_a_transformers_vit_is_byte_exact(inner, method):
    predicted, measured = _measured(_vit(inner), method, None if inner else "bf16", (3, 32, 32))
    assert predicted == measured


@pytest.mark.skipif(bool(MISSING), reason=MISSING)
@pytest.mark.parametrize(
    "name,amp",
    [("vit-dropout", "bf16"), ("swin", "bf16"), ("efficientnet", "fp16"), ("segformer", "bf16")],
)
def test_amp_around_transformers_models_is_byte_exact(name, amp):
    """Attention with dropout and a float mask (the math kernel, which computes half precision in
    float32), a recorded capture with drop path (``torch.rand(dtype=x.dtype)``), a Conv2d subclass."""
    entry = next(e for e in ENTRIES if e.name == name)
    r = entry.resolutions[0]
    predicted, measured = _measured(entry.build(r).train(), "full", amp, (3, r, r))
    assert predicted == measured


@pytest.mark.parametrize("name", ["mha-both-masks-weights", "mha-dropout", "encoder-masks", "transformer"])
def test_amp_around_torch_attention_modules_is_byte_exact(name):
    """``nn.MultiheadAttention`` and the ``nn.Transformer`` layers, recorded through their parts."""
    entry = next(e for e in ATTENTION if e.name == name)
    predicted, measured = _measured(entry.build().train(), "full", "bf16", ATTENTION_SHAPE[1:])
    assert predicted == measured


@pytest.mark.parametrize("name", ["mobilenetv3-small", "resnet18"])
def test_amp_on_zoo_models_checks(name):
    p = memplan.profile(name, "mobiletl", batch=2, resolution=32, amp="bf16", check=True, calibration=None)
    assert p.check["predicted"] == p.check["observed"] and not p.check["differing"]


def test_check_runs_under_the_same_autocast():
    torch.manual_seed(0)
    p = memplan.profile(Net(), "bias", batch=2, input_shape=SHAPE, amp="fp16", check=True, calibration=None)
    assert p.check["predicted"] == p.check["observed"] and not p.check["differing"]


def test_a_mode_that_does_not_cost_autocast_refuses_it():
    """memplan's lean autograd ops (``applied`` mode) under autocast are not modelled: refused, not guessed."""
    with pytest.raises(BadOption, match="mode 'applied' does not cost a step under autocast"):
        memplan.profile(Net(), "bias", input_shape=SHAPE, amp="bf16", mode="applied")
    with pytest.raises(BadOption, match=r"\(amp: in forward\)"):
        memplan.profile(Net("bf16"), "bias", input_shape=SHAPE, mode="applied")


def test_bad_amp_is_one_line(capsys):
    with pytest.raises(BadOption, match="--amp must be one of bf16, fp16"):
        memplan.profile(Net(), input_shape=SHAPE, amp="fp8")
    with pytest.raises(SystemExit) as exc:
        main(["profile", "mcunet-5fps", "--amp", "int4"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--amp must be one of" in err and "Traceback" not in err


def test_amp_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "mcunet-5fps", "-r", "32", "--amp", "bf16", "--json", "-", "--calibration", "none"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert '"saved_activation_bytes"' in out
