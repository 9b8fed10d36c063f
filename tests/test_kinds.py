"""Op kinds in one place: each kind is one entry of ``memplan.graph.kinds.KINDS`` (how capture
recognises it, its traits, its elementwise FLOPs, the attributes capture records), every table the
graph layer reads is derived from those entries, and the costs and the modes name only registered
kinds and cover every one."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn

from memplan.costs.flops import FLOP_RULES
from memplan.graph import kinds
from memplan.graph.kinds import KINDS, TRAITS, kind
from memplan.modes import MODES

torch.set_num_threads(1)


def test_flops_and_the_pytorch_mode_cover_every_kind():
    """A new kind without a FLOP rule or a rule of the reference mode (what eager PyTorch saves) fails here."""
    assert [k for k in KINDS if k not in FLOP_RULES] == []
    assert [k for k in KINDS if MODES["pytorch"].find_rule(k) is None] == []


def test_rules_name_registered_kinds():
    """No FLOP rule or mode rule is written for a kind that capture never produces (a typo)."""
    assert [k for k in FLOP_RULES if k not in KINDS] == []
    for name, mode in MODES.items():
        assert [k for k in getattr(mode, "rules", {}) if k not in KINDS] == [], name


def test_the_graph_tables_are_the_entries():
    """The sets and maps the graph layer reads are views of the entries' fields."""
    for cls, name in kinds.MODULE_KINDS.items():
        assert cls in KINDS[name].modules
    for fn, name in kinds.FUNCTION_KINDS.items():
        assert any(fn is f for f in KINDS[name].functions)
    for method, name in kinds.METHOD_KINDS.items():
        assert method in KINDS[name].methods
    assert kinds.MASK_ACTIVATIONS <= kinds.ACTIVATIONS and kinds.NORM_KINDS <= kinds.PARAM_KINDS
    assert kinds.FREE_KINDS <= kinds.NO_KERNEL
    assert set(kinds.ELEMENTWISE_FLOPS) == {n for n, k in KINDS.items() if k.flops is not None}
    for fn, (name, args) in kinds.FUNCTIONAL_LAYERS.items():
        assert any(fn is f for f in KINDS[name].functions) and KINDS[name].input_arg in args
    assert kinds.FUNCTIONAL_LAYERS[torch.addmm] == ("linear", ("bias", "input", "weight"))
    assert all(k.traits <= TRAITS for k in KINDS.values())


def test_a_kind_is_recognised_as_its_entry_says():
    """Modules (and their plain subclasses), functions and Tensor methods map to their kind."""

    class MyReLU(nn.ReLU):
        pass

    assert kinds.module_kind(nn.Conv2d(2, 2, 1)) == "conv" and kinds.module_kind(MyReLU()) == "relu"
    assert kinds.FUNCTION_KINDS[operator.iadd] == "add" and kinds.METHOD_KINDS["unfold"] == "view"


def test_memplan_modules_declare_registered_kinds():
    """memplan's lean modules name their kind (``memplan_kind``); each is an entry."""
    import memplan.models.int8.ops as int8
    import memplan.nn.lean as lean

    declared = {
        cls.memplan_kind
        for module in (lean, int8)
        for cls in vars(module).values()
        if isinstance(cls, type) and getattr(cls, "memplan_kind", None)
    }
    assert declared and declared <= set(KINDS)


def test_a_second_claim_or_an_unknown_trait_is_refused():
    with pytest.raises(ValueError, match="already belong to 'relu'"):
        kind("my-relu", functions=(torch.relu,))
    with pytest.raises(ValueError, match="unknown traits"):
        kind("my-op", "fast")
    assert "my-relu" not in KINDS and "my-op" not in KINDS
