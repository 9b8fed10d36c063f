"""What a search reads (its options' ``inputs``, :class:`memplan.search.options.Inputs`): the model
(captured at the input and batch it is costed at) and the contribution profile (given, or the
shipped one measured on the model's layer table)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.nn as nn

from ..api import Captured, capture
from ..errors import InputShapeError, MemplanError
from ..io import read_json, shipped
from ..models import recorded_shape
from ..plan import Training, fingerprint
from .options import Inputs
from .space import Candidate, Contributions, ProfileError, contributions_of, load_contributions

#: the shipped contribution profiles (package data)
PROFILES_DIR = shipped("profiles")

#: the model searched when none is given: the 256KB paper's int8 mcunet-5fps with its ImageNet
#: weights (shipped), whose profile is measured as an int8 graph with QAS on CIFAR-10 at 128 px
#: (benchmarks/mcu_transfer.py); the profile's costing resolution is the default input.
#: EfficientNet-Lite0 keeps its Fashion-MNIST profile when named.
DEFAULT_MODEL = "mcunet-5fps-int8"


def find_profile(graph_fingerprint: str, directory: str | os.PathLike = PROFILES_DIR) -> Path:
    """The shipped contribution profile (``profiles/*.json``) measured on this layer table."""
    for path in sorted(Path(directory).glob("*.json")):
        try:
            data = read_json(path, "contribution profile")
        except MemplanError:
            continue
        if data.get("fingerprint") == graph_fingerprint and "bias" in data:
            return path
    raise ProfileError(
        f"no shipped contribution profile in {directory} matches this model (fingerprint {graph_fingerprint})",
        "measure one with memplan contrib and pass it as profile",
    )


def capture_inputs(model: str | nn.Module | None, opts: Inputs) -> tuple[Captured, Contributions, Any]:
    """(capture, contributions, profile path): the model at the resolution its profile was costed
    at unless given, the profile given or the shipped one matching the model's fingerprint."""
    resolution, input_shape, classes = opts.resolution, opts.input_shape, opts.classes
    profile_path = opts.profile_path
    if model is None:
        model = DEFAULT_MODEL
    contributions = None
    if opts.profile is not None:
        contributions = contributions_of(opts.profile, "contribution profile (given)")
    elif profile_path is not None:
        contributions = load_contributions(profile_path)
    if contributions is not None and input_shape is None:
        resolution = resolution or contributions.costing_resolution
        input_shape = profile_shape(contributions, resolution)
    try:
        cap = capture(
            model,
            batch=opts.batch,
            resolution=resolution,
            input_shape=input_shape,
            classes=classes or (contributions.classes if contributions else None),
        )
    except InputShapeError as exc:  # at the profile's input: the profile is another model's
        if contributions is None or opts.input_shape is not None:
            raise
        raise ProfileError(
            f"the contribution profile was measured on {contributions.model}; {exc.message}",
            "give the profile measured on this model (or --input-shape C,H,W if it is this model's)",
        ) from None
    if contributions is None:
        profile_path = find_profile(fingerprint(cap.graph))
        contributions = load_contributions(profile_path)
        own = resolution is None and input_shape is None and contributions.costing_resolution is not None
        if own:
            resolution = contributions.costing_resolution
            input_shape = profile_shape(contributions, resolution)
        if own or (classes is None and contributions.classes and contributions.classes != cap.classes):
            cap = capture(
                model,
                batch=opts.batch,
                resolution=resolution,
                input_shape=input_shape,
                classes=classes or contributions.classes,
            )
    return cap, contributions, profile_path


def profile_shape(contributions: Contributions, resolution: int | None) -> tuple[int, ...] | None:
    """The per-sample input shape a model is costed at for its profile: the runs' (their channel
    count: a grey model takes 1) at ``resolution`` px; None where the profile records no costing
    side and none is given (the model's own input then)."""
    return recorded_shape(contributions.run_shape, resolution) if resolution is not None else None


def resolution_warnings(cap: Captured, contributions: Contributions) -> list[str]:
    costed = tuple(cap.graph.input_shape[1:])
    if contributions.run_shape is None or tuple(contributions.run_shape) == costed:
        return []
    return [
        f"the contribution runs were made at input {'x'.join(map(str, contributions.run_shape))}; "
        f"this search costs memory at {'x'.join(map(str, costed))}: its Δacc were measured at "
        f"another resolution"
    ]


def profile_training(contributions: Contributions, cand: Candidate, optimizer: str | None) -> Training | None:
    """The rates the profile chose per family (``contrib --lr-grid``) as the scheme's training: ``lr``
    is that of the deepest family ``cand`` trains (weight, then bias, then classifier); None when the
    profile chose none."""
    rates = contributions.rates
    if not rates or optimizer is None:
        return None
    family = "weight" if cand.weights else "bias" if cand.k else "classifier"
    lr = rates.get(family) or rates.get("bias") or rates.get("classifier")
    if lr is None:
        return None
    return Training(
        optimizer=optimizer,
        lr=lr,
        epochs=contributions.epochs or 1,
        batch_size=contributions.batch_size or 1,
        rates=dict(rates),
    )
