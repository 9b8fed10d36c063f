"""Graph capture: a model at one input shape as a :class:`LayerGraph` (ops in forward order, their
tensors and storages), from a torch.fx trace or, where tracing fails, one recorded eager run,
with shapes propagated on the meta device.

* :mod:`.model`: the data (:class:`TensorInfo`, :class:`Param`, :class:`Node`, :class:`LayerGraph`);
* :mod:`.kinds`: canonical op kinds and which modules are known exactly; :mod:`.trace`: the
  symbolic tracer; :mod:`.leafcalls`: custom autograd Functions and script functions as single
  calls; :mod:`.checkpoint`: activation checkpointing calls as segments of the graph;
  :mod:`.record`: capture by an eager run on meta; :mod:`.layout`: meta-device memory
  layouts; :mod:`.capture`: capture + shape propagation (:mod:`.build`: the LayerGraph of it);
  :mod:`.blocks`: block discovery;
* :mod:`.conv`: conv-layer conventions (conv index, bias carrier, padding, sub-channel count).

``capture_graph`` (:mod:`.capture`) and ``trace`` (:mod:`.trace`) are not re-exported here: the
one public way to capture is ``memplan.capture`` (``memplan.api``), whose last step is
``capture_graph``; only the engine layers inside that pipeline import them, from their modules.
"""

from .blocks import find_blocks
from .build import select_output
from .capture import train_mode
from .conv import (
    COMPUTED_SELECT_RULES,
    EXPLICIT_SELECT,
    SELECT_RULES,
    ConvLayer,
    bias_carrier,
    channel_index_problem,
    conv_layers,
    conv_padding,
    conv_table,
    is_pw1,
    sub_channels,
)
from .kinds import module_kind, node_kind
from .layout import flatten
from .model import CheckpointSegment, LayerGraph, Node, Param, TensorInfo, role
from .trace import LeafTracer

__all__ = [
    "flatten",
    "select_output",
    "train_mode",
    "role",
    "LeafTracer",
    "LayerGraph",
    "CheckpointSegment",
    "Node",
    "TensorInfo",
    "Param",
    "find_blocks",
    "module_kind",
    "node_kind",
    "ConvLayer",
    "SELECT_RULES",
    "COMPUTED_SELECT_RULES",
    "EXPLICIT_SELECT",
    "channel_index_problem",
    "bias_carrier",
    "conv_layers",
    "conv_padding",
    "conv_table",
    "is_pw1",
    "sub_channels",
]
