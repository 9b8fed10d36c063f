"""Cache-and-Reuse (Yang et al., "Cache and Reuse: Rethinking the Efficiency of On-device
Transfer Learning", CVPR Workshops 2024; seed 004): two-stage training.

Stage A runs the frozen prefix (everything before the K-th last block) once over the N
training samples and caches its output at B bits per element (channel-wise quantile
quantisation, the paper's Eq. 2). Stage B trains the last K blocks + head for E epochs,
reading the cache instead of running the prefix. The trainable set is exactly ``lastk``'s
(norms there in train mode), so the plan *is* the ``lastk`` plan; the per-layer memory is
that of stage B's training step (the prefix saves nothing in either stage).

Figures in ``Profile.extras`` (``memplan.accounting.extras``; bytes, and FLOPs = 2 x MACs of conv / linear / matmul, the
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

Published vs ours (50,000 samples, 224 px; the paper's "MB" is MiB, see ``memplan reproduce``):
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

from ..graph import LayerGraph
from ..plan import Plan
from .base import lastk, positive, strategy

DEFAULT_BITS = 4
DEFAULT_SAMPLES = 50_000
DEFAULT_EPOCHS = 50


@strategy(
    "cache-reuse",
    "two-stage: cache the frozen prefix's output at --bits once, then train the last K "
    "blocks (as lastk) for --epochs from the cache",
    ("blocks", "layers", "bits", "samples", "epochs"),
)
def cache_reuse(
    graph: LayerGraph,
    blocks: int | None = None,
    layers: int | None = None,
    bits: int = DEFAULT_BITS,
    samples: int = DEFAULT_SAMPLES,
    epochs: int = DEFAULT_EPOCHS,
) -> Plan:
    plan = lastk(graph, blocks=blocks, layers=layers)
    plan.method = "cache-reuse"
    plan.options = {
        "bits": positive("bits", bits, 32),
        "samples": positive("samples", samples),
        "epochs": positive("epochs", epochs),
    }
    return plan
