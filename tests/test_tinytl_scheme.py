"""TinyTL-L+B as a point of the scheme space (issue 26): what ``added_modules`` records, what
``apply_scheme`` builds from it on the plain model (the same branches every time, outputs
unchanged at initialisation), checkpoints of such a model, and the one-line refusals. The cost and
trained-tensor equalities with the strategy are in ``test_baseline_schemes.py``."""

import copy

import pytest
import torch

from memplan.api import capture
from memplan.apply import add_modules, apply_scheme, unapply
from memplan.errors import MemplanError, SchemeError
from memplan.graph import conv_layers
from memplan.models import zoo
from memplan.nn.transforms import LITE_ATTR, LiteResidual
from memplan.plan import Plan, Scheme, Train, fingerprint, load_scheme, scheme_from_dict
from memplan.strategies import changes_architecture, make_plan

torch.set_num_threads(1)
MODEL, RES = "mcunet-5fps", 48


@pytest.fixture(scope="module")
def lite():
    return capture(MODEL, resolution=RES, batch=2, method="tinytl-lb")


@pytest.fixture(scope="module")
def scheme(lite):
    return Scheme.from_plan(lite.graph, make_plan(lite.graph, "tinytl-lb"))


def plain(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return zoo.build(MODEL, 10).eval()


def test_added_modules_record_the_transform_and_the_backbone_keeps_its_numbering(scheme, tmp_path):
    (added,) = scheme.added_modules
    assert added.architecture == "lite" and added.tag == LITE_ATTR
    assert added.options == {
        "lite": True,
        "lite_kernel": 5,
        "lite_groups": 2,
        "lite_downsample": 2,
        "lite_norm": None,
        "lite_blocks": None,
    }
    base = capture(MODEL, resolution=RES, batch=2).graph
    assert scheme.fingerprint == fingerprint(base)
    assert scheme.bias_update == len(conv_layers(base))  # every backbone conv; the branch convs not counted
    assert not any("main" in k or LITE_ATTR in k for k in scheme.norm_modes)
    scheme.save(tmp_path / "s.json")
    assert '"schema_version": 4' in (tmp_path / "s.json").read_text()
    assert load_scheme(tmp_path / "s.json") == scheme


def test_apply_scheme_builds_the_branches_and_leaves_the_outputs_unchanged(scheme, tmp_path):
    m = plain()
    x = torch.randn(3, 3, RES, RES)
    with torch.no_grad():
        before = m(x)
    scheme.save(tmp_path / "s.json")
    applied = apply_scheme(copy.deepcopy(m), tmp_path / "s.json")  # a path, and no graph: traced after the build
    wrapped = [q for q, mod in applied.named_modules() if isinstance(mod, LiteResidual)]
    assert len(wrapped) == len(zoo.build(MODEL, 10).blocks) - 1  # every block but the first
    trains = {n for n, p in applied.named_parameters() if p.requires_grad}
    assert {n for n in dict(applied.named_parameters()) if ".lite_residual." in n} <= trains
    assert not any(n.endswith("conv.weight") and ".lite_residual." not in n for n in trains)
    with torch.no_grad():
        assert torch.equal(applied.eval()(x), before)


def test_two_builds_hold_the_same_branches_and_leave_the_generator_alone(scheme):
    a, b = plain(), plain()
    state = torch.get_rng_state()
    a, b = add_modules(a, scheme), add_modules(b, scheme)
    assert torch.equal(torch.get_rng_state(), state)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert add_modules(a, scheme) is a and len(a.state_dict()) == len(sa)  # built already: unchanged


def test_checkpoint_has_the_plain_keys_plus_the_branches(scheme):
    applied = apply_scheme(plain(), scheme)
    opt = torch.optim.SGD([p for p in applied.parameters() if p.requires_grad], lr=0.1)
    applied(torch.randn(4, 3, RES, RES)).square().mean().backward()
    opt.step()
    state = applied.state_dict()
    plain_keys = set(plain().state_dict())
    extra = set(state) - plain_keys
    assert plain_keys <= set(state) and extra and all(".lite_residual." in k for k in extra)
    fresh = plain(1)
    with pytest.raises(RuntimeError, match="Unexpected key.*lite_residual"):
        fresh.load_state_dict(state)  # strict: the trained branches have no place in the plain model
    result = fresh.load_state_dict(state, strict=False)
    assert set(result.unexpected_keys) == extra and not result.missing_keys
    assert all(torch.equal(fresh.state_dict()[k], state[k]) for k in plain_keys)
    rebuilt = add_modules(plain(2), scheme)
    rebuilt.load_state_dict(state)  # strict: the architecture the scheme builds
    x = torch.randn(2, 3, RES, RES)
    with torch.no_grad():
        torch.testing.assert_close(rebuilt.eval()(x), applied.eval()(x))
    assert any(isinstance(m, LiteResidual) for m in unapply(applied).modules())  # lean modules only


def test_refusals_are_one_line(scheme, lite):
    base = capture(MODEL, resolution=RES, batch=2)
    with pytest.raises(SchemeError, match="adds lite_residual modules .* this model lacks"):
        make_plan(base.graph, "sparse", scheme=scheme)
    bias_only = Scheme.from_plan(base.graph, make_plan(base.graph, "bias"))
    with pytest.raises(SchemeError, match="added lite_residual layers the scheme does not name"):
        make_plan(lite.graph, "sparse", scheme=bias_only)
    other = scheme.model_copy(
        update={
            "added_modules": [scheme.added_modules[0].model_copy(update={"options": {"lite": True, "lite_kernel": 3}})]
        }
    )
    with pytest.raises(SchemeError, match="lite_residual layers differ from those"):
        apply_scheme(plain(), other)
    unknown = scheme.model_copy(
        update={"added_modules": [scheme.added_modules[0].model_copy(update={"architecture": "x"})]}
    )
    with pytest.raises(MemplanError, match="architecture transform"):
        apply_scheme(plain(), unknown)
    legacy = {**scheme.model_dump(mode="json"), "schema_version": 3, "added_modules": [{"lite_residual": True}]}
    with pytest.raises(SchemeError, match="added_modules"):
        scheme_from_dict(legacy)
    plan = make_plan(lite.graph, "tinytl-lb")
    branch_conv = next(n.name for n in lite.graph.nodes if n.tags and n.kind == "conv")
    part = Plan("part", {**plan.train, branch_conv: Train(0.5)}, plan.norm_train, added=plan.added)
    with pytest.raises(SchemeError, match="trains added layer .* in part"):
        Scheme.from_plan(lite.graph, part)
    unrecorded = Plan("unrecorded", plan.train, plan.norm_train)
    with pytest.raises(SchemeError, match="records no architecture"):
        Scheme.from_plan(lite.graph, unrecorded)


def test_sparse_transforms_the_model_only_for_a_scheme_with_added_modules(scheme):
    base = capture(MODEL, resolution=RES, batch=2)
    bias_only = Scheme.from_plan(base.graph, make_plan(base.graph, "bias"))
    assert changes_architecture("sparse", {"scheme": scheme})
    assert not changes_architecture("sparse", {"scheme": bias_only}) and not changes_architecture("sparse", {})
    assert changes_architecture("tinytl-lb", {}) and changes_architecture("bias", {"lite": True})
