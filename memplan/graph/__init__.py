"""Graph capture: torch.fx trace with conv / linear / norm / activation / pooling leaves, and
shape propagation on the meta device.

* :mod:`.model`: the data (:class:`TensorInfo`, :class:`Param`, :class:`Node`, :class:`LayerGraph`);
* :mod:`.kinds`: canonical op kinds; :mod:`.trace`: the tracer; :mod:`.layout`: meta-device
  memory layouts; :mod:`.capture`: trace + shape propagation; :mod:`.blocks`: block discovery;
* :mod:`.conv`: conv-layer conventions (conv index, bias carrier, padding, sub-channel count).
"""

from .blocks import find_blocks
from .capture import capture
from .conv import SELECT_RULES, ConvLayer, bias_carrier, conv_layers, conv_padding, conv_table, is_pw1, sub_channels
from .kinds import module_kind, node_kind
from .model import LayerGraph, Node, Param, TensorInfo
from .trace import LeafTracer, trace

__all__ = ["capture", "trace", "LeafTracer", "LayerGraph", "Node", "TensorInfo", "Param", "find_blocks",
           "module_kind", "node_kind", "ConvLayer", "SELECT_RULES", "bias_carrier", "conv_layers", "conv_padding",
           "conv_table", "is_pw1", "sub_channels"]
