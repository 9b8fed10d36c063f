"""FLOP rules: one small formula per op kind.

Conventions (stated in every report):

* ``macs`` and ``forward`` FLOPs = 2 x MACs are counted for conv / linear / matmul only
  (``memplan.graph.kinds.MAC_KINDS``); bias additions are not part of them.
* Every other op (norms, activations, adds, multiplies, pooling, softmax) is counted as
  "other" FLOPs: ``ELEMENTWISE_FLOPS[kind]`` per output element; norms 2 per element
  (scale and shift with folded statistics) plus 4 per input element in train mode
  (mean, variance); pooling 1 per input element read. Their backward, when the input
  needs a gradient, costs the same again.
* Backward of conv / linear: grad-input = 2 x MACs when an input needs a gradient;
  grad-weight = 2 x MACs x (updated fraction); grad-bias = 1 FLOP per output element
  (a reduction). For matmul each operand that needs a gradient costs 2 x MACs (grad-input).
* Norm affine grads: scale 2 per element (grad-weight), shift 1 per element (grad-bias).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..graph.attention import sdpa_backend
from ..graph.kinds import ELEMENTWISE_FLOPS
from ..plan import OpView
from ..registry import Registry


@dataclass(frozen=True)
class Flops:
    macs: int = 0
    forward: int = 0
    grad_input: int = 0
    grad_weight: int = 0
    grad_bias: int = 0

    @property
    def backward(self) -> int:
        return self.grad_input + self.grad_weight + self.grad_bias


FlopRule = Callable[[OpView, float], Flops]
FLOP_RULES: Registry[FlopRule] = Registry("FLOP rule")
flop_rule = FLOP_RULES.register


def flops_of(op: OpView, weight_fraction: float) -> Flops | None:
    """FLOPs of one op; ``weight_fraction`` is the fraction of its weight gradient computed
    (the mode decides: plain PyTorch computes all of it). None for an unknown kind."""
    rule = FLOP_RULES.get(op.kind)
    return None if rule is None else rule(op, weight_fraction)


def _out_numel(op: OpView) -> int:
    return op.node.out.numel if op.node.out else 0


def _layer(op: OpView, macs: int, wf: float) -> Flops:
    return Flops(
        macs=macs,
        forward=2 * macs,
        grad_input=2 * macs if op.grad_input else 0,
        grad_weight=round(2 * macs * wf) if op.weight_grad else 0,
        grad_bias=_out_numel(op) if op.bias_grad else 0,
    )


@flop_rule("conv")
def conv(op: OpView, wf: float) -> Flops:
    weight_shape = op.node.attrs["weight_shape"]
    per_output = 1
    for s in weight_shape[1:]:  # C_in / groups x kernel
        per_output *= s
    return _layer(op, _out_numel(op) * per_output, wf)


@flop_rule("linear")
def linear(op: OpView, wf: float) -> Flops:
    return _layer(op, _out_numel(op) * op.node.in_tensors[0].shape[-1], wf)


@flop_rule("matmul")
def matmul(op: OpView, wf: float) -> Flops:
    macs = _out_numel(op) * op.node.in_tensors[0].shape[-1]
    return Flops(macs=macs, forward=2 * macs, grad_input=2 * macs * sum(op.req_in))


@flop_rule("sdpa")
def sdpa(op: OpView, wf: float) -> Flops:
    """F.scaled_dot_product_attention: forward QK^T and PV (2 matmuls). Backward as the CPU kernel
    runs it (``memplan.graph.attention.sdpa_backend``): the flash kernel recomputes QK^T and
    computes dV, dP, dQ and dK whenever it runs (5 matmuls, torch's ``sdpa_backward_flop``); the
    math kernel runs each matmul's gradient for the operands that need one."""
    q, k, v = (op.operand(n) for n in ("query", "key", "value"))
    lead = q.numel // (q.shape[-2] * q.shape[-1])
    qk = lead * q.shape[-2] * k.shape[-2] * q.shape[-1]  # MACs of Q K^T
    pv = lead * q.shape[-2] * k.shape[-2] * v.shape[-1]  # MACs of P V
    rq, rk, rv, rm = (op.operand_grad(n) for n in ("query", "key", "value", "attn_mask"))
    if not (rq or rk or rv or rm):
        back = 0
    elif sdpa_backend(op) == "flash":
        back = 2 * (3 * qk + 2 * pv)
    else:
        scores = rq or rk or rm
        back = 2 * (qk * (rq + rk) + pv * (scores + rv))
    return Flops(macs=qk + pv, forward=2 * (qk + pv), grad_input=back)


@flop_rule("batchnorm", "groupnorm", "layernorm")
def norm(op: OpView, wf: float) -> Flops:
    n = _out_numel(op)
    batch_stats = op.norm_train or op.kind != "batchnorm"
    fwd = 2 * n + (4 * n if batch_stats else 0)
    return Flops(
        forward=fwd,
        grad_input=fwd if op.grad_input else 0,
        grad_weight=2 * n if op.train.weight else 0,
        grad_bias=n if op.train.bias else 0,
    )


@flop_rule(*ELEMENTWISE_FLOPS)
def elementwise(op: OpView, wf: float) -> Flops:
    if op.kind == "dropout" and not op.node.attrs.get("training", True):
        return Flops()
    f = ELEMENTWISE_FLOPS[op.kind] * _out_numel(op)
    return Flops(forward=f, grad_input=f if op.grad_input else 0)


@flop_rule("maxpool", "avgpool", "adaptive_avgpool", "adaptive_maxpool", "mean")
def pool(op: OpView, wf: float) -> Flops:
    f = op.node.in_tensors[0].numel
    return Flops(forward=f, grad_input=f if op.grad_input else 0)


@flop_rule("interpolate")
def interpolate(op: OpView, wf: float) -> Flops:
    f = 4 * _out_numel(op)  # bilinear: 4 weighted taps per output (upper bound for nearest)
    return Flops(forward=f, grad_input=f if op.grad_input else 0)


@flop_rule("cross_entropy")
def cross_entropy(op: OpView, wf: float) -> Flops:
    f = 3 * op.node.in_tensors[0].numel  # log-softmax
    return Flops(forward=f, grad_input=f if op.grad_input else 0)


@flop_rule("view", "identity", "cast", "getitem", "meta", "param", "input", "output", "cat", "pad", "fold")
def free(op: OpView, wf: float) -> Flops:
    return Flops()
