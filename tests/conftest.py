import os

import pytest
import torch

torch.set_num_threads(1)
os.environ.setdefault("MEMPLAN_NUM_THREADS", "1")

from memplan import zoo  # noqa: E402

#: small per-model test resolutions: the cost rules do not depend on the size, so keep runs fast
SMALL = 32


def small_shape(name: str, batch: int = 2, resolution: int | None = None) -> tuple[int, ...]:
    entry = zoo.get_entry(name)
    res = resolution or (SMALL if entry.resolution >= 64 else entry.resolution)
    return (batch, *entry.input_shape(res))


@pytest.fixture(scope="session")
def zoo_names() -> list[str]:
    return zoo.names()
