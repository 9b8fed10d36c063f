import atexit
import os
import shutil
import tempfile

import pytest
import torch
from hypothesis import HealthCheck, settings

torch.set_num_threads(1)
os.environ.setdefault("MEMPLAN_NUM_THREADS", "1")
# kernel-workspace calibrations (memplan calibrate) of this test session only: never the user's cache
os.environ["MEMPLAN_CACHE"] = tempfile.mkdtemp(prefix="memplan-test-cache-")
atexit.register(shutil.rmtree, os.environ["MEMPLAN_CACHE"], True)

# hypothesis profiles: `ci` (default) is reproducible and fixed-size; `pytest --hypothesis-profile long`
# runs thousands of random examples (failures are kept in .hypothesis/ and replayed first)
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=False,
)
settings.register_profile(
    "long",
    max_examples=5000,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile("ci")

from memplan.models import zoo  # noqa: E402

#: small per-model test resolutions: the cost rules do not depend on the size, so keep runs fast
SMALL = 32


def small_shape(name: str, batch: int = 2, resolution: int | None = None) -> tuple[int, ...]:
    entry = zoo.get_entry(name)
    res = resolution or (SMALL if entry.resolution >= 64 else entry.resolution)
    return (batch, *entry.input_shape(res))


@pytest.fixture(scope="session")
def zoo_names() -> list[str]:
    return zoo.names()


def pytest_collection_modifyitems(config, items):
    """Tests marked ``slow`` run only when the marker expression names them (``-m slow``)."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="long run: select it with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
