"""Tests of memplan.nn.lean: exact forwards, reference gradients, saved bytes, sparse updates."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.graph import saved_tensors_hooks

from memplan.errors import BadOption
from memplan.nn.lean import (
    FrozenConv,
    FrozenLinear,
    MaskedHardtanh,
    MaskedLeakyReLU,
    MaskedReLU,
    MaskedReLU6,
    ShiftOnlyNorm,
    SignHardswish,
    SubChannelConv,
    packbits,
    select_channels,
    unpackbits,
)

torch.set_num_threads(1)


def saved_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes of distinct storages saved for backward by ``module(x)``, excluding the storages
    of the module's parameters and buffers."""
    own = {t.untyped_storage().data_ptr() for t in list(module.parameters()) + list(module.buffers())}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in own:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        y = module(x)
    y.sum().backward()  # the saved tensors must still be usable
    return sum(seen.values())


CONV_CASES = {
    "plain": dict(cls=nn.Conv2d, c_in=4, c_out=6, k=3),
    "stride2_pad": dict(cls=nn.Conv2d, c_in=4, c_out=6, k=3, stride=2, padding=1),
    "dilation": dict(cls=nn.Conv2d, c_in=4, c_out=6, k=3, dilation=2, padding=2),
    "groups2": dict(cls=nn.Conv2d, c_in=4, c_out=6, k=3, groups=2, padding=1),
    "depthwise": dict(cls=nn.Conv2d, c_in=6, c_out=6, k=3, groups=6, padding=1, stride=2),
    "pointwise": dict(cls=nn.Conv2d, c_in=8, c_out=5, k=1, bias=False),
    "same": dict(cls=nn.Conv2d, c_in=4, c_out=6, k=3, padding="same"),
    "conv1d": dict(cls=nn.Conv1d, c_in=4, c_out=6, k=3, stride=2, padding=1),
}


def make_conv(case: dict, dtype=torch.float32, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    kw = {k: v for k, v in case.items() if k not in ("cls", "c_in", "c_out", "k")}
    return case["cls"](case["c_in"], case["c_out"], case["k"], dtype=dtype, **kw)


def conv_input(case: dict, batch: int = 2, size: int = 7, dtype=torch.float32) -> torch.Tensor:
    spatial = (size,) if case["cls"] is nn.Conv1d else (size, size)
    return torch.randn(batch, case["c_in"], *spatial, dtype=dtype)


def reference_grads(plain: nn.Module, x: torch.Tensor, gy: torch.Tensor):
    x = x.clone().requires_grad_(True)
    y = plain(x)
    y.backward(gy)
    return y.detach(), x.grad, plain.weight.grad, None if plain.bias is None else plain.bias.grad


# ----------------------------------------------------------------------------- bit packing
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 13, 64, 1001])
def test_packbits_round_trip(n):
    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) > 0.5
    packed = packbits(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(n / 8)
    assert torch.equal(unpackbits(packed, n), mask)


def test_packbits_bit_order_and_shape():
    mask = torch.tensor([[True, False, False], [False, False, False], [False, False, True]])
    packed = packbits(mask)  # flat index 0 -> bit 0 of byte 0, flat index 8 -> bit 0 of byte 1
    assert packed.tolist() == [1, 1]
    assert torch.equal(unpackbits(packed, 9).view(3, 3), mask)
    with pytest.raises(ValueError):
        unpackbits(packed, 17)


# ----------------------------------------------------------------------------- FrozenConv
@pytest.mark.parametrize("name", list(CONV_CASES))
def test_frozen_conv_matches_plain(name):
    case = CONV_CASES[name]
    plain = make_conv(case)
    plain.weight.requires_grad_(False)
    lean = FrozenConv.from_module(copy.deepcopy(plain))
    x = conv_input(case)
    gy = torch.randn_like(plain(x))
    y_ref, gx_ref, _, gb_ref = reference_grads(plain, x, gy)
    xl = x.clone().requires_grad_(True)
    y = lean(xl)
    y.backward(gy)
    assert torch.equal(y, y_ref)
    torch.testing.assert_close(xl.grad, gx_ref, rtol=1e-6, atol=1e-6)
    if gb_ref is not None:
        torch.testing.assert_close(lean.bias.grad, gb_ref, rtol=1e-6, atol=1e-6)
    assert lean.weight.grad is None
    assert saved_bytes(lean, x.clone().requires_grad_(True)) == 0


@pytest.mark.parametrize("name", ["stride2_pad", "dilation", "groups2", "depthwise", "conv1d"])
def test_frozen_conv_gradcheck(name):
    from memplan.nn.lean.conv import _FrozenConvFn

    case = CONV_CASES[name]
    lean = FrozenConv.from_module(make_conv(case, dtype=torch.float64))
    x = conv_input(case, size=5, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, b: _FrozenConvFn.apply(x, b, lean.weight, lean), (x, lean.bias))


def test_frozen_conv_shares_parameters_and_bias_only_without_input_grad():
    conv = nn.Conv2d(3, 4, 3)
    lean = FrozenConv.from_module(conv)
    assert lean.weight is conv.weight and lean.bias is conv.bias
    assert not conv.weight.requires_grad
    assert set(lean.state_dict()) == set(conv.state_dict())
    x = torch.randn(2, 3, 6, 6)  # first layer: the input needs no gradient
    assert saved_bytes(lean, x) == 0 and lean.bias.grad is not None
    y = lean(x[0])  # unbatched input
    assert torch.equal(y, conv(x[0]))
    conv.weight.requires_grad_(True)
    with pytest.raises(RuntimeError):
        lean(x)


def test_frozen_conv_rejects_unsupported():
    with pytest.raises(NotImplementedError):
        FrozenConv.from_module(nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"))
    with pytest.raises(NotImplementedError):
        FrozenConv.from_module(nn.ConvTranspose2d(2, 2, 3))


# ----------------------------------------------------------------------------- FrozenLinear
@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8), (8,)])
def test_frozen_linear(shape):
    torch.manual_seed(0)
    plain = nn.Linear(8, 4)
    plain.weight.requires_grad_(False)
    lean = FrozenLinear.from_module(copy.deepcopy(plain))
    x = torch.randn(*shape)
    gy = torch.randn_like(plain(x))
    y_ref, gx_ref, _, gb_ref = reference_grads(plain, x, gy)
    xl = x.clone().requires_grad_(True)
    y = lean(xl)
    y.backward(gy)
    assert torch.equal(y, y_ref)
    torch.testing.assert_close(xl.grad, gx_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lean.bias.grad, gb_ref, rtol=1e-6, atol=1e-6)
    assert saved_bytes(lean, x.clone().requires_grad_(True)) == 0


def test_frozen_linear_gradcheck():
    from memplan.nn.lean.conv import _FrozenLinearFn

    lin = nn.Linear(5, 3, dtype=torch.float64)
    x = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: _FrozenLinearFn.apply(x, b, lin.weight.detach()), (x, lin.bias))


# ----------------------------------------------------------------------------- SubChannelConv
SUB_CASES = ["plain", "stride2_pad", "dilation", "depthwise", "pointwise", "conv1d"]


@pytest.mark.parametrize("name", SUB_CASES)
@pytest.mark.parametrize("ratio", [0.25, 0.5, 1.0])
def test_subchannel_matches_plain(name, ratio):
    case = CONV_CASES[name]
    plain = make_conv(case)
    lean = SubChannelConv.from_module(copy.deepcopy(plain), ratio)
    c_in = case["c_in"]
    n = max(1, int(c_in * ratio))
    assert lean.idx.numel() == n
    x = conv_input(case)
    gy = torch.randn_like(plain(x))
    y_ref, gx_ref, gw_ref, gb_ref = reference_grads(plain, x, gy)
    xl = x.clone().requires_grad_(True)
    y = lean(xl)
    y.backward(gy)
    assert torch.equal(y, y_ref)
    torch.testing.assert_close(xl.grad, gx_ref, rtol=1e-6, atol=1e-6)
    if lean.groups == 1:
        gw_sel = gw_ref.index_select(1, lean.idx)
    else:  # depthwise: the selected channels' filters
        gw_sel = gw_ref.index_select(0, lean.idx)
    torch.testing.assert_close(lean.weight_sel.grad, gw_sel, rtol=1e-5, atol=1e-5)
    if gb_ref is not None:
        torch.testing.assert_close(lean.bias.grad, gb_ref, rtol=1e-6, atol=1e-6)
    assert lean.weight.grad is None
    spatial = math.prod(x.shape[2:])
    assert saved_bytes(lean, x.clone().requires_grad_(True)) == x.shape[0] * n * spatial * 4


@pytest.mark.parametrize("name", ["stride2_pad", "depthwise", "conv1d"])
def test_subchannel_gradcheck(name):
    from memplan.nn.lean.conv import _SubChannelConvFn

    case = CONV_CASES[name]
    lean = SubChannelConv.from_module(make_conv(case, dtype=torch.float64), 0.5)
    x = conv_input(case, size=5, dtype=torch.float64).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x, w, b: _SubChannelConvFn.apply(x, w, b, lean), (x, lean.weight_sel, lean.bias)
    )


def test_subchannel_depthwise_multiplier():
    conv = nn.Conv2d(4, 8, 3, groups=4, padding=1)
    plain = copy.deepcopy(conv)
    lean = SubChannelConv.from_module(conv, 0.5)
    assert lean.weight_sel.shape == (4, 1, 3, 3)  # 2 channels x 2 filters each
    x = torch.randn(2, 4, 5, 5)
    y_ref, _, gw_ref, _ = reference_grads(plain, x, torch.ones(2, 8, 5, 5))
    y = lean(x)
    y.backward(torch.ones_like(y))
    assert torch.equal(y, y_ref)
    torch.testing.assert_close(lean.weight_sel.grad, gw_ref.index_select(0, lean.rows))


def test_subchannel_selection_rules():
    conv = nn.Conv2d(8, 4, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.arange(1, 9, dtype=torch.float32).view(1, 8, 1, 1).expand(4, 8, 1, 1))
        conv.weight[:, 3] = 100.0
    assert select_channels(conv.weight, 1, 0.25, "magnitude+").tolist() == [3, 7]
    assert select_channels(conv.weight, 1, 0.25, "magnitude-").tolist() == [0, 1]
    r1 = select_channels(conv.weight, 1, 0.5, "random", seed=1)
    assert torch.equal(r1, select_channels(conv.weight, 1, 0.5, "random", seed=1))
    assert r1.numel() == 4 and torch.equal(r1, r1.sort().values)
    assert select_channels(conv.weight, 1, 0.01, "magnitude+").tolist() == [3]  # at least 1
    dw = nn.Conv2d(4, 4, 3, groups=4)
    with torch.no_grad():
        dw.weight.mul_(0).add_(torch.tensor([1.0, 5.0, 2.0, 4.0]).view(4, 1, 1, 1))
    assert select_channels(dw.weight, 4, 0.5, "magnitude+").tolist() == [1, 3]
    with pytest.raises(BadOption):
        select_channels(conv.weight, 1, 0.0)
    with pytest.raises(BadOption):
        select_channels(conv.weight, 1, 0.5, "largest")
    with pytest.raises(NotImplementedError):
        SubChannelConv.from_module(nn.Conv2d(4, 6, 3, groups=2), 0.5)


@pytest.mark.parametrize("name", ["plain", "depthwise"])
@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_subchannel_unselected_weights_stay_bit_identical(name, opt):
    case = CONV_CASES[name]
    conv = make_conv(case)
    w0 = conv.weight.detach().clone()
    lean = SubChannelConv.from_module(conv, 0.5, rule="random", seed=3)
    params = list(lean.parameters())  # includes the frozen full weight: must be left alone
    if opt == "sgd":
        optim = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4)
    else:
        optim = torch.optim.Adam(params, lr=0.1)
    for _ in range(5):
        optim.zero_grad()
        lean(conv_input(case)).square().mean().backward()
        optim.step()
    merged = lean.merged_weight()
    dim, index = (1, lean.idx) if lean.groups == 1 else (0, lean.rows)
    keep = torch.ones(w0.shape[dim], dtype=torch.bool)
    keep[index] = False
    assert torch.equal(
        merged.index_select(dim, keep.nonzero().flatten()), w0.index_select(dim, keep.nonzero().flatten())
    )
    assert torch.equal(conv.weight, w0)  # the shared Parameter itself untouched
    assert not torch.equal(merged.index_select(dim, index), w0.index_select(dim, index))
    lean.write_back()
    assert torch.equal(conv.weight, merged)
    x = conv_input(case)
    assert torch.equal(lean(x), F.conv2d(x, merged, conv.bias, lean.stride, lean.padding, lean.dilation, lean.groups))


# ----------------------------------------------------------------------------- ShiftOnlyNorm
def make_bn(c: int = 6, dtype=torch.float32) -> nn.BatchNorm2d:
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(c, dtype=dtype)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-1, 1)
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2.0)
    return bn


def test_shift_only_norm_matches_eval_bn():
    plain = make_bn().eval()
    plain.weight.requires_grad_(False)
    lean = ShiftOnlyNorm.from_module(copy.deepcopy(plain)).train()  # train mode changes nothing
    x = torch.randn(2, 6, 5, 5)
    gy = torch.randn_like(x)
    y_ref, gx_ref, _, gb_ref = reference_grads(plain, x, gy)
    xl = x.clone().requires_grad_(True)
    y = lean(xl)
    y.backward(gy)
    assert torch.equal(y, y_ref)
    torch.testing.assert_close(xl.grad, gx_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lean.bias.grad, gb_ref, rtol=1e-6, atol=1e-6)
    assert lean.weight.grad is None
    assert torch.equal(lean.running_mean, plain.running_mean)  # stats never updated
    assert set(lean.state_dict()) == set(plain.state_dict())
    assert saved_bytes(lean, x.clone().requires_grad_(True)) == 0


def test_shift_only_norm_gradcheck():
    from memplan.nn.lean.norm import _ShiftNormFn

    lean = ShiftOnlyNorm.from_module(make_bn(3, dtype=torch.float64))
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: _ShiftNormFn.apply(x, b, lean), (x, lean.bias))


# ----------------------------------------------------------------------------- masked activations
SPECIALS = torch.tensor([0.0, -0.0, 6.0, -1.0, 1.0, 7.0, -3.0, 3.0, float("nan"), float("inf")])
ACTS = {
    "relu": (nn.ReLU, MaskedReLU),
    "relu6": (nn.ReLU6, MaskedReLU6),
    "hardtanh": (lambda inplace=False: nn.Hardtanh(-1.0, 1.0, inplace), MaskedHardtanh),
    "leaky": (lambda inplace=False: nn.LeakyReLU(0.1, inplace), MaskedLeakyReLU),
}


@pytest.mark.parametrize("name", list(ACTS))
@pytest.mark.parametrize("inplace", [False, True])
def test_masked_activation_exact(name, inplace):
    make_plain, lean_cls = ACTS[name]
    plain = make_plain(inplace=inplace)
    lean = lean_cls.from_module(plain)
    torch.manual_seed(0)
    base = torch.cat([torch.randn(3, 5, 7) * 4, SPECIALS.view(1, 1, 10).expand(3, 5, 10)], dim=2)
    gy = torch.randn_like(base)
    gy[0, 0, -1] = float("nan")  # masked-out positions must give exactly 0, not nan * 0
    outs, grads = [], []
    for mod in (plain, lean):
        x = base.clone().requires_grad_(True)
        y = mod(x * 1.0)  # a non-leaf, so in-place is allowed
        y.backward(gy)
        outs.append(y.detach())
        grads.append(x.grad)
    assert torch.equal(outs[0].nan_to_num(123.0), outs[1].nan_to_num(123.0))
    # PyTorch's own hardtanh backward is inconsistent for NaN inputs (vectorised vs tail)
    keep = ~base.isnan() if name in ("relu6", "hardtanh") else torch.ones_like(base, dtype=torch.bool)
    assert torch.equal(grads[0][keep].nan_to_num(123.0), grads[1][keep].nan_to_num(123.0))
    x = base.clone().requires_grad_(True)
    assert saved_bytes(lean, x * 1.0) == math.ceil(base.numel() / 8)


def test_masked_relu6_from_hardtanh_and_gradcheck():
    from memplan.nn.lean.activations import _MaskActFn

    assert type(MaskedReLU6.from_module(nn.ReLU6())) is MaskedReLU6
    assert type(MaskedReLU6.from_module(nn.Hardtanh(-2, 2))) is MaskedHardtanh
    x = (torch.rand(4, 5, dtype=torch.float64) * 10 - 2).requires_grad_(True)
    for mod in (MaskedReLU(), MaskedReLU6(), MaskedLeakyReLU(0.2)):
        assert torch.autograd.gradcheck(lambda t, mod=mod: _MaskActFn.apply(t, mod), (x,))


# ----------------------------------------------------------------------------- SignHardswish
def test_sign_hardswish():
    act = SignHardswish.from_module(nn.Hardswish())
    x = torch.cat([torch.randn(2, 3, 5, 5) * 4, SPECIALS.view(1, 1, 2, 5).expand(2, 3, 2, 5)], 2)
    x = x.nan_to_num(0.5).requires_grad_(True)
    gy = torch.randn_like(x)
    y = act(x)
    y.backward(gy)
    assert torch.equal(y, F.hardswish(x.detach()))  # exact forward
    # MobileTL's approximated derivative: 1 where x > 0, else 0
    assert torch.equal(x.grad, torch.where(x.detach() > 0, gy, torch.zeros_like(gy)))
    assert saved_bytes(act, x.detach().clone().requires_grad_(True)) == math.ceil(x.numel() / 8)
    inplace = SignHardswish(inplace=True)
    xi = x.detach().clone().requires_grad_(True)
    yi = inplace(xi * 1.0)
    yi.backward(gy)
    assert torch.equal(yi, y.detach()) and torch.equal(xi.grad, x.grad)


# ----------------------------------------------------------------------------- composition
def test_lean_inverted_residual_block_saves_only_the_ideal():
    """An MBV2-style block, MobileTL-style: pw1 sub-channel update (1/4), shift-only inner BNs,
    1-bit ReLU6 masks, frozen depthwise and pw2 convs with trainable biases."""
    torch.manual_seed(0)
    c, e, hw, b = 8, 24, 6, 2
    pw1, dw, pw2 = nn.Conv2d(c, e, 1), nn.Conv2d(e, e, 3, padding=1, groups=e), nn.Conv2d(e, c, 1)
    bn1, bn2 = make_bn(e).eval(), make_bn(e).eval()
    plain = nn.Sequential(pw1, bn1, nn.ReLU6(), dw, bn2, nn.ReLU6(), pw2)
    ref = copy.deepcopy(plain)
    lean = nn.Sequential(
        SubChannelConv.from_module(pw1, 0.25),
        ShiftOnlyNorm.from_module(bn1),
        MaskedReLU6.from_module(plain[2]),
        FrozenConv.from_module(dw),
        ShiftOnlyNorm.from_module(bn2),
        MaskedReLU6.from_module(plain[5]),
        FrozenConv.from_module(pw2),
    )
    x = torch.randn(b, c, hw, hw)
    assert torch.equal(lean(x), ref(x))
    mask = math.ceil(b * e * hw * hw / 8)
    assert saved_bytes(lean, x) == b * 2 * hw * hw * 4 + 2 * mask


def test_subchannel_first_layer_and_frozen_slice():
    conv = nn.Conv2d(4, 6, 3)
    lean = SubChannelConv.from_module(conv, 0.5)
    assert list(lean.state_dict()) == ["weight", "bias"]  # the plain conv's keys (weight_sel folded in)
    x = torch.randn(2, 4, 5, 5)  # the input needs no gradient
    assert saved_bytes(lean, x) == 2 * 2 * 25 * 4
    lean.weight_sel.requires_grad_(False)  # bias-only: nothing saved
    assert saved_bytes(lean, x) == 0 and lean.bias.grad is not None
    assert torch.equal(lean(x[0]), conv(x[0]))  # unbatched
