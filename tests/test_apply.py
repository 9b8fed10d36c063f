"""apply_plan / apply_strategy / apply_scheme and the ``applied`` mode, checked against
saved_tensors_hooks measurements, plain-PyTorch gradients and real SGD steps."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memplan
from memplan.accounting.engine import compute
from memplan.apply import apply_plain, apply_plan, apply_scheme, apply_strategy, write_back
from memplan.errors import BadOption, MemplanError
from memplan.graph import conv_layers
from memplan.graph.capture import capture_graph
from memplan.modes import get_mode
from memplan.nn.lean import (
    FrozenConv,
    LeanAvgPool2d,
    MaskedDropout,
    MaskedReLU,
    ShiftOnlyNorm,
    SignHardswish,
    SubChannelConv,
)
from memplan.nn.train import fit, make_optimizer
from memplan.plan import Plan, Scheme, Train
from memplan.strategies import STRATEGIES, make_plan
from memplan.verify.measure import saved_bytes

from .conftest import small_shape
from .helpers import real_model

MODELS = ["mcunet-5fps", "mbv2-w0.35", "proxylessnas-mobile", "mobilenetv3-small"]
METHODS = ["full", "last", "norm", "bias", "lastk", "mobiletl", "sparse"]


def sparse_config(graph) -> dict:
    """tiny-training backward_config: biases of the last 8 convs, four weights at mixed ratios."""
    n = len(conv_layers(graph))
    return {
        "n_bias_update": 8,
        "manual_weight_idx": [n - 8, n - 6, n - 4, n - 2],
        "weight_update_ratio": [0.25, 0.5, 1, 0.125],
    }


def options(method: str, graph) -> dict:
    assert method in STRATEGIES, f"strategy {method} is not registered"  # a missing strategy fails, never skips
    by_method = {"lastk": {"blocks": 2}, "mobiletl": {"blocks": 2}, "sparse": {"scheme": sparse_config(graph)}}
    return by_method.get(method, {})


def planned(name: str, method: str, shape=None, classes: int = 10, seed: int = 0):
    """(real model, graph, plan, shape): nothing applied yet."""
    model = real_model(name, classes, seed)
    shape = shape or small_shape(name)
    graph = capture_graph(model, shape)
    plan = make_plan(graph, method, **options(method, graph))
    return model, graph, plan, shape


def batch(shape, classes: int = 10):
    g = torch.Generator().manual_seed(1)
    return torch.randn(shape, generator=g), torch.randint(0, classes, (shape[0],), generator=g)


def mode_bytes(graph, plan, mode: str) -> int:
    prof = compute(graph, plan, get_mode(mode))
    assert prof.unknown_ops == {}
    return prof.totals.saved_activation_bytes


# ----------------------------------------------------------------------------- byte-exact predictions
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("method", METHODS)
def test_applied_prediction_is_byte_exact(name, method):
    model, graph, plan, shape = planned(name, method)
    predicted = mode_bytes(graph, plan, "applied")
    assert apply_plan(model, plan, graph) is model
    x, y = batch(shape)
    measured = saved_bytes(model, x, y, backward=True)
    assert measured.bytes == predicted, measured.tensors
    # these zoo models have lean ops for every op ideal improves on: applied == ideal, except
    # that a ReLU whose output a trainable conv keeps anyway needs no mask (ideal counts one)
    ideal = mode_bytes(graph, plan, "ideal")
    if any(n.kind == "relu" for n in graph.nodes):
        assert measured.bytes <= ideal
    else:
        assert measured.bytes == ideal
    assert measured.bytes <= mode_bytes(graph, plan, "pytorch")  # never more than plain PyTorch
    # profiling the applied model still works: lean modules are leaves of the same kinds
    assert mode_bytes(capture_graph(model, shape), plan, "applied") == measured.bytes


def test_bias_saving_over_plain_pytorch_proxylessnas():
    """TinyTL's point: bias-only fine-tuning saves almost as much as full in eager PyTorch."""
    shape = small_shape("proxylessnas-mobile", batch=2, resolution=96)
    x, y = batch(shape)
    measured = {}
    for setup in ("pytorch", "applied"):
        model, graph, plan, _ = planned("proxylessnas-mobile", "bias", shape)
        (apply_plain(model, graph, plan) if setup == "pytorch" else apply_plan(model, plan, graph))
        measured[setup] = saved_bytes(model, x, y).bytes
        assert measured[setup] == mode_bytes(graph, plan, setup)
    ratio = measured["pytorch"] / measured["applied"]
    print(
        f"proxylessnas-mobile bias 96px batch 2: plain {measured['pytorch']} B, applied "
        f"{measured['applied']} B, {ratio:.1f}x"
    )
    assert ratio >= 10


# ----------------------------------------------------------------------------- what apply_plan does
def test_apply_strategy_swaps_lean_modules_in_place():
    model = real_model("mobilenetv3-small")
    shape = small_shape("mobilenetv3-small")
    same = apply_strategy(model, "mobiletl", input_shape=shape, blocks=2)
    assert same is model
    kinds = {type(m) for m in model.modules()}
    assert {ShiftOnlyNorm, SignHardswish, MaskedDropout} <= kinds and FrozenConv not in kinds  # all convs train
    last_block = model.blocks[-1]
    # mobiletl: every conv of the top blocks trains, internal norms shift only, h-swish approximated
    assert isinstance(last_block.conv.dw.bn, ShiftOnlyNorm) and last_block.conv.dw.bn.bias.requires_grad
    assert isinstance(last_block.conv.dw.act, SignHardswish)
    assert type(last_block.conv.dw.conv) is nn.Conv2d and last_block.conv.dw.conv.weight.requires_grad
    assert type(last_block.conv.project.bn) is nn.BatchNorm2d and last_block.conv.project.bn.training
    assert not any(p.requires_grad for p in model.blocks[0].parameters())  # frozen prefix
    assert type(model.stem.conv) is nn.Conv2d  # nothing recorded there: left alone
    assert not model.blocks[0].conv.dw.bn.training


def test_apply_plan_sparse_uses_the_plan_selection_rule():
    model, graph, _, shape = planned("mcunet-5fps", "full")
    convs = conv_layers(graph)
    plan = Plan(
        "sparse",
        {
            convs[-2].name: Train(0.5, False, "random"),
            convs[-4].name: Train(0.25, False, "magnitude-"),
            graph.classifier.name: Train(1.0, True),
        },
    )
    apply_plan(model, plan, graph)
    a, b = model.get_submodule(convs[-2].name), model.get_submodule(convs[-4].name)
    assert isinstance(a, SubChannelConv) and (a.rule, a.ratio) == ("random", 0.5)
    assert isinstance(b, SubChannelConv) and (b.rule, b.ratio) == ("magnitude-", 0.25)
    x, y = batch(shape)
    assert saved_bytes(model, x, y).bytes == mode_bytes(graph, plan, "applied")
    # the trainable slices live next to the frozen weights: part of the applied total and peak
    copies = a.weight_sel.numel() * 4 + b.weight_sel.numel() * 4
    applied = compute(graph, plan, get_mode("applied"))
    assert applied.extras["subchannel_copy_bytes"] == copies
    assert applied.totals.total_bytes == (
        applied.totals.weight_bytes + applied.totals.gradient_bytes + applied.totals.saved_activation_bytes + copies
    )


def test_apply_plan_traces_itself_and_refuses_other_graphs_and_reapplying():
    shape = small_shape("mcunet-5fps")
    model = real_model("mcunet-5fps")
    other_graph = capture_graph(real_model("mcunet-5fps"), shape)
    plan = make_plan(other_graph, "bias")
    with pytest.raises(BadOption, match="not traced from this model"):
        apply_plan(model, plan, other_graph)
    apply_plan(model, plan, input_shape=shape)  # traced on meta at that shape
    assert isinstance(model.blocks[-1].conv.project.bn, ShiftOnlyNorm)
    with pytest.raises(BadOption, match="already holds memplan lean modules"):
        apply_plan(model, plan, input_shape=shape)


def test_apply_plan_refuses_what_no_lean_op_realises():
    model = real_model("mobilenetv3-small")
    graph = capture_graph(model, small_shape("mobilenetv3-small"))
    head = graph.classifier.name
    with pytest.raises(BadOption, match="no sub-channel linear op"):
        apply_plan(model, Plan("x", {head: Train(0.5, True)}), graph)
    gate = next(n.name for n in graph.nodes if n.kind == "hardsigmoid")
    with pytest.raises(BadOption, match="no sign-approximated backward for hardsigmoid"):
        apply_plan(model, Plan("x", {head: Train(1.0, True)}, approx={gate}), graph)
    grouped = nn.Sequential(nn.Conv2d(4, 8, 3, groups=2), nn.Flatten(), nn.Linear(8 * 4 * 4, 3))
    g2 = capture_graph(grouped, (2, 4, 6, 6))
    with pytest.raises(BadOption, match="cannot apply SubChannelConv"):
        apply_plan(grouped, Plan("x", {"0": Train(0.5)}), g2)


def test_apply_scheme_and_write_back(tmp_path):
    model, graph, _, shape = planned("mbv2-w0.35", "full")
    scheme = Scheme.from_backward_config(sparse_config(graph), graph)
    path = tmp_path / "scheme.json"
    scheme.save(path)
    apply_scheme(model, str(path))
    subs = {n: m for n, m in model.named_modules() if isinstance(m, SubChannelConv)}
    assert len(subs) == 3  # ratio 1 trains a plain conv
    x, y = batch(shape)
    before = {n: m.weight.detach().clone() for n, m in subs.items()}
    opt = make_optimizer(model.parameters(), "sgd", 0.1)
    fit(model, opt, x, y, steps=2)
    merged = {n: m.merged_weight() for n, m in subs.items()}
    assert all(torch.equal(m.weight, before[n]) for n, m in subs.items())  # stale until write_back
    write_back(model)
    assert all(torch.equal(m.weight, merged[n]) for n, m in subs.items())
    other = real_model("mcunet-5fps")
    with pytest.raises(MemplanError, match="layer table differs"):
        apply_scheme(other, scheme)


def test_profile_api_accepts_applied_mode():
    p = memplan.profile("mcunet-5fps", "bias", mode="applied", resolution=32, batch=2, classes=10)
    assert p.mode == "applied" and p.unknown_ops == {}


def test_relu_feeding_a_trained_conv_keeps_no_mask():
    """ReLU's output is the next conv's input: when that conv trains, PyTorch's ReLU shares the
    tensor the conv keeps (free), a mask would cost numel / 8 bytes more."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 1),
        nn.ReLU(),
        nn.Conv2d(8, 4, 1),
        nn.Flatten(),
        nn.Linear(4 * 6 * 6, 3),
    )
    graph = capture_graph(model, (2, 3, 8, 8))
    plan = Plan("x", {"0": Train(0.0, True), "3": Train(1.0, True), "5": Train(0.0, True), "7": Train(1.0, True)})
    predicted = mode_bytes(graph, plan, "applied")
    apply_plan(model, plan, graph)
    assert isinstance(model[0], FrozenConv) and isinstance(model[1], ShiftOnlyNorm)
    assert type(model[2]) is nn.ReLU and type(model[4]) is MaskedReLU  # conv 5 is frozen
    x, y = batch((2, 3, 8, 8), 3)
    # conv 3 input (= ReLU 2 output) 2x8x6x6 floats, ReLU 4 mask, linear input 2x144 floats, loss
    hand = 2 * 8 * 36 * 4 + math.ceil(2 * 8 * 36 / 8) + 2 * 144 * 4 + (2 * 3 * 4 + 2 * 8 + 4)
    assert saved_bytes(model, x, y).bytes == predicted == hand


class SharedReLU(nn.Module):
    """One ReLU module called twice (torchvision ResNet style): its first output feeds a trained
    conv (kept anyway), its second does not."""

    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.c3 = nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        x = self.c3(self.relu(self.c2(self.relu(self.c1(x)))))
        return self.fc(x.mean((2, 3)))


def test_module_called_twice_gets_one_decision():
    torch.manual_seed(0)
    model = SharedReLU()
    graph = capture_graph(model, (2, 3, 8, 8))
    plan = Plan("x", {"c1": Train(0.0, True), "c2": Train(1.0, True), "fc": Train(1.0, True)})
    predicted = mode_bytes(graph, plan, "applied")
    apply_plan(model, plan, graph)
    assert isinstance(model.relu, MaskedReLU)  # the second call wants a mask: both calls get one
    x, y = batch((2, 3, 8, 8), 3)
    # c2 input (first ReLU output) 2x4x6x6 floats + two masks of 2x4x6x6 bits, fc input, loss
    hand = 2 * 4 * 36 * 4 + 2 * math.ceil(2 * 4 * 36 / 8) + 2 * 4 * 4 + (2 * 3 * 4 + 2 * 8 + 4)
    assert saved_bytes(model, x, y).bytes == predicted == hand


# ----------------------------------------------------------------------------- other ops, fallbacks
class Mixed(nn.Module):
    """Ops apply_plan swaps (avg-pool, leaky ReLU, hardtanh, dropout) next to ops it leaves alone
    (GroupNorm, max-pool, functional relu, in-place dropout, hardsigmoid, SiLU, conv with string padding)."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.act1 = nn.LeakyReLU(0.1)
        self.pool = nn.AvgPool2d(2)
        self.c2 = nn.Conv2d(8, 8, 3, padding="same")
        self.bn = nn.BatchNorm2d(8)
        self.act2 = nn.Hardtanh(-1.0, 2.0)
        self.mp = nn.MaxPool2d(2)
        self.c3 = nn.Conv2d(8, 16, 1)
        self.gate = nn.Hardsigmoid()
        self.silu = nn.SiLU()
        self.drop = nn.Dropout(0.3)
        self.drop_inplace = nn.Dropout(0.2, inplace=True)
        self.fc = nn.Linear(16 * 4 * 4, 5)

    def forward(self, x):
        x = self.pool(self.act1(self.gn(self.c1(x))))
        x = self.mp(self.act2(self.bn(self.c2(x))))
        x = F.relu(self.c3(x))
        x = self.silu(x * self.gate(x))
        return self.fc(self.drop_inplace(self.drop(torch.flatten(x, 1)) * 1.0))


@pytest.mark.parametrize("method", ["full", "bias", "norm", "last"])
def test_mixed_ops_byte_exact_and_documented_gaps(method):
    torch.manual_seed(0)
    model = Mixed()
    graph = capture_graph(model, (2, 3, 16, 16))
    plan = make_plan(graph, method)
    predicted = mode_bytes(graph, plan, "applied")
    apply_plan(model, plan, graph)
    x, y = batch((2, 3, 16, 16), 5)
    assert saved_bytes(model, x, y, backward=True).bytes == predicted
    if method == "bias":  # the swaps that apply: lean pool, masks, frozen convs, shift-only BN
        assert isinstance(model.pool, LeanAvgPool2d) and isinstance(model.drop, MaskedDropout)
        assert isinstance(model.c1, FrozenConv) and isinstance(model.bn, ShiftOnlyNorm)
        assert type(model.c2) is nn.Conv2d and type(model.drop_inplace) is nn.Dropout  # left alone
    if method == "last":
        assert predicted == mode_bytes(graph, plan, "ideal")


def kept_by(module: nn.Module, x: torch.Tensor) -> list[int]:
    """Storage bytes of each tensor autograd keeps for backward of ``module(x)``."""
    kept: list[int] = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: kept.append(t.untyped_storage().nbytes()) or t, lambda t: t
    ):
        module(x)
    return kept


def test_lean_dropout_and_avgpool_match_plain():
    torch.manual_seed(0)
    x = torch.randn(4, 6, 9, 9)
    for plain, lean in [
        (nn.AvgPool2d(2), LeanAvgPool2d.from_module(nn.AvgPool2d(2))),
        (
            nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
            LeanAvgPool2d.from_module(nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False)),
        ),
    ]:
        outs = []
        for mod in (plain, lean):
            xi = x.clone().requires_grad_(True)
            y = mod(xi)
            y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(2)))
            outs.append((y.detach(), xi.grad))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        assert kept_by(lean, x.clone().requires_grad_(True)) == []
    xd = torch.randn(4, 1000)
    outs = []
    for mod in (nn.Dropout(0.3), MaskedDropout.from_module(nn.Dropout(0.3))):
        torch.manual_seed(7)
        xi = xd.clone().requires_grad_(True)
        y = mod(xi)
        y.backward(torch.ones_like(y) * 0.5)
        outs.append((y.detach(), xi.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    drop = MaskedDropout(0.3)
    assert kept_by(drop, xd.clone().requires_grad_(True)) == [math.ceil(4 * 1000 / 8)]
    assert torch.equal(drop.eval()(xd), xd)
    with pytest.raises(NotImplementedError):
        MaskedDropout.from_module(nn.Dropout(0.2, inplace=True))


# ----------------------------------------------------------------------------- training
def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}


@pytest.mark.parametrize("name", ["mcunet-5fps", "mobilenetv3-small"])
@pytest.mark.parametrize("method", METHODS)
def test_sgd_lowers_loss_and_leaves_frozen_state_bit_identical(name, method):
    # batch 4 at 48 px: batch statistics of a 2-sample batch at 1x1 maps make train-mode norms erratic
    model, graph, plan, shape = planned(name, method, small_shape(name, batch=4, resolution=48))
    apply_plan(model, plan, graph)
    before = snapshot(model)
    frozen = {k for k, v in model.state_dict(keep_vars=True).items() if not v.requires_grad}
    # buffers that legitimately change: running statistics of norms in train mode
    moving = {
        k
        for k in frozen
        for n in plan.norm_train
        if k.startswith(n + ".") and "running" in k or k == f"{n}.num_batches_tracked"
    }
    x, y = batch(shape)
    torch.manual_seed(3)
    losses = fit(model, make_optimizer(model.parameters(), "sgd", 0.01), x, y, steps=4)
    assert losses[-1] < losses[0], losses
    after = model.state_dict(keep_vars=True)
    changed = [k for k in frozen - moving if not torch.equal(after[k], before[k])]
    assert changed == []
    for mod in model.modules():
        if isinstance(mod, SubChannelConv):  # unselected channels bit-identical, selected ones got gradients
            dim, index = (1, mod.idx) if mod.groups == 1 else (0, mod.rows)
            rest = torch.ones(mod.weight.shape[dim], dtype=torch.bool)
            rest[index] = False
            keep = rest.nonzero().flatten()
            assert torch.equal(mod.merged_weight().index_select(dim, keep), mod.weight.index_select(dim, keep))
            assert mod.weight_sel.grad is not None and mod.weight_sel.grad.abs().sum() > 0


EXACT_METHODS = ["full", "last", "norm", "bias", "lastk", "sparse"]


@pytest.mark.parametrize(
    "name,method",
    [(n, m) for n in MODELS for m in EXACT_METHODS] + [("mbv2-w0.35", "mobiletl"), ("proxylessnas-mobile", "mobiletl")],
)
def test_gradients_equal_plain_pytorch(name, method):
    """Every lean op except the sign-approximated h-swish is exact. mobiletl on ReLU6-only
    networks approximates nothing (ReLU6's 1-bit mask is its exact derivative)."""
    plain, graph, plan, shape = planned(name, method)
    lean = copy.deepcopy(plain)
    apply_plain(plain, graph, plan)
    apply_plan(lean, plan, capture_graph(lean, shape))
    x, y = batch(shape)
    losses = []
    for model in (plain, lean):
        torch.manual_seed(5)  # the same dropout draw
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        losses.append(loss.detach())
    assert torch.equal(losses[0], losses[1])
    lean_params = dict(lean.named_parameters())
    compared = 0
    for pname, p in plain.named_parameters():
        if not p.requires_grad:
            continue
        q = lean_params[pname]
        owner = lean.get_submodule(pname.rpartition(".")[0])
        if isinstance(owner, SubChannelConv) and pname.endswith(".weight"):
            dim, index = (1, owner.idx) if owner.groups == 1 else (0, owner.rows)
            ref, got = p.grad.index_select(dim, index), owner.weight_sel.grad
        else:
            ref, got = p.grad, q.grad
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7, msg=pname)
        compared += 1
    assert compared == sum(1 for p in lean.parameters() if p.requires_grad)


def test_optimizer_state_and_gradients_match_the_prediction():
    """Gradient and optimizer-state bytes the costs predict, against the tensors that exist."""
    model, graph, plan, shape = planned("mbv2-w0.35", "sparse")
    apply_plan(model, plan, graph)
    x, y = batch(shape)
    for opt_name in ("sgd", "sgd-momentum", "adam"):
        prof = compute(graph, plan, get_mode("applied"), optimizer=opt_name)
        opt = make_optimizer(model.parameters(), opt_name, 0.01)
        fit(model, opt, x, y, steps=1)
        grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        state = sum(v.numel() * v.element_size() for s in opt.state.values() for k, v in s.items() if k != "step")
        assert grads == prof.totals.gradient_bytes
        assert state == prof.totals.optimizer_bytes
    assert make_optimizer(model.parameters()).defaults["momentum"] == 0  # the 256KB paper's plain SGD
    with pytest.raises(BadOption):
        make_optimizer(model.parameters(), "rmsprop")
    with pytest.raises(BadOption, match="nothing to train"):
        make_optimizer([nn.Parameter(torch.zeros(1), requires_grad=False)])


def test_fit_is_seeded_and_independent_of_what_ran_before():
    """Dropout draws come from ``seed`` inside fit, and the caller's generator is left as it was."""
    import torch.nn as nn

    from memplan.nn.train import fit

    def run(burn: int) -> tuple[list[float], torch.Tensor]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.Dropout(0.5), nn.Linear(8, 3))
        torch.rand(burn)  # other work consumed the global generator
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.arange(60.0).reshape(10, 6) / 60, torch.arange(10) % 3
        state = torch.random.get_rng_state()
        losses = fit(model, opt, x, y, epochs=2, batch_size=4, seed=3)
        assert torch.equal(torch.random.get_rng_state(), state)
        return losses, model[2].weight.detach().clone()

    (l1, w1), (l2, w2) = run(1), run(1000)
    assert l1 == l2 and torch.equal(w1, w2)


def test_a_sub_channel_update_memplan_cannot_realise_is_refused_not_trained_whole():
    """A conv subclass with its own forward is traced through, so no SubChannelConv replaces it: a
    0.5 update of it would train the whole weight. apply_plan refuses it in one line, before
    changing the model; at ratio 1 it applies. (``apply_plain``, plain PyTorch's flags for
    ``verify``'s comparison, trains such a weight whole by definition: its docstring says so.)"""
    from memplan.api import capture as cap_model
    from memplan.plan.plan import Plan, Train

    class PaddedConv(nn.Conv2d):
        def forward(self, x):
            return super().forward(nn.functional.pad(x, (1, 1, 1, 1)))

    def build():
        torch.manual_seed(0)
        return nn.Sequential(PaddedConv(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 2))

    model = build()
    graph = cap_model(model, (3, 6, 6), batch=2).graph
    conv = next(n for n in graph.nodes if n.kind.startswith("conv"))
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    half = Plan("x", {conv.layer: Train(0.5, False), "3": Train(1.0, True)})
    with pytest.raises(BadOption, match="not a stock Conv1d / Conv2d"):
        apply_plan(model, half, graph)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before  # untouched
    whole = Plan("x", {conv.layer: Train(1.0, False), "3": Train(1.0, True)})
    apply_plan(model, whole, graph)
    assert model[0].weight.requires_grad
