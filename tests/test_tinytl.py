"""TinyTL: GroupNorm swap, lite residual branches, tinytl-* strategies and the ``tinytl`` mode.

Memory figures are checked against TinyTL's published numbers (``memplan.reproduce.figures``, within
1%) and against the reproductions in shared/reference/accounting.md §3 (to 0.05 MB); the
mode's walk is also checked on a small model counted by hand below.
"""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import memplan
from memplan.api import capture, profile_captured
from memplan.apply import apply_plain
from memplan.errors import BadOption
from memplan.graph import find_blocks
from memplan.graph.capture import capture_graph
from memplan.models import zoo
from memplan.nn.transforms import LiteResidual, add_lite_residual, group_count, is_lite, lite_kernel, swap_norm
from memplan.reproduce.figures import by_key
from memplan.strategies import make_plan

from .helpers import predicted_and_measured

MB = 1e6
TT2 = "tinytl.table2.proxylessnas-mobile"


def meta_model(name: str, classes: int) -> nn.Module:
    with torch.device("meta"):
        return zoo.build(name, classes)


def tinytl_net(classes: int = 102) -> nn.Module:
    """TinyTL's Table 2 network: ProxylessNAS-Mobile, GroupNorm (8 ch/group), lite residual branches."""
    return add_lite_residual(swap_norm(meta_model("proxylessnas-mobile", classes), "group"))


def close(ours_bytes: float, key: str, reproduced_mb: float | None) -> None:
    """Within 1% of the published figure, and to 0.05 MB of accounting.md's reproduction."""
    published = by_key(key).in_base_units()
    assert abs(ours_bytes - published) <= 0.01 * published, (key, ours_bytes / MB, published / MB)
    if reproduced_mb is not None:
        assert abs(ours_bytes / MB - reproduced_mb) < 0.05, (key, ours_bytes / MB, reproduced_mb)


# --------------------------------------------------------------------------- swap_norm


def test_swap_norm_group_replaces_every_batchnorm_and_keeps_affine():
    torch.manual_seed(0)
    m = zoo.build("mobilenetv2", 10)
    bns = {q: mod for q, mod in m.named_modules() if isinstance(mod, nn.BatchNorm2d)}
    for bn in bns.values():
        nn.init.uniform_(bn.weight)
        nn.init.uniform_(bn.bias)
    assert swap_norm(m, "group") is m
    assert not any(isinstance(mod, nn.BatchNorm2d) for mod in m.modules())
    for q, bn in bns.items():
        gn = m.get_submodule(q)
        assert isinstance(gn, nn.GroupNorm)
        assert gn.num_channels == bn.num_features and gn.num_channels // gn.num_groups == 8
        assert gn.eps == bn.eps
        assert torch.equal(gn.weight, bn.weight) and torch.equal(gn.bias, bn.bias)
    m(torch.randn(1, 3, 32, 32))


def test_swap_norm_batch_is_identity_and_bad_value_is_an_error():
    m = zoo.build("mcunet-5fps", 10)
    before = [type(mod) for mod in m.modules()]
    assert swap_norm(m, "batch") is m and [type(mod) for mod in m.modules()] == before
    with pytest.raises(BadOption):
        swap_norm(m, "layer")


def test_group_count():
    # C // 8 groups, at least one, lowered to a divisor of C
    assert [group_count(c) for c in (8, 16, 320, 4, 12, 44)] == [1, 2, 40, 1, 1, 4]


def test_swap_norm_on_meta_and_cli_option():
    m = swap_norm(meta_model("proxylessnas-mobile", 10), "group")
    assert all(p.is_meta for p in m.parameters())
    cap = capture("proxylessnas-mobile", resolution=32, norm="group")
    kinds = {n.kind for n in cap.graph.nodes}
    assert "groupnorm" in kinds and "batchnorm" not in kinds


# --------------------------------------------------------------------------- lite residual


def test_lite_kernel_rule():
    # TinyTL: shrink by 2 until the kernel fits the pooled map
    assert lite_kernel(5, [56, 56]) == 5
    assert lite_kernel(5, [3, 3]) == 3
    assert lite_kernel(5, [2, 2]) == 1
    assert lite_kernel(3, [1, 4]) == 1


def test_lite_residual_architecture_proxylessnas():
    m = add_lite_residual(meta_model("proxylessnas-mobile", 10))
    blocks = find_blocks(zoo.build("proxylessnas-mobile", 10))
    wrapped = [q for q, mod in m.named_modules() if isinstance(mod, LiteResidual)]
    assert wrapped == blocks[1:]  # every block but the first, as TinyTL's insert_lite_residual
    # hand count at 224 px: block inputs 112 (blocks 1), 56 (2-3), 28 (4-7), 14 (8-11, 15), 7 (12-14, 16-19);
    # pooled by 2: 7 -> 3 for the last four blocks, whose 5x5 kernel shrinks to 3x3
    for q in wrapped:
        i = int(q.split(".")[-1])
        conv1 = m.get_submodule(q).lite_residual.conv1
        assert conv1.kernel_size == ((3, 3) if i >= 16 else (5, 5)), q
        assert conv1.stride == ((2, 2) if i in (1, 3, 7, 15) else (1, 1)), q
        assert conv1.groups == 2 and conv1.in_channels == conv1.out_channels  # all widths are multiples of 8
        assert conv1.weight.is_meta
    explicit = add_lite_residual(meta_model("proxylessnas-mobile", 10), blocks=blocks)
    assert sum(isinstance(mod, LiteResidual) for mod in explicit.modules()) == len(blocks)
    assert add_lite_residual(explicit) is explicit  # already has branches: unchanged
    assert sum(isinstance(mod, LiteResidual) for mod in explicit.modules()) == len(blocks)


def test_lite_residual_trainable_params_match_mobiletl_table3():
    """MobileTL Table 3 prints TinyTL-L's trainable parameters (100 classes): 1,944,516 =
    lite branches + classifier. It pins the branch architecture (kernels, widths, first block)."""
    cap = capture("proxylessnas-mobile", classes=100, resolution=64, norm="group", method="tinytl-l")
    p = profile_captured(cap, "tinytl-l", mode="tinytl")
    assert p.totals.trainable_params == by_key("mobiletl.table3.proxylessnas-mobile.tinytl-l.trainable_params").value


@pytest.mark.parametrize("norm", ["batch", "group"])
def test_lite_residual_preserves_output_traces_and_trains(norm):
    torch.manual_seed(0)
    m = zoo.build("proxylessnas-mobile", 10).eval()
    swap_norm(m, norm)
    x = torch.randn(2, 3, 112, 112)  # 7x7 maps at the end: odd sizes, pooled to 3x3 and resized back
    with torch.no_grad():
        before = m(x)
        add_lite_residual(m, norm=norm)
        after = m(x)
    assert torch.equal(before, after)  # the last norm's scale is 0: the branches add exactly 0
    graph = capture_graph(m, (2, 3, 112, 112))
    assert len(graph.blocks) == 20
    lite = [n for n in graph.nodes if is_lite(n)]
    assert len([n for n in lite if n.kind == "conv"]) == 2 * 19
    assert {n.kind for n in lite} == {"avgpool", "conv", "relu", "batchnorm" if norm == "batch" else "groupnorm"}
    assert sum(n.kind == "interpolate" for n in graph.nodes) == 19
    # a training step of tinytl-l reaches every branch parameter and nothing of the backbone
    plan = make_plan(graph, "tinytl-l")
    apply_plain(m, graph, plan)
    F.cross_entropy(m(x), torch.tensor([1, 2])).backward()
    branch_params = {qual for n in lite for qual in n.uses.values()}
    for name, p in m.named_parameters():
        assert (p.grad is not None) == (name in branch_params or name.startswith("classifier.")), name


@pytest.mark.parametrize("norm, method", [("batch", "tinytl-l"), ("group", "tinytl-lb")])
def test_lite_network_pytorch_mode_matches_autograd(norm, method):
    """The traced branches (pool, convs, norms, resize, add) cost what autograd really saves."""
    torch.manual_seed(0)
    m = add_lite_residual(swap_norm(zoo.build("proxylessnas-mobile", 10), norm))
    prof, measured = predicted_and_measured(m, (2, 3, 64, 64), method, {})
    assert prof.totals.saved_activation_bytes == measured.bytes
    assert not prof.unknown_ops


def test_lite_strategies_need_branches():
    graph = capture_graph(meta_model("proxylessnas-mobile", 10), (1, 3, 32, 32))
    with pytest.raises(BadOption):
        make_plan(graph, "tinytl-l")


def test_lite_options_reach_the_transform():
    cap = capture(
        "proxylessnas-mobile",
        resolution=64,
        method="tinytl-lb",
        method_options={"lite_kernel": 3, "lite_groups": 4, "lite_norm": "group"},
    )
    convs = [n for n in cap.graph.nodes if is_lite(n) and n.kind == "conv" and n.name.endswith("conv1")]
    assert len(convs) == 19
    assert all(n.attrs["kernel_size"] in ((3, 3), (1, 1)) and n.attrs["groups"] == 4 for n in convs)
    assert all(n.kind == "groupnorm" for n in cap.graph.nodes if is_lite(n) and "norm" in n.name)
    with pytest.raises(BadOption):
        capture("proxylessnas-mobile", resolution=64, method="tinytl-l", method_options={"lite_kernel": 4})


# --------------------------------------------------------------------------- the tinytl mode


class _Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)

    def forward(self, x):
        return x + self.conv2(self.act(self.bn(self.conv1(x))))


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.blocks = nn.Sequential(_Block(8))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


# Hand count, per sample (fp32): input 3x8x8 = 768 B; stem out 8x4x4 = 512 B = every block tensor;
# the depthwise conv2 output / 8 groups = 64 B; fc input 32 B, output 20 B; ReLU mask 128 bits = 16 B.
# Working memory: stem 768+512, conv1 512+512, bn 512, relu 512, conv2 512+64, fc 32+20; the block
# input (512) stays alive inside the block (it feeds conv1 and the add).
# Params: stem 216+8, conv1 64, bn 8+8, conv2 72, fc 40+5 = 421.
#  full: kept before each layer 0 / 768 / 1280 / 1792 / 1808 / 2320 -> peaks 1280, 2304, 2304, 2816,
#        2896 (conv2), 2372 -> 2896 / sample; params 421 x 4 = 1684
#  last: nothing kept -> max(1280, 1536, 1024, 1024, 1088, 52) = 1536; params 45 x 4 + 376 x 1 = 556
#  bias: only the ReLU mask (16) -> conv2 at 576 + 16 + 512 = 1104 < 1536 (conv1);
#        params (8 + 8 + 45) x 4 + 360 = 604
@pytest.mark.parametrize("method, per_sample, params", [("full", 2896, 1684), ("last", 1536, 556), ("bias", 1536, 604)])
def test_tinytl_mode_hand_count(method, per_sample, params):
    p = memplan.profile(_Tiny(), method, mode="tinytl", batch=2, input_shape=(3, 8, 8))
    assert p.totals.total_bytes == p.totals.peak_bytes == 2 * per_sample + params
    assert p.extras["tinytl"] == {"peak_activation_bytes_per_sample": per_sample, "param_bytes": params}
    assert p.peak_phase == "forward"


def test_tinytl_mode_peak_layer_and_kept():
    p = memplan.profile(_Tiny(), "full", mode="tinytl", batch=2, input_shape=(3, 8, 8))
    assert p.peak_layer == "blocks.0.conv2"
    # kept at batch 2: stem input 1536, conv1 input 1024, bn input 1024, ReLU mask 32, conv2 input 1024, fc input 64
    assert p.totals.saved_activation_bytes == 1536 + 1024 + 1024 + 32 + 1024 + 64


# --------------------------------------------------------------------------- published figures


@pytest.fixture(scope="module")
def table2():
    """TinyTL Table 2 network (GroupNorm + lite residual), batch 8, 224 px, Flowers head (102)."""
    return capture(tinytl_net(102), batch=8, resolution=224)


@pytest.mark.parametrize(
    "method, reproduced",
    [("full", 390.8), ("norm", 192.4), ("last", 30.8), ("tinytl-b", 31.7), ("tinytl-l", None), ("tinytl-lb", None)],
)
def test_tinytl_table2(table2, method, reproduced):
    p = profile_captured(table2, method, mode="tinytl")
    close(p.totals.total_bytes, f"{TT2}.{method}.memory", reproduced)
    t = p.extras["tinytl"]
    assert p.totals.total_bytes == round(8 * t["peak_activation_bytes_per_sample"]) + t["param_bytes"]
    # the parameter bytes counted on the module itself (accounting.md §3: trainable 4 B, frozen 1 B), with
    # the parameters the plan trains as plain PyTorch sets them (requires_grad)
    model = apply_plain(table2.model, table2.graph, make_plan(table2.graph, method))
    params = list(model.parameters())
    assert t["param_bytes"] == sum(q.numel() * (4 if q.requires_grad else 1) for q in params)


@pytest.mark.parametrize("method, reproduced", [("full", 367.0), ("norm", 183.0), ("last", 29.0), ("bias", 29.9)])
def test_tinytl_plain_network(method, reproduced):
    """Without lite residual (BN network): accounting.md's 'plain network' numbers."""
    p = memplan.profile("proxylessnas-mobile", method, mode="tinytl", batch=8, classes=102)
    assert abs(p.totals.total_bytes / MB - reproduced) < 0.05


def test_tinytl_at_320px():
    p = memplan.profile(
        "proxylessnas-mobile", "tinytl-lb", mode="tinytl", batch=8, resolution=320, classes=102, norm="group"
    )
    close(p.totals.total_bytes, f"{TT2}.tinytl-lb.res320.memory", None)


@pytest.mark.parametrize(
    "name, key, reproduced",
    [
        ("mobilenetv2-w1.4", "tinytl.table3.mobilenetv2-w1.4.full.memory", 644.2),
        ("resnet50", "tinytl.table3.resnet50.full.memory", 807.6),
    ],
)
def test_tinytl_table3(name, key, reproduced):
    p = memplan.profile(name, "full", mode="tinytl", batch=8, classes=102)
    close(p.totals.total_bytes, key, reproduced)


def test_compare_cli_tinytl(capsys):
    from memplan.cli import main

    methods = "full,last,norm,bias,tinytl-b,tinytl-l,tinytl-lb,lastk:3"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "compare",
                "proxylessnas-mobile",
                "--classes",
                "100",
                "--batch",
                "8",
                "--mode",
                "tinytl",
                "--methods",
                methods,
            ]
        )
    out = capsys.readouterr().out
    assert exc.value.code == 0
    for m in ("full", "last", "norm", "bias", "tinytl-b", "tinytl-l", "tinytl-lb", "lastk(blocks=3)"):
        assert any(line.startswith(m + " ") for line in out.splitlines()), m
    # MobileTL Table 3 (same network, 100 classes): trainable parameters, and FT-Last 29.0 MB
    # reproduced exactly under this convention (accounting.md)
    rows = memplan.compare(
        "proxylessnas-mobile",
        [m if ":" not in m else ("lastk", {"blocks": 3}) for m in methods.split(",")],
        mode="tinytl",
        classes=100,
        batch=8,
    )
    keys = ["full", "last", "norm", "bias", "tinytl-b", "tinytl-l", None, "lastk"]
    for row, key in zip(rows, keys):
        if key is not None:
            assert (
                row.totals.trainable_params
                == by_key(f"mobiletl.table3.proxylessnas-mobile.{key}.trainable_params").value
            ), key
    assert round(rows[1].totals.total_bytes / MB, 1) == by_key("mobiletl.table3.proxylessnas-mobile.last.memory").value
