"""The model's input convention reaches contribution analysis (``ZooEntry.normalize``): the 256KB
paper's int8 graphs take the "MCU transform" ``pixel - 127.5``, their fp32 forms ``(x - 0.5) / 0.5``;
other zoo models are standardised with the training images' moments. Checked on the prepared
task against the sample images decoded and resized here, through ``contrib measure`` (recorded
in the profile) and back through ``memplan.train.prepare`` (the validation stage's setup)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import memplan.train
from memplan.cli import main
from memplan.contrib.setup import Split, build_setup

torch.set_num_threads(1)

SAMPLE = Path(__file__).parent / "data" / "cifar10-sample"
SIDE = 48


def sample_train_images() -> torch.Tensor:
    """The sample's training images as float32 N x 3 x H x W in [0, 255], decoded here with PIL."""
    d = np.load(SAMPLE / "cifar10-sample-train-jpeg.npz")
    jpeg, offsets = d["jpeg"], d["offsets"]
    pixels = [
        np.asarray(Image.open(io.BytesIO(jpeg[a:b].tobytes())).convert("RGB"))
        for a, b in zip(offsets[:-1], offsets[1:])
    ]
    return torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2).float()


def resized(pixels: torch.Tensor) -> torch.Tensor:
    """Images in [0, 1] at SIDE px (bilinear, antialiased), as a model at that resolution sees them."""
    return F.interpolate(pixels / 255, size=(SIDE, SIDE), mode="bilinear", align_corners=False, antialias=True)


def setup(model: str):
    return build_setup(model, None, str(SAMPLE), resolution=SIDE, split=Split(validation=None, train_per_class=12))


@pytest.mark.parametrize(
    ("model", "expected"),
    [("mcunet-5fps-int8", lambda x: x * 255 - 127.5), ("mcunet-5fps-fp32", lambda x: (x - 0.5) / 0.5)],
)
def test_int8_backbones_take_the_mcu_transform(model, expected):
    s = setup(model)
    want = expected(resized(sample_train_images()))
    assert s.task.x_train.shape == want.shape  # 12 per class keeps every training image, in order
    torch.testing.assert_close(s.task.x_train, want, atol=2e-3, rtol=0)
    assert s.dataset["normalization"]["from"] == "the model's input convention"


def test_other_zoo_models_standardise_on_the_training_images():
    s = setup("mcunet-5fps")
    x = resized(sample_train_images())
    mean, std = x.mean((0, 2, 3), keepdim=True), x.std((0, 2, 3), keepdim=True)
    torch.testing.assert_close(s.task.x_train, (x - mean) / std, atol=1e-4, rtol=1e-4)
    assert s.dataset["normalization"] == {
        "from": "the training images",
        "mean": pytest.approx(mean.flatten().tolist(), abs=1e-6),
        "std": pytest.approx(std.flatten().tolist(), abs=1e-6),
    }


def test_contrib_measure_feeds_the_int8_graph_its_own_input(tmp_path, capsys):
    """A cheap measure of mcunet-5fps-int8 on the sample runs, records the convention, and the
    training setup rebuilt from the profile (validation stage, ``memplan.train.prepare``) uses it."""
    out = tmp_path / "p.json"
    args = ["contrib", "measure", "mcunet-5fps-int8", "--data", str(SAMPLE), "-r", "32", "--estimator", "fisher"]
    with pytest.raises(SystemExit) as exc:
        main([*args, "--batches", "1", "--probe-epochs", "1", "-j", "1", "--threads", "1", "--out", str(out)])
    assert exc.value.code == 0
    # a gradient estimator trains no run: its numbers come from training batches, not the validation split
    said = " ".join(capsys.readouterr().out.split())
    assert "measured by fisher from training-data gradients" in said
    assert "linear probe" in said and "on the validation split" in said  # the probe is scored there
    norm = json.loads(out.read_text())["dataset"]["normalization"]
    assert norm == {"from": "the model's input convention", "mean": [0.5] * 3, "std": pytest.approx([1 / 255] * 3)}
    prepared = memplan.train.prepare(out)
    assert prepared.data.mean.flatten().tolist() == [0.5] * 3
    images = np.full((1, 32, 32, 3), 255, np.uint8)
    torch.testing.assert_close(prepared.transform(images), torch.full((1, 3, 32, 32), 127.5))
