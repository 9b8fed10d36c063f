"""A model trained under a plan saves and loads like the plain model (issue 27, item 2).

``state_dict()`` of an applied model has exactly the plain model's keys with the trained values
(a sub-channel update folded into its conv's weight); it loads strictly into a freshly built plain
model, which then computes the same outputs; a plain checkpoint loads into an applied model; and
``memplan.unapply`` puts the plain modules back. Checked on a model holding every lean module
kind, on the zoo's mcunet-5fps with its shipped 100KB scheme, and on the third-party corpus (one
model per family by default, the whole corpus with ``-m slow``).
"""

from __future__ import annotations

import copy
import io
from dataclasses import replace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memplan
from memplan.apply import apply_plan
from memplan.graph import conv_layers
from memplan.nn.lean import LEAN_MODULES, FrozenLinear, SubChannelConv
from memplan.nn.transforms import replace_module
from memplan.plan import Plan, Train
from memplan.strategies import make_plan

from . import corpus
from .helpers import real_model

torch.set_num_threads(1)
SHAPE = (4, 3, 8, 8)


class EveryKind(nn.Module):
    """One module for every lean module kind apply_plan puts in (plus a Linear, swapped by hand
    for FrozenLinear, which apply_plan never needs)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)  # bias trains: everything after it is recorded
        self.bn = nn.BatchNorm2d(8)  # frozen scale and statistics -> ShiftOnlyNorm
        self.relu = nn.ReLU()  # -> MaskedReLU
        self.frozen = nn.Conv2d(8, 8, 3, padding=1)  # frozen weight -> FrozenConv
        self.relu6 = nn.ReLU6()  # -> MaskedReLU6
        self.sub = nn.Conv2d(8, 8, 1)  # half the input channels -> SubChannelConv
        self.hardtanh = nn.Hardtanh(-2.0, 2.0)  # -> MaskedHardtanh
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)  # a quarter of the groups -> depthwise SubChannelConv
        self.leaky = nn.LeakyReLU(0.1)  # -> MaskedLeakyReLU
        self.hswish = nn.Hardswish()  # approximated -> SignHardswish
        self.pool = nn.AvgPool2d(2)  # -> LeanAvgPool2d
        self.drop = nn.Dropout(0.2)  # -> MaskedDropout
        self.fc1 = nn.Linear(8 * 4 * 4, 16)  # -> FrozenLinear (by hand)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn(self.stem(x)))
        x = self.hardtanh(self.sub(self.relu6(self.frozen(x))))
        x = self.hswish(self.leaky(self.dw(x)))
        return self.fc(self.fc1(self.drop(self.pool(x).flatten(1))))


PLAN = Plan(
    "every-kind",
    {
        "stem": Train(0.0, True),
        "bn": Train(0.0, True),
        "frozen": Train(0.0, True),
        "sub": Train(0.5, True),
        "dw": Train(0.25, True),
        "fc1": Train(0.0, True),
        "fc": Train(1.0, True),
    },
    approx={"hswish"},
)


def fresh(seed: int = 0) -> EveryKind:
    torch.manual_seed(seed)
    model = EveryKind()
    with torch.no_grad():  # statistics that are not the defaults, so that a lost buffer shows
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    return model


def applied_every_kind() -> nn.Module:
    model = apply_plan(fresh(), PLAN, input_shape=SHAPE)
    replace_module(model, "fc1", FrozenLinear.from_module(model.fc1))
    kinds = {type(m) for m in model.modules()}
    assert set(LEAN_MODULES) <= kinds, f"not covered: {set(LEAN_MODULES) - kinds}"
    return model


def data(shape=SHAPE, classes: int = 10, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g), torch.randint(0, classes, (shape[0],), generator=g)


def train(model: nn.Module, shape, steps: int = 3, lr: float = 0.5) -> None:
    x, y = data(shape)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def eval_outputs(model: nn.Module, shape) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(data(shape, seed=2)[0])


def via_file(state: dict) -> dict:
    """A torch.save / torch.load(weights_only=True) round trip, as a user's checkpoint takes it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def assert_saves_and_loads_like_plain(model: nn.Module, build, shape) -> None:
    """``model`` (applied, trained) against ``build()`` (a fresh plain model of the same class)."""
    plain = build()
    state = model.state_dict()
    assert list(state) == list(plain.state_dict()), "the applied model's keys differ from the plain model's"
    initial = plain.state_dict()
    subs = {n: m for n, m in model.named_modules() if isinstance(m, SubChannelConv)}
    for name, m in subs.items():
        assert torch.equal(state[f"{name}.weight"], m.merged_weight())
    if subs:  # training moved sub-channel weights: only folding carries them into the checkpoint
        assert any(not torch.equal(state[f"{n}.weight"], initial[f"{n}.weight"]) for n in subs)
    plain.load_state_dict(via_file(state), strict=True)
    assert torch.equal(eval_outputs(plain, shape), eval_outputs(model, shape))


def test_every_lean_kind_saves_loads_and_unapplies():
    model = applied_every_kind()
    train(model, SHAPE)
    assert_saves_and_loads_like_plain(model, fresh, SHAPE)
    # a plain checkpoint (other weights, other statistics) loads strictly into the applied model
    other = fresh(seed=7)
    model.load_state_dict(via_file(other.state_dict()), strict=True)
    assert torch.equal(eval_outputs(model, SHAPE), eval_outputs(other, SHAPE))
    assert torch.equal(model.sub.weight_sel, other.sub.weight[:, model.sub.idx])
    # ... and trains on from there
    train(model, SHAPE, steps=1)
    assert not torch.equal(model.state_dict()["sub.weight"], other.sub.weight)


def test_unapply_puts_the_plain_modules_back_with_the_trained_values():
    originals = {n: m for n, m in fresh().named_children()}
    model = fresh()
    bn, fc = model.bn, model.fc
    apply_plan(model, PLAN, input_shape=SHAPE)
    replace_module(model, "fc1", FrozenLinear.from_module(model.fc1))
    train(model, SHAPE)
    model.double()  # new buffer objects on the lean modules: unapply must take those
    x = data(SHAPE, seed=2)[0].double()
    with torch.no_grad():
        state, out = model.state_dict(), model.eval()(x)
    same = memplan.unapply(model)
    assert same is model and model.bn is bn and model.fc is fc
    assert {n: type(m) for n, m in model.named_children()} == {n: type(m) for n, m in originals.items()}
    assert not any(type(m) in LEAN_MODULES for m in model.modules())
    assert all(t.dtype == torch.float64 for t in [*model.parameters(), *model.buffers()] if t.is_floating_point())
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    with torch.no_grad():
        assert torch.equal(model(x), out)
    # the partially updated weights train whole again, as plain PyTorch trains them under the plan
    assert model.sub.weight.requires_grad and model.dw.weight.requires_grad and not model.frozen.weight.requires_grad


def test_unapply_of_a_hand_built_lean_module_is_one_clear_error():
    lean = SubChannelConv(nn.Conv2d(4, 4, 1), 0.5)
    with pytest.raises(memplan.MemplanError, match="from_module"):
        memplan.unapply(nn.Sequential(lean))
    assert type(memplan.unapply(SubChannelConv.from_module(nn.Conv2d(4, 4, 1), 0.5))) is nn.Conv2d


def test_mcunet_trained_under_the_shipped_scheme_loads_into_a_fresh_model():
    """The issue's case: mcunet-5fps and the shipped 100KB scheme, saved the usual way."""
    model = real_model("mcunet-5fps")
    memplan.apply_scheme(model, memplan.shipped_scheme("mcunet-5fps-100KB"))
    assert any(isinstance(m, SubChannelConv) for m in model.modules())
    train(model, (2, 3, 48, 48), steps=2, lr=0.05)
    assert_saves_and_loads_like_plain(model, lambda: real_model("mcunet-5fps"), (2, 3, 48, 48))


def sparse_plan(graph) -> Plan:
    """``bias`` (every bias and norm shift, frozen statistics) with the weights of the last 4 stock
    (groups 1 or depthwise) convs trained at channel ratios 1/4, 1/2, 1, 1/8: sub-channel updates
    (efficientnet_pytorch has no stock conv: its convs pad in their own forward)."""
    base = make_plan(graph, "bias")
    stock = [
        n.name
        for n in conv_layers(graph)
        if type(n.module) is nn.Conv2d and n.module.groups in (1, n.module.in_channels)
    ][-4:]
    ratios = [0.25, 0.5, 1.0, 0.125][-len(stock) :] if stock else []
    weights = {name: replace(base.train.get(name, Train()), weight=r) for name, r in zip(stock, ratios)}
    return Plan("sparse-bias", {**base.train, **weights}, base.norm_train, base.approx)


def check_corpus_entry(entry: corpus.Entry) -> None:
    base = entry.build()
    plan = sparse_plan(corpus.capture_entry(base, entry.shape))
    model = apply_plan(copy.deepcopy(base), plan, input_shape=entry.shape)
    subs = any(isinstance(m, SubChannelConv) for m in model.modules())
    assert subs == any(0 < t.weight < 1 for t in plan.train.values()), entry.id
    train(model, entry.shape, steps=1, lr=0.05)
    with torch.no_grad():  # a step on a random-init model may leave a selection unchanged: move each
        for m in model.modules():
            if isinstance(m, SubChannelConv):
                m.weight_sel.add_(0.01)
    assert_saves_and_loads_like_plain(model, entry.build, entry.shape)
    memplan.unapply(model)
    assert not any(type(m) in LEAN_MODULES for m in model.modules())
    assert list(model.state_dict()) == list(base.state_dict())


@pytest.mark.parametrize("entry", [pytest.param(e, id=e.id) for e in corpus.ONE_PER_FAMILY])
def test_corpus_model_trained_sparse_loads_into_a_fresh_model(entry):
    check_corpus_entry(entry)


def pytest_generate_tests(metafunc):
    """The whole corpus only when ``-m slow`` selects it; otherwise one skipped placeholder."""
    if metafunc.function.__name__ != "test_whole_corpus_trained_sparse_loads_into_a_fresh_model":
        return
    if "slow" not in (metafunc.config.getoption("markexpr") or ""):
        skip = pytest.mark.skip(reason="whole corpus: select it with -m slow")
        metafunc.parametrize("entry", [pytest.param(None, id="whole-corpus", marks=skip)])
        return
    metafunc.parametrize("entry", [pytest.param(e, id=e.id) for e in corpus.entries(include_heavy=False)])


@pytest.mark.slow
def test_whole_corpus_trained_sparse_loads_into_a_fresh_model(entry):
    check_corpus_entry(entry)
