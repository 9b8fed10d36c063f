"""CIFAR-10 for the transfer benchmark (benchmarks/transfer_data.py): the JPEG npz format of the
shared copy, read through memplan's ``file.py:factory`` data source; the pixels are Pillow's own
decoding of each image's bytes, the labels as stored; a missing folder is one clear line."""

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from memplan.contrib.data import load_data
from memplan.contrib.data.core import BadData

from .helpers import load_benchmark

SPEC = str(Path(__file__).resolve().parents[1] / "benchmarks" / "transfer_data.py") + ":cifar10"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "cifar10"


def write_split(path: Path, labels: list[int], seed: int) -> list[bytes]:
    """A split in the shared copy's format (random 32x32 JPEGs); the JPEG bytes of each image."""
    rng = np.random.default_rng(seed)
    blobs = []
    for _ in labels:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
        blobs.append(buf.getvalue())
    offsets = np.cumsum([0, *map(len, blobs)]).astype(np.int64)
    jpeg = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    np.savez(path, jpeg=jpeg, offsets=offsets, labels=np.asarray(labels, dtype=np.uint8))
    return blobs


def test_cifar10_reads_the_shared_format_through_the_factory_source(tmp_path, monkeypatch):
    train_labels = [c for c in range(10) for _ in range(3)]
    blobs = write_split(tmp_path / "cifar10-train-jpeg.npz", train_labels, 0)
    write_split(tmp_path / "cifar10-test-jpeg.npz", list(range(10)), 1)
    monkeypatch.setenv("MEMPLAN_CIFAR10", str(tmp_path))
    data = load_benchmark("transfer_data")
    arrays = data.cifar10()
    assert arrays["x_train"].shape == (30, 32, 32, 3) and arrays["x_train"].dtype == np.uint8
    assert arrays["y_train"].tolist() == train_labels and arrays["y_test"].tolist() == list(range(10))
    for i in (0, 17, 29):
        assert np.array_equal(arrays["x_train"][i], np.asarray(Image.open(io.BytesIO(blobs[i])).convert("RGB")))
    task = load_data(SPEC, (3, 64, 64), validation=1)  # memplan's own loader, as the benchmark calls it
    assert task.classes == 10 and tuple(task.x_train.shape[1:]) == (3, 64, 64)
    assert task.x_val.shape[0] == 10 and task.x_train.shape[0] == 20 and task.x_test.shape[0] == 10


def test_a_missing_folder_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPLAN_CIFAR10", str(tmp_path / "nowhere"))
    with pytest.raises(BadData, match="not in .*nowhere.*MEMPLAN_CIFAR10") as exc:
        load_data(SPEC, (3, 64, 64))
    assert "\n" not in str(exc.value)


@pytest.mark.skipif(not (SHARED / "cifar10-test-jpeg.npz").is_file(), reason="the shared CIFAR-10 copy is not here")
def test_the_shared_test_split_has_1000_images_per_class():
    x, y = load_benchmark("transfer_data").read_jpeg_npz(SHARED / "cifar10-test-jpeg.npz")
    assert x.shape == (10000, 32, 32, 3) and np.bincount(y).tolist() == [1000] * 10
