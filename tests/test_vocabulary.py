"""The transformer / hybrid vocabulary (issue 22 item 1), one tiny hand-written module per construct,
x full / bias / norm / last, batch 2, each against the independent measurement
(``tests/corpus.check_pair``, the CNN corpus's checks): ``pytorch``-mode saved bytes ==
saved_tensors_hooks on a real CPU step, forward / backward FLOPs == FlopCounterMode, ``--check``
observes the same bytes and agrees, and after ``apply_strategy`` eval outputs bit-identical to plain
PyTorch's, loss identical, gradients close, ``applied`` prediction == measurement.

Every model starts with a patch embedding (conv, stride = kernel) whose tokens the construct
works on, and ends with a LayerNorm and a linear head, so that each strategy trains something and
the construct's input needs a gradient under ``full``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from . import corpus

C, P = 16, 4  # channels, patch size
SHAPE = (2, 3, 16, 16)  # 16 tokens of 16 channels


def drop_path(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """timm's / transformers' stochastic depth: per-sample keep mask from ``rand`` + ``floor_``."""
    if p == 0.0 or not training:
        return x
    keep = 1 - p
    mask = keep + torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device)
    mask.floor_()
    return x.div(keep) * mask


class Tokens(nn.Module):
    """Patch embedding -> (B, N, C) tokens -> ``body`` -> LayerNorm -> mean over tokens -> head."""

    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, C, P, P)
        self.norm = nn.LayerNorm(C)
        self.head = nn.Linear(C, corpus.CLASSES)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.patch(x).flatten(2).transpose(1, 2)

    def body(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.body(self.embed(x))).mean(1))


class Mlp(Tokens):
    """Linear -> activation -> Linear, residual."""

    def __init__(self, act: nn.Module):
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(C, 2 * C), act, nn.Linear(2 * C, C)

    def body(self, t):
        return t + self.fc2(self.act(self.fc1(t)))


class ClassTokens(Tokens):
    """Class and distillation tokens cat in front, position embedding added, head on the class token."""

    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, C))
        self.dist = nn.Parameter(torch.randn(1, 1, C))
        self.pos = nn.Parameter(torch.randn(1, 18, C) * 0.1)
        self.fc = nn.Linear(C, C)

    def forward(self, x):
        t = self.embed(x)
        b = t.shape[0]
        t = torch.cat([self.cls.expand(b, -1, -1), self.dist.expand(b, -1, -1), t], dim=1) + self.pos
        t = self.norm(self.fc(t))
        return self.head((t[:, 0] + t[:, 1]) / 2)


class LayerScale(Tokens):
    """x + gamma * f(norm(x)) with gamma a (C,) parameter (CaiT / DINOv2 / ConvNeXt layer scale)."""

    def __init__(self):
        super().__init__()
        self.pre = nn.LayerNorm(C)
        self.fc = nn.Linear(C, C)
        self.gamma = nn.Parameter(torch.full((C,), 0.1))

    def body(self, t):
        return t + self.gamma * self.fc(self.pre(t))


class DropPath(Tokens):
    """Stochastic depth on a residual branch. Rate 0.25: the training branch in the training step
    (``rand``, ``floor_``, ``div``, ``mul``), the eval branch (identity) in the eval checks; rate 0:
    the identity branch in the training step too."""

    def __init__(self, p: float):
        super().__init__()
        self.fc = nn.Linear(C, C)
        self.p = p

    def body(self, t):
        return t + drop_path(self.fc(t), self.p, self.training)


class LastDimsNorm(Tokens):
    """LayerNorm over the last two dims (tokens x channels)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm((16, C))

    def body(self, t):
        return self.ln2(self.fc(t))


class ChunkSplitCat(Tokens):
    """qkv-style chunk, split into unequal parts, cat back, unbind."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)

    def body(self, t):
        q, k, v = self.qkv(t).chunk(3, dim=-1)
        a, b = (q * k).split([4, C - 4], dim=-1)
        x = torch.cat([b, torch.sigmoid(a)], dim=-1) + v
        first, *rest = x.unbind(1)
        return self.proj(torch.stack([first, *rest], 1))


class ViewChains(Tokens):
    """reshape / permute / transpose / flatten / view chains between linears (heads split and merged,
    a linear on a non-contiguous permuted input)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(C, C)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(C, C)

    def body(self, t):
        b, n, c = t.shape
        h = self.fc1(t).view(b, n, 4, c // 4).permute(0, 2, 1, 3)  # (b, heads, n, d)
        h = self.fc2(h.transpose(-1, -2)).transpose(-1, -2)  # token mixing on a transposed (strided) input
        h = h.permute(0, 2, 1, 3).reshape(b, n, c)
        return self.fc3(h.flatten(0, 1).view(b, n, c))


class MobileViTUnfold(Tokens):
    """MobileViT (v1) unfolding by reshapes / transposes into (B * patch area, patches, C), a linear,
    and folding back; then the feature map's conv."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(C, C)
        self.conv = nn.Conv2d(C, C, 1)

    def forward(self, x):
        f = self.patch(x)  # (B, C, 4, 4), 2x2 patches of 2x2
        b, c, h, w = f.shape
        p = f.reshape(b * c * 2, 2, 2, 2).transpose(1, 2).reshape(b, c, 4, 4).transpose(1, 3).reshape(b * 4, 4, c)
        p = self.fc(p)
        f = p.contiguous().view(b, 4, 4, c).transpose(1, 3).reshape(b * c * 2, 2, 2, 2).transpose(1, 2)
        f = self.conv(f.reshape(b, c, h, w))
        return self.head(self.norm(f.flatten(2).transpose(1, 2)).mean(1))


class MobileViTv2Fold(Tokens):
    """MobileViT-v2: ``F.unfold`` into (B, C, patch area, patches), a 1x1 conv over it, ``F.fold`` back."""

    def __init__(self):
        super().__init__()
        self.conv_in = nn.Conv2d(C, C, 1)
        self.mix = nn.Conv2d(C, C, 1)
        self.gn = nn.GroupNorm(1, C)

    def forward(self, x):
        f = self.conv_in(self.patch(x))
        b, c, h, w = f.shape
        u = F.unfold(f, kernel_size=2, stride=2).reshape(b, c, 4, -1)
        u = self.mix(self.gn(u))
        f = F.fold(u.reshape(b, c * 4, -1), output_size=(h, w), kernel_size=2, stride=2)
        return self.head(self.norm(f.flatten(2).transpose(1, 2)).mean(1))


class TensorUnfold(Tokens):
    """Non-overlapping windows by ``Tensor.unfold`` (a strided view), a linear over each window's pixels."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        f = self.patch(x)  # (B, C, 4, 4)
        b, c = f.shape[:2]
        w = f.unfold(2, 2, 2).unfold(3, 2, 2)  # (B, C, 2, 2, 2, 2)
        w = self.fc(w.reshape(b, c, 4, 4))  # windows x pixels
        return self.head(self.norm(w.permute(0, 2, 3, 1).reshape(b, 16, c)).mean(1))


CASES = {
    "patch-embed+cls-dist-tokens+pos-add": ClassTokens,
    "gelu-exact": lambda: Mlp(nn.GELU()),
    "gelu-tanh": lambda: Mlp(nn.GELU(approximate="tanh")),
    "silu": lambda: Mlp(nn.SiLU()),
    "hardswish": lambda: Mlp(nn.Hardswish()),
    "layer-scale": LayerScale,
    "drop-path-train": lambda: DropPath(0.25),
    "drop-path-eval": lambda: DropPath(0.0),
    "layernorm-last-dims": LastDimsNorm,
    "chunk-split-cat": ChunkSplitCat,
    "view-chains": ViewChains,
    "mobilevit-unfold": MobileViTUnfold,
    "mobilevitv2-unfold-fold": MobileViTv2Fold,
    "tensor-unfold": TensorUnfold,
}
STRATEGIES = ("full", "bias", "norm", "last")
#: ops allowed to be costed by observation (random draws: no cost rule, nothing saved)
OBSERVED_OK = {"rand", "Tensor.floor_"}


@pytest.mark.parametrize("method", STRATEGIES)
@pytest.mark.parametrize("case", CASES)
def test_construct_to_the_byte(case, method):
    torch.manual_seed(0)
    model = CASES[case]().eval()
    graph = corpus.capture_entry(model, SHAPE)
    r = corpus.check_pair(model, graph, SHAPE, method, case, raise_errors=True)
    where = f"{case}/{method}"
    assert r.measured_bytes > 0 or method == "last", where
    assert r.predicted_bytes == r.measured_bytes, f"{where}: predicted {r.predicted_bytes}, measured {r.measured_bytes}"
    assert not r.unknown_ops and set(r.observed_ops) <= OBSERVED_OK, (where, r.unknown_ops, r.observed_ops)
    assert r.flops_exact, (
        where,
        r.predicted_fwd_flops,
        r.measured_fwd_flops,
        r.predicted_bwd_flops,
        r.measured_bwd_flops,
    )
    assert not r.check_differing and r.check_observed == r.measured_bytes, (where, r.check_differing)
    assert r.eval_identical and r.loss_identical and r.grads_close, (where, r.eval_max_diff, r.grad_mismatch)
    assert r.applied_predicted == r.applied_measured, (where, r.applied_predicted, r.applied_measured)
