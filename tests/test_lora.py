"""LoRA (``--method lora``): the predicted saved bytes and trainable parameters equal those of
``peft``'s own LoRA model (``get_peft_model``), measured on a real CPU step with
``saved_tensors_hooks``, on a Hugging Face ViT and on a CNN with conv targets; the scheme format
carries the adapters and ``apply_scheme`` builds them again (the same outputs at initialisation,
lora_B = 0); the one-line refusals."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import memplan
from memplan.apply import apply_scheme, apply_strategy
from memplan.cli import main
from memplan.errors import BadOption
from memplan.nn.lora import LORA_ATTR, LoRA
from memplan.plan import Scheme, load_scheme
from memplan.strategies import make_plan
from memplan.verify.measure import saved_bytes

from .setups_corpus import SmallCNN
from .transformers_corpus import ENTRIES, MISSING

try:  # the lora extra (in the test extra too); memplan's own LoRA needs nothing more
    import peft

    NO_PEFT = ""
except ImportError as exc:  # pragma: no cover
    peft, NO_PEFT = None, f"{type(exc).__name__}: {exc} (pip install 'memplan[lora]')"
needs_peft = pytest.mark.skipif(bool(NO_PEFT), reason=NO_PEFT)


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN()


def _vit() -> nn.Module:
    return next(e for e in ENTRIES if e.name == "vit").build(32)


def _peft_measured(
    model: nn.Module, shape: tuple[int, ...], rank: int, targets: list[str], head: str, amp: bool = False
):
    """(saved bytes, trainable parameters) of one real step of peft's LoRA model of ``model``
    (the classifier trained whole: ``modules_to_save``; BatchNorms in eval mode, the frozen base's
    statistics), under bfloat16 autocast with ``amp``."""
    config = peft.LoraConfig(r=rank, lora_alpha=8, target_modules=targets, modules_to_save=[head])
    pm = peft.get_peft_model(copy.deepcopy(model), config).train()
    for m in pm.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn((2, *shape), generator=g), torch.randint(0, 10, (2,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        saved = saved_bytes(pm, x, y, backward=True).bytes
    return saved, sum(p.numel() for p in pm.parameters() if p.requires_grad)


@needs_peft
@pytest.mark.skipif(bool(MISSING), reason=MISSING)
def test_lora_on_a_transformers_vit_equals_peft():
    vit = _vit()
    inner = vit.model  # peft adapts the transformers model; the wrapper only picks its logits
    saved, trainable = _peft_measured(inner, (3, 32, 32), 8, ["q_proj", "v_proj"], "classifier")
    p = memplan.profile(vit, "lora", batch=2, input_shape=(3, 32, 32), rank=8, targets="q_proj,v_proj")
    assert p.totals.saved_activation_bytes == saved
    assert p.totals.trainable_params == trainable


@pytest.mark.parametrize(
    "rank,targets",
    [(8, ["c1", "c2"]), (16, ["c1", "c2", "dw"]), (4, None)],
    ids=["convs", "depthwise", "default"],
)
@needs_peft
def test_lora_on_a_cnn_with_conv_targets_equals_peft(rank, targets):
    default = ["c1", "c2"]  # the default: every conv / linear but the classifier and the depthwise (4 % 16)
    saved, trainable = _peft_measured(_cnn(), (3, 16, 16), rank, targets or default, "fc")
    opts = {"rank": rank} | ({"targets": ",".join(targets)} if targets else {})
    p = memplan.profile(_cnn(), "lora", batch=2, input_shape=(3, 16, 16), calibration=None, **opts)
    assert p.totals.saved_activation_bytes == saved
    assert p.totals.trainable_params == trainable


@needs_peft
@pytest.mark.skipif(bool(MISSING), reason=MISSING)
def test_lora_under_autocast_equals_peft():
    """peft casts an adapter's input to the adapter's dtype: under autocast, a float32 copy of a
    bfloat16 input, which ``lora_A`` then casts down again into a copy it keeps."""
    saved, _ = _peft_measured(_cnn(), (3, 16, 16), 8, ["c1", "c2"], "fc", amp=True)
    p = memplan.profile(_cnn(), "lora", batch=2, input_shape=(3, 16, 16), targets="c1,c2", amp="bf16", calibration=None)
    assert p.totals.saved_activation_bytes == saved
    vit = _vit()
    saved, _ = _peft_measured(vit.model, (3, 32, 32), 8, ["q_proj", "v_proj"], "classifier", amp=True)
    p = memplan.profile(vit, "lora", batch=2, input_shape=(3, 32, 32), targets="q_proj,v_proj", amp="bf16")
    assert p.totals.saved_activation_bytes == saved


def test_the_lora_option_adds_the_adapters_to_any_strategy():
    """``-o lora=true`` builds the adapters (what a scheme's ``added_modules`` records); the strategy
    decides what trains: ``full`` trains them with everything else."""
    p = memplan.profile(_cnn(), "full", input_shape=(3, 16, 16), lora=True, lora_rank=4, calibration=None)
    adapters = {layer.name: layer.trainable_params for layer in p.layers if ".lora_" in layer.name}
    # c1 (3 -> 8, 3x3) and c2 (8 -> 16, 3x3): A = rank x C_in x 3 x 3, B = C_out x rank
    assert adapters == {"c1.lora_A": 4 * 3 * 9, "c1.lora_B": 8 * 4, "c2.lora_A": 4 * 8 * 9, "c2.lora_B": 16 * 4}
    plain = memplan.profile(_cnn(), "full", input_shape=(3, 16, 16), calibration=None)
    assert p.totals.trainable_params == plain.totals.trainable_params + sum(adapters.values())


def test_a_scheme_carries_lora_and_apply_scheme_builds_it(tmp_path):
    cap = memplan.capture(_cnn(), batch=2, input_shape=(3, 16, 16), method="lora", method_options={"rank": 4})
    plan = make_plan(cap.graph, "lora", rank=4)
    scheme = Scheme.from_plan(cap.graph, plan)
    (added,) = scheme.added_modules
    assert added.architecture == "lora" and added.tag == LORA_ATTR
    assert added.options == {"lora": True, "lora_rank": 4, "lora_targets": None, "lora_alpha": 8}
    scheme.save(tmp_path / "lora.json")
    assert load_scheme(tmp_path / "lora.json") == scheme
    plain = _cnn().eval()
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        before = plain(x)
    applied = apply_scheme(copy.deepcopy(plain), tmp_path / "lora.json")
    assert sorted(q for q, m in applied.named_modules() if isinstance(m, LoRA)) == ["c1", "c2"]
    trains = sorted(n for n, p in applied.named_parameters() if p.requires_grad)
    assert trains == [
        "c1.lora_A.weight",
        "c1.lora_B.weight",
        "c2.lora_A.weight",
        "c2.lora_B.weight",
        "fc.bias",
        "fc.weight",
    ]
    with torch.no_grad():
        assert torch.equal(applied.eval()(x), before)  # lora_B starts at zero
    state = applied.state_dict()
    assert set(plain.state_dict()) <= set(state)  # the plain model's keys, the adapters' beside them
    assert {k for k in state if k not in plain.state_dict()} == {
        f"c{i}.lora_{ab}.weight" for i in (1, 2) for ab in "AB"
    }


def test_apply_strategy_lora_matches_peft_trainable_set():
    model = apply_strategy(_cnn(), "lora", rank=8, targets="c1,c2")
    trains = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trains == {
        "c1.lora_A.weight",
        "c1.lora_B.weight",
        "c2.lora_A.weight",
        "c2.lora_B.weight",
        "fc.weight",
        "fc.bias",
    }


@pytest.mark.parametrize(
    "opts,needle",
    [
        ({"targets": "nothing"}, "no module matches the lora targets nothing"),
        ({"targets": "bn"}, "lora target 'bn' is a BatchNorm2d"),
        ({"targets": "dw", "rank": 4}, "groups=16, which does not divide rank 4"),
        ({"rank": 0}, "--rank must be a positive integer"),
        ({"targets": "c1,fc"}, "lora target 'fc' is the classifier"),
    ],
)
def test_bad_lora_options_are_one_line(opts, needle):
    with pytest.raises(BadOption, match=needle):
        memplan.profile(_cnn(), "lora", input_shape=(3, 16, 16), **opts)


def test_lora_on_the_command_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["profile", "mcunet-5fps", "-r", "32", "-m", "lora", "-o", "rank=4", "-o", "targets=nothing"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and "no module matches" in lines[0]
    with pytest.raises(SystemExit) as exc:
        main(["profile", "mcunet-5fps", "-r", "32", "-m", "lora", "-o", "rank=4", "--calibration", "none"])
    assert exc.value.code == 0 and "method lora" in capsys.readouterr().out
