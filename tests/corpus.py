"""The real-client corpus: CNNs built by packages that nobody at memplan wrote.

Each family is a list of :class:`Entry` (name, builder, per-model input shape with batch, heavy
flag). ``Entry.build()`` returns a fresh, randomly initialised ``nn.Module`` (seeded, so two calls
give the same weights) with ``CLASSES`` outputs. Nothing is downloaded: no pretrained weights.

Packages (pinned in ``requirements-corpus.txt``, installed with ``pip install --no-deps``, since
they declare torchvision, which has no CPU build for this torch and fails at import; none of them
needs it for the models):

* ``geffnet`` (gen-efficientnet-pytorch, R. Wightman): every constructor it exports;
* ``efficientnet_pytorch`` (lukemelas): ``EfficientNet.from_name("efficientnet-b0" .. "b3")``;
* ``efficientnet_lite_pytorch``: ``EfficientNet.from_name("efficientnet-lite0" .. "lite4")``;
* ``ofa`` (Once-for-All, MIT HAN lab): static MobileNetV3-Large / MobileNetV2 (ProxylessNASNets) /
  ResNet50 / ResNet50-D and the elastic OFA supernets at their max config, one seeded sampled
  config each, and the static subnets extracted from those samples;
* ``mcunet`` (MIT HAN lab): ``ProxylessNASNets.build_from_config`` of mcunet-5fps (the layer table
  of reference/architectures.md) and its MobileNetV2 at width 0.35 without feature-mix conv
  (the 256KB paper's mbv2-w0.35).

``CORPUS`` maps family -> entries; ``ONE_PER_FAMILY`` is the default (fast) test selection;
``entries(families=None, include_heavy=True)`` flattens. ``MISSING`` maps a family whose package
cannot be imported to the import error (the tests report it, they do not hide it).
"""

from __future__ import annotations

import copy
import importlib
import random
import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn

CLASSES = 10
BATCH = 2
SEED = 0
SHAPE_32 = (BATCH, 3, 32, 32)

INSTALL = "pip install --no-deps -r requirements-corpus.txt"


@dataclass(frozen=True)
class Entry:
    family: str
    name: str
    builder: Callable[[], nn.Module]
    shape: tuple[int, ...] = SHAPE_32  # batch first
    heavy: bool = False  # too slow for the slow CI run (build + one real forward / backward > 60 s)
    note: str = ""

    @property
    def id(self) -> str:
        return f"{self.family}:{self.name}"

    def build(self) -> nn.Module:
        torch.manual_seed(SEED)
        return self.builder()

    def __iter__(self):  # unpacks as (name, builder)
        return iter((self.name, self.build))


# ----------------------------------------------------------------------------- torchvision stub
def _stub_torchvision() -> None:
    """``ofa.utils`` imports ``torchvision.transforms`` / ``.functional`` for its data loaders only
    (``ofa/utils/my_dataloader/my_random_resize_crop.py`` subclasses ``RandomResizedCrop`` at import
    time), never for the networks. torchvision has no CPU build for the pinned torch (its wheel
    fails at import) and must not be installed, so empty placeholder modules stand in for it while
    ``ofa`` is imported. A real torchvision, if one is importable, is left alone."""
    if "torchvision" in sys.modules:
        return
    try:
        importlib.import_module("torchvision")
        return
    except Exception:  # absent, or the broken CPU wheel
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]

    def module(name: str) -> types.ModuleType:
        mod = types.ModuleType(name)
        mod.__doc__ = "memplan test stub: ofa imports it for data loaders only"
        sys.modules[name] = mod
        return mod

    tv = module("torchvision")
    transforms = module("torchvision.transforms")
    functional = module("torchvision.transforms.functional")
    datasets = module("torchvision.datasets")
    tv.transforms, tv.datasets, transforms.functional = transforms, datasets, functional
    for cls in (
        "RandomResizedCrop",
        "RandomCrop",
        "Compose",
        "Resize",
        "CenterCrop",
        "ToTensor",
        "Normalize",
        "RandomHorizontalFlip",
        "ColorJitter",
    ):
        setattr(transforms, cls, type(cls, (), {}))
    datasets.ImageFolder = type("ImageFolder", (), {})


MISSING: dict[str, str] = {}


def _import(family: str, module: str):
    try:
        if family == "ofa":
            _stub_torchvision()
        with warnings.catch_warnings():  # geffnet scripts activations at import: torch.jit.script deprecation
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module(module)
    except Exception as exc:
        MISSING.setdefault(family, f"{module}: {type(exc).__name__}: {exc}".splitlines()[0])
        return None
    finally:
        _unstub_torchvision()


def _unstub_torchvision() -> None:
    """Take the placeholders out of ``sys.modules`` once ``ofa`` holds what it needs: libraries that
    look torchvision up (``transformers`` asks ``importlib.util.find_spec``) must not find a stub."""
    for name in [n for n, m in sys.modules.items() if n == "torchvision" or n.startswith("torchvision.")]:
        if (getattr(sys.modules[name], "__doc__", "") or "").startswith("memplan test stub"):
            del sys.modules[name]


# ----------------------------------------------------------------------------- geffnet
#: the three EfficientNet-L2 variants (475M parameters): build 16 s + one real forward / backward 11 s
#: at batch 2, 32 px, but the five strategy checks (several model copies each) take 2-3 min per model
#: and 13.4 GB peak RSS (measured on a 2-core machine, torch 2.13 CPU). Kept in the registry
#: (benchmarks/real_clients.py --models runs them); the slow test skips them with this reason. At
#: random init plain autograd's gradients of efficientnet_l2 are already non-finite (842 parameters).
_L2 = (
    "475M params: the 5 strategy checks take 2-3 min per model and 13.4 GB peak RSS "
    "(build 16 s + one real fwd/bwd 11 s at batch 2, 32 px)"
)
GEFFNET_HEAVY: dict[str, str] = {"efficientnet_l2": _L2, "tf_efficientnet_l2_ns": _L2, "tf_efficientnet_l2_ns_475": _L2}


def _geffnet() -> list[Entry]:
    ge = _import("geffnet", "geffnet.gen_efficientnet")
    mv3 = _import("geffnet", "geffnet.mobilenetv3")
    if ge is None or mv3 is None:
        return []
    out = []
    for mod in (ge, mv3):
        for name in mod.__all__:
            if name != name.lower():  # GenEfficientNet, the class
                continue
            fn = getattr(mod, name)
            out.append(
                Entry(
                    "geffnet",
                    name,
                    lambda fn=fn: fn(pretrained=False, num_classes=CLASSES),
                    heavy=name in GEFFNET_HEAVY,
                    note=GEFFNET_HEAVY.get(name, ""),
                )
            )
    return out


# ----------------------------------------------------------------------------- efficientnet_pytorch / lite
def _from_name(family: str, names: list[str]) -> list[Entry]:
    """``EfficientNet.from_name(name)`` of package ``family`` (efficientnet_pytorch and its lite fork)."""
    mod = _import(family, family)
    if mod is None:
        return []
    return [
        Entry(family, name, lambda name=name: mod.EfficientNet.from_name(name, num_classes=CLASSES)) for name in names
    ]


def _efficientnet_pytorch() -> list[Entry]:
    return _from_name("efficientnet_pytorch", [f"efficientnet-b{i}" for i in range(4)])


def _efficientnet_lite() -> list[Entry]:
    return _from_name("efficientnet_lite_pytorch", [f"efficientnet-lite{i}" for i in range(5)])


# ----------------------------------------------------------------------------- ofa
#: the published OFA supernets' search spaces (ofa_mbv3_d234_e346_k357_w1.0,
#: ofa_proxyless_d234_e346_k357_w1.3, ofa_resnet50_d=0+1+2_e=0.2+0.25+0.35_w=0.65+0.8+1.0)
OFA_SPACES = {
    "OFAMobileNetV3": dict(width_mult=1.0, ks_list=[3, 5, 7], expand_ratio_list=[3, 4, 6], depth_list=[2, 3, 4]),
    "OFAProxylessNASNets": dict(width_mult=1.3, ks_list=[3, 5, 7], expand_ratio_list=[3, 4, 6], depth_list=[2, 3, 4]),
    "OFAResNets": dict(depth_list=[0, 1, 2], expand_ratio_list=[0.2, 0.25, 0.35], width_mult_list=[0.65, 0.8, 1.0]),
}
OFA_SAMPLE_SEED = 1


def _ofa_supernet(cls_name: str, sample: bool, extract: bool) -> nn.Module:
    nets = importlib.import_module("ofa.imagenet_classification.elastic_nn.networks")
    net = getattr(nets, cls_name)(
        n_classes=CLASSES, dropout_rate=0.1 if cls_name != "OFAResNets" else 0, **OFA_SPACES[cls_name]
    )
    if sample:  # ofa samples with the global `random` module: seed it, and restore the caller's state
        state = random.getstate()
        random.seed(OFA_SAMPLE_SEED)
        try:
            net.sample_active_subnet()
        finally:
            random.setstate(state)
    if extract:
        net = net.get_active_subnet(preserve_weight=True)
    return net


def _ofa() -> list[Entry]:
    if _import("ofa", "ofa.imagenet_classification.networks") is None:
        return []
    if _import("ofa", "ofa.imagenet_classification.elastic_nn.networks") is None:
        return []
    static = importlib.import_module("ofa.imagenet_classification.networks")
    out = [
        Entry("ofa", name, lambda name=name: getattr(static, name)(n_classes=CLASSES))
        for name in ("MobileNetV3Large", "MobileNetV2", "ResNet50", "ResNet50D")
    ]
    for cls_name in OFA_SPACES:
        out.append(Entry("ofa", f"{cls_name}-max", lambda c=cls_name: _ofa_supernet(c, False, False)))
        out.append(Entry("ofa", f"{cls_name}-sampled", lambda c=cls_name: _ofa_supernet(c, True, False)))
        out.append(Entry("ofa", f"{cls_name}-sampled-subnet", lambda c=cls_name: _ofa_supernet(c, True, True)))
    return out


# ----------------------------------------------------------------------------- mcunet
#: MCUNet-5FPS (reference/architectures.md): (in, out, kernel, expand, mid, stride, residual)
MCUNET_5FPS = [
    (16, 8, 3, 1, 16, 1, False), (8, 16, 3, 4, 32, 2, False), (16, 16, 3, 3, 48, 1, True),
    (16, 24, 7, 3, 48, 2, False), (24, 24, 3, 5, 120, 1, True), (24, 40, 3, 5, 120, 2, False),
    (40, 40, 7, 4, 160, 1, True), (40, 48, 5, 4, 160, 1, False), (48, 48, 3, 3, 144, 1, True),
    (48, 48, 3, 4, 192, 1, True), (48, 96, 7, 5, 240, 2, False), (96, 96, 5, 4, 384, 1, True),
    (96, 96, 5, 4, 384, 1, True), (96, 160, 3, 6, 576, 1, False),
]  # fmt: skip


def mcunet_5fps_config(classes: int = CLASSES) -> dict:
    """mcunet's ``ProxylessNASNets`` config dict (the format of its released ``*.json`` net configs,
    read by ``build_from_config`` / ``set_layer_from_config``). A fresh dict each call:
    ``set_layer_from_config`` pops the ``name`` keys."""

    def identity(c: int) -> dict:
        return {
            "name": "IdentityLayer",
            "in_channels": c,
            "out_channels": c,
            "use_bn": False,
            "act_func": None,
            "dropout_rate": 0,
            "ops_order": "weight_bn_act",
        }

    blocks = [
        {
            "name": "MobileInvertedResidualBlock",
            "mobile_inverted_conv": {
                "name": "MBInvertedConvLayer",
                "in_channels": cin,
                "out_channels": cout,
                "kernel_size": k,
                "stride": s,
                "expand_ratio": e,
                "mid_channels": mid,
                "act_func": "relu6",
                "use_se": False,
            },
            "shortcut": identity(cin) if res else None,
        }
        for cin, cout, k, e, mid, s, res in MCUNET_5FPS
    ]
    return {
        "name": "ProxylessNASNets",
        "bn": {"momentum": 0.1, "eps": 1e-3},
        "first_conv": {
            "name": "ConvLayer",
            "in_channels": 3,
            "out_channels": 16,
            "kernel_size": 3,
            "stride": 2,
            "dilation": 1,
            "groups": 1,
            "bias": False,
            "has_shuffle": False,
            "use_bn": True,
            "act_func": "relu6",
            "dropout_rate": 0,
            "ops_order": "weight_bn_act",
        },
        "blocks": blocks,
        "feature_mix_layer": None,
        "classifier": {
            "name": "LinearLayer",
            "in_features": 160,
            "out_features": classes,
            "bias": True,
            "use_bn": False,
            "act_func": None,
            "dropout_rate": 0,
            "ops_order": "weight_bn_act",
        },
    }


def _mcunet() -> list[Entry]:
    nets = _import("mcunet", "mcunet.tinynas.nn.networks")
    if nets is None:
        return []
    return [
        Entry("mcunet", "mcunet-5fps", lambda: nets.ProxylessNASNets.build_from_config(mcunet_5fps_config())),
        # the 256KB paper's variant: no feature-mix conv, no dropout (mcunet's own MobileNetV2 class)
        Entry(
            "mcunet",
            "mbv2-w0.35",
            lambda: nets.MobileNetV2(n_classes=CLASSES, width_mult=0.35, dropout_rate=0, no_mix_layer=True),
        ),
    ]


# ----------------------------------------------------------------------------- registry
CORPUS: dict[str, list[Entry]] = {
    "geffnet": _geffnet(),
    "efficientnet_pytorch": _efficientnet_pytorch(),
    "efficientnet_lite_pytorch": _efficientnet_lite(),
    "ofa": _ofa(),
    "mcunet": _mcunet(),
}
FAMILIES = list(CORPUS)

#: the default (fast) selection: one model per family, each covering the trickiest constructs
ONE_PER_FAMILY_NAMES = {
    # Conv2dSame (pads in forward from the input size), custom autograd Function h-swish / h-sigmoid
    # (geffnet's memory-efficient activations), SE with a functional gate, ReLU
    "geffnet": "tf_mobilenetv3_large_100",
    # MemoryEfficientSwish (custom autograd Function), drop connect (rand / floor in train mode),
    # static same padding, F.adaptive_avg_pool2d SE
    "efficientnet_pytorch": "efficientnet-b0",
    # a fork of the above without SE / swish: ReLU6, drop connect
    "efficientnet_lite_pytorch": "efficientnet-lite0",
    # elastic supernet at a sampled config: dynamic convs that slice their weights in forward
    # (F.conv2d(x, self.conv.weight[:out, :in, ...])), dynamic BN via F.batch_norm, SE, h-swish
    "ofa": "OFAMobileNetV3-sampled",
    # ProxylessNASNets from a config dict, x.mean(3).mean(2) pooling, identity shortcuts
    "mcunet": "mcunet-5fps",
}


def entries(families=None, include_heavy: bool = True) -> list[Entry]:
    return [e for f in (families or FAMILIES) for e in CORPUS[f] if include_heavy or not e.heavy]


def get(id_or_name: str) -> Entry:
    for e in entries():
        if id_or_name in (e.id, e.name):
            return e
    raise KeyError(id_or_name)


ONE_PER_FAMILY: list[Entry] = [get(f"{f}:{n}") for f, n in ONE_PER_FAMILY_NAMES.items() if f not in MISSING]


# ----------------------------------------------------------------------------- checks
# The measurements the corpus is held to (shared by tests/test_corpus.py and
# benchmarks/real_clients.py). Every check runs on a real CPU model at the entry's small shape.

STRATEGIES = ("full", "last", "norm", "bias", "lastk")


def strategy_options(method: str, graph) -> dict:
    """lastk: the last 2 blocks where the graph has blocks, else the last 3 layers."""
    if method != "lastk":
        return {}
    return {"blocks": 2} if graph.blocks else {"layers": 3}


def data(shape, classes: int = CLASSES):
    g = torch.Generator().manual_seed(1)
    return torch.randn(shape, generator=g), torch.randint(0, classes, (shape[0],), generator=g)


def measure_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[int, int]:
    """(forward, backward) conv / linear / matmul FLOPs of one real step, as tests/test_flops.py
    measures them: FlopCounterMode, backward with the group-aware convolution_backward formula."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from memplan.costs.observe import conv_backward_flops

    with FlopCounterMode(display=False) as fwd:
        loss = F.cross_entropy(model(x), y)
    with FlopCounterMode(
        display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops}
    ) as bwd:
        if loss.requires_grad:
            loss.backward()
    model.zero_grad(set_to_none=True)
    return fwd.get_total_flops(), bwd.get_total_flops()


@dataclass
class PairResult:
    """One model x strategy: predictions, measurements and the apply_* checks."""

    model: str
    method: str
    options: dict
    capture: str = ""
    predicted_bytes: int | None = None
    measured_bytes: int | None = None
    unknown_ops: dict | None = None
    observed_ops: dict | None = None
    predicted_fwd_flops: int | None = None
    measured_fwd_flops: int | None = None
    predicted_bwd_flops: int | None = None
    measured_bwd_flops: int | None = None
    eval_identical: bool | None = None  # eval outputs after apply_strategy == plain PyTorch's under the plan
    eval_max_diff: float | None = None
    #: informational: max |diff| of the applied model's eval outputs from an untouched copy's (all
    #: parameters requiring grad). Nonzero only where torch itself picks another kernel by the
    #: ``requires_grad`` flags the plan sets (matmul folding, the SDPA kernel): plain training
    #: under the same plan computes the same thing, which is what ``eval_identical`` compares.
    eval_original_diff: float | None = None
    loss_identical: bool | None = None  # train-mode loss (same dropout draw) after apply_strategy == plain's
    grads_close: bool | None = None  # every trainable parameter's gradient allclose to plain autograd's (GRAD_*)
    grads_strict: bool | None = None  # ... at tests/test_apply.py's tolerance (rtol 1e-5, atol 1e-7)
    grad_mismatch: str = ""
    applied_predicted: int | None = None
    applied_measured: int | None = None
    check_observed: int | None = None  # memplan.check (--check): saved bytes of a meta run (informational)
    check_differing: list = field(default_factory=list)  # modules where --check sees a difference
    errors: dict = field(default_factory=dict)  # stage -> one-line error

    @property
    def bytes_exact(self) -> bool:
        return self.predicted_bytes is not None and self.predicted_bytes == self.measured_bytes

    @property
    def flagged(self) -> bool:
        return bool(self.unknown_ops or self.observed_ops)

    @property
    def rel_error(self) -> float | None:
        if self.predicted_bytes is None or not self.measured_bytes:
            return None
        return (self.predicted_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def flops_exact(self) -> bool:
        return (
            self.predicted_fwd_flops is not None
            and self.predicted_fwd_flops == self.measured_fwd_flops
            and self.predicted_bwd_flops == self.measured_bwd_flops
        )

    @property
    def applied_exact(self) -> bool:
        return self.applied_predicted is not None and self.applied_predicted == self.applied_measured

    def problems_beyond_bytes(self, where: str) -> list[str]:
        """What is not exact besides the saved bytes: FLOPs, ``--check``, and the model after apply."""
        out = []
        if not self.flops_exact:
            out.append(
                f"{where}: FLOPs {self.predicted_fwd_flops} / {self.predicted_bwd_flops}, "
                f"measured {self.measured_fwd_flops} / {self.measured_bwd_flops}"
            )
        if self.check_differing or self.check_observed != self.measured_bytes:
            out.append(f"{where}: --check {self.check_observed} vs {self.measured_bytes}: {self.check_differing[:2]}")
        if not (self.eval_identical and self.loss_identical and self.grads_close and self.applied_exact):
            out.append(
                f"{where}: apply: eval identical {self.eval_identical}, loss identical {self.loss_identical}, "
                f"grads {self.grad_mismatch or 'ok'}, applied {self.applied_predicted} vs {self.applied_measured}"
            )
        return out

    @property
    def ok(self) -> bool:
        return (
            not set(self.errors) - {"check"}
            and (self.bytes_exact or self.flagged)
            and self.flops_exact
            and bool(self.eval_identical)
            and bool(self.loss_identical)
            and bool(self.grads_close)
            and self.applied_exact
        )


#: gradient tolerance: rtol as tests/test_apply.py, atol relative to the gradient's own scale. A lean
#: op sums in another order than the stock backward kernel (e.g. a norm shift's gradient, a sum over
#: batch x H x W): on gradients of magnitude ~10 float32 reordering gives ~1e-6 absolute differences,
#: with both results equally far from a float64 reference (mobilenetv2_120d, bias: plain 4.8e-5,
#: lean 4.6e-5 from float64 at max |grad| 15.5), which test_apply's fixed atol 1e-7 cannot absorb.
GRAD_RTOL, GRAD_ATOL, GRAD_SCALE_ATOL = 1e-5, 1e-7, 1e-6


def grads_match(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """allclose at GRAD_*; non-finite entries (a random-init giant such as efficientnet_l2 overflows
    in plain autograd too) must sit at the same places with the same values."""
    finite = ref[torch.isfinite(ref)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    return torch.allclose(got, ref, rtol=GRAD_RTOL, atol=GRAD_ATOL + GRAD_SCALE_ATOL * scale, equal_nan=True)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _training_flags(model: nn.Module) -> dict[nn.Module, bool]:
    return {m: m.training for m in model.modules()}


def _restore(flags: dict[nn.Module, bool]) -> None:
    for m, t in flags.items():
        m.training = t


def capture_entry(base: nn.Module, shape):
    import memplan

    return memplan.capture(copy.deepcopy(base), shape[1:], batch=shape[0]).graph


def check_pair(
    base: nn.Module,
    graph,
    shape,
    method: str,
    name: str = "",
    *,
    raise_errors: bool = False,
    apply_checks: bool = True,
    flops: Callable | None = None,
) -> PairResult:
    """Checks 1-3 for ``method`` on ``base`` (left untouched; every run is on a deep copy).

    ``graph`` is ``memplan.capture(...).graph`` of a copy of ``base`` at ``shape``. 1: ``pytorch``-mode saved
    bytes vs ``saved_tensors_hooks``. 2: forward / backward FLOPs vs FlopCounterMode. 3 (with
    ``apply_checks``): ``apply_strategy`` on a copy: eval outputs bit-identical to plain
    PyTorch's under the same plan (``apply_plain``'s ``requires_grad`` flags), train-mode loss
    identical and trainable gradients allclose to plain autograd's, ``applied`` prediction ==
    measurement. Also recorded, informational: ``memplan.check`` (the meta-device
    self-check) against the measurement. With ``raise_errors`` a failing stage raises instead of being
    recorded (the informational self-check never raises). ``flops(model, x, y)`` measures a step's
    (forward, backward) FLOPs (default :func:`measure_flops`).
    """
    owners = [(n, n.module) for n in graph.nodes]  # the checks point the graph at their copies: restore
    try:
        return _check_pair(
            base,
            graph,
            shape,
            method,
            name,
            raise_errors=raise_errors,
            apply_checks=apply_checks,
            flops=flops or measure_flops,
        )
    finally:
        for node, module in owners:
            node.module = module


def _check_pair(
    base: nn.Module, graph, shape, method: str, name: str, *, raise_errors: bool, apply_checks: bool, flops: Callable
) -> PairResult:
    import torch.nn.functional as F

    import memplan
    from memplan.accounting.engine import compute
    from memplan.apply import apply_plain
    from memplan.modes import get_mode
    from memplan.strategies import make_plan
    from memplan.verify.measure import model_modules, saved_bytes

    opts = strategy_options(method, graph)
    res = PairResult(name, method, opts, capture=graph.capture)
    x, y = data(shape)

    def stage(label: str, fn) -> bool:
        try:
            fn()
            return True
        except Exception as exc:
            if raise_errors:
                raise
            res.errors[label] = one_line(exc)
            return False

    plan = None

    def plain_checks() -> None:
        nonlocal plan
        plan = make_plan(graph, method, **opts)
        prof = compute(graph, plan, get_mode("pytorch"))
        t = prof.totals
        res.predicted_bytes = t.saved_activation_bytes
        res.unknown_ops, res.observed_ops = dict(prof.unknown_ops), dict(prof.observed_ops)
        res.predicted_fwd_flops = t.forward_flops
        res.predicted_bwd_flops = t.backward_grad_input_flops + t.backward_grad_weight_flops
        model = copy.deepcopy(base)
        model_modules(model, graph)
        apply_plain(model, graph, plan)
        torch.manual_seed(3)
        # backward=True: without a backward the autograd graph of the hooked run is never freed
        # (memplan.verify.measure.saved_bytes keeps the packed tensors, a reference cycle gc cannot see)
        res.measured_bytes = saved_bytes(model, x, y, backward=True).bytes
        model.zero_grad(set_to_none=True)
        torch.manual_seed(3)
        res.measured_fwd_flops, res.measured_bwd_flops = flops(model, x, y)

    if not stage("pytorch", plain_checks):
        return res

    def self_check() -> None:  # informational: `memplan profile --check` (issue item 5), where it exists
        try:
            from memplan.check import check
        except ImportError:
            return
        model = copy.deepcopy(base)
        model_modules(model, graph)
        out = check(model, graph, plan)
        res.check_observed = out.observed
        res.check_differing = [f"{r.module or '<model>'}: {r.predicted} vs {r.observed}" for r in out.differing][:5]

    try:
        self_check()
    except Exception as exc:  # informational: recorded, never raised
        res.errors["check"] = one_line(exc)
    if not apply_checks:
        return res

    lean = copy.deepcopy(base)
    plain = copy.deepcopy(base)

    def apply() -> None:
        out = memplan.apply_strategy(lean, method, input_shape=shape, **opts)
        assert out is lean, "apply_strategy returned another object"

    if not stage("apply_strategy", apply):
        return res

    def eval_outputs() -> None:
        # the reference is plain PyTorch under the same plan (apply_plain: the same requires_grad
        # flags): torch picks some kernels by them (matmul folding, the SDPA kernel by grad mode)
        model_modules(plain, graph)
        apply_plain(plain, graph, plan)
        flags = {**_training_flags(lean), **_training_flags(plain)}
        plain.eval(), lean.eval()
        with torch.no_grad():
            a, b = plain(x), lean(x)
            original = copy.deepcopy(base).eval()(x)
        a_grad, c = plain(x).detach(), lean(x).detach()  # autograd on: the lean autograd ops run
        res.eval_identical = torch.equal(a, b) and torch.equal(a_grad, c)
        res.eval_max_diff = max((a - b).abs().max().item(), (a_grad - c).abs().max().item())
        res.eval_original_diff = (original - b).abs().max().item()
        _restore(flags)

    stage("eval", eval_outputs)

    def gradients() -> None:
        model_modules(plain, graph)
        apply_plain(plain, graph, plan)
        losses = []
        for m in (plain, lean):
            torch.manual_seed(5)  # the same dropout / drop-connect draw
            loss = F.cross_entropy(m(x), y)
            loss.backward()
            losses.append(loss.detach())
        res.loss_identical = torch.equal(losses[0], losses[1])
        lean_params = dict(lean.named_parameters())
        bad, strict = [], []
        trainable = [(n, p) for n, p in plain.named_parameters() if p.requires_grad]
        for pname, p in trainable:
            q = lean_params.get(pname)
            if q is None or q.grad is None or p.grad is None or not q.requires_grad:
                bad.append(f"{pname}: missing")
            elif not grads_match(q.grad, p.grad):
                bad.append(
                    f"{pname}: max diff {(q.grad - p.grad).abs().max().item():.3g} "
                    f"(max |grad| {p.grad.abs().max().item():.3g})"
                )
            elif not torch.allclose(q.grad, p.grad, rtol=1e-5, atol=1e-7):
                strict.append(pname)
        extra = sorted({n for n, p in lean.named_parameters() if p.requires_grad} - {n for n, _ in trainable})
        bad += [f"{n}: trains after apply_strategy only" for n in extra]
        res.grads_close = not bad
        res.grads_strict = not bad and not strict
        res.grad_mismatch = "; ".join(bad[:3]) + (f" (+{len(bad) - 3} more)" if len(bad) > 3 else "")
        lean.zero_grad(set_to_none=True)

    stage("gradients", gradients)

    def applied() -> None:
        res.applied_predicted = compute(graph, plan, get_mode("applied")).totals.saved_activation_bytes
        torch.manual_seed(3)
        res.applied_measured = saved_bytes(lean, x, y, backward=True).bytes

    stage("applied", applied)
    return res
