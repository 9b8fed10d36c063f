"""``memplan contrib validate`` (the additivity check, issue 39) is made while choosing, so it
measures on the profile's validation split, over at least 4 seeds of its own, trains each
distinct scheme once, and bounds its correlation by the seed-to-seed agreement of the stable
schemes (the collapse test is in test_real.py)."""

import pytest
import torch

from memplan.contrib.analysis import run_contrib
from memplan.errors import BadOption
from memplan.search.additivity import validate_profile
from memplan.search.options import ValidateOptions
from memplan.search.space import Candidate

from .test_real import make_npz

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("split")
    npz = make_npz(tmp / "task.npz", n=30)  # 3 classes: 12 validation images (4 per class), 30 test images
    protocol = dict(seeds=(0,), epochs=1, batch_size=8, probe_epochs=2, ratios=(0.5, 1.0))
    run_contrib("minilearn-cifar10", data=str(npz), out=tmp / "p.json", validation=4, **protocol)
    return tmp / "p.json"


def test_the_check_measures_distinct_schemes_on_validation_over_four_seeds(profile):
    check = validate_profile(profile, ["2KB", "8KB"], per_budget=3, bootstrap=50)
    assert "measured on the 12 validation images" in check.description
    assert "seeds [100, 101, 102, 103]" in check.description
    accuracies = [a for p in check.points for a in p.accuracy] + check.reference_accuracy
    assert all(len(p.accuracy) == 4 for p in check.points) and len(check.reference_accuracy) == 4
    assert all(abs(a * 12 / 100 - round(a * 12 / 100)) < 1e-6 for a in accuracies)  # multiples of 1/12
    names = [p.candidate for p in check.points]
    assert len(names) == len(set(names)) and Candidate(0).describe() not in names  # the reference is apart
    assert check.ceiling is None or check.ceiling["schemes"] <= len(check.points)
    tested = validate_profile(profile, ["8KB"], per_budget=3, bootstrap=50, split="test", searched=False)
    assert "measured on the 30 test images" in tested.description
    assert any("test split" in n for n in tested.notes)


@pytest.mark.parametrize("bad", [dict(seeds=(0, 1, 2)), dict(seeds=(0, 0, 1, 2)), dict(split="train")])
def test_too_few_seeds_or_an_unknown_split_is_refused(bad):
    with pytest.raises((BadOption, ValueError)):
        ValidateOptions(**bad)
