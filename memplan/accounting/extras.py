"""Strategy figures beyond per-layer costs, by strategy name: ``extras(graph, plan, profile)``
returns plain data merged into ``Profile.extras`` (bytes; FLOPs = 2 x MACs of conv / linear /
matmul, the ``forward_flops`` / ``backward_flops`` convention).

* ``cache-reuse`` (Cache-and-Reuse, ``memplan.strategies.cache_reuse``): cache bytes per
  sample and for N samples, stage A / stage B FLOPs and the saving against single-stage
  training;
* ``minilearn`` (MiniLearn, ``memplan.strategies.minilearn``): flash storage of the cached
  features and the model, training RAM of stage II and of stage III (FC head only).

The strategies' module docstrings define each figure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..costs.records import HIDDEN_KINDS, Profile
from ..graph import LayerGraph, TensorInfo
from ..modes import get_mode
from ..plan import Plan
from ..registry import Registry
from ..strategies.base import lastk_start
from ..strategies.minilearn import STAGES, cut_start, minilearn, stage_start
from .engine import compute

Extras = Callable[[LayerGraph, Plan, Profile], dict[str, Any]]
EXTRAS: Registry[Extras] = Registry("strategy extras")


def strategy_extras(graph: LayerGraph, plan: Plan, profile: Profile) -> dict[str, Any]:
    """The extras of ``plan.method`` ({} for a strategy without any)."""
    fn = EXTRAS.get(plan.method)
    return {} if fn is None else fn(graph, plan, profile)


def cut_tensors(graph: LayerGraph, start: int) -> list[TensorInfo]:
    """Tensors made before node ``start`` and read at or after it (the prefix's output to
    cache), one per storage, in order of first use; parameters and shape queries excluded."""
    seen: dict[int, TensorInfo] = {}
    for node in graph.nodes[start:]:
        if node.kind == "meta":
            continue
        for src, t in zip(node.inputs, node.in_tensors):
            if src < start and t.storage not in graph.param_storages:
                seen.setdefault(t.storage, t)
    return list(seen.values())


def per_sample_numel(graph: LayerGraph, tensors: list[TensorInfo]) -> int:
    """Elements per sample of batch-first ``tensors``."""
    return sum(t.numel for t in tensors) // graph.batch


def packed_bytes(numel: int, bits: int) -> int:
    """Bytes of ``numel`` codes of ``bits`` bits, packed and padded to a whole byte."""
    return (numel * bits + 7) // 8


def layer_nodes(graph: LayerGraph, profile: Profile) -> list[int]:
    """Node index of every ``profile.layers`` entry (the profile lists nodes in forward
    order, hidden kinds left out)."""
    index = [n.index for n in graph.nodes if n.kind not in HIDDEN_KINDS]
    if len(index) != len(profile.layers):
        raise ValueError("profile does not belong to this graph")
    return index


def split_sum(graph: LayerGraph, profile: Profile, start: int, field: str) -> tuple[int, int]:
    """(sum before node ``start``, sum from ``start`` on) of one per-layer cost field."""
    before = after = 0
    for idx, layer in zip(layer_nodes(graph, profile), profile.layers):
        if idx < start:
            before += getattr(layer, field)
        else:
            after += getattr(layer, field)
    return before, after


@EXTRAS.register("cache-reuse")
def cache_extras(graph: LayerGraph, plan: Plan, profile: Profile) -> dict[str, Any]:
    """Cache size and stage A / stage B FLOPs of a ``cache-reuse`` plan."""
    opts = plan.options
    bits, samples, epochs = opts["bits"], opts["samples"], opts["epochs"]
    start = lastk_start(graph, opts.get("blocks"), opts.get("layers"))
    cut = cut_tensors(graph, start)
    per_sample = packed_bytes(per_sample_numel(graph, cut), bits)
    prefix_fwd, suffix_fwd = (f // graph.batch for f in split_sum(graph, profile, start, "forward_flops"))
    bwd = profile.totals.backward_flops // graph.batch
    stage_a = samples * prefix_fwd
    two_stage = stage_a + epochs * samples * (suffix_fwd + bwd)
    single_stage = epochs * samples * (prefix_fwd + suffix_fwd + bwd)
    return {
        "cache_shape": [list(t.shape[1:]) for t in cut],
        "cache_bits": bits,
        "cache_bytes_per_sample": per_sample,
        "cache_bytes": samples * per_sample,
        "samples": samples,
        "epochs": epochs,
        "stage_a_forward_flops": stage_a,
        "stage_b_forward_flops_per_epoch": samples * suffix_fwd,
        "stage_b_backward_flops_per_epoch": samples * bwd,
        "two_stage_training_flops": two_stage,
        "single_stage_training_flops": single_stage,
        "flops_saving_ratio": single_stage / two_stage,
        "single_stage_frozen_forward_share": prefix_fwd / (prefix_fwd + suffix_fwd + bwd),
    }


def stage_ram(graph: LayerGraph, plan: Plan, profile: Profile, stage: str) -> int:
    """RAM of MiniLearn's ``stage`` (II ``retrain`` / III ``finetune``): the fp32 weights +
    gradients + optimizer state + saved activations of the layers it trains, under the
    profile's mode; the frozen part before them stays in flash and is not counted."""
    opts = plan.options
    if opts["stage"] != stage:
        plan = minilearn(graph, opts["cut"], opts["samples"], opts["bits"], stage)
        profile = compute(
            graph, plan, get_mode(profile.mode), optimizer=profile.optimizer, frozen_bits=profile.frozen_bits
        )
    return split_sum(graph, profile, stage_start(graph, opts["cut"], stage), "total_bytes")[1]


@EXTRAS.register("minilearn")
def minilearn_extras(graph: LayerGraph, plan: Plan, profile: Profile) -> dict[str, Any]:
    """Flash storage and training RAM of a ``minilearn`` plan."""
    samples, bits = plan.options["samples"], plan.options["bits"]
    start = cut_start(graph, plan.options["cut"])
    cut = cut_tensors(graph, start)
    numel = per_sample_numel(graph, cut)
    per_sample = packed_bytes(numel, bits)
    model_bytes = profile.totals.params
    ram = {stage: stage_ram(graph, plan, profile, stage) for stage in STAGES}
    return {
        "cut_layer": graph.nodes[start].name,
        "feature_shape": [list(t.shape[1:]) for t in cut],
        "feature_bits": bits,
        "feature_bytes_per_sample": per_sample,
        "samples": samples,
        "feature_bytes": samples * per_sample,
        "model_bytes": model_bytes,
        "storage_bytes": samples * per_sample + model_bytes,
        "train_batch_bytes": graph.batch * numel * 4,
        "train_ram_bytes": ram["retrain"],
        "finetune_ram_bytes": ram["finetune"],
        "stage": plan.options["stage"],
        "ram_bytes": ram[plan.options["stage"]],
    }
