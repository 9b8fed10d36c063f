"""Architecture options every strategy takes (remove_se, activation, lite + lite_blocks), MobileTL's
patches (train_main) and MiniLearn's stages, checked against the networks themselves."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import memplan
from memplan.cli import main
from memplan.errors import BadOption
from memplan.models import resolve
from memplan.nn.transforms import is_lite, is_squeeze_excite, remove_se, swap_activation


class ScaleFirstSE(nn.Module):
    """SE written the torchvision way: functional mean pooling, ``scale * x``, sigmoid gate."""

    def __init__(self, c: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, 4, 1), nn.Conv2d(4, c, 1)

    def forward(self, x):
        scale = torch.sigmoid(self.fc2(torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))))
        return scale * x


class Gated(nn.Module):
    """x * gate(x) without pooling: not an SE."""

    def __init__(self, c: int):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.conv(x))


def small_net() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.Hardswish(),
        ScaleFirstSE(8),
        Gated(8),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 2),
    )


def test_remove_se_finds_se_by_structure_not_by_class():
    net = small_net()
    assert is_squeeze_excite(net[2]) and not is_squeeze_excite(net[3])
    remove_se(net)
    assert isinstance(net[2], nn.Identity) and isinstance(net[3], Gated)
    assert net(torch.randn(2, 3, 8, 8)).shape == (2, 2)
    with pytest.raises(BadOption):
        remove_se(net)  # nothing left to remove: one-line error


def test_remove_se_drops_exactly_the_se_parameters():
    """MobileNetV3-Small with and without its SE modules: the difference is their parameters."""
    with_se = memplan.profile("mobilenetv3-small", "bias", resolution=64)
    model = resolve("mobilenetv3-small", None, meta=True).model
    se_params = sum(p.numel() for m in model.modules() if is_squeeze_excite(m) for p in m.parameters())
    without = memplan.profile("mobilenetv3-small", "bias", resolution=64, remove_se=True)
    assert se_params > 0 and with_se.totals.params - without.totals.params == se_params


def test_swap_activation_keeps_gates():
    net = swap_activation(small_net(), "relu")
    kinds = [type(m) for m in net.modules()]
    assert nn.Hardswish not in kinds and nn.ReLU in kinds
    with pytest.raises(BadOption):
        swap_activation(small_net(), "swish-ish")


def test_relu_swap_saves_hswish_memory():
    """h-swish keeps its fp32 input, ReLU a 1-bit mask (ideal mode): the swap only shrinks saved bytes."""
    kw = dict(mode="ideal", resolution=64, blocks=3)
    hs = memplan.profile("mobilenetv3-small", "lastk", **kw).totals.saved_activation_bytes
    relu = memplan.profile("mobilenetv3-small", "lastk", activation="relu", **kw).totals.saved_activation_bytes
    assert relu < hs


def test_lite_blocks_puts_branches_in_the_last_blocks_only():
    cap = memplan.capture("proxylessnas-mobile", resolution=64, method="tinytl-l", method_options={"lite_blocks": 2})
    lite_blocks = {n.block for n in cap.graph.nodes if is_lite(n)}
    assert lite_blocks == set(cap.graph.blocks[-2:])


def test_mobiletl_train_main_false_trains_patches_and_head_only():
    options = dict(blocks=3, lite=True, lite_blocks=3, train_main=False)
    p = memplan.profile("proxylessnas-mobile", "mobiletl", mode="ideal", resolution=64, classes=10, **options)
    cap = memplan.capture("proxylessnas-mobile", resolution=64, classes=10, method="mobiletl", method_options=options)
    lite = {n.name for n in cap.graph.nodes if is_lite(n)}
    trained = {layer.name for layer in p.layers if layer.trainable_params}
    blocks = {layer.block for layer in p.layers if layer.name in trained and layer.block}
    assert trained and all(n in lite for n in trained if any(n.startswith(b + ".") for b in blocks))
    assert len(blocks) == 3


def test_minilearn_finetune_stage_trains_the_head_alone():
    """Stage III of KWS with a 5-class head: the 576 -> 5 FC is all that trains."""
    p = memplan.profile("minilearn-kws", "minilearn", classes=5, stage="finetune")
    assert p.totals.trainable_params == 576 * 5 + 5
    assert p.extras["stage"] == "finetune" and p.extras["ram_bytes"] == p.extras["finetune_ram_bytes"]
    assert p.extras["finetune_ram_bytes"] < p.extras["train_ram_bytes"]


def test_apply_strategy_with_architecture_options_trains():
    model = resolve("mobilenetv3-small", 10, meta=False).model
    memplan.apply_strategy(model, "lastk", blocks=2, remove_se=True, activation="relu", input_shape=(1, 3, 64, 64))
    assert not any(is_squeeze_excite(m) for m in model.modules())
    assert not any(isinstance(m, nn.Hardswish) for m in model.modules())
    loss = model(torch.randn(2, 3, 64, 64)).sum()
    loss.backward()


@pytest.mark.parametrize(
    "args, code",
    [(["-o", "remove_se=true"], 0), (["-o", "remove_se=maybe"], 2), (["-o", "activation=relu", "-o", "lite=true"], 0)],
)
def test_cli_architecture_options(capsys, args, code):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "mobilenetv3-small", "--method", "bias", "--resolution", "64", *args])
    assert exc.value.code == code
    if code:
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
