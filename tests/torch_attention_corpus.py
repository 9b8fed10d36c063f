"""The torch.nn attention corpus: models built from ``nn.MultiheadAttention`` and the
``nn.Transformer`` layers, beside the Hugging Face corpus (tests/transformers_corpus.py).

Each :class:`AEntry` builds a fresh, seeded, randomly initialised model whose ``forward(x)`` takes
an image batch (batch 2, 3 x 32 x 32) and returns logits: 8 x 8 patches (16 tokens) embedded by a
linear layer or a conv stem, the attention module under test, mean pooling and a linear head. The
variants cover what changes what autograd saves: the kernel (``need_weights=False`` runs the fused
SDPA kernel, ``need_weights=True`` the math path), batch_first on / off, masks (bool / float
``attn_mask``, ``key_padding_mask``, causal), ``add_bias_kv`` / ``add_zero_attn``, kdim / vdim,
cross-attention, dropout, post- / pre-norm, relu / gelu, and the encoder / decoder / full
transformer stacks. ``FAST`` is the default (fast) selection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

CLASSES = 10
SHAPE = (2, 3, 32, 32)
DIM, HEADS, FF = 16, 2, 32
TOKENS = 16  # 32 px in 8 x 8 patches


class Patches(nn.Module):
    """(B, 3, 32, 32) -> (B, 16, DIM): 8 x 8 patches, flattened and embedded by a linear layer."""

    def __init__(self, dim: int = DIM):
        super().__init__()
        self.embed = nn.Linear(3 * 64, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        return self.embed(x.reshape(b, 3, 4, 8, 4, 8).permute(0, 2, 4, 1, 3, 5).reshape(b, TOKENS, 3 * 64))


class ConvStem(nn.Module):
    """(B, 3, 32, 32) -> (B, 16, DIM): a stride-2 conv-BN-ReLU, then a 4 x 4 stride-4 conv (4 x 4 tokens)."""

    def __init__(self, dim: int = DIM):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, dim, 4, 4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).flatten(2).transpose(1, 2)


def causal(n: int, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """A causal mask: True (or -inf) above the diagonal."""
    upper = torch.ones(n, n, dtype=torch.bool).triu(1)
    return upper if dtype == torch.bool else torch.zeros(n, n).masked_fill(upper, float("-inf"))


def padding(b: int, n: int) -> torch.Tensor:
    """A key padding mask hiding the last 3 tokens of the second sample."""
    mask = torch.zeros(b, n, dtype=torch.bool)
    mask[1, -3:] = True
    return mask


class MHA(nn.Module):
    """Tokens -> nn.MultiheadAttention -> mean -> head. ``cross``: keys / values from a second
    projection of the tokens (of width ``kdim`` / ``vdim`` where given); ``mask``: None, ``bool``,
    ``float``, ``padding`` (key_padding_mask) or ``both``."""

    def __init__(
        self,
        *,
        batch_first: bool = True,
        need_weights: bool = False,
        average: bool = True,
        mask: str | None = None,
        cross: bool = False,
        stem: type[nn.Module] = Patches,
        **mha: object,
    ):
        super().__init__()
        self.batch_first, self.need_weights, self.average, self.mask, self.cross = (
            batch_first,
            need_weights,
            average,
            mask,
            cross,
        )
        self.stem = stem()
        kdim, vdim = mha.get("kdim") or DIM, mha.get("vdim") or DIM
        if cross:
            self.to_k, self.to_v = nn.Linear(DIM, kdim), nn.Linear(DIM, vdim)
        self.attn = nn.MultiheadAttention(DIM, HEADS, batch_first=batch_first, **mha)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.stem(x)
        q = k = v = t
        if self.cross:
            k, v = self.to_k(t), self.to_v(t)
        if not self.batch_first:
            q, k, v = (a.transpose(0, 1) for a in (q, k, v))
        kw: dict = {}
        if self.mask in ("bool", "both"):
            kw["attn_mask"] = causal(TOKENS)
        if self.mask == "float":
            kw["attn_mask"] = causal(TOKENS, torch.float32)
        if self.mask in ("padding", "both"):
            kw["key_padding_mask"] = padding(x.shape[0], TOKENS)
        out, _ = self.attn(q, k, v, need_weights=self.need_weights, average_attn_weights=self.average, **kw)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return self.head(out.mean(1))


class Encoder(nn.Module):
    """Tokens -> nn.TransformerEncoder of ``layers`` nn.TransformerEncoderLayer -> mean -> head."""

    def __init__(self, layers: int = 2, masks: bool = False, final_norm: bool = False, **layer: object):
        super().__init__()
        self.masks = masks
        self.stem = Patches()
        block = nn.TransformerEncoderLayer(DIM, HEADS, FF, batch_first=True, **layer)
        norm = nn.LayerNorm(DIM) if final_norm else None
        # nested tensors (the sparsity fast path, eval / no-grad only) where torch allows them: with masks
        self.encoder = nn.TransformerEncoder(block, layers, norm=norm, enable_nested_tensor=masks)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.stem(x)
        if self.masks:
            t = self.encoder(t, mask=causal(TOKENS), src_key_padding_mask=padding(x.shape[0], TOKENS))
        else:
            t = self.encoder(t)
        return self.head(t.mean(1))


class Decoder(nn.Module):
    """Tokens (target) and a conv stem's tokens (memory) -> nn.TransformerDecoderLayer -> head."""

    def __init__(self, **layer: object):
        super().__init__()
        self.stem, self.memory = Patches(), ConvStem()
        self.decoder = nn.TransformerDecoderLayer(DIM, HEADS, FF, batch_first=True, **layer)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.decoder(self.stem(x), self.memory(x), tgt_mask=causal(TOKENS)).mean(1))


class Transformer(nn.Module):
    """Tokens -> nn.Transformer (1 encoder + 1 decoder layer, sequence first) -> head."""

    def __init__(self, **kw: object):
        super().__init__()
        self.stem = Patches()
        self.transformer = nn.Transformer(DIM, HEADS, 1, 1, FF, **kw)
        self.head = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.stem(x).transpose(0, 1)
        return self.head(self.transformer(t, t).mean(0))


@dataclass(frozen=True)
class AEntry:
    name: str
    make: Callable[[], nn.Module]

    def build(self) -> nn.Module:
        torch.manual_seed(0)
        return self.make()


def _e(name: str, cls: type[nn.Module], **kw: object) -> AEntry:
    return AEntry(name, lambda: cls(**kw))


ENTRIES: list[AEntry] = [
    _e("mha", MHA),
    _e("mha-seq-first", MHA, batch_first=False),
    _e("mha-weights", MHA, need_weights=True),
    _e("mha-weights-per-head", MHA, need_weights=True, average=False, batch_first=False),
    _e("mha-bool-mask", MHA, mask="bool"),
    _e("mha-float-mask", MHA, mask="float"),
    _e("mha-padding-mask", MHA, mask="padding"),
    _e("mha-both-masks-weights", MHA, mask="both", need_weights=True),
    _e("mha-bias-kv", MHA, add_bias_kv=True, add_zero_attn=True),
    _e("mha-no-bias", MHA, bias=False),
    _e("mha-cross", MHA, cross=True),
    _e("mha-kdim-vdim", MHA, cross=True, kdim=8, vdim=12),
    _e("mha-dropout", MHA, dropout=0.1),
    _e("mha-dropout-weights", MHA, dropout=0.1, need_weights=True),
    _e("hybrid", MHA, stem=ConvStem),
    _e("encoder", Encoder),
    _e("encoder-prenorm-gelu", Encoder, norm_first=True, activation="gelu", final_norm=True),
    _e("encoder-gelu-module", Encoder, activation=nn.GELU(), dropout=0.0),
    _e("encoder-masks", Encoder, masks=True),
    _e("decoder", Decoder),
    _e("decoder-prenorm", Decoder, norm_first=True, activation="gelu"),
    _e("transformer", Transformer),
]
BY_NAME = {e.name: e for e in ENTRIES}
#: the default selection (about half of the corpus, a few seconds): the fused kernel, sequence-first,
#: the math path with both masks, add_bias_kv, kdim / vdim, a hybrid, encoder stacks (pre-norm gelu,
#: masks with nested tensors enabled), a decoder and nn.Transformer
FAST = [
    BY_NAME[n]
    for n in (
        "mha",
        "mha-seq-first",
        "mha-both-masks-weights",
        "mha-bias-kv",
        "mha-kdim-vdim",
        "hybrid",
        "encoder-prenorm-gelu",
        "encoder-masks",
        "decoder",
        "transformer",
    )
]
