"""Capture of model patterns seen in third-party libraries: modules that subclass a known layer
but compute something else, functional layers, custom autograd Functions, script functions,
shape-dependent control flow, extra forward arguments, structured outputs. Every number is
checked against saved_tensors_hooks / FlopCounterMode on a real CPU run."""

from __future__ import annotations

import collections
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memplan
from memplan.accounting.engine import compute
from memplan.apply import apply_plain
from memplan.check import check
from memplan.graph.capture import capture_graph
from memplan.modes import get_mode
from memplan.strategies import make_plan
from memplan.verify.measure import saved_bytes

from .test_flops import measure_flops

BASIC = [("full", {}), ("last", {}), ("norm", {}), ("bias", {}), ("lastk", {"layers": 2})]


class BNAct(nn.BatchNorm2d):
    """A norm layer that applies its activation in its own forward (timm's BatchNormAct2d style)."""

    def __init__(self, c: int):
        super().__init__(c)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(
            F.batch_norm(
                x,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                self.training or not self.track_running_stats,
                0.1,
                self.eps,
            )
        )


class ConvSame(nn.Conv2d):
    """TensorFlow "SAME" padding computed from the input shape in forward (geffnet Conv2dSame style)."""

    def forward(self, x):
        ih, iw = x.shape[-2:]
        ph = max((-(ih // -self.stride[0]) - 1) * self.stride[0] + self.kernel_size[0] - ih, 0)
        pw = max((-(iw // -self.stride[1]) - 1) * self.stride[1] + self.kernel_size[1] - iw, 0)
        if ph > 0 or pw > 0:
            x = F.pad(x, [pw // 2, pw - pw // 2, ph // 2, ph - ph // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class InitOnly(nn.Conv2d):
    """Overrides __init__ only: still a stock Conv2d."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__(c_in, c_out, 3, padding=1, bias=False)


class SwishFn(torch.autograd.Function):
    """Memory-efficient swish: saves only its input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return g * (s * (1 + x * (1 - s)))


@torch.jit.script
def hard_sigmoid_script(x: torch.Tensor) -> torch.Tensor:
    return F.relu6(x + 3.0) / 6.0


class Block(nn.Module):
    def __init__(self, c: int, act: str):
        super().__init__()
        self.pw = InitOnly(c, 2 * c)
        self.bn = BNAct(2 * c)
        self.dw = ConvSame(2 * c, 2 * c, 3, stride=2, groups=2 * c, bias=False)
        self.gate = nn.Linear(2 * c, 2 * c)
        self.proj = nn.Conv2d(2 * c, c, 1)
        self.act = act

    def forward(self, x):
        y = self.dw(self.bn(self.pw(x)))
        y = SwishFn.apply(y) if self.act == "swish" else y * hard_sigmoid_script(y)
        se = F.linear(y.mean((2, 3)), self.gate.weight, self.gate.bias)  # functional use of a module's weight
        y = y * torch.sigmoid(se)[:, :, None, None]
        if self.training:  # drop connect, as efficientnet_pytorch does
            keep = torch.floor(0.8 + torch.rand(y.shape[0], 1, 1, 1, dtype=y.dtype, device=y.device))
            y = y / 0.8 * keep
        return self.proj(y)


class ThirdPartyStyle(nn.Module):
    def __init__(self, act: str = "swish", classes: int = 5):
        super().__init__()
        self.stem = ConvSame(3, 8, 3, stride=2)
        self.blocks = nn.Sequential(Block(8, act), Block(8, act))
        self.head = nn.Linear(8, classes)

    def forward(self, x, features_only: bool = False):
        x = self.blocks(self.stem(x))
        return x if features_only else self.head(x.mean((2, 3)))


def _randomise_norms(model: nn.Module) -> None:
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 2)
                m.bias.uniform_(-1, 1)


def _exact(model: nn.Module, shape: tuple[int, ...], method: str, opts: dict, classes: int = 5, output=None):
    graph = capture_graph(model, shape, output=output)
    plan = make_plan(graph, method, **opts)
    prof = compute(graph, plan, get_mode("pytorch"))
    apply_plain(model, graph, plan)
    torch.manual_seed(1)
    x, y = torch.randn(shape), torch.randint(0, classes, (shape[0],))
    meas = saved_bytes(model, x, y, output=output)
    assert prof.unknown_ops == {}, prof.unknown_ops
    assert prof.totals.saved_activation_bytes == meas.bytes, (method, meas.tensors)
    return graph, prof


def test_known_layers_only_when_forward_is_stock():
    graph = capture_graph(ThirdPartyStyle(), (2, 3, 32, 32))
    kinds = collections.Counter((n.target, n.kind) for n in graph.nodes)
    assert kinds[("InitOnly", "conv")] == 2  # __init__ override only: a stock conv module
    assert kinds[("conv2d", "conv")] == 3  # ConvSame traced into: its F.conv2d is the conv layer
    assert kinds[("batch_norm", "batchnorm")] == 2 and kinds[("ReLU", "relu")] == 2  # BNAct: norm + activation
    assert kinds[("SwishFn.apply", "unknown")] == 2  # one opaque node per custom Function call
    stem = graph.by_name("stem")  # a functional layer is named after the module owning its weight
    assert stem.kind == "conv" and set(stem.params) == {"weight", "bias"} and stem.attrs["stride"] == (2, 2)


@pytest.mark.parametrize("method,opts", BASIC)
@pytest.mark.parametrize("act", ["swish", "script"])
def test_third_party_patterns_byte_exact_and_flops(method, opts, act):
    torch.manual_seed(0)
    model = ThirdPartyStyle(act)
    graph, prof = _exact(model, (2, 3, 32, 32), method, opts)
    if method != "last":
        assert prof.observed_ops.get("SwishFn.apply" if act == "swish" else "hard_sigmoid_script", 0) == 2
        assert prof.observed_ops.get("rand") == 2 and prof.observed_ops.get("floor") == 2
    model.zero_grad(set_to_none=True)
    fwd, bwd = measure_flops(model, (2, 3, 32, 32), classes=5)
    t = prof.totals
    assert t.forward_flops == fwd and t.backward_grad_input_flops + t.backward_grad_weight_flops == bwd


def test_functional_layers_train_with_their_module():
    graph = capture_graph(ThirdPartyStyle(), (2, 3, 32, 32))
    plan = make_plan(graph, "bias")
    # the F.linear of blocks.0.gate and the stem's F.conv2d are layers the strategies see
    assert plan.train["blocks.0.gate"].bias and plan.train["stem"].bias
    assert "blocks.0.bn" in {n.name for n in graph.param_nodes() if n.kind == "batchnorm"}


class ShapeDependent(nn.Module):
    """Python control flow on a shape and iteration over a tensor: symbolic tracing fails."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        x = F.relu(self.bn(self.conv(x)))
        if x.shape[-1] > 8:
            x = F.max_pool2d(x, 2)
        rows = [r.mean((1, 2)) for r in x]  # iterate over the batch
        return self.fc(torch.stack(rows))


@pytest.mark.parametrize("method,opts", BASIC)
def test_recorded_capture_is_byte_exact(method, opts):
    torch.manual_seed(0)
    graph, prof = _exact(ShapeDependent(), (3, 3, 16, 16), method, opts, classes=4)
    assert graph.capture == "recorded" and prof.capture == "recorded"
    assert prof.observed_ops == {} and any(n.kind == "maxpool" for n in graph.nodes)


Out = collections.namedtuple("Out", ["features", "logits"])


class Structured(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 3)
        self.aux = nn.Linear(4, 3)

    def forward(self, x, scale: float = 1.0, mask=None):
        maps = F.relu(self.conv(x))
        f = maps.mean((2, 3)) * scale
        if self.kind == "tuple":
            return self.fc(f), self.aux(f)
        if self.kind == "dict":
            return {"aux": self.aux(f), "logits": self.fc(f)}
        return Out(maps, self.fc(f))


@pytest.mark.parametrize(
    "kind,output", [("tuple", None), ("tuple", 1), ("dict", "logits"), ("dict", None), ("namedtuple", "logits")]
)
def test_structured_outputs_and_defaulted_arguments(kind, output):
    torch.manual_seed(0)
    graph, _ = _exact(Structured(kind), (2, 3, 8, 8), "full", {}, classes=3, output=output)
    assert graph.classes == 3


def test_output_that_is_not_logits_is_a_one_line_error():
    with pytest.raises(memplan.MemplanError, match="--output"):
        capture_graph(Structured("namedtuple"), (2, 3, 8, 8))  # the first tensor is the feature maps


@pytest.mark.parametrize("method,opts", BASIC + [("mobiletl", {"blocks": 1})])
def test_apply_never_changes_what_the_model_computes(method, opts):
    torch.manual_seed(0)
    base = ThirdPartyStyle("script")
    _randomise_norms(base)
    x = torch.randn(2, 3, 32, 32)
    base.eval()
    ref = base(x)
    model = memplan.apply_strategy(copy.deepcopy(base), method, input_shape=(2, 3, 32, 32), **opts)
    model.eval()
    assert torch.equal(model(x), ref)
    graph = capture_graph(copy.deepcopy(base), (2, 3, 32, 32))
    prof = compute(graph, make_plan(graph, method, **opts), get_mode("applied"))
    model.train()
    fresh = memplan.apply_strategy(copy.deepcopy(base), method, input_shape=(2, 3, 32, 32), **opts)
    assert prof.totals.saved_activation_bytes == saved_bytes(fresh, x, torch.randint(0, 5, (2,))).bytes
    if method in ("bias", "norm"):  # the BNAct norms (and recorded ConvSame convs) keep what PyTorch keeps
        assert prof.extras["left_as_is"]["batch_norm"] == 2 and prof.extras["left_as_is"]["conv2d"] >= 2


class NeedsNoGrad(nn.Module):
    """A leaf that refuses inputs requiring grad: it runs during capture but not when replayed."""

    def forward(self, x):
        if x.requires_grad:
            raise RuntimeError("no autograd here")
        return x * 2


def test_op_that_cannot_be_replayed_is_bounded_and_listed():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), NeedsNoGrad(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    graph = capture_graph(model, (2, 3, 6, 6), leaf_modules=[NeedsNoGrad])
    prof = compute(graph, make_plan(graph, "full"), get_mode("pytorch"))
    x = graph.nodes[2].in_tensors[0].nbytes
    assert prof.unknown_ops == {"NeedsNoGrad": 1}
    assert prof.layer("1").saved_activation_bytes == 2 * x  # upper bound: its input + its output
    assert "unknown_ops" in prof.conventions["observed"]


@pytest.mark.parametrize("name", memplan.models.zoo.names())
def test_check_agrees_on_every_zoo_model(name):
    from .helpers import real_model, small_shape

    model = real_model(name)
    graph = capture_graph(model, small_shape(name))
    for method, opts in BASIC:
        if method == "lastk" and graph.blocks:
            opts = {"blocks": 2}
        result = check(model, graph, make_plan(graph, method, **opts))
        assert result.agrees, (name, method, result.differing)


def test_check_on_third_party_patterns_and_cli(capsys):
    model = ThirdPartyStyle("script")
    p = memplan.profile(model, "bias", batch=2, input_shape=(3, 32, 32), check=True)
    assert p.check["predicted"] == p.check["observed"] == p.totals.saved_activation_bytes
    assert p.check["differing"] == []


class Sliced(nn.Module):
    """Once-for-all supernet style: the active sub-network reads slices of larger parameters
    (``F.batch_norm`` on ``bn.weight[:c]``, a classifier ``F.linear`` on ``fc.weight[:, :c].contiguous()``)."""

    def __init__(self, active: int):
        super().__init__()
        self.active = active
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        c = self.active
        x = F.conv2d(x, self.conv.weight[:c], self.conv.bias[:c], padding=1)
        x = F.batch_norm(
            x,
            self.bn.running_mean[:c],
            self.bn.running_var[:c],
            self.bn.weight[:c],
            self.bn.bias[:c],
            self.training,
            0.1,
            self.bn.eps,
        )
        x = F.relu(x).mean((2, 3))
        return F.linear(x, self.fc.weight[:, :c].contiguous(), self.fc.bias)


@pytest.mark.parametrize("method,opts", BASIC)
@pytest.mark.parametrize("active", [8, 6])
def test_parameters_read_through_slices_train_and_cost_exactly(method, opts, active):
    torch.manual_seed(0)
    model = Sliced(active)
    graph, prof = _exact(model, (2, 3, 8, 8), method, opts, output=None)
    # the F.linear owns the bias it reads directly; its weight slice is read from parameter node fc.weight
    assert [n.name for n in graph.classifier_layers] == ["fc", "fc.weight"]
    fwd, bwd = measure_flops(model, (2, 3, 8, 8), classes=5)
    t = prof.totals
    assert t.forward_flops == fwd and t.backward_grad_input_flops + t.backward_grad_weight_flops == bwd
    x = torch.randn(2, 3, 8, 8)
    ref = model.eval()(x)
    applied = memplan.apply_strategy(copy.deepcopy(model), method, input_shape=(2, 3, 8, 8), **opts)
    assert torch.equal(applied.eval()(x), ref)
    trained = {n for n, p in applied.named_parameters() if p.requires_grad}
    expected = {
        "last": {"fc.weight", "fc.bias"},
        "norm": {"fc.weight", "fc.bias", "bn.weight", "bn.bias"},
        "bias": {"fc.weight", "fc.bias", "bn.bias", "conv.bias"},
    }  # full, lastk --layers 2 (from conv): all
    assert trained == expected.get(method, set(dict(model.named_parameters())))


def test_paper_convention_refuses_parameters_it_has_no_rule_for():
    last = memplan.profile(Sliced(6), "last", mode="tinytraining", batch=2, input_shape=(3, 8, 8))
    assert last.extras["tinytraining"]["activation_bits"] == 2 * 6 * 8  # the classifier input, 8-bit
    with pytest.raises(memplan.MemplanError, match="no rule for training parameter .conv.bias."):
        memplan.profile(Sliced(6), "bias", mode="tinytraining", batch=2, input_shape=(3, 8, 8))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(
    "call", [((2, 3), True), ((2, 3), False), ((-1, -2), True), (3, True), ((1,), False), (None, False)]
)
def test_mean_laid_out_as_its_kernel_lays_it_out(channels_last, call):
    """The capture's own ``mean`` output (it skips the meta kernel) has the shape and strides of
    the meta kernel's and of the CPU kernel's."""
    from memplan.graph.layout import mean_output

    x = torch.randn(2, 8, 4, 4)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    dim, keepdim = call
    meta = torch.empty_strided(x.shape, x.stride(), device="meta")
    args = (meta,) if dim is None else (meta, dim, keepdim)
    ours = mean_output(args, {})
    for ref in (x.mean() if dim is None else x.mean(dim, keepdim), meta.mean(*args[1:])):
        assert (ours.shape, ours.stride(), ours.dtype) == (ref.shape, ref.stride(), ref.dtype)
