"""Memory-lean drop-in modules: keep only what backward really needs.

Eager PyTorch saves more than backward needs (accounting.md §1): a Conv2d with a frozen
weight still saves its input and weight, ReLU saves a full float tensor, BatchNorm saves its
input even with a frozen scale. The modules below replace those ops with custom
``torch.autograd.Function``\\ s that keep the ideal minimum (accounting.md §2).

Rules every class here follows:

* every saved activation goes through ``ctx.save_for_backward`` so that
  ``torch.autograd.graph.saved_tensors_hooks`` sees it (memplan measures memory that way);
  parameters and buffers are reached through plain references held on ``ctx`` (they are
  resident anyway, not activations), and backward checks that they were not modified in
  place since forward;
* ``LeanX.from_module(m, ...)`` shares ``m``'s Parameter and buffer objects under the same
  attribute names, so optimisers and state_dicts keep working as far as possible.
  ``from_module`` of a frozen-weight op sets ``requires_grad=False`` on the shared weight
  and ``forward`` refuses to run if it was switched back on;
* forward outputs equal the plain module's; gradients equal PyTorch's (same boundary
  conventions), except ``SignHardswish`` whose backward is approximated on purpose.

What each op saves for backward, in bytes (``numel`` = elements of the activation):

=====================  ===============================================================
``FrozenConv``         0
``FrozenLinear``       0
``SubChannelConv``     B x n x spatial x itemsize (the n selected input channels only)
``ShiftOnlyNorm``      0
``MaskedReLU``         ceil(numel / 8)  (1-bit mask, uint8)
``MaskedHardtanh``     ceil(numel / 8)  (``MaskedReLU6`` too)
``MaskedLeakyReLU``    ceil(numel / 8)
``SignHardswish``      ceil(numel / 8)
``MaskedDropout``      ceil(numel / 8)  (the keep mask; PyTorch's CPU dropout keeps a float one)
``LeanAvgPool2d``      0  (PyTorch's avg-pool keeps its input, though backward needs only its shape)
=====================  ===============================================================

``state_dict`` of every class has the keys of the module it replaces (``SubChannelConv`` folds
``weight_sel`` into ``weight``), and ``restore`` (``memplan.unapply``) gives that module back.

Every class declares the op kind it is costed as (``memplan_kind``), so a model holding lean
modules traces to the same kinds as the plain one, whatever has been imported.
"""

from .activations import MaskedHardtanh, MaskedLeakyReLU, MaskedReLU, MaskedReLU6, SignHardswish
from .bits import packbits, unpackbits
from .conv import FrozenConv, FrozenLinear, SubChannelConv, select_channels, top_channels
from .norm import ShiftOnlyNorm
from .pool import LeanAvgPool2d, MaskedDropout
from .restore import remember, restore

#: every lean module class (``apply_plan`` refuses a model that already holds one)
LEAN_MODULES = (
    FrozenConv,
    SubChannelConv,
    FrozenLinear,
    ShiftOnlyNorm,
    MaskedReLU,
    MaskedHardtanh,
    MaskedReLU6,
    MaskedLeakyReLU,
    SignHardswish,
    MaskedDropout,
    LeanAvgPool2d,
)

__all__ = [
    "packbits",
    "unpackbits",
    "select_channels",
    "top_channels",
    "FrozenConv",
    "FrozenLinear",
    "SubChannelConv",
    "ShiftOnlyNorm",
    "MaskedReLU",
    "MaskedHardtanh",
    "MaskedReLU6",
    "MaskedLeakyReLU",
    "SignHardswish",
    "MaskedDropout",
    "LeanAvgPool2d",
    "LEAN_MODULES",
    "remember",
    "restore",
]
