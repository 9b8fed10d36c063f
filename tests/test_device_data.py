"""benchmarks/device_data.py: a protocol's data made small enough to travel to a lent GPU. On
small synthetic copies of both sources (Fashion-MNIST's idx files, CIFAR-10's JPEG npz), the
reduced files keep exactly the training images the protocol reads, blank the rest, and give the
same task, tensor for tensor, as the originals; other data is refused in one line."""

import gzip
import json

import numpy as np
import pytest
import torch

from memplan.contrib.data import load_data

from .helpers import load_benchmark
from .test_transfer_data import SPEC, write_split

PROTOCOL = {"resolution": 8, "validation": 2, "train_per_class": 3, "test_per_class": None}
PER_CLASS, CLASSES = 8, 10


def idx(path, a: np.ndarray) -> None:
    head = bytes([0, 0, 0x08, a.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in a.shape)
    path.write_bytes(gzip.compress(head + a.astype(np.uint8).tobytes()))


def task(spec: str, split_seed: int = 0):
    return load_data(spec, (3, 8, 8), 3, validation=2, seed=split_seed)


def same_task(a, b) -> bool:
    return all(torch.equal(getattr(a, k), getattr(b, k)) for k in ("x_train", "y_train", "x_val", "y_val", "x_test"))


def reduce(tmp_path, data: str, split_seed: int = 0) -> tuple:
    proto = tmp_path / "protocol.json"
    proto.write_text(json.dumps({**PROTOCOL, "data": data, "split_seed": split_seed}))
    dest = tmp_path / "dest"
    load_benchmark("device_data").main([str(proto), str(dest)])
    return dest


@pytest.mark.parametrize("split_seed", [0, 3])  # another split reads other images
def test_fashion_mnist_keeps_the_read_images_and_the_task(tmp_path, monkeypatch, split_seed):
    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    src.mkdir()
    labels = np.repeat(np.arange(CLASSES), PER_CLASS)
    images = rng.integers(1, 256, (len(labels), 28, 28))  # no image is all zeros
    idx(src / "train-images-idx3-ubyte.gz", images)
    idx(src / "train-labels-idx1-ubyte.gz", labels)
    idx(src / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (CLASSES, 28, 28)))
    idx(src / "t10k-labels-idx1-ubyte.gz", np.arange(CLASSES))
    monkeypatch.setenv("MEMPLAN_FASHION_MNIST", str(src))
    original = task("fashion-mnist", split_seed)
    dest = reduce(tmp_path, "fashion-mnist", split_seed)
    reduced = load_benchmark("device_data").read_idx(dest / "train-images-idx3-ubyte.gz")
    nonzero = reduced.reshape(len(labels), -1).any(1)
    assert nonzero.sum() == CLASSES * (2 + 3)  # validation + training subset per class
    assert np.array_equal(reduced[nonzero], images[nonzero])
    monkeypatch.setenv("MEMPLAN_FASHION_MNIST", str(dest))
    assert same_task(task("fashion-mnist", split_seed), original)


def test_cifar10_keeps_the_read_images_and_the_task(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    blobs = write_split(src / "cifar10-train-jpeg.npz", [c for c in range(CLASSES) for _ in range(PER_CLASS)], 0)
    write_split(src / "cifar10-test-jpeg.npz", list(range(CLASSES)), 1)
    monkeypatch.setenv("MEMPLAN_CIFAR10", str(src))
    original = task(SPEC)
    dest = reduce(tmp_path, "benchmarks/transfer_data.py:cifar10")
    with np.load(dest / "cifar10-train-jpeg.npz") as z:
        raw, offsets = z["jpeg"].tobytes(), z["offsets"]
    kept = [raw[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    assert sum(k in blobs for k in kept) == CLASSES * (2 + 3)
    assert (dest / "cifar10-test-jpeg.npz").read_bytes() == (src / "cifar10-test-jpeg.npz").read_bytes()
    monkeypatch.setenv("MEMPLAN_CIFAR10", str(dest))
    assert same_task(task(SPEC), original)


def test_other_data_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="reads 'digits'"):
        reduce(tmp_path, "digits")
