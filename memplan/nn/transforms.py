"""Architecture transforms applied to a model before tracing (and by ``apply_strategy``).

* :func:`swap_norm`: BatchNorm -> GroupNorm with 8 channels per group (TinyTL, Sec. 4.1).
* :func:`add_lite_residual`: TinyTL's lite residual branch beside every block (Sec. 3.2).
* :func:`remove_se`: drop squeeze-and-excitation modules (MobileTL Table 4, "remove-SE").
* :func:`swap_activation`: one activation for every activation module but gates (TinyTL's
  ReLU, MobileTL Table 4's "ReLU" row).

All edit the model in place, keep it ``torch.fx``-traceable, and work on real and on
meta-device models (new modules are created on the device / dtype of the block they join;
random initialisation is skipped on meta, where only shapes matter).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..errors import BadOption, MemplanError
from ..graph import Node, find_blocks, module_kind, node_kind
from ..graph.capture import capture_graph  # transforms run inside the pipeline (memplan.api), before its capture
from ..graph.kinds import ACTIVATIONS
from ..graph.model import TAG_ATTR, WRAP_ATTR
from ..graph.trace import trace
from ..models.zoo.blocks import make_divisible

#: channels per group of the GroupNorm layers TinyTL uses
GN_CHANNELS_PER_GROUP = 8
#: attribute of :class:`LiteResidual` holding the branch, and the branch's tag (``graph.model.TAG_ATTR``):
#: every node captured inside a branch carries it in ``Node.tags`` (strategies and modes find lite layers by it)
LITE_ATTR = "lite_residual"
_BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: per-sample input a transform traces a model at when none is given (the capture pipeline,
#: ``memplan.strategies.transform_model``, always passes the model's own)
DEFAULT_SAMPLE_SHAPE = (3, 224, 224)


# --------------------------------------------------------------------------- norms


def group_count(channels: int, per_group: int = GN_CHANNELS_PER_GROUP) -> int:
    """Number of GroupNorm groups for ``channels``: ``channels // per_group`` (at least 1), lowered
    to the nearest divisor of ``channels`` when it does not divide them (e.g. 44 -> 4 groups)."""
    groups = max(1, channels // per_group)
    while channels % groups:
        groups -= 1
    return groups


def group_norm(channels: int, eps: float = 1e-5, affine: bool = True, device=None, dtype=None) -> nn.GroupNorm:
    return nn.GroupNorm(group_count(channels), channels, eps=eps, affine=affine, device=device, dtype=dtype)


def _to_group_norm(bn: nn.modules.batchnorm._BatchNorm) -> nn.GroupNorm:
    """A GroupNorm over the same channels; scale and shift copied (running statistics dropped)."""
    device = dtype = None
    if bn.weight is not None:
        device, dtype = bn.weight.device, bn.weight.dtype
    gn = group_norm(bn.num_features, bn.eps, bn.affine, device, dtype)
    if bn.affine and not bn.weight.is_meta:
        with torch.no_grad():
            gn.weight.copy_(bn.weight)
            gn.bias.copy_(bn.bias)
    gn.train(bn.training)
    return gn


def replace_module(model: nn.Module, qualname: str, new: nn.Module) -> None:
    """Put ``new`` in place of the submodule ``qualname`` of ``model`` (setattr on its parent)."""
    parent, _, name = qualname.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)


def swap_norm(model: nn.Module, norm: str) -> nn.Module:
    """Replace every BatchNorm (1d / 2d / 3d) by a GroupNorm with 8 channels per group
    (:func:`group_count`), in place; returns the model (the new norm when ``model`` is a BatchNorm).

    ``"batch"`` leaves the model as it is; ``"group"`` swaps. GroupNorm keeps the BatchNorm's
    affine scale / shift values and eps; running statistics have no GroupNorm counterpart.
    """
    if norm == "batch":
        return model
    if norm != "group":
        raise BadOption(f"unknown --norm {norm!r}", "use 'batch' or 'group'")
    if isinstance(model, _BATCHNORMS):
        return _to_group_norm(model)
    for qualname, m in list(model.named_modules()):
        if isinstance(m, _BATCHNORMS):
            replace_module(model, qualname, _to_group_norm(m))
    return model


# --------------------------------------------------------------------------- SE and activations

#: kinds that pool a whole feature map (the squeeze of a squeeze-and-excitation module)
GLOBAL_POOLS = frozenset({"adaptive_avgpool", "adaptive_maxpool", "mean"})
#: activation kinds used as gates (SE, attention): kept by :func:`swap_activation`
GATES = frozenset({"sigmoid", "hardsigmoid"})
#: --activation names -> module class
ACTIVATION_MODULES: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU, "relu6": nn.ReLU6, "leaky_relu": nn.LeakyReLU, "hardswish": nn.Hardswish,
    "silu": nn.SiLU, "gelu": nn.GELU, "elu": nn.ELU, "tanh": nn.Tanh,
}  # fmt: skip


def _derives_through_pool(gm: fx.GraphModule, node: fx.Node, source: fx.Node) -> bool:
    """Whether ``node`` is computed from ``source`` along a path through a global pooling."""
    pending, seen, pooled = [(node, False)], set(), False
    while pending:
        n, through = pending.pop()
        if (n, through) in seen:
            continue
        seen.add((n, through))
        through = through or node_kind(gm, n)[0] in GLOBAL_POOLS
        if n is source:
            pooled = pooled or through
        pending.extend((a, through) for a in n.all_input_nodes)
    return pooled


def is_squeeze_excite(module: nn.Module) -> bool:
    """Whether ``module`` computes ``x * gate(x)`` with a gate reached from ``x`` through a global
    pooling (squeeze-and-excitation, whatever the class): read from its torch.fx trace."""
    if not any(True for _ in module.children()):
        return False
    try:
        gm = trace(module)
    except MemplanError:
        return False
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if len(inputs) != 1 or not isinstance(out, fx.Node) or node_kind(gm, out)[0] != "mul":
        return False
    operands = [a for a in out.args if isinstance(a, fx.Node)]
    if len(operands) != 2 or inputs[0] not in operands:
        return False
    gate = operands[1] if operands[0] is inputs[0] else operands[0]
    return gate is not inputs[0] and _derives_through_pool(gm, gate, inputs[0])


def remove_se(model: nn.Module) -> nn.Module:
    """Replace every squeeze-and-excitation module (:func:`is_squeeze_excite`) by ``nn.Identity``,
    in place; returns the model. A model without one is refused (the option would change nothing)."""
    found: list[str] = []
    for qualname, m in model.named_modules():
        if qualname and not any(qualname.startswith(f + ".") for f in found) and is_squeeze_excite(m):
            found.append(qualname)
    if not found:
        raise BadOption("remove_se: the model has no squeeze-and-excitation module (x * gate(pool(x)))")
    for qualname in found:
        replace_module(model, qualname, nn.Identity())
    return model


def swap_activation(model: nn.Module, activation: str) -> nn.Module:
    """Replace every activation module but gates (``GATES``) by a new ``activation`` module, in
    place; returns the model. Functional activations in a ``forward`` stay as they are."""
    cls = ACTIVATION_MODULES.get(activation)
    if cls is None:
        raise BadOption(f"unknown activation {activation!r}", f"choose one of: {', '.join(ACTIVATION_MODULES)}")
    for qualname, m in list(model.named_modules()):
        kind = module_kind(m)
        if qualname and kind in ACTIVATIONS and kind not in GATES and type(m) is not cls:
            replace_module(model, qualname, cls())
    return model


# --------------------------------------------------------------------------- lite residual


class LiteResidual(nn.Module):
    """``block(x) + upsample(lite_residual(x))``: a block with TinyTL's lite residual branch.

    The branch output is bilinearly resized to the block output's spatial size, read from the
    tensor at run time (``out.shape[2:]`` traces to a shape query, not to arithmetic), so the
    wrapped model runs at any resolution.

    Checkpoints keep the block's own keys: ``state_dict()`` holds the wrapped block's entries under
    the block's name (``blocks.3.conv.weight``, not ``blocks.3.main.conv.weight``) plus the
    branch's (``blocks.3.lite_residual.*``), and ``load_state_dict`` takes either form. So a plain
    checkpoint loads into a model with branches (``strict=False``: the branch keys are its
    ``missing_keys``), and the backbone of a trained one loads into the plain model
    (``strict=False``: the trained branch weights are its ``unexpected_keys``; a strict load
    refuses them, naming each).
    """

    def __init__(self, block: nn.Module, branch: nn.Sequential):
        super().__init__()
        self.main = block
        self.lite_residual = branch
        setattr(branch, TAG_ATTR, LITE_ATTR)
        setattr(self, WRAP_ATTR, "main")
        self.register_state_dict_post_hook(_unwrap_keys)
        self.register_load_state_dict_pre_hook(_wrap_keys)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.main(x)
        r = self.lite_residual(x)
        return out + F.interpolate(r, size=out.shape[2:], mode="bilinear", align_corners=False)


def _unwrap_keys(module: LiteResidual, state: dict, prefix: str, _metadata: dict) -> None:
    """state_dict hook: the wrapped block's entries under the block's own name (``prefix``), the
    branch's after them; the version metadata of the block's modules renamed alike."""
    inner = prefix + "main."
    mine = [k for k in state if k.startswith(prefix)]
    moved = {(prefix + k[len(inner) :] if k.startswith(inner) else k): state.pop(k) for k in mine}
    for k in sorted(moved, key=lambda k: k.startswith(prefix + "lite_residual.")):  # stable: the block's first
        state[k] = moved[k]
    meta = getattr(state, "_metadata", None)
    if meta is not None:
        for k in [k for k in meta if k == inner[:-1] or k.startswith(inner)]:
            meta[prefix + k[len(inner) :] if k != inner[:-1] else prefix[:-1]] = meta.pop(k)


def _wrap_keys(_module: LiteResidual, state: dict, prefix: str, *_args) -> None:
    """load_state_dict pre-hook: the block's entries given under the block's own name go to ``main``."""
    branch = prefix + "lite_residual."
    for k in [k for k in state if k.startswith(prefix) and not k.startswith((branch, prefix + "main."))]:
        state[prefix + "main." + k[len(prefix) :]] = state.pop(k)


def lite_kernel(kernel: int, pooled: Sequence[int]) -> int:
    """TinyTL's kernel rule: shrink ``kernel`` by 2 until it fits the smallest pooled side."""
    k = kernel
    while k > 1 and k > min(pooled):
        k -= 2
    return k


def lite_mid_channels(in_channels: int) -> int:
    """Branch width: the input channels rounded to a multiple of 8 (TinyTL's ``make_divisible``)."""
    return make_divisible(in_channels, 8)


def _norm_layer(kind: str, channels: int, device, dtype) -> nn.Module:
    if kind == "group":
        return group_norm(channels, device=device, dtype=dtype)
    return nn.BatchNorm2d(channels, device=device, dtype=dtype)


def lite_branch(  # TinyTL's branch hyperparameters, one per argument
    in_channels: int,
    out_channels: int,
    kernel: int,
    stride: int,
    groups: int,
    downsample: int,
    norm: str,
    device=None,
    dtype=None,
) -> nn.Sequential:
    """AvgPool(downsample) -> Conv k x k (groups, stride of the block) -> norm -> ReLU -> 1x1 conv
    -> norm, the last norm's scale zero so the branch adds nothing until it trains."""
    mid = lite_mid_channels(in_channels)
    branch = nn.Sequential(OrderedDict([
        ("pool", nn.AvgPool2d(downsample, downsample)),
        ("conv1", nn.Conv2d(in_channels, mid, kernel, stride, kernel // 2, groups=groups, bias=False,
                            device=device, dtype=dtype)),
        ("norm1", _norm_layer(norm, mid, device, dtype)),
        ("act", nn.ReLU()),
        ("conv2", nn.Conv2d(mid, out_channels, 1, bias=False, device=device, dtype=dtype)),
        ("final_norm", _norm_layer(norm, out_channels, device, dtype)),
    ]))  # fmt: skip
    if device is None or torch.device(device).type != "meta":
        for m in branch.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(branch.final_norm.weight)
    return branch


def _block_io(model: nn.Module, blocks: Sequence[str], input_shape: Sequence[int]):
    """{block: (input shape, output shape)} from a meta trace at ``(1, *input_shape)``."""
    graph = capture_graph(model, (1, *input_shape), block_names=list(blocks), name=type(model).__name__)
    io = {}
    for b in graph.blocks:
        first, last = graph.block_range(b)
        ins = {
            t.storage: t
            for n in graph.nodes[first : last + 1]
            if n.block == b
            for i, t in zip(n.inputs, n.in_tensors)
            if graph.nodes[i].block != b and t.storage not in graph.param_storages
        }
        if len(ins) != 1:
            raise BadOption(
                f"block {b!r} takes {len(ins)} activation inputs",
                "the lite residual wraps blocks with one input tensor",
            )
        io[b] = (next(iter(ins.values())).shape, graph.nodes[last].out.shape)
    return io


def _reference_io(model: nn.Module, blocks: Sequence[str], input_shape: Sequence[int], io: dict) -> dict:
    """:func:`_block_io` at the reference input the branch kernels are chosen at: C x 224 x 224
    (:data:`DEFAULT_SAMPLE_SHAPE`; TinyTL's rule, so that the branches of an ImageNet network are
    the same whatever resolution it is profiled at), or ``io`` itself, at the model's own input,
    when that is the reference or the model cannot run at it (a classifier sized for its input)."""
    reference = (input_shape[0], *DEFAULT_SAMPLE_SHAPE[1:])
    if tuple(input_shape) == reference:
        return io
    try:
        return _block_io(model, blocks, reference)
    except MemplanError:
        return io


def _norm_kind_of(block: nn.Module) -> str:
    """'group' if the block normalises with GroupNorm, else 'batch'."""
    return "group" if any(isinstance(m, nn.GroupNorm) for m in block.modules()) else "batch"


def add_lite_residual(  # two thirds docstring (TinyTL's branch rule)
    model: nn.Module,
    kernel: int = 5,
    groups: int = 2,
    downsample: int = 2,
    norm: str | None = None,
    blocks: Sequence[str] | None = None,
    input_shape: Sequence[int] = DEFAULT_SAMPLE_SHAPE,
) -> nn.Module:
    """Wrap the blocks named in ``blocks``, by default every block of ``memplan.graph.find_blocks``
    but the first, in a :class:`LiteResidual`, in place; returns the model.

    TinyTL leaves the first block, the one at the highest resolution, without a branch (its
    ``insert_lite_residual`` walks ``net.blocks[1:]``); Table 2 reproduces only that way
    (ProxylessNAS-Mobile FT-Full 390.8 MB; 402.2 with a branch in the first block too).

    Branch (TinyTL Sec. 3.2): ``AvgPool2d(downsample)`` -> ``Conv2d(C_in, mid, k, stride,
    groups)`` with ``mid`` = C_in rounded to a multiple of 8 and the block's stride -> norm ->
    ReLU -> ``Conv2d(mid, C_out, 1)`` -> norm (scale 0) -> bilinear resize to the block output.
    Channels, stride and pooling come from a meta trace at the per-sample ``input_shape`` (the
    model's own: the capture pipeline passes it); ``k`` is ``kernel`` shrunk by 2 until it fits
    the pooled input at 224 px (TinyTL's rule, fixed for the architecture, not re-chosen per
    profiling resolution; at the model's own input when it cannot run at 224 px). ``norm``:
    ``"batch"``, ``"group"`` (8 channels per group), or None for the kind the block itself uses.
    The pooling has no padding (TinyTL's ``AvgPool2d(2, 2)``); a block input smaller than the
    window is not pooled. A model that already
    has branches is returned unchanged (as TinyTL's ``insert_lite_residual`` does).
    """
    if kernel < 1 or kernel % 2 == 0:
        raise BadOption(f"lite_kernel must be a positive odd number, got {kernel}")
    if groups < 1 or downsample < 1:
        raise BadOption(f"lite_groups and lite_downsample must be positive, got {groups} and {downsample}")
    if norm not in (None, "batch", "group"):
        raise BadOption(f"unknown lite_norm {norm!r}", "use 'batch' or 'group'")
    if any(isinstance(m, LiteResidual) for m in model.modules()):
        return model
    names = list(blocks) if blocks is not None else find_blocks(model)[1:]
    if not names:
        raise BadOption(
            "no block to add a lite residual branch to (the first block gets none)",
            "name the blocks explicitly (module qualnames)",
        )
    io = _block_io(model, names, input_shape)
    ref = _reference_io(model, names, input_shape, io)
    for name in names:
        block = model.get_submodule(name)
        (_, c_in, *in_hw), (_, c_out, *out_hw) = io[name]
        if len(in_hw) != 2 or len(out_hw) != 2:
            raise BadOption(
                f"block {name!r} is not 2-D (input {io[name][0]})",
                "the lite residual branch is for (N, C, H, W) convolutional blocks",
            )
        mid = lite_mid_channels(c_in)
        if c_in % groups or mid % groups:
            raise BadOption(f"lite_groups={groups} does not divide the {c_in} input channels of block {name!r}")
        down = min(downsample, *in_hw)  # a map smaller than the pooling window is not pooled
        ref_hw = ref[name][0][2:]
        pooled = [s // min(downsample, *ref_hw) for s in ref_hw]  # the kernel rule: at the reference input
        stride = max(1, round(in_hw[0] / out_hw[0]))
        p = next(block.parameters(), None)
        branch = lite_branch(
            c_in,
            c_out,
            lite_kernel(kernel, pooled),
            stride,
            groups,
            down,
            norm or _norm_kind_of(block),
            p.device if p is not None else None,
            p.dtype if p is not None else None,
        )
        branch.train(block.training)
        replace_module(model, name, LiteResidual(block, branch))
    return model


def is_lite(node: Node) -> bool:
    """Whether a captured node runs inside a lite residual branch (tagged by :class:`LiteResidual`)."""
    return LITE_ATTR in node.tags
