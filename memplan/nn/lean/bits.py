"""Bit packing of 0/1 masks: ``ceil(numel / 8)`` bytes, least significant bit first."""

from __future__ import annotations

import torch
from torch import Tensor


def packbits(mask: Tensor) -> Tensor:
    """Pack a bool tensor into a flat uint8 tensor of ``ceil(numel / 8)`` bytes.

    Bit ``i`` of the flattened mask goes to byte ``i // 8``, bit position ``i % 8``
    (least significant bit first, numpy's ``bitorder='little'``); padding bits are 0.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"packbits expects a bool tensor, got {mask.dtype}")
    flat = mask.reshape(-1)
    pad = (-flat.numel()) % 8
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    bits = flat.view(torch.uint8).view(-1, 8)
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device)
    # distinct bits never carry, so the sum is the bitwise OR
    return (bits << shifts).sum(dim=1, dtype=torch.uint8)


def unpackbits(packed: Tensor, numel: int) -> Tensor:
    """Inverse of :func:`packbits`: a flat bool tensor of ``numel`` elements."""
    if packed.dtype != torch.uint8 or packed.dim() != 1:
        raise TypeError("unpackbits expects a 1-D uint8 tensor")
    if packed.numel() != (numel + 7) // 8:
        raise ValueError(f"{packed.numel()} bytes cannot hold exactly {numel} bits")
    shifts = torch.arange(8, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(1) >> shifts) & 1
    return bits.reshape(-1)[:numel].bool()
