"""``split_seed`` (``memplan contrib measure --split-seed``, the transfer protocol's ``split_seed``):
another seed carves other validation and training images from the same training split, a fresh
replicate of the task; the test split is the source's own whatever the seed; the seed is recorded
where it is not 0 (so every profile and checkpoint written before it keeps its identity) and a
final evaluation rebuilds the same split from the record."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from memplan.contrib.setup import AS_BUILT, Split, build_setup, setup_of
from memplan.errors import MemplanError

torch.set_num_threads(1)

SAMPLE = str(Path(__file__).parent / "data" / "cifar10-sample")  # 12 training images per class
MODEL, SIDE = "mcunet-5fps-fp32", 32


def rows(x: torch.Tensor) -> set[bytes]:
    """Each image of ``x`` as its bytes: sets of images compare independently of their order."""
    return {img.numpy().tobytes() for img in x}


def setup(seed: int):
    return build_setup(MODEL, None, SAMPLE, resolution=SIDE, split=Split(3, 6, seed=seed))


def test_another_seed_carves_other_images_and_keeps_the_test_split():
    a, b = setup(0), setup(5)
    for s in (a, b):
        assert s.task.x_val.shape[0] == 30 and s.task.x_train.shape[0] == 60
        assert not rows(s.task.x_val) & rows(s.task.x_train)  # validation is never trained on
    assert rows(a.task.x_val) != rows(b.task.x_val)
    assert rows(a.task.x_train) != rows(b.task.x_train)
    torch.testing.assert_close(a.task.x_test, b.task.x_test, rtol=0, atol=0)
    assert a.dataset["digest"] != b.dataset["digest"]
    assert "split_seed" not in a.dataset and b.dataset["split_seed"] == 5


def test_a_profile_rebuilds_its_own_split():
    s = setup(5)
    profile = SimpleNamespace(model=MODEL, weights={"source": AS_BUILT}, input_shape=list(s.shape), dataset=s.dataset)
    assert rows(setup_of(profile).task.x_val) == rows(s.task.x_val)
    profile.dataset = {**s.dataset, "split_seed": 6}  # recorded wrongly: other images, refused by digest
    with pytest.raises(MemplanError, match="differs from what the profile was measured on"):
        setup_of(profile)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_a_bad_seed_is_one_line(bad):
    with pytest.raises(MemplanError, match="the split's seed must be a non-negative integer"):
        setup(bad)
