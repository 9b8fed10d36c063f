"""Mode ``tinytraining``: the 256KB paper's analytic *extra* memory (accounting.md §4; Lin et
al., NeurIPS 2022, Sec. 3 "analytic profiling"; ``nelem_saved_for_backward`` in the authors' code).

Counted in bits, with 8-bit activations and weights, 32-bit biases and no momentum; the frozen
model (in flash) and the forward working memory are not counted, and nothing is shared or
peaked: the total is a plain sum over layers.

* the classifier keeps its input at 8 bits when it trains; its own weight and bias are not
  counted (``fc_bits = 0`` in the authors' code);
* a conv / linear whose bias trains keeps a 1-bit mask of its output and costs its bias at
  32 bits. The paper's models fold BN into the conv; in a conv -> BN model the BN shift is that
  bias (``memplan.graph.bias_carrier``), so a norm whose shift trains is charged the same;
* a conv / linear whose weight trains at ratio r keeps n = int(C_in x r) input channels (at
  least one) at 8 bits and an 8-bit copy of the updated weight, C_out x n x k^2 (n x k^2 for a
  depthwise conv, whose n counts output channels); a grouped, non-depthwise conv keeps all input
  channels and copies the whole weight, as the authors' code does;
* a norm whose scale trains (outside the paper's scheme space) is charged like a per-channel
  weight: its input at 8 bits and C x 8 bits. Batch statistics cost nothing here;
* every other op keeps nothing;
* a parameter no conv / linear / norm layer owns (read through a slice or copy, as once-for-all
  supernets do) has no rule: a plan training one is a one-line error, except the classifier's
  (not counted anyway, ``fc_bits = 0``; its input is, as for any classifier).

The paper assumes batch 1; inputs and masks scale with the traced batch. In the profile,
``saved_activation_bytes`` holds the inputs and masks, ``weight_bytes`` the updated weight copies
and biases (not the frozen model), and ``total_bytes`` = ``peak_bytes`` is the sum of all four
components. ``extras["tinytraining"]`` gives the exact bit counts and KiB (= bits / 8 / 1024,
what the paper prints as "kB").

Two costs the paper leaves out of its analytic numbers, off by default (SGD without momentum, no
accumulation, as the paper trains), are options (``Mode.configure``; the optimizer is the
profile's ``optimizer``):

* optimizer state (``optimizer_bytes``): ``sgd-momentum`` keeps one buffer, ``adam`` two, per
  updated weight and bias element (App. C: "momentum will double the memory requirement for
  updating parameters (assume we can safely quantize momentum buffer; otherwise the memory usage
  will be 5x larger)"; Sec. 3.2: Adam "costs 3x memory"). ``state_bits=None`` (default) stores a
  buffer at its parameter's bits (8 for weights, 32 for biases), so momentum doubles the update
  memory; ``state_bits=32`` keeps fp32 buffers: an int8 weight then costs 8 + 32 = 40 bits, 5x;
* gradient accumulation (``gradient_bytes``, ``grad_accumulation=True``): one accumulator per
  updated weight and bias element at ``accumulation_bits`` (default 32: int32 / fp32 sums of int8
  products), alive across the accumulated steps (App. C Table 5: 160 -> 188 KB measured on
  MCUNet-5FPS; the scheme behind those numbers is not printed).

As for the weights, the classifier's own state is not counted (``fc_bits = 0``).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from ..costs.records import LayerCost, Saved, Summary, Totals
from ..errors import BadOption
from ..graph import LayerGraph, bias_carrier, conv_layers
from ..graph.kinds import NORM_KINDS
from ..plan import OpView, Plan, Train, grad_flow, updated_weight_numel
from .base import Mode, Rule, mask_bits, private, register_mode
from .pytorch import pytorch

ACTIVATION_BITS = 8
WEIGHT_BITS = 8
BIAS_BITS = 32
KIB_BITS = 8 * 1024  # bits per KiB (the paper's "kB")


@dataclass(frozen=True)
class Bits:
    """Extra memory of one op, in bits."""

    input: int = 0  # kept (selected) input at ACTIVATION_BITS
    mask: int = 0  # 1-bit mask of the output (bias update)
    weight: int = 0  # updated weight copy at WEIGHT_BITS
    bias: int = 0  # updated bias at BIAS_BITS

    @property
    def activation(self) -> int:
        return self.input + self.mask

    @property
    def params(self) -> int:
        return self.weight + self.bias


def layer_bits(op: OpView) -> Bits:
    """What updating this op costs under the 256KB paper's convention (module docstring)."""
    node, t = op.node, op.train
    if node is op.graph.classifier:
        return Bits(input=node.in_tensors[0].numel * ACTIVATION_BITS if op.recorded and op.weight_grad else 0)
    if not op.recorded or not node.params or not t.any:
        return Bits()
    if node.kind == "param":  # a parameter read by a computed op (a weight slice, a scale)
        if node in op.graph.classifier_layers:
            return Bits()
        raise BadOption(
            f"the 256KB paper's convention has no rule for training parameter {node.name!r}: "
            "it is read through a computed op (a slice or copy), not by a conv, linear or norm layer of its own",
            "profile this model in mode pytorch, applied or ideal",
        )
    x, out = node.in_tensors[0], node.out
    inp = weight = 0
    if t.weight:
        shape = node.params["weight"].shape
        total = math.prod(shape)
        groups = node.attrs.get("groups", 1) or 1
        if node.kind in NORM_KINDS or (node.kind == "conv" and groups > 1 and shape[1] != 1):
            kept, weight = x.numel, total  # a norm scale, or a grouped non-depthwise conv: everything
        else:  # the selected channels' share of the input
            weight = updated_weight_numel(shape, groups, t.weight)
            kept = x.numel * weight // total
        inp, weight = kept * ACTIVATION_BITS, weight * WEIGHT_BITS
    mask = bias = 0
    if t.bias:
        mask = out.numel
        bias = node.params["bias"].numel * BIAS_BITS
    return Bits(inp, mask, weight, bias)


def _keeps_nothing(op: OpView) -> tuple[()]:
    return ()


def _states(totals: Totals) -> int:
    """Optimizer buffers per trainable element, as the engine counted them (``optimizer_bytes`` =
    buffers x ``gradient_bytes``: ``memplan.optim.OPTIMIZERS`` of the profile's optimizer)."""
    return totals.optimizer_bytes // totals.gradient_bytes if totals.gradient_bytes else 0


class TinyTrainingMode(Mode):
    name = "tinytraining"
    description = (
        "the 256KB paper's analytic extra memory: 8-bit kept inputs and weight copies, 32-bit biases, "
        "1-bit masks, summed (no peak); weight_bytes = updated copies + biases; KiB in extras"
    )
    extra_only = True
    conv_update_table = True
    deployed_bits = (WEIGHT_BITS, BIAS_BITS)  # the int8 model in flash: int8 weights, int32 biases
    #: bits of one optimizer buffer element (None: the parameter's own bits, the paper's quantised buffer)
    state_bits: int | None = None
    #: keep a gradient accumulator per updated element, at ``accumulation_bits``
    grad_accumulation: bool = False
    accumulation_bits: int = 32
    OPTIONS = ("state_bits", "grad_accumulation", "accumulation_bits")

    def configure(self, **options: object) -> TinyTrainingMode:
        """A copy with options set: ``state_bits`` (None or 1..64), ``grad_accumulation`` (bool),
        ``accumulation_bits`` (1..64). Rules are shared with the registered instance."""
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            raise BadOption(f"unknown tinytraining option {unknown[0]!r}", f"choose from {', '.join(self.OPTIONS)}")
        out = copy.copy(self)
        for key, value in options.items():
            if key == "grad_accumulation":
                if not isinstance(value, bool):
                    raise BadOption(f"grad_accumulation must be true or false, got {value!r}")
            elif value is not None or key != "state_bits":
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
                    raise BadOption(f"{key} must be an integer number of bits in 1..64, got {value!r}")
            setattr(out, key, value)
        return out

    def find_rule(self, kind: str) -> Rule | None:
        """Own rules (conv / linear / norms); any other kind that ``pytorch`` knows keeps nothing."""
        if kind in self.rules:
            return self.rules[kind]
        return _keeps_nothing if pytorch.find_rule(kind) is not None else None

    def extra_bits(self, b: Bits, states: int) -> tuple[int, int]:
        """(optimizer-state bits, accumulation bits) of one op's updated elements."""
        weights, biases = b.weight // WEIGHT_BITS, b.bias // BIAS_BITS
        sw, sb = (WEIGHT_BITS, BIAS_BITS) if self.state_bits is None else (self.state_bits, self.state_bits)
        state = states * (weights * sw + biases * sb)
        accum = (weights + biases) * self.accumulation_bits if self.grad_accumulation else 0
        return state, accum

    def summarize(
        self,
        graph: LayerGraph,
        views: list[OpView],
        saved: list[list[Saved]],
        node_costs: list[LayerCost],
        totals: Totals,
        peak=None,
    ) -> Summary:
        """Weights = updated copies and biases; optimizer state and accumulators as configured;
        total = peak = the sum, which builds up along the forward pass (``at``: running sum per node)."""
        bits = [layer_bits(op) for op in views]
        states = _states(totals)
        totals.weight_bytes = totals.gradient_bytes = totals.optimizer_bytes = 0
        at, running, state_bits, accum_bits = [], 0, 0, 0
        for lc, b in zip(node_costs, bits):
            state, accum = self.extra_bits(b, states)
            state_bits, accum_bits = state_bits + state, accum_bits + accum
            lc.weight_bytes, lc.gradient_bytes, lc.optimizer_bytes = b.params // 8, -(-accum // 8), -(-state // 8)
            totals.weight_bytes += lc.weight_bytes
            totals.gradient_bytes += lc.gradient_bytes
            totals.optimizer_bytes += lc.optimizer_bytes
            running += lc.weight_bytes + lc.saved_activation_bytes + lc.gradient_bytes + lc.optimizer_bytes
            at.append(running)
        total = totals.weight_bytes + totals.saved_activation_bytes + totals.gradient_bytes + totals.optimizer_bytes
        activation, params = sum(b.activation for b in bits), sum(b.params for b in bits)
        all_bits = activation + params + state_bits + accum_bits
        extras = {
            "tinytraining": {
                "activation_bits": activation,
                "weight_bits": params,
                "optimizer_state_bits": state_bits,
                "accumulation_bits": accum_bits,
                "total_bits": all_bits,
                "activation_kib": activation / KIB_BITS,
                "weight_kib": params / KIB_BITS,
                "optimizer_state_kib": state_bits / KIB_BITS,
                "accumulation_kib": accum_bits / KIB_BITS,
                "total_kib": all_bits / KIB_BITS,
                "optimizer_buffers": states,
                "state_bits": "parameter bits" if self.state_bits is None else self.state_bits,
                "grad_accumulation": self.grad_accumulation,
            }
        }
        return Summary(total, total, at.index(total), "forward", at, extras)


tinytraining = register_mode(TinyTrainingMode())


@tinytraining.rule("conv", "linear", *sorted(NORM_KINDS))
def layer(op: OpView):
    b = layer_bits(op)
    if b.input:
        yield private(b.input // 8, f"input at {ACTIVATION_BITS} bits")
    if b.mask:
        yield mask_bits(b.mask)


# --------------------------------------------------------------------------- Figure 11a
# Per-conv update costs, the 256KB paper's Figure 11a: for every conv, the activation and weight
# memory of updating it (weight at ratio 1 and bias) under this convention. Activation = the
# input kept at 8 bits + the 1-bit mask of the output; weight = the 8-bit updated weight copy +
# the 32-bit bias (a conv -> BN model's bias is the BN shift, ``memplan.graph.bias_carrier``).


@dataclass(frozen=True)
class ConvUpdateCost:
    """What updating one conv costs (bits)."""

    conv_index: int  # forward order, stem = 0
    layer: str
    input_bits: int  # input kept at 8 bits
    mask_bits: int  # 1-bit mask of the output
    weight_bits: int  # 8-bit copy of the whole weight
    bias_bits: int  # 32-bit bias

    @property
    def activation_kib(self) -> float:
        return (self.input_bits + self.mask_bits) / KIB_BITS

    @property
    def weight_kib(self) -> float:
        return (self.weight_bits + self.bias_bits) / KIB_BITS

    @property
    def total_kib(self) -> float:
        return self.activation_kib + self.weight_kib


def conv_update_costs(graph: LayerGraph) -> list[ConvUpdateCost]:
    """One row per conv (conv index order): the cost of updating its weight (ratio 1) and bias."""
    convs = conv_layers(graph)
    train = {c.name: Train(1.0, "bias" in c.params) for c in convs}
    for c in convs:
        carrier = bias_carrier(graph, c)
        if carrier is not None and carrier is not c:
            train[carrier.name] = Train(0.0, True)
    views = grad_flow(graph, Plan("update-all", train))
    rows = []
    for i, c in enumerate(convs):
        b = layer_bits(views[c.index])
        carrier = bias_carrier(graph, c)
        if carrier is not None and carrier is not c:
            extra = layer_bits(views[carrier.index])
            b = Bits(b.input + extra.input, b.mask + extra.mask, b.weight + extra.weight, b.bias + extra.bias)
        rows.append(ConvUpdateCost(i, c.name, b.input, b.mask, b.weight, b.bias))
    return rows
