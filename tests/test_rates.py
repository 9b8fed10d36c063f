"""Learning rates per parameter family (memplan.rates): the text form, the families torch's own
modules' parameters fall in (checked against each parameter's owner module, not against
memplan's own tables), the plan's families, and training code getting a scheme's rates."""

import pytest
import torch
from torch import nn

from memplan.api import capture
from memplan.contrib.halving import successive_halving
from memplan.contrib.protocol import Protocol
from memplan.errors import BadOption
from memplan.optim import make_optimizer
from memplan.plan import Scheme, Training
from memplan.rates import FAMILIES, Rates, param_groups
from memplan.strategies import make_plan


def test_text_form_round_trips_and_names_what_differs():
    r = Rates.parse("1.25e-2/weight=5e-4")
    assert r == Rates(classifier=0.0125, bias=0.0125, norm=0.0125, weight=0.0005)
    assert str(r) == "0.0125/weight=0.0005" and Rates.parse(str(r)) == r
    assert str(Rates.uniform(2.5e-3)) == "0.0025" == f"{2.5e-3:g}"  # one rate reads as before
    assert Rates.parse("bias=1/classifier=2/norm=3/weight=4") == Rates(2, 1, 3, 4)
    assert Rates.uniform(0.1).single == 0.1 and r.single is None
    assert Rates.of(0.5) == Rates.of("0.5") == Rates.uniform(0.5)


@pytest.mark.parametrize("text", ["", "x", "-1", "0", "1e-2/momentum=0.9", "weight=1e-3", "nan", "inf"])
def test_bad_text_is_one_clear_error(text):
    with pytest.raises(BadOption):
        Rates.parse(text)


def test_restrict_merges_settings_that_differ_only_where_nothing_trains():
    grid = [Rates.uniform(1e-3), Rates.uniform(1e-2), Rates.parse("1e-2/weight=1e-3")]
    biases = {"classifier", "bias"}
    assert list(dict.fromkeys(r.restrict(biases) for r in grid)) == grid[:2]
    assert len(dict.fromkeys(r.restrict(biases | {"weight"}) for r in grid)) == 3
    assert Rates.parse("1e-2/weight=1e-3").restrict(()) == Rates.uniform(1e-2)  # the classifier alone


class Net(nn.Module):
    """torch.nn's own layers: conv with and without bias, BatchNorm, LayerNorm, GroupNorm, a head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.dw = nn.Conv2d(8, 8, 3, groups=8, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.gn = nn.GroupNorm(2, 8)
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = self.gn(self.bn(self.dw(self.conv(x))))
        return self.fc(self.ln(x.mean((2, 3))))


def test_torch_modules_fall_in_the_family_of_their_owner():
    net = Net()
    norms = (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm)
    expected = {}
    for mname, mod in net.named_modules():
        for pname, _ in mod.named_parameters(recurse=False):
            name = f"{mname}.{pname}"
            if mname == "fc":
                expected[name] = "classifier"
            elif pname == "bias":
                expected[name] = "bias"  # conv biases and norm shifts
            else:
                expected[name] = "norm" if isinstance(mod, norms) else "weight"
    rates = Rates(classifier=1.0, bias=2.0, norm=3.0, weight=4.0)
    groups = param_groups(net, rates, "fc")
    ids = {id(p): n for n, p in net.named_parameters()}
    got = {ids[id(p)]: g["family"] for g in groups for p in g["params"]}
    assert got == expected
    assert all(g["lr"] == getattr(rates, g["family"]) for g in groups)
    net.conv.weight.requires_grad_(False)  # frozen parameters are left out
    assert "conv.weight" not in {ids[id(p)] for g in param_groups(net, rates, "fc") for p in g["params"]}


def test_a_plans_families_are_the_families_of_the_parameters_it_trains():
    cap = capture("mcunet-5fps", resolution=64, classes=10)
    for method, families in [
        ("last", {"classifier"}),
        ("bias", {"classifier", "bias"}),
        ("norm", {"classifier", "bias", "norm"}),
        ("full", {"classifier", "bias", "norm", "weight"}),
    ]:
        assert make_plan(cap.graph, method).families(cap.graph) == families, method


def test_make_optimizer_trains_each_family_at_the_schemes_rate():
    net = Net()
    training = Training(optimizer="adam", lr=0.01, epochs=1, batch_size=8, rates={"weight": 1e-3}, classifier="fc")
    scheme = Scheme(model="x", fingerprint="0" * 16, input_shape=[3, 8, 8], bias_update=1, training=training)
    opt = make_optimizer(net, scheme=scheme)
    by_family = {g["family"]: g["lr"] for g in opt.param_groups}
    assert type(opt) is torch.optim.Adam
    assert by_family == {"classifier": 0.01, "bias": 0.01, "norm": 0.01, "weight": 1e-3}
    # tensors carry no names: one rate, the scheme's lr; an explicit lr wins over the families
    assert [g["lr"] for g in make_optimizer(net.parameters(), scheme=scheme).param_groups] == [0.01]
    assert {g["lr"] for g in make_optimizer(net, lr=0.5, scheme=scheme).param_groups} == {0.5}
    # the scheme round-trips its rates through JSON
    again = Scheme.model_validate_json(scheme.model_dump_json())
    assert again.training == training
    with pytest.raises(ValueError, match="unknown parameter families"):
        Training(optimizer="adam", lr=0.01, epochs=1, batch_size=8, rates={"momentum": 0.9})


def test_protocol_at_rates_sets_every_family_and_keeps_its_identity_for_one_rate():
    p = Protocol(lr_classifier=0.1, lr_bias=0.1, lr_weight=0.1)
    assert p.at(Rates.uniform(0.1)).identity() == p.identity()  # checkpoints written before stay valid
    q = p.at(Rates(classifier=1, bias=2, norm=3, weight=4), seed=7)
    assert q.rates == Rates(1, 2, 3, 4) and q.seeds == (7,)
    assert set(FAMILIES) == set(q.rates.as_dict())


def test_halving_takes_each_candidates_own_settings():
    own = {"a": [1, 2], "b": [1]}
    h = successive_halving(["a", "b"], own, [0], lambda c, lr, s: 10 * lr + (c == "b"))
    assert h.rungs[0] == [("a", 1), ("a", 2), ("b", 1)]
    assert h.best.candidate == "a" and h.best.lr == 2
