"""The one optimizer table (memplan.optim): the state it declares is what torch really keeps, and
every consumer (training, accounting, contribution protocol, search) reads the same entry."""

import json

import pytest
import torch
import torch.nn as nn

import memplan
from memplan.contrib.profile import load_profile
from memplan.contrib.protocol import Protocol
from memplan.errors import BadOption
from memplan.optim import OPTIMIZERS, make_optimizer, states
from memplan.search.space import contributions_of, profile_hash

torch.set_num_threads(1)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_declared_state_is_what_torch_keeps_per_trainable_element(name):
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)  # frozen: no state
    opt = make_optimizer(model.parameters(), name, 0.01)
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # the optimizer's own per-parameter buffers of the parameter's shape (Adam's step counter is a scalar)
    kept = sum(
        t.numel()
        for p, st in opt.state.items()
        for t in st.values()
        if isinstance(t, torch.Tensor) and t.shape == p.shape and t.numel() > 1
    )
    assert kept == states(name) * trainable
    assert all(p.requires_grad for p in opt.state)


def test_accounting_counts_the_tables_state():
    for name in OPTIMIZERS:
        p = memplan.profile("mcunet-5fps", method="last", mode="pytorch", batch=1, resolution=32, optimizer=name)
        # the classifier's weight and bias train; fp32 state per trainable element
        assert p.totals.optimizer_bytes == states(name) * p.totals.gradient_bytes


def test_unknown_optimizer_is_a_one_line_error():
    with pytest.raises(BadOption, match="unknown optimizer 'rmsprop'"):
        make_optimizer([nn.Parameter(torch.zeros(2))], "rmsprop")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        Protocol(optimizer="rmsprop")


def test_profiles_written_with_momentum_load_as_the_optimizer_they_meant(tmp_path):
    assert Protocol(momentum=0.0).optimizer == "sgd"
    assert Protocol(momentum=0.9).optimizer == "sgd-momentum"
    with pytest.raises(ValueError, match="momentum 0.5"):
        Protocol(momentum=0.5)
    shipped = memplan.shipped_scheme("mcunet-5fps-100KB")
    scheme = json.loads(open(shipped).read())
    prof_path = next(
        p
        for p in (shipped.parent.parent / "profiles").glob("*.json")
        if profile_hash(load_profile(p)) == scheme["provenance"]["profile_hash"]
    )
    raw = json.loads(prof_path.read_text())
    assert raw["protocol"]["momentum"] == 0.0 and "optimizer" not in raw["protocol"]
    # the search counts the state of the optimizer the profile's runs trained with
    assert contributions_of(load_profile(prof_path)).optimizer == "sgd"


def test_a_scheme_brings_its_optimizer_to_the_accounting(tmp_path):
    """A scheme searched for Adam is costed with Adam's two state buffers unless told otherwise."""
    scheme = memplan.load_scheme(memplan.shipped_scheme("mcunet-5fps-100KB"))
    adam = tmp_path / "adam.json"
    scheme.model_copy(update={"optimizer": "adam"}).save(adam)
    kw = dict(method="sparse", mode="pytorch", classes=10, resolution=32)
    own = memplan.profile("mcunet-5fps", scheme=str(adam), **kw).totals
    told = memplan.profile("mcunet-5fps", scheme=str(adam), optimizer="sgd", **kw).totals
    assert own.gradient_bytes > 0 and own.optimizer_bytes == states("adam") * own.gradient_bytes
    assert told.optimizer_bytes == 0
    assert memplan.profile("mcunet-5fps", scheme=scheme, **kw).totals.optimizer_bytes == 0  # recorded none: sgd
