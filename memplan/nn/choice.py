"""The single decision "which lean module replaces this op": ``apply_plan`` swaps it in, the
``applied`` accounting mode predicts memory from it.

===================================================  ==================  ==================
op (module), under the plan                          replaced by         keeps for backward
===================================================  ==================  ==================
Conv1d/2d, frozen weight, recorded by autograd       ``FrozenConv``      nothing
Conv1d/2d, weight fraction r in (0, 1)               ``SubChannelConv``  selected channels
BatchNorm, eval (frozen stats), frozen scale         ``ShiftOnlyNorm``   nothing
ReLU / ReLU6 / Hardtanh / LeakyReLU                  ``Masked*``         1-bit mask
Hardswish in ``plan.approx``                         ``SignHardswish``   1-bit mask
Dropout, 0 < p < 1, out of place                     ``MaskedDropout``   1-bit mask
AvgPool2d                                            ``LeanAvgPool2d``   nothing
===================================================  ==================  ==================

Activations, dropout and pooling are swapped where their input needs a gradient, norms where
autograd records them; a ReLU is not, where a consumer keeps its output anyway (a conv or
linear whose whole weight trains): PyTorch's ReLU then shares that tensor, a mask would add
``numel / 8`` bytes. A ReLU6 / ReLU in ``plan.approx`` keeps its exact 1-bit mask (its
derivative is 0 or 1 already); only h-swish gets MobileTL's sign approximation. Everything
else is left alone: a frozen prefix (nothing recorded) saves nothing anyway, a trainable conv
needs its input, and a Linear with a frozen weight already keeps no activation in eager
PyTorch (so ``FrozenLinear`` would save nothing).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn as nn

from ..graph.kinds import FREE_KINDS, PARAM_KINDS
from ..plan import OpView, grad_flow
from ..registry import Registry
from .lean import (
    LEAN_MODULES,
    FrozenConv,
    LeanAvgPool2d,
    MaskedDropout,
    MaskedHardtanh,
    MaskedLeakyReLU,
    MaskedReLU,
    MaskedReLU6,
    ShiftOnlyNorm,
    SignHardswish,
    SubChannelConv,
)

LeanChoice = Callable[[OpView, nn.Module], "type[nn.Module] | None"]
CHOICES: Registry[LeanChoice] = Registry("lean choice")


@CHOICES.register("conv")
def _conv(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    if type(m) not in (nn.Conv1d, nn.Conv2d) or m.padding_mode != "zeros" or isinstance(m.padding, str):
        return None
    if 0 < op.train.weight < 1:
        return SubChannelConv
    return FrozenConv if op.train.weight == 0 and op.recorded else None


@CHOICES.register("batchnorm")
def _batchnorm(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    frozen = op.train.weight == 0 and not op.norm_train
    has_stats = isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None
    return ShiftOnlyNorm if frozen and has_stats and op.recorded else None


def _output_kept_anyway(op: OpView) -> bool:
    """Does a consumer keep ``op``'s output storage for its own backward (a conv, or a linear
    with a contiguous input, whose whole weight trains), directly or through views?"""
    if op.plan is None:
        return False
    storage = op.node.out.storage
    frontier, seen = [op.node.index], set()
    while frontier:
        i = frontier.pop()
        for n in op.graph.nodes[i + 1 :]:
            if i not in n.inputs or n.index in seen:
                continue
            seen.add(n.index)
            x = n.in_tensors[n.inputs.index(i)]
            if x.storage != storage or op.plan.of(n).weight < 1:
                if n.kind in FREE_KINDS and n.out is not None and n.out.storage == storage:
                    frontier.append(n.index)
                continue
            if n.kind == "conv" or (n.kind == "linear" and (x.contiguous or len(x.shape) <= 2)):
                return True
    return False


@CHOICES.register("relu")
def _relu(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    # PyTorch's ReLU keeps its output: free when a trainable consumer keeps that tensor anyway
    return MaskedReLU if type(m) is nn.ReLU and op.grad_input and not _output_kept_anyway(op) else None


@CHOICES.register("hardtanh")
def _hardtanh(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    if not (isinstance(m, nn.Hardtanh) and op.grad_input):
        return None
    return MaskedReLU6 if (m.min_val, m.max_val) == (0.0, 6.0) else MaskedHardtanh


@CHOICES.register("leaky_relu")
def _leaky_relu(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    return MaskedLeakyReLU if type(m) is nn.LeakyReLU and op.grad_input else None


@CHOICES.register("hardswish")
def _hardswish(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    return SignHardswish if type(m) is nn.Hardswish and op.approx and op.grad_input else None


@CHOICES.register("dropout")
def _dropout(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    ok = type(m) is nn.Dropout and 0 < m.p < 1 and not m.inplace
    return MaskedDropout if ok and op.grad_input else None


@CHOICES.register("avgpool")
def _avgpool(op: OpView, m: nn.Module) -> type[nn.Module] | None:
    return LeanAvgPool2d if type(m) is nn.AvgPool2d and op.grad_input else None


def _calls(op: OpView) -> list[OpView]:
    """The views of every call of ``op``'s module, in forward order (just ``op`` when it is
    called once)."""
    uses = [n.index for n in op.graph.nodes if n.module is op.node.module]
    if len(uses) == 1 or op.plan is None:
        return [op]
    views = grad_flow(op.graph, op.plan)
    return [views[i] for i in uses]


def lean_class(op: OpView) -> type[nn.Module] | None:
    """The lean module class ``apply_plan`` puts in place of ``op``'s module (or that module's
    own class when it already is one); None when the op is left alone.

    One decision per module, whatever call ``op`` is: a module called several times (a shared
    ReLU) is swapped for all its calls. Convs and norms follow their first call (the one the
    plan names); activations, dropout and pooling, whose lean versions compute the same thing,
    are swapped when any call would be."""
    m = op.node.module
    if op.node.op != "call_module" or m is None:
        return None
    if type(m) in LEAN_MODULES:
        return type(m)
    choose = CHOICES.get(op.kind)
    if choose is None:
        return None
    choices = [choose(v, m) for v in _calls(op)]
    if op.kind in PARAM_KINDS:
        return choices[0]
    return next((c for c in choices if c is not None), None)
