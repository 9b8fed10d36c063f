"""The traced-model data: tensors, parameters, nodes and the :class:`LayerGraph`.

A :class:`LayerGraph` holds the nodes of one model at one input shape in forward
(topological) order, each with its op kind, its tensor inputs, its output shape / dtype and
the id of the *storage* its output lives in (``LayerGraph.storages`` gives bytes per id).
Sizes are in bytes, shapes and strides in elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.nn as nn

from ..errors import MemplanError

#: module attribute naming what a module is for (e.g. ``"lite_residual"``, set by the transform
#: that inserts TinyTL's branches); capture records it on every node run inside the module. Only
#: architecture transforms set it, on the modules they add: a tagged node is not the backbone's
TAG_ATTR = "memplan_tag"
#: attribute of a wrapper an architecture transform put in place of a module of the model: the name
#: of its child that holds the wrapped module (TinyTL's ``LiteResidual``: ``"main"``); capture records
#: the wrappers (``LayerGraph.wrappers``), so names map back to the model before the transform
WRAP_ATTR = "memplan_wraps"


@dataclass(frozen=True)
class TensorInfo:
    """Shape, dtype, storage and strides (in elements; empty = contiguous) of one tensor
    (storage ids index ``LayerGraph.storages``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    storage: int
    strides: tuple[int, ...] = ()

    @property
    def contiguous(self) -> bool:
        last_unit = all(st == 1 for s, st in zip(self.shape[-1:], self.strides[-1:]) if s != 1)
        return last_unit and self.mergeable(len(self.shape))

    def mergeable(self, dims: int) -> bool:
        """Whether the first ``dims`` dims can be viewed as one (``reshape`` without a copy);
        size-1 dims do not matter, as in torch's view rule."""
        kept = [(s, st) for s, st in zip(self.shape[:dims], self.strides[:dims]) if s != 1]
        return all(st0 == st1 * s1 for (_, st0), (s1, st1) in zip(kept, kept[1:]))

    @property
    def layout(self) -> tuple[int, ...]:
        """The strides, row-major ones for a contiguous tensor (``strides`` empty)."""
        if self.strides:
            return self.strides
        out, n = [], 1
        for s in reversed(self.shape):
            out.append(n)
            n *= s
        return tuple(reversed(out))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class Param:
    """One parameter tensor owned by a node (counted once, at its first use)."""

    name: str  # qualified name in the model's state_dict
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def role(pname: str) -> str:
    """A parameter's role for the strategies: ``bias`` (a shift) or ``weight`` (everything else)."""
    return "bias" if pname.rsplit(".", 1)[-1].endswith("bias") else "weight"


@dataclass(eq=False)
class Node:
    """One traced op. ``inputs[i]`` is the index of the node producing ``in_tensors[i]``."""

    index: int
    name: str  # module qualname for modules, fx node name otherwise
    op: str  # fx op: placeholder | call_module | call_function | call_method | get_attr | output
    kind: str  # canonical kind from memplan.graph.kinds, or "unknown"
    target: str  # module class or function name (what the unknown-op report shows)
    inputs: list[int]
    in_tensors: list[TensorInfo]
    outs: tuple[TensorInfo, ...]
    module: nn.Module | None = None
    params: dict[str, Param] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    scope: str = ""  # qualname of the innermost module whose forward created this node
    scopes: tuple[str, ...] = ()  # qualnames of every module call this node runs inside, outermost first
    tags: frozenset[str] = frozenset()  # TAG_ATTR of the modules it runs inside (and of their parents)
    segments: tuple[int, ...] = ()  # ids of the checkpoint segments it runs in, outermost first (``checkpoints``)
    block: str | None = None
    layer: str = ""  # the layer whose parameters this op uses (plans are keyed by it); "" for none
    uses: dict[str, str] = field(default_factory=dict)  # every parameter the op reads: local name -> qualname
    fx: fx.Node | None = field(default=None, repr=False)  # the captured call (replayed by memplan.costs.observe)
    fx_inputs: tuple = field(default=(), repr=False)  # the fx node of each of ``in_tensors``
    fx_consts: dict = field(default_factory=dict, repr=False)  # values of the call's non-tensor fx arguments

    @property
    def out(self) -> TensorInfo | None:
        return self.outs[0] if self.outs else None

    def __repr__(self) -> str:
        shape = self.out.shape if self.out else None
        return f"Node({self.index}, {self.name!r}, {self.kind}, out={shape})"


@dataclass(frozen=True)
class CheckpointSegment:
    """One activation-checkpointing call of the model (``memplan.graph.checkpoint``): ``kind``
    ``reentrant`` or ``non-reentrant``; ``inputs``: the indices of the nodes producing the tensors
    passed to it (what its backward keeps); ``parent``: the id of the enclosing segment (None: top
    level); ``early_stop``: non-reentrant recomputation stops after the last saved tensor;
    ``exact``: False for a variant memplan counts as not checkpointed (``note`` says which);
    ``scope``: the module whose forward made the call."""

    id: int
    kind: str
    inputs: tuple[int, ...]
    parent: int | None = None
    early_stop: bool = True
    exact: bool = True
    note: str = ""
    scope: str = ""


@dataclass(eq=False)
class LayerGraph:
    """A traced model at one input shape: nodes in forward order plus the storage table."""

    nodes: list[Node]
    storages: list[int]  # nbytes per storage id
    param_storages: frozenset[int]  # storages of parameters / buffers (never activations)
    blocks: list[str]  # block module qualnames in forward order
    input_shape: tuple[int, ...]  # with batch
    batch: int
    model_name: str = ""
    buffer_bytes: int = 0  # running statistics and other buffers (part of the static memory)
    capture: str = "symbolic"  # "symbolic" (torch.fx) or "recorded" (one eager run on meta, graph.record)
    output: str = ""  # the entry of a tuple / dict / namedtuple output the loss takes ("" = the output itself)
    gm: fx.GraphModule | None = field(default=None, repr=False)  # the captured fx graph
    amp: torch.dtype | None = None  # the step's autocast dtype (memplan.graph.autocast), None for none
    observed: dict = field(default_factory=dict, repr=False)  # replay cache of memplan.costs.observe
    #: storages of constants (tensors the model reads from outside itself: a module-level cache, an
    #: fx ``_tensor_constant``): resident like buffers (in ``param_storages``), but what an op saves of
    #: one is counted as saved, as ``saved_tensors_hooks`` sees it whether or not the cache was filled
    #: before capture
    constant_storages: frozenset[int] = frozenset()
    #: qualname of every wrapper module (``WRAP_ATTR``) -> the child holding the module it wraps
    wrappers: dict[str, str] = field(default_factory=dict)
    checkpoints: list[CheckpointSegment] = field(default_factory=list)  # activation checkpointing, by id
    #: the model as its user prepared it, read before capture: ``requires_grad`` per parameter qualname and
    #: train mode per module qualname (what strategy ``as-is`` plans by)
    prepared_grad: dict[str, bool] = field(default_factory=dict)
    prepared_training: dict[str, bool] = field(default_factory=dict)

    def original_name(self, name: str) -> str:
        """``name`` (a module or parameter qualname) in the model before its architecture transforms
        wrapped modules (``WRAP_ATTR``): ``blocks.3.main.conv`` -> ``blocks.3.conv``. The innermost
        wrapper first, so nested wrappers map back too."""
        for wrapper in sorted(self.wrappers, key=len, reverse=True):
            inner = f"{wrapper}.{self.wrappers[wrapper]}" if wrapper else self.wrappers[wrapper]
            if name == inner or name.startswith(inner + "."):
                name = wrapper + name[len(inner) :] if wrapper else name[len(inner) + 1 :]
        return name

    def is_weight(self, storage: int | None) -> bool:
        """Whether a saved ``storage`` is no activation: a parameter's or a buffer's (not a constant's)."""
        return storage in self.param_storages and storage not in self.constant_storages

    def by_name(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def param_nodes(self) -> list[Node]:
        """Nodes that own parameters (listed at their first use), in forward order."""
        return [n for n in self.nodes if n.params]

    @property
    def classifier(self) -> Node:
        """The last linear layer in forward order (the last conv for fully convolutional nets)
        whose weight is a parameter: its own, or one it reads through views and slices (a
        once-for-all supernet's ``F.linear(x, self.weight[:out, :in])``)."""
        for kinds in (("linear",), ("conv",)):
            for n in reversed(self.nodes):
                if n.kind in kinds and (n.params or self.sources(n, "weight")):
                    return n
        raise MemplanError("model has no linear or conv layer to use as classifier")

    @property
    def classifier_layers(self) -> list[Node]:
        """What a plan trains to train the classifier (:meth:`param_layers`)."""
        return self.param_layers(self.classifier)

    def param_layers(self, node: Node) -> list[Node]:
        """What a plan trains to train ``node``'s weight and bias: ``node`` for those it owns,
        the ``param`` nodes it reads the others from (:meth:`sources`)."""
        own = [node] if node.params else []
        return own + [s for p in ("weight", "bias") if p not in node.uses for s in self.sources(node, p)]

    def sources(self, node: Node, operand: str) -> list[Node]:
        """The ``param`` node operand ``operand`` of a functional layer reads through views,
        slices and copies (``[]`` for a module's own parameters or a computed tensor)."""
        i = node.attrs.get("operands", {}).get(operand)
        if i is None:
            return []
        src = self.nodes[node.inputs[i]]
        while src.kind in ("view", "getitem", "identity") and len(src.inputs) == 1:
            src = self.nodes[src.inputs[0]]
        return [src] if src.kind == "param" else []

    @property
    def classes(self) -> int:
        """Classifier outputs: the last dim of the (batch, classes) logits the loss node reads."""
        return self.nodes[-2].in_tensors[0].shape[-1]

    def block_range(self, block: str) -> tuple[int, int]:
        """Index range [first, last] of the nodes inside ``block``."""
        idx = [n.index for n in self.nodes if n.block == block]
        if not idx:
            raise KeyError(block)
        return min(idx), max(idx)
