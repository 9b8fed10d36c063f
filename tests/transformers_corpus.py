"""The transformer corpus: vision transformers and hybrids from Hugging Face ``transformers``
(a library nobody at memplan wrote), built from small configs: nothing is downloaded.

Each :class:`TEntry` builds a fresh, seeded, randomly initialised model for an input resolution
(configs that fix an image size get that resolution), wrapped so that ``forward(x)`` returns the
logits of ``pixel_values=x``. Attention runs with the library's default implementation (SDPA where
the model supports it, which is what a user gets). ``RESOLUTIONS`` are the two input sizes the
corpus checks; ``ONE_PER_GROUP`` is the default (fast) selection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

CLASSES = 10
BATCH = 2
SEED = 0
RESOLUTIONS = (32, 64)

try:
    import transformers as T

    MISSING = ""
except ImportError as exc:  # pragma: no cover - transformers is in the test extra
    T = None
    MISSING = f"{type(exc).__name__}: {exc}"


class Logits(nn.Module):
    """``forward(x)`` = the wrapped model's logits for ``pixel_values=x``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=x).logits


@dataclass(frozen=True)
class TEntry:
    name: str
    group: str  # "vit" (plain ViTs), "hier" (windowed / hierarchical), "hybrid" (conv + attention), "conv"
    make: Callable[[int], nn.Module]  # resolution -> the transformers model
    resolutions: tuple[int, int] = RESOLUTIONS  # the two input sizes checked

    def build(self, resolution: int) -> nn.Module:
        torch.manual_seed(SEED)
        return Logits(self.make(resolution)).eval()

    def shape(self, resolution: int) -> tuple[int, ...]:
        return (BATCH, 3, resolution, resolution)


def _vit_kw(r: int) -> dict:
    return dict(
        image_size=r,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=CLASSES,
    )


def _m(cls: str, cfg: str, **kw) -> Callable[[int], nn.Module]:
    def make(r: int) -> nn.Module:
        args = {k: (v(r) if callable(v) else v) for k, v in kw.items()}
        return getattr(T, cls)(getattr(T, cfg)(num_labels=CLASSES, **args))

    return make


def _vitlike(cls: str, cfg: str, **extra) -> Callable[[int], nn.Module]:
    def make(r: int) -> nn.Module:
        return getattr(T, cls)(getattr(T, cfg)(**{**_vit_kw(r), **extra}))

    return make


_SWIN = dict(image_size=lambda r: r, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)

ENTRIES: list[TEntry] = (
    []
    if T is None
    else [
        TEntry("vit", "vit", _vitlike("ViTForImageClassification", "ViTConfig")),
        TEntry(
            "vit-dropout",
            "vit",
            _vitlike(
                "ViTForImageClassification", "ViTConfig", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1
            ),
        ),
        TEntry("vit-eager", "vit", _vitlike("ViTForImageClassification", "ViTConfig", attn_implementation="eager")),
        TEntry("deit", "vit", _vitlike("DeiTForImageClassification", "DeiTConfig")),
        TEntry("deit-distilled", "vit", _vitlike("DeiTForImageClassificationWithTeacher", "DeiTConfig")),
        TEntry("vit-msn", "vit", _vitlike("ViTMSNForImageClassification", "ViTMSNConfig")),
        TEntry(
            "beit",
            "vit",
            _vitlike(
                "BeitForImageClassification",
                "BeitConfig",
                use_relative_position_bias=True,
                layer_scale_init_value=0.1,
                drop_path_rate=0.1,
            ),
        ),
        TEntry("data2vec-vision", "vit", _vitlike("Data2VecVisionForImageClassification", "Data2VecVisionConfig")),
        TEntry("dinov2", "vit", _vitlike("Dinov2ForImageClassification", "Dinov2Config", layerscale_value=0.1)),
        TEntry(
            "dinov2-registers",
            "vit",
            _vitlike("Dinov2WithRegistersForImageClassification", "Dinov2WithRegistersConfig", num_register_tokens=2),
        ),
        TEntry("ijepa", "vit", _vitlike("IJepaForImageClassification", "IJepaConfig")),
        TEntry("swin", "hier", _m("SwinForImageClassification", "SwinConfig", **_SWIN)),
        TEntry("swinv2", "hier", _m("Swinv2ForImageClassification", "Swinv2Config", **_SWIN)),
        TEntry("donut-swin", "hier", _m("DonutSwinForImageClassification", "DonutSwinConfig", **_SWIN)),
        TEntry(
            "pvt",
            "hier",
            _m(
                "PvtForImageClassification",
                "PvtConfig",
                image_size=lambda r: r,
                num_encoder_blocks=2,
                depths=[1, 1],
                sequence_reduction_ratios=[2, 1],
                hidden_sizes=[16, 32],
                patch_sizes=[4, 2],
                strides=[4, 2],
                num_attention_heads=[1, 2],
                mlp_ratios=[2, 2],
            ),
        ),
        TEntry(
            "pvt-v2",
            "hier",
            _m(
                "PvtV2ForImageClassification",
                "PvtV2Config",
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[16, 32],
                patch_sizes=[3, 3],
                strides=[2, 2],
                num_attention_heads=[1, 2],
                mlp_ratios=[2, 2],
            ),
        ),
        TEntry(
            "segformer",
            "hier",
            _m(
                "SegformerForImageClassification",
                "SegformerConfig",
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[2, 1],
                hidden_sizes=[16, 32],
                patch_sizes=[3, 3],
                strides=[2, 2],
                num_attention_heads=[1, 2],
                mlp_ratios=[2, 2],
            ),
        ),
        TEntry(
            "hiera",
            "hier",
            _m(
                "HieraForImageClassification",
                "HieraConfig",
                image_size=lambda r: [r, r],
                embed_dim=16,
                depths=[1, 1],
                num_heads=[1, 2],
                query_stride=[2, 2],
                masked_unit_size=[4, 4],
                patch_stride=[2, 2],
                patch_size=[3, 3],
                patch_padding=[1, 1],
                num_query_pool=1,
            ),
        ),
        TEntry(
            "focalnet",
            "hier",
            _m(
                "FocalNetForImageClassification",
                "FocalNetConfig",
                image_size=lambda r: r,
                patch_size=2,
                embed_dim=16,
                depths=[1, 1],
            ),
        ),
        TEntry(
            "mobilevit",
            "hybrid",
            _m(
                "MobileViTForImageClassification",
                "MobileViTConfig",
                image_size=lambda r: r,
                hidden_sizes=[16, 24, 32],
                neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
            ),
        ),
        TEntry(
            "mobilevitv2",
            "hybrid",
            _m("MobileViTV2ForImageClassification", "MobileViTV2Config", image_size=lambda r: r, width_multiplier=0.25),
            (64, 128),
        ),
        TEntry(
            "levit",
            "hybrid",
            _m(
                "LevitForImageClassification",
                "LevitConfig",
                image_size=lambda r: r,
                hidden_sizes=[16, 24, 32],
                num_attention_heads=[1, 2, 2],
                depths=[1, 1, 1],
                key_dim=[8, 8, 8],
            ),
        ),
        TEntry(
            "swiftformer",
            "hybrid",
            _m(
                "SwiftFormerForImageClassification",
                "SwiftFormerConfig",
                depths=[1, 1, 1, 1],
                embed_dims=[8, 16, 24, 32],
            ),
        ),
        TEntry(
            "poolformer",
            "hybrid",
            _m(
                "PoolFormerForImageClassification",
                "PoolFormerConfig",
                depths=[1, 1, 1, 1],
                hidden_sizes=[8, 16, 24, 32],
            ),
        ),
        TEntry(
            "convnext",
            "conv",
            _m(
                "ConvNextForImageClassification",
                "ConvNextConfig",
                hidden_sizes=[8, 16, 24, 32],
                depths=[1, 1, 1, 1],
                layer_scale_init_value=0.1,
                drop_path_rate=0.1,
            ),
        ),
        TEntry(
            "convnextv2",
            "conv",
            _m(
                "ConvNextV2ForImageClassification",
                "ConvNextV2Config",
                hidden_sizes=[8, 16, 24, 32],
                depths=[1, 1, 1, 1],
            ),
        ),
        TEntry(
            "efficientnet",
            "conv",
            _m(
                "EfficientNetForImageClassification",
                "EfficientNetConfig",
                image_size=lambda r: r,
                width_coefficient=0.25,
                depth_coefficient=0.25,
                hidden_dim=320,
            ),
        ),
        TEntry(
            "mobilenet-v1",
            "conv",
            _m("MobileNetV1ForImageClassification", "MobileNetV1Config", image_size=lambda r: r, depth_multiplier=0.25),
        ),
        TEntry(
            "mobilenet-v2",
            "conv",
            _m("MobileNetV2ForImageClassification", "MobileNetV2Config", image_size=lambda r: r, depth_multiplier=0.25),
        ),
        TEntry(
            "resnet",
            "conv",
            _m(
                "ResNetForImageClassification",
                "ResNetConfig",
                embedding_size=16,
                hidden_sizes=[16, 24, 32, 48],
                depths=[1, 1, 1, 1],
            ),
        ),
        TEntry(
            "regnet",
            "conv",
            _m(
                "RegNetForImageClassification",
                "RegNetConfig",
                embedding_size=16,
                hidden_sizes=[16, 24, 32, 48],
                depths=[1, 1, 1, 1],
                groups_width=8,
            ),
        ),
    ]
)

BY_NAME = {e.name: e for e in ENTRIES}
#: the default selection: one plain ViT (SDPA), one windowed (mask from a parameter), one hybrid
ONE_PER_GROUP = [BY_NAME[n] for n in ("deit", "swin", "mobilevit")] if ENTRIES else []
