"""Mode ``applied``: what eager PyTorch saves after ``memplan.apply_plan`` / ``apply_strategy``.

Each op is costed as the module ``apply_plan`` leaves in its place (``memplan.nn.choice.lean_class``
decides, for the original model and for an already applied one alike); ops left alone follow
the ``pytorch`` rules. What the lean modules keep, measured with saved_tensors_hooks
(tests/test_apply.py, tests/test_lean.py):

* ``FrozenConv`` (conv with a frozen weight that autograd records), ``ShiftOnlyNorm`` (eval BN
  with a frozen scale), ``LeanAvgPool2d``: nothing;
* ``SubChannelConv`` (weight fraction r): the ``n = max(1, int(C_in * r))`` selected input
  channels, a new ``B x n x spatial`` tensor (the input itself when n == C_in);
* ``MaskedReLU`` / ``MaskedReLU6`` / ``MaskedHardtanh`` / ``MaskedLeakyReLU``, ``SignHardswish``
  (h-swish in ``plan.approx``) and ``MaskedDropout``: a bit-packed mask, ``ceil(numel / 8)`` B;
* sub-channel weight gradients cover the selected slice only (``partial_weight_grads``).

It equals ``ideal`` (whose masks are packed the same way) except in these cases. Below
``ideal``: a ReLU whose output a consumer keeps anyway (a conv / linear whose whole weight
trains) stays a plain ReLU and shares that tensor, where ``ideal`` adds a 1-bit mask. Above
``ideal``, where no lean module exists or ``apply_plan`` leaves the op alone, it keeps what
eager PyTorch keeps:

* GroupNorm / LayerNorm keep their per-group mean and rstd (2 x rows x 4 B) besides the input,
  which ``ideal`` does not count;
* max-pool keeps its input and int64 indices (``ideal``: a few-bit argmax per output);
  functional / 1-D avg-pool and adaptive avg-pool with an output larger than 1x1 keep their
  input (``ideal``: nothing);
* functional activations / dropout (``F.relu(x)`` in a forward, not a module), ``Dropout1d/2d``,
  in-place or p outside (0, 1) dropout, convs with string or non-zero padding modes, and
  activations other than ReLU / ReLU6 / Hardtanh / LeakyReLU / approximated h-swish keep what
  PyTorch keeps (``ideal``: a mask for the ReLU-style ones, nothing for a frozen conv);
* a fractional update of a Linear layer has no lean op (``apply_plan`` refuses it); it is
  costed as PyTorch trains it, whole (the full input).

Only stock modules are replaced (``memplan.graph.kinds.module_kind``): the same ops called as
functions, inside a module's own ``forward`` (a "same"-padding conv, a BatchNorm that applies
its activation), are left as they are and keep what PyTorch keeps; ``extras["left_as_is"]``
counts them by target.

``SubChannelConv`` keeps its trainable slice ``weight_sel`` next to the full frozen weight: the
copies (``n / C_in`` of each such weight, at its itemsize) are added to ``total_bytes`` and to
the static part of ``peak_bytes``, and reported as ``extras["subchannel_copy_bytes"]``
(``weight_bytes`` counts every weight once, as the other modes do).
"""

from __future__ import annotations

from ..costs.peak import PeakOptions
from ..costs.records import LayerCost, Saved, Summary, Totals
from ..graph import LayerGraph, sub_channels
from ..nn.choice import lean_class
from ..nn.lean import FrozenConv, LeanAvgPool2d, ShiftOnlyNorm, SubChannelConv
from ..plan import OpView
from .base import Mode, mask_bits, private, register_mode, tensor
from .pytorch import pytorch

#: kinds a stock module of which apply_plan may replace by a lean one; the same op as a function
#: call (``F.conv2d`` inside a module's own forward, ``F.relu``) is left as PyTorch runs it
LEAN_REPLACEABLE = frozenset({"conv", "batchnorm", "relu", "hardtanh", "leaky_relu", "hardswish", "dropout", "avgpool"})


class AppliedMode(Mode):
    name = "applied"
    description = "eager PyTorch 2.13 after memplan.apply_*: lean autograd ops where they save memory"
    autocast = False  # the lean autograd ops under autocast are not modelled

    def summarize(
        self,
        graph: LayerGraph,
        views: list[OpView],
        saved: list[list[Saved]],
        node_costs: list[LayerCost],
        totals: Totals,
        peak: PeakOptions | None = None,
    ) -> Summary:
        summary = super().summarize(graph, views, saved, node_costs, totals, peak)
        left: dict[str, int] = {}
        for op in views:
            if op.recorded and op.node.op != "call_module" and op.kind in LEAN_REPLACEABLE:
                left[op.node.target] = left.get(op.node.target, 0) + 1
        if left:
            summary.extras["left_as_is"] = left
        copies = sum(subchannel_copy_bytes(op) for op in views if lean_class(op) is SubChannelConv)
        if copies:
            summary.total_bytes += copies
            summary.peak_bytes += copies
            summary.at = [b + copies for b in summary.at]
            summary.extras["subchannel_copy_bytes"] = copies
        return summary


def selected_channels(op: OpView) -> tuple[int, int]:
    """(n, C_in): the input channels a sub-channel update keeps, of all."""
    channels = op.node.in_tensors[0].shape[1]
    return sub_channels(channels, op.train.weight), channels


def subchannel_copy_bytes(op: OpView) -> int:
    """Bytes of ``SubChannelConv.weight_sel``: n / C_in of the weight (n * k^2 * multiplier for a
    depthwise conv)."""
    w = op.node.params["weight"]
    n, channels = selected_channels(op)
    return w.numel // channels * n * w.dtype.itemsize


applied = register_mode(AppliedMode(parent=pytorch))
rule = applied.rule


@rule("conv")
def conv(op: OpView):
    cls = lean_class(op)
    if cls is SubChannelConv:
        x = op.node.in_tensors[0]
        n, channels = selected_channels(op)
        yield (
            tensor(op, x, "input")
            if n == channels
            else private(x.nbytes // channels * n, f"input channels {n}/{channels}")
        )
    elif cls is not FrozenConv:
        yield from pytorch.find_rule("conv")(op)


@rule("batchnorm")
def batchnorm(op: OpView):
    if lean_class(op) is not ShiftOnlyNorm:
        yield from pytorch.find_rule("batchnorm")(op)


@rule("avgpool")
def avgpool(op: OpView):
    if lean_class(op) is not LeanAvgPool2d:
        yield from pytorch.find_rule("avgpool")(op)


@rule("relu", "hardtanh", "leaky_relu", "hardswish", "dropout")
def masked(op: OpView):
    if lean_class(op) is None:
        yield from pytorch.find_rule(op.kind)(op)
    elif op.grad_input:
        yield mask_bits(op.node.out.numel)
