"""The natural hand-made schemes as baselines (issue 39): "every bias + the weights of the last k
convs" and "the biases of the last k convs" train exactly those tensors on a real model (read from
``requires_grad`` after ``apply_scheme``, not from memplan's plan), and the validation stage's
candidate of each is the largest k that fits the budget, its memory checked against the
accounting engine on a plan built here by hand (``Train`` per layer, not through a scheme)."""

import copy

import pytest
import torch

from memplan.accounting.engine import compute
from memplan.api import capture, profile_captured
from memplan.apply import apply_scheme
from memplan.graph import bias_carrier, conv_layers
from memplan.modes import get_mode
from memplan.plan import Scheme
from memplan.plan.plan import Plan, Train
from memplan.search.baselines import BASELINES, SIZE_RULES, largest
from memplan.search.candidates import Candidate, sized_candidate, sized_candidates, union_candidates
from memplan.strategies import make_plan

torch.set_num_threads(1)

MODEL, RES, BATCH = "mbv2-w0.35", 32, 2
WEIGHTS, BIASES = "every bias + last-k conv weights", "biases of the last k convs"


@pytest.fixture(scope="module")
def cap():
    return capture(MODEL, resolution=RES, batch=BATCH)


def conv_modules(model: torch.nn.Module) -> list[str]:
    """Names of the model's Conv2d modules (forward order is registration order in the zoo's MobileNetV2)."""
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Conv2d)]


def undated(found: list[Candidate]) -> list[tuple]:
    """``found``'s fields, each scheme without its provenance, whose creation time differs between calls."""
    return [
        (c.name, c.scheme.model_dump(exclude={"provenance"}), c.memory_bytes, c.baseline, c.in_unions) for c in found
    ]


def trained(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def by_hand(cap, k: int, weights: bool) -> Plan:
    """The plan written by hand: the classifier; every bias and norm shift (``weights``) or those of
    the last k convs' layers; and with ``weights`` the whole weights of the last k convs."""
    graph = cap.graph
    convs = conv_layers(graph)
    if weights:
        plan = make_plan(graph, "bias")
        train = dict(plan.train)
        for c in convs[-k:]:
            train[c.name] = Train(1.0, train.get(c.name, Train()).bias)
        return Plan("by hand", train)
    train = {n.name: Train(1.0, True) for n in graph.classifier_layers}
    for c in convs[-k:]:
        train[bias_carrier(graph, c).name] = Train(0.0, True)  # the conv's bias, or the shift of its BN
    return Plan("by hand", train)


@pytest.mark.parametrize("k", [1, 3])
def test_every_bias_and_last_k_weights_trains_exactly_those(cap, k):
    graph = cap.graph
    scheme = Scheme.from_plan(graph, BASELINES[WEIGHTS].plan(graph, k), model=MODEL)
    model = apply_scheme(copy.deepcopy(cap.model), scheme)
    convs = conv_modules(cap.model)
    classifier = {n for n, _ in cap.model.named_parameters() if not any(n.startswith(c + ".") for c in convs)}
    biases = {n for n, _ in cap.model.named_parameters() if n.endswith(".bias")}
    head = {n for n in classifier if n.startswith(graph.classifier.name)}
    want = biases | head | {f"{c}.weight" for c in convs[-k:]}
    assert trained(model) == want
    assert len(convs) == BASELINES[WEIGHTS].sizes(graph)


def test_biases_of_the_last_k_convs_train_the_last_norm_shifts(cap):
    graph, k = cap.graph, 4
    scheme = Scheme.from_plan(graph, BASELINES[BIASES].plan(graph, k), model=MODEL)
    model = apply_scheme(copy.deepcopy(cap.model), scheme)
    got = trained(model) - {n for n in trained(model) if n.startswith(graph.classifier.name)}
    assert len(got) == k and all(n.endswith(".bias") for n in got)
    norms = [n for n, m in cap.model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert got == {f"{n}.bias" for n in norms[-k:]}  # the shift of each of the last k convs' norms


def test_largest_is_the_last_size_that_fits():
    for n in range(0, 9):
        for cut in range(0, n + 1):
            asked: list[int] = []
            assert largest(lambda k, asked=asked, cut=cut: asked.append(k) or k <= cut, n) == cut
            assert len(asked) <= n.bit_length() + 1


@pytest.mark.parametrize("name,weights", [(WEIGHTS, True), (BIASES, False)])
def test_the_stage_takes_the_largest_k_that_fits(cap, name, weights):
    """The budget lies between the memory of k = K and K + 1 (each computed by the accounting engine
    on the plan written by hand): the candidate is k = K, with that memory."""
    mode = get_mode("applied")
    memory = {
        k: compute(cap.graph, by_hand(cap, k, weights), mode, optimizer="adam").totals.total_bytes for k in (4, 5)
    }
    assert memory[4] < memory[5]
    budget = (memory[4] + memory[5]) // 2

    def cost(scheme):
        return profile_captured(cap, "sparse", mode="applied", optimizer="adam", scheme=scheme).totals.total_bytes

    found = sized_candidate(name, BASELINES[name], cap.graph, cost, budget, mode="applied")
    assert found.name == f"{name} (k=4)" and found.baseline
    assert found.memory_bytes == memory[4] <= budget
    assert sized_candidate(name, BASELINES[name], cap.graph, cost, memory[4] - 1, mode="applied").name.endswith("(k=3)")
    assert sized_candidate(name, BASELINES[name], cap.graph, cost, 1, mode="applied") is None


def test_the_size_rules():
    assert SIZE_RULES["largest"](45) == [45]
    assert SIZE_RULES["ladder"](45) == [45, 22, 11, 5, 2, 1]
    assert SIZE_RULES["ladder"](4) == [4, 2, 1] and SIZE_RULES["ladder"](1) == [1]
    for k in range(1, 70):
        sizes = SIZE_RULES["ladder"](k)
        assert sizes[0] == k and sizes[-1] == 1 and sizes == sorted(set(sizes), reverse=True)
        assert len(sizes) == k.bit_length()


def applied_bytes(cap, plan: Plan) -> int:
    return compute(cap.graph, plan, get_mode("applied"), optimizer="adam").totals.total_bytes


@pytest.mark.parametrize("name,weights", [(WEIGHTS, True), (BIASES, False)])
def test_the_ladder_adds_the_halved_sizes_out_of_unions(cap, name, weights):
    """Between k = 5 and 6's memory the ladder offers k = 5, 2, 1, each costing what the accounting
    engine says of the plan written by hand; only the largest enters unions."""
    budget = (applied_bytes(cap, by_hand(cap, 5, weights)) + applied_bytes(cap, by_hand(cap, 6, weights))) // 2

    def cost(scheme):
        return profile_captured(cap, "sparse", mode="applied", optimizer="adam", scheme=scheme).totals.total_bytes

    found = sized_candidates(name, BASELINES[name], cap.graph, cost, budget, "applied", "ladder")
    assert [c.name for c in found] == [f"{name} (k={k})" for k in (5, 2, 1)]
    assert [c.memory_bytes for c in found] == [applied_bytes(cap, by_hand(cap, k, weights)) for k in (5, 2, 1)]
    assert [c.in_unions for c in found] == [True, False, False] and all(c.baseline for c in found)
    assert undated(sized_candidates(name, BASELINES[name], cap.graph, cost, budget, "applied", "largest")) == undated(
        found[:1]
    )
    assert sized_candidates(name, BASELINES[name], cap.graph, cost, 1, "applied", "ladder") == []


def test_a_smaller_size_enters_no_union(cap):
    """Unions join the candidates that enter them: two that do give their union, one that does not
    gives none."""

    def scheme(plan: Plan) -> Scheme:
        return Scheme.from_plan(cap.graph, plan, model=MODEL, mode="applied")

    head = scheme(make_plan(cap.graph, "last"))
    weights = scheme(BASELINES[WEIGHTS].plan(cap.graph, 1))  # every bias, the last conv's weights
    blocks = scheme(BASELINES["last blocks"].plan(cap.graph))  # the last blocks' weights and biases
    result = type("Result", (), {"mode": "applied", "metric": "total", "budget_bytes": 10**12})()

    def union_names(*cands: Candidate) -> list[str]:
        return [u.name for u in union_candidates(result, cands, cap, {"optimizer": "adam"})]

    a, b = Candidate("a", weights, 0, True), Candidate("b", blocks, 0, True)
    assert union_names(a, b, Candidate("head", head, 0, True)) == ["a + b"]
    assert union_names(a, Candidate("b", blocks, 0, True, in_unions=False)) == []
