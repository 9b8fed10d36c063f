"""Cache-and-Reuse (Yang et al., "Cache and Reuse: Rethinking the Efficiency of On-device
Transfer Learning", CVPR Workshops 2024; seed 004): two-stage training.

Stage A runs the frozen prefix (everything before the K-th last block) once over the N
training samples and caches its output at B bits per element (channel-wise quantile
quantisation, the paper's Eq. 2). Stage B trains the last K blocks + head for E epochs,
reading the cache instead of running the prefix. The trainable set is exactly ``lastk``'s
(norms there in train mode), so the plan *is* the ``lastk`` plan; the per-layer memory is
that of stage B's training step (the prefix saves nothing in either stage).

Figures in ``Profile.extras`` (bytes, and FLOPs = 2 x MACs of conv / linear / matmul, the
``forward_flops`` / ``backward_flops`` convention; norms, activations etc. are not in them):

* ``cache_shape``: per-sample shape(s) of the tensor(s) crossing the cut (one for a block cut);
* ``cache_bytes_per_sample`` = ceil(elements x B / 8): each sample's codes packed and padded
  to whole bytes; ``cache_bytes`` = N x that. Per-channel scale / offset and labels are not
  counted (see below);
* ``stage_a_forward_flops``: prefix forward x N, once;
* ``stage_b_forward_flops_per_epoch`` / ``stage_b_backward_flops_per_epoch``: suffix x N;
* ``two_stage_training_flops`` = stage A + E x N x (suffix forward + backward);
* ``single_stage_training_flops`` = E x N x (full forward + backward) (Algorithm 1);
* ``flops_saving_ratio`` = single-stage / two-stage;
* ``single_stage_frozen_forward_share``: prefix forward / (full forward + backward) of one
  single-stage step (the paper's Figure 1b quantity).

Defaults from the paper: ``bits`` 4 (its "Ours-4b", used in Table 2 and for Places365 in
Table 3; Table 4 shows 8 and 2 bits lose nothing and 1 bit loses accuracy), ``samples``
50,000 (the CIFAR-100 training split on which its latency and cache sizes are measured),
``epochs`` 50 ("We finetune each model for 50 epochs").

Published vs ours (50,000 samples, 224 px; the paper's "MB" is MiB, see ``memplan.published``):
MobileNetV2 last 4 blocks (96 x 14 x 14 cut) fp32 / 8 / 4 / 2 / 1 bit: 3589 / 898 / 450 /
226 / 113 MiB printed, 3588.9 / 897.2 / 448.6 / 224.3 / 112.2 computed; every Table 2 and 4
size is 0.1-3.7 MiB (at most 0.6%) above N x C x H x W x B / 8, consistent with stored labels,
per-channel quantisation parameters or file metadata, which are not modelled. Not
reproducible: Table 1's "FP32 Cache 3.6GB" (Table 4's 3589 MiB / 1000, neither GB nor GiB)
and its "INT4 Cache 460MB" (450 in Tables 2 and 4 for the same cut: a typo). Its Figure 1
FLOP figures ("around 500 MFLOPs to train 4 blocks", "1258 MFLOPs" for the full model, "53%"
frozen-forward share for 5 blocks) follow an unstated counting; under 2 x MACs the first is
close (stage B forward + backward per image), the other two are not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import BadOption
from ..graph import LayerGraph, TensorInfo
from ..plan import Plan
from .base import lastk, lastk_start, strategy

if TYPE_CHECKING:  # costs imports the modes, one of which imports the strategies
    from ..costs import Profile

DEFAULT_BITS = 4
DEFAULT_SAMPLES = 50_000
DEFAULT_EPOCHS = 50


def positive(name: str, value: Any, high: int | None = None) -> int:
    """``value`` as a positive int (at most ``high``), else a one-line BadOption."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (high is not None and value > high):
        bound = f" in 1..{high}" if high is not None else ""
        raise BadOption(f"--{name.replace('_', '-')} must be an integer{bound}, got {value!r}")
    return value


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
    from ..costs import HIDDEN_KINDS  # here: see the TYPE_CHECKING import above

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


def cache_extras(graph: LayerGraph, plan: Plan, profile: Profile) -> dict[str, Any]:
    """Cache size and stage A / stage B FLOPs of a ``cache-reuse`` plan (see module docstring)."""
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


@strategy("cache-reuse", "two-stage: cache the frozen prefix's output at --bits once, then train the last K "
          "blocks (as lastk) for --epochs from the cache", ("blocks", "layers", "bits", "samples", "epochs"),
          extras=cache_extras)
def cache_reuse(graph: LayerGraph, blocks: int | None = None, layers: int | None = None, bits: int = DEFAULT_BITS,
                samples: int = DEFAULT_SAMPLES, epochs: int = DEFAULT_EPOCHS) -> Plan:
    plan = lastk(graph, blocks=blocks, layers=layers)
    plan.method = "cache-reuse"
    plan.options = {"bits": positive("bits", bits, 32), "samples": positive("samples", samples),
                    "epochs": positive("epochs", epochs)}
    return plan
