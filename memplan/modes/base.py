"""An accounting mode: a small set of per-kind rules saying what one op keeps for backward,
plus the mode's conventions for weights, gradients and optimizer state.

Rules return :class:`Saved` items. An item that refers to an existing storage (an input or
the output of the op) is counted once however many ops keep it, exactly as autograd shares
one storage between the ops that save it; private items (masks, statistics, copies) are
counted per op. A mode may inherit the rules of a parent and override some of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from .. import names
from ..costs.peak import PeakOptions, simulate_peak
from ..costs.records import LayerCost, Saved, Summary, Totals
from ..graph import LayerGraph, TensorInfo
from ..plan import OpView, Plan
from ..registry import Registry

Rule = Callable[[OpView], Iterable[Saved]]


def ref(t: TensorInfo, graph_storages: list[int], what: str = "") -> Saved:
    """Keep an existing tensor: the whole storage it lives in is what stays alive."""
    return Saved(graph_storages[t.storage], t.storage, what)


def tensor(op: OpView, t: TensorInfo, what: str = "") -> Saved:
    return ref(t, op.graph.storages, what)


def private(nbytes: int, what: str = "") -> Saved:
    return Saved(int(nbytes), None, what)


def mask_bits(numel: int, what: str = "1-bit mask") -> Saved:
    """A bit-packed 0/1 mask: ceil(numel / 8) bytes."""
    return private(math.ceil(numel / 8), what)


class Mode:
    """A named accounting convention. Subclasses override the hooks; rules are registered with
    ``@mode.rule("kind", ...)``. ``saved`` returns None for a kind no rule covers (unknown)."""

    name: str = ""
    description: str = ""
    #: plain PyTorch computes (and stores) the whole weight gradient even for a partial update
    partial_weight_grads: bool = True
    #: the mode models eager PyTorch kernels, so measured kernel workspaces (``memplan calibrate``)
    #: belong in its simulated peak
    kernel_workspaces: bool = False
    #: what an op keeps for backward is what eager PyTorch saves, so the bytes observed for an op without a
    #: rule (replayed on meta, ``memplan.costs.observe``) are this mode's own convention, not a borrowing
    eager_saved: bool = False
    #: the training step the mode's peak assumes unless told (``memplan.costs.peak.SCHEDULES``)
    default_schedule: str = names.DEFAULT_SCHEDULE
    #: the mode counts only the *extra* memory of training (not the forward working memory), so a
    #: device budget for it leaves a reserve for the forward (``memplan.accounting.devices``)
    extra_only: bool = False
    #: ``memplan profile --per-layer`` also prints the cost of updating each conv (the 256KB
    #: paper's Figure 11a, ``memplan.api.update_costs``)
    conv_update_table: bool = False
    #: (weight, bias) bits of the frozen model as deployed (``accounting.devices.deployed_bytes``);
    #: None: the parameters' own dtype
    deployed_bits: tuple[int, int] | None = None
    #: the mode costs a step under autocast (``--amp``, or an autocast in the model's forward: the
    #: graph's casts, ``memplan.graph.autocast``)
    autocast: bool = True
    #: the mode's memory follows recomputed segments (activation checkpointing, ``Plan.recompute``):
    #: their inputs kept, what their ops save held again only while the backward recomputes them
    recompute: bool = True

    def __init__(self, parent: Mode | None = None):
        self.parent = parent
        self.rules: Registry[Rule] = Registry(f"{self.name} rule")
        self.rule = self.rules.register

    def find_rule(self, kind: str) -> Rule | None:
        mode: Mode | None = self
        while mode is not None:
            if kind in mode.rules:
                return mode.rules[kind]
            mode = mode.parent
        return None

    def saved(self, op: OpView) -> list[Saved] | None:
        rule = self.find_rule(op.kind)
        if rule is None:
            return None
        return list(rule(op)) if op.recorded else []

    def summarize(
        self,
        graph: LayerGraph,
        views: list[OpView],
        saved: list[list[Saved]],
        node_costs: list[LayerCost],
        totals: Totals,
        peak: PeakOptions | None = None,
    ) -> Summary:
        """Total and peak bytes from the per-node costs (``node_costs[i]`` and ``saved[i]`` belong
        to node i). Default: total = weights + gradients + optimizer state + saved activations;
        peak = the simulated training step of ``memplan.costs.peak`` run as ``peak`` says
        (schedule, kernel workspaces). Modes without a simulated step ignore ``peak``."""
        total = totals.weight_bytes + totals.gradient_bytes + totals.optimizer_bytes + totals.saved_activation_bytes
        static = totals.weight_bytes + totals.optimizer_bytes + graph.buffer_bytes
        peak, index, phase, at = simulate_peak(
            graph, views, saved, [lc.gradient_bytes for lc in node_costs], static, peak
        )
        return Summary(total, peak, index, phase, at)

    def quick_total(self, graph: LayerGraph, plan: Plan) -> int | None:
        """``total_bytes`` (= ``peak_bytes``) of ``plan`` without the full profile, for modes that can
        (the search calls it per candidate); None: use ``memplan.accounting.engine.compute``."""
        return None

    def configure(self, **options: object) -> Mode:
        """This mode with ``options`` set (a mode that takes options overrides this); the
        registered instance is never changed."""
        if options:
            from ..errors import BadOption

            raise BadOption(f"mode {self.name!r} takes no options (got {', '.join(sorted(options))})")
        return self

    def weight_fraction(self, fraction: float) -> float:
        """Fraction of a partially-updated weight whose gradient is computed and stored."""
        if fraction <= 0:
            return 0.0
        return fraction if self.partial_weight_grads else 1.0


MODES: Registry[Mode] = Registry("accounting mode", names=names.MODES)


def register_mode(mode: Mode) -> Mode:
    """Add ``mode`` to :data:`MODES` under its name; returns it."""
    return MODES.add(mode.name, mode)


def get_mode(name: str) -> Mode:
    """The accounting mode named ``name`` (one-line error listing the known ones)."""
    return MODES.choose(name)
