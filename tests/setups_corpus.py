"""The setups corpus (issue 38): models prepared the way users cut training memory themselves,
with activation checkpointing (``torch.utils.checkpoint`` in its forms, and the library switches
that use it) and with their own freezing. Nothing is downloaded: random, seeded weights.

Each :class:`Setup` builds a fresh model, ready to train as its user prepared it, for the input
shape ``SHAPE`` (batch 4, 64 px, the issue's table). ``SETUPS`` lists them; a setup whose library
cannot be imported is in ``MISSING`` (name -> the import error), and the tests skip it and say so.
timm (pinned in ``requirements-corpus.txt``, installed with ``--no-deps``) is imported with
placeholders for torchvision (:func:`import_timm`).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

CLASSES = 10
SHAPE = (4, 3, 64, 64)
SEED = 0


def conv_bn(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout))


class Block(nn.Module):
    """A ResNet basic block; a 1x1 projection where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.a, self.b = conv_bn(cin, cout, stride), conv_bn(cout, cout)
        self.proj = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.proj is None else self.proj(x)
        return F.relu(self.b(F.relu(self.a(x))) + identity)


class ResCNN(nn.Module):
    """Stem, four residual blocks (16, 16, 32, 32 channels), pooling and a linear head. ``reentrant``:
    every block runs under ``torch.utils.checkpoint.checkpoint`` with ``use_reentrant`` set to it
    (None: no checkpointing)."""

    def __init__(self, reentrant: bool | None = None):
        super().__init__()
        self.reentrant = reentrant
        self.stem = nn.Sequential(*conv_bn(3, 16), nn.ReLU())
        self.blocks = nn.ModuleList([Block(16, 16), Block(16, 16), Block(16, 32, 2), Block(32, 32)])
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x) if self.reentrant is None else checkpoint(block, x, use_reentrant=self.reentrant)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class SequentialCNN(nn.Module):
    """A plain conv stack run by ``checkpoint_sequential`` in ``segments`` segments (non-reentrant)."""

    def __init__(self, segments: int = 4):
        super().__init__()
        self.segments = segments
        layers: list[nn.Module] = []
        for cin, cout, stride in ((3, 16, 1), (16, 16, 1), (16, 32, 2), (32, 32, 1)):
            layers += [*conv_bn(cin, cout, stride), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = checkpoint_sequential(self.features, self.segments, x, use_reentrant=False)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class SmallCNN(nn.Module):
    """Convs of stride 1 and 2, a BatchNorm, a depthwise conv and a linear classifier: LoRA's CNN
    (``tests/test_lora.py``, ``benchmarks/device_setups.py``)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.c1(x)))
        x = F.relu(self.dw(F.relu(self.c2(x))))
        return self.fc(x.mean((2, 3)))


class StemCheckpointed(ResCNN):
    """The ResCNN with its stem under a reentrant checkpoint too: the stem's only input is the image,
    which needs no gradient, so torch runs it under ``no_grad`` and its parameters get none."""

    def __init__(self):
        super().__init__(reentrant=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = checkpoint(self.stem, x, use_reentrant=True)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Nested(ResCNN):
    """Two checkpointed halves, each checkpointing its blocks again (non-reentrant inside non-reentrant)."""

    def __init__(self):
        super().__init__(reentrant=False)

    def half(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        for block in blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = checkpoint(self.half, x, self.blocks[:2], use_reentrant=False)
        x = checkpoint(self.half, x, self.blocks[2:], use_reentrant=False)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Selective(ResCNN):
    """Every block under selective activation checkpointing (a ``context_fn`` that keeps the
    convolutions' outputs): a variant memplan does not model, counted as not checkpointed."""

    def __init__(self):
        super().__init__(reentrant=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        def policy(ctx, op, *args, **kwargs):
            keep = op is torch.ops.aten.convolution.default
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        x = self.stem(x)
        for block in self.blocks:
            x = checkpoint(
                block, x, use_reentrant=False, context_fn=lambda: create_selective_checkpoint_contexts(policy)
            )
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def hand_frozen() -> nn.Module:
    """The plain ResCNN with its first half (stem and the first two blocks) frozen by hand:
    ``requires_grad_(False)`` and eval mode (running statistics), the rest training."""
    model = ResCNN()
    for part in (model.stem, model.blocks[0], model.blocks[1]):
        part.requires_grad_(False)
        part.eval()
    return model


class Logits(nn.Module):
    """``forward(x)`` = the logits of a Hugging Face model for ``pixel_values=x``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


def hf_vit(dropout: float = 0.0) -> nn.Module:
    """A small Hugging Face ViT (64 px, patch 8, 4 layers of width 64) with
    ``gradient_checkpointing_enable()``, in train mode."""
    import transformers as T

    config = T.ViTConfig(
        image_size=64,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=CLASSES,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    model = T.ViTForImageClassification(config)
    model.gradient_checkpointing_enable()
    return Logits(model).train()


def hf_vit_reentrant() -> nn.Module:
    """The checkpointed ViT with ``gradient_checkpointing_kwargs={"use_reentrant": True}``."""
    model = hf_vit()
    model.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    return model


def hf_vit_eval() -> nn.Module:
    """The checkpointed ViT with dropout 0.1, left in eval mode (as ``from_pretrained`` returns it)
    with its embeddings frozen: no dropout runs, and Hugging Face checkpoints only in train mode."""
    model = hf_vit(dropout=0.1).eval()
    model.model.vit.embeddings.requires_grad_(False)
    return model


class _Anything(type):
    """A placeholder class whose every attribute is another placeholder (``InterpolationMode.NEAREST``)."""

    def __getattr__(cls, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})


class _StubModule(types.ModuleType):
    """A placeholder module: every attribute a placeholder class (``Frozen*``: an ``nn.Module``)."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (nn.Module,), {}) if name.startswith("Frozen") else _Anything(name, (), {})
        setattr(self, name, cls)
        return cls


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every ``torchvision`` module as a :class:`_StubModule`."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__, module.__doc__ = [], "memplan test stub: timm imports it, resnet18 never uses it"
        return module

    def exec_module(self, module) -> None:
        return None


def import_timm():
    """``timm``, imported with placeholders for torchvision where the real one cannot be imported:
    timm imports torchvision at import time (``FrozenBatchNorm2d``, data transforms), and torchvision
    has no CPU build for this torch (as in ``tests/corpus.py``); resnet18 uses none of it. The
    placeholders leave ``sys.modules`` afterwards (``transformers`` must not find them)."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # absent, or the broken CPU wheel
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        finder = _StubFinder()
        sys.meta_path.insert(0, finder)
        try:
            return importlib.import_module("timm")
        finally:
            sys.meta_path.remove(finder)
            for name in [n for n, m in sys.modules.items() if isinstance(m, _StubModule)]:
                del sys.modules[name]
    return importlib.import_module("timm")


def timm_resnet18() -> nn.Module:
    """timm's resnet18 (10 classes) with ``set_grad_checkpointing()``."""
    timm = import_timm()
    model = timm.create_model("resnet18", pretrained=False, num_classes=CLASSES)
    model.set_grad_checkpointing()
    return model


@dataclass(frozen=True)
class Setup:
    name: str
    builder: Callable[[], nn.Module]
    method: str = "full"  # the strategy it is profiled with ("as-is": as prepared)
    needs: str = ""  # the library it needs (timm: ``pip install --no-deps -r requirements-corpus.txt``)

    def build(self) -> nn.Module:
        torch.manual_seed(SEED)
        return self.builder()


SETUPS = [
    Setup("rescnn-checkpoint", lambda: ResCNN(reentrant=False)),
    Setup("rescnn-checkpoint-reentrant", lambda: ResCNN(reentrant=True)),
    Setup("sequential-4-segments", SequentialCNN),
    Setup("hf-vit-gradient-checkpointing", hf_vit, needs="transformers"),
    Setup("hf-vit-gradient-checkpointing-reentrant", hf_vit_reentrant, needs="transformers"),
    Setup("timm-resnet18-grad-checkpointing", timm_resnet18, needs="timm"),
    Setup("hand-frozen-first-half", hand_frozen, method="as-is"),
    Setup("hf-vit-eval-as-is", hf_vit_eval, method="as-is", needs="transformers"),
    Setup("rescnn-checkpoint-as-is", lambda: ResCNN(reentrant=False), method="as-is"),
]


def _missing() -> dict[str, str]:
    out = {}
    for s in SETUPS:
        if not s.needs:
            continue
        try:
            import_timm() if s.needs == "timm" else importlib.import_module(s.needs)
        except Exception as exc:  # absent, or failing at import: timm without torchvision
            out[s.name] = f"{s.needs}: {type(exc).__name__}: {exc}".splitlines()[0]
    return out


MISSING = _missing()
