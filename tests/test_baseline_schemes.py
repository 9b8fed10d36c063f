"""Every hand-picked baseline is one point of the scheme space (issue 26): a strategy's plan written
as a scheme (``Scheme.from_plan``) costs exactly the strategy's bytes in every accounting mode and,
applied to a real model, trains exactly the same tensors with the same train / eval flags. The
memory of each side comes from its own path (the strategy's planner; the scheme's mapping), so a
difference in either shows. TinyTL-L+B's scheme is planned on the model with its lite residual
branches but applied to the plain model (``apply_scheme`` builds the branches) and costed from the
plain model's name through the pipeline (``--method sparse --scheme``); it keeps the backbone's
fingerprint."""

import copy

import pytest
import torch

from memplan.api import capture, profile, profile_captured
from memplan.apply import apply_plan, apply_scheme
from memplan.errors import SchemeError
from memplan.modes.base import MODES
from memplan.plan import Scheme, fingerprint, scheme_to_plan
from memplan.plan.plan import Plan, Train
from memplan.strategies import make_plan

torch.set_num_threads(1)

BASELINES = ("last", "bias", "norm", "lastk", "mobiletl", "tinytl-lb", "full")
MODELS = (("mcunet-5fps", 48), ("efficientnet-lite0", 32), ("resnet18", 32))


def trained_state(model: torch.nn.Module) -> tuple:
    """(parameters that require grad, modules in train mode, the lean modules' types by name)."""
    grads = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    train = sorted(n for n, m in model.named_modules() if m.training)
    kinds = sorted((n, type(m).__name__) for n, m in model.named_modules())
    return grads, train, kinds


@pytest.mark.parametrize("model,res", MODELS)
@pytest.mark.parametrize("strategy", BASELINES)
def test_baseline_as_scheme_costs_and_trains_the_same(model, res, strategy):
    plain = capture(model, resolution=res, batch=2)
    cap = capture(model, resolution=res, batch=2, method=strategy)  # with the strategy's architecture
    plan = make_plan(cap.graph, strategy)
    scheme = Scheme.from_plan(cap.graph, plan)
    assert scheme.fingerprint == fingerprint(plain.graph)  # the backbone's, added modules or not
    assert bool(scheme.added_modules) == (strategy == "tinytl-lb")
    assert scheme_to_plan(cap.graph, scheme).train == {k: v for k, v in plan.train.items() if v.any}
    own = {}
    for mode in MODES:
        own[mode] = profile_captured(cap, strategy, mode=mode, optimizer="adam").totals
        as_scheme = profile_captured(cap, "sparse", mode=mode, optimizer="adam", scheme=scheme).totals
        assert as_scheme.total_bytes == own[mode].total_bytes, mode
        assert as_scheme.saved_activation_bytes == own[mode].saved_activation_bytes, mode
    if scheme.added_modules:  # from the plain model's name: the pipeline builds the branches
        by_name = profile(model, "sparse", resolution=res, batch=2, optimizer="adam", scheme=scheme).totals
        assert by_name.total_bytes == own["pytorch"].total_bytes
    a, b = copy.deepcopy(cap.model), copy.deepcopy(plain.model)
    apply_plan(a, plan, capture(a, (3, res, res), batch=2).graph)
    b = apply_scheme(b, scheme, capture(b, (3, res, res), batch=2).graph)  # traced before the branches
    assert trained_state(a) == trained_state(b)


def test_a_plan_no_scheme_can_say_is_refused():
    cap = capture("mcunet-5fps", resolution=48)
    # the bias of the first conv alone: not the biases of the last n convs
    plan = make_plan(cap.graph, "last")
    carrier = next(n for n in cap.graph.nodes if n.kind == "batchnorm")
    odd = Plan("odd", {**plan.train, carrier.name: Train(0.0, True)})
    with pytest.raises(SchemeError, match="last n convs"):
        Scheme.from_plan(cap.graph, odd)
