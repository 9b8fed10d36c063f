"""memplan.verify: predicted vs measured for plain PyTorch and the applied setup."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
from rich.console import Console

import memplan.verify as verify_module
from memplan.errors import BadOption
from memplan.render.reports import print_verify
from memplan.verify import EXIT_MISMATCH, verify
from memplan.verify.measure import SavedMeasurement

from .helpers import real_model


def rendered(report) -> str:
    console = Console(record=True, width=200)
    print_verify(report, console)
    return console.export_text()


def test_verify_bias_matches_and_saves():
    report = verify("proxylessnas-mobile", "bias", batch=2, resolution=64, classes=10)
    assert report.ok and report.device == "cpu" and report.input_shape == [2, 3, 64, 64]
    for run in (report.pytorch, report.applied):
        assert run.measured_saved == run.predicted_saved > 0
        assert len(run.losses) == 2 and run.losses[1] < run.losses[0]
        assert run.measured_peak is not None and run.measured_peak > run.measured_saved
    assert report.saving >= 10
    # plain PyTorch keeps ~10 MB more for backward here: the measured peaks show it too
    assert report.applied.measured_peak < report.pytorch.measured_peak
    text = rendered(report)
    assert "saved activations" in text and "ok" in text
    assert str(report.pytorch.measured_saved) in text and str(report.applied.measured_saved) in text


def test_verify_reports_mismatch(monkeypatch):
    real = verify_module.saved_bytes
    monkeypatch.setattr(verify_module, "saved_bytes", lambda *a: SavedMeasurement(real(*a).bytes + 3))
    report = verify("mcunet-5fps", "last", batch=2, resolution=32, classes=10, steps=1)
    assert not report.ok and report.applied.saved_error == 3
    assert "mismatch" in rendered(report)
    assert EXIT_MISMATCH == 1
    assert verify("mcunet-5fps", "last", batch=2, resolution=32, classes=10, steps=1, tolerance=3).ok
    assert "CUDA" not in rendered(report)  # the CPU's run: pytorch mode is its convention
    monkeypatch.setattr(verify_module, "saved_bytes", lambda *a: SavedMeasurement(real(*a).bytes - 7680))
    on_gpu = dataclasses.replace(
        verify("mcunet-5fps", "last", batch=2, resolution=32, classes=10, steps=1), device="cuda"
    )
    assert "predicts eager PyTorch on the CPU" in rendered(on_gpu)


def test_verify_sparse_scheme_option_and_module_input_left_untouched():
    model = real_model("mbv2-w0.35")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    config = {"n_bias_update": 6, "n_weight_update": 2, "weight_update_ratio": [0.5, 0.25]}
    report = verify(model, "sparse", batch=2, resolution=32, scheme=config, optimizer="sgd-momentum")
    assert report.ok and report.applied.predicted_saved < report.pytorch.predicted_saved
    assert all(
        type(m).__module__.startswith("torch.nn") or type(m).__module__.startswith("memplan.models.zoo")
        for m in model.modules()
    )
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())


def test_verify_importance_scheme_file(tmp_path):
    """A scheme whose sub-channel updates list their channels (schema 2, ``importance``) verifies
    byte-exact, and the applied setup keeps what the same ratios by weight norm keep."""
    from memplan.graph.capture import capture_graph
    from memplan.nn.lean import top_channels
    from memplan.plan import Scheme

    model = real_model("mbv2-w0.35")
    graph = capture_graph(model, (2, 3, 32, 32))
    config = {"n_bias_update": 6, "n_weight_update": 2, "weight_update_ratio": [0.5, 0.25]}
    base = Scheme.from_backward_config(config, graph)
    gen = torch.Generator().manual_seed(4)
    updates = []
    for w in base.weight_updates:
        weight = model.get_submodule(w.layer).weight
        c_in = weight.shape[1] * model.get_submodule(w.layer).groups
        chosen = top_channels(torch.rand(c_in, generator=gen), w.ratio)
        updates.append(w.model_copy(update={"select": "importance", "channels": chosen, "importance_source": "rand"}))
    path = tmp_path / "importance.json"
    base.model_copy(update={"weight_updates": updates}).save(path)
    report = verify(model, "sparse", batch=2, resolution=32, scheme=str(path), steps=1)
    assert report.ok and report.applied.measured_saved == report.applied.predicted_saved > 0
    plain = verify(model, "sparse", batch=2, resolution=32, scheme=config, steps=1)
    assert report.applied.measured_saved == plain.applied.measured_saved


def test_verify_bad_input():
    with pytest.raises(BadOption):
        verify("mcunet-5fps", "bias", device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(BadOption, match="no CUDA"):
            verify("mcunet-5fps", "bias", device="cuda")
    with pytest.raises(BadOption):
        verify(nn.Sequential(nn.Flatten(), nn.Linear(12, 2)), "last", steps=0)
