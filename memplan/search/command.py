"""``memplan search`` as one library call: search, validate (``--validate``), write.

:func:`search_and_validate` reads the contribution profile once and passes it along; it runs the
search (:func:`memplan.search.run.run_search`), costs the scheme found in ``applied`` mode
(eager PyTorch after ``memplan.apply_scheme``) and plain ``pytorch`` mode at the profile's
training batch, trains the validation stage's candidates when ``Stage.validate_candidates`` is
set (:mod:`memplan.search.stage`; its further searches reuse the profile read) and writes the
scheme: to ``out`` when given; a validated scheme (which training chose) without ``out`` to
:func:`default_out` in the stage's folder, never nowhere. The command line
(``memplan.cli_search``) only renders what it returns (:class:`Searched`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch.nn as nn

from ..accounting.devices import fit, load_device
from ..api import capture, profile_captured
from ..contrib.profile import ContribProfile, load_profile
from ..errors import MemplanError
from ..io import shipped, validated
from ..models.zoo import find_entry
from ..plan import Scheme, load_scheme
from .options import SearchCommand, SearchOptions
from .result import SearchResult
from .run import run_search
from .stage import Progress, Validated, check_stage, validate_search

#: the modes the scheme found is also costed in (:class:`AppliedCost`)
APPLIED_MODES = ("applied", "pytorch")


@dataclass
class AppliedCost:
    """The scheme's memory in :data:`APPLIED_MODES` at ``batch`` (the profile's training batch, else
    the scheme's): ``totals`` by mode (``memplan.accounting`` totals: ``total_bytes``,
    ``saved_activation_bytes``, bytes)."""

    batch: int
    source: str  # whose batch: "the profile's training" or "the scheme's"
    totals: dict[str, Any]


@dataclass
class Searched:
    """What ``memplan search`` produced: the search, the applied-mode cost of its scheme (or why it is
    missing), the validation stage's outcome (with ``--validate``) and where the scheme was written
    (None: nowhere; a search without ``--validate`` or ``out``)."""

    result: SearchResult
    applied: AppliedCost | None = None
    applied_error: str | None = None
    validated: Validated | None = None
    out: str | None = None
    # the device the scheme's training is checked on (--target, else the one the zoo entry is built
    # for): accounting.devices.fit of the scheme at batch 1 in the device's mode, SRAM and flash, bytes
    device_fit: dict[str, Any] | None = None
    # a shipped scheme equal to the one found whose training validated it (memplan/data/schemes)
    shipped: Scheme | None = None

    @property
    def scheme(self) -> Scheme:
        """The scheme returned: the validated one with ``--validate``, else the search's."""
        return self.validated.scheme if self.validated is not None else self.result.scheme


def search_and_validate(
    model: str | nn.Module | None = None, opts: SearchCommand | None = None, progress: Progress | None = None
) -> Searched:
    """Search, validate when ``opts.stage.validate_candidates`` is set, write (module docstring).
    ``progress``: what is reported as it goes (``progress.searched`` gets the :class:`Searched`
    before any training). The stage's executor and folder are checked before any work."""
    opts = opts or SearchCommand()
    progress = progress or Progress()
    stage, search = opts.stage, opts.search
    n = stage.validate_candidates
    if n is not None:
        check_stage(stage)
    profile = _read_profile(search)
    if profile is not None:
        search = search.replace(profile=profile)
    out = search.output.out
    result = run_search(model, search.replace(out=None) if n is not None else search)
    if profile is None and result.profile_path is not None:  # the shipped one the search found
        profile = load_profile(result.profile_path)
    done = Searched(result, out=result.out)
    try:
        done.applied = applied_cost(result, profile, search.inputs.classes)
    except MemplanError as exc:  # the search itself is done: say why the cost is missing
        done.applied_error = str(exc)
    done.device_fit = device_fit(result, model, search.inputs.classes or (profile and profile.dataset.get("classes")))
    done.shipped = shipped_validation(result.scheme)
    if progress.searched is not None:
        progress.searched(done)
    if n is None:
        return done
    if profile is None:
        raise MemplanError("the validation stage trains from the profile's setup: search with a profile")
    again = partial(_again, model, search.replace(profile=profile, out=None, curves=False))
    options = {
        "optimizer": result.scheme.optimizer,
        "frozen_bits": search.accounting.frozen_bits,
        "mode_options": search.accounting.mode_options,
    }
    done.validated = validate_search(result, n, again, profile, stage=stage, options=options, progress=progress)
    path = out if out is not None else default_out(result, stage.validate_dir)
    done.validated.scheme.save(path)
    done.out = str(path)
    return done


def _read_profile(opts: SearchOptions) -> ContribProfile | None:
    """The profile the options name or give (a file read once; a JSON object read as a profile);
    None where none is named: the search finds the shipped one."""
    given = opts.inputs.profile
    if isinstance(given, dict):
        return validated(lambda: ContribProfile.model_validate(given), "contribution profile (given)")
    if given is not None or opts.inputs.profile_path is None:
        return given if isinstance(given, ContribProfile) else None
    return load_profile(opts.inputs.profile_path)


def _again(model: str | nn.Module | None, opts: SearchOptions, objective: str, budget: int) -> SearchResult:
    """The same search under another objective and budget (bytes): the stage's further candidates."""
    return run_search(model, opts.replace(objective=objective, budget=budget))


def default_out(result: SearchResult, folder: str | Path) -> Path:
    """Where a validated scheme goes without ``out``: ``folder/MODEL-BUDGET.scheme.json`` (characters
    other than letters, digits, ``.``, ``_`` and ``-`` as ``_``)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{result.model}-{result.budget_text}")
    return Path(folder) / f"{name}.scheme.json"


def applied_cost(result: SearchResult, profile: ContribProfile | None, classes: int | None) -> AppliedCost:
    """The searched scheme's memory in :data:`APPLIED_MODES` at the profile's training batch (the
    scheme's without a profile, or where its micro-batches do not divide the profile's), on the model
    at the search's input shape; with micro-batches (``Scheme.execution``), traced at one of them."""
    batch, source = result.scheme.batch, "the scheme's"
    execution = result.scheme.execution
    micro = execution.micro_batches if execution is not None else 1
    if profile is not None and profile.protocol.batch_size % micro == 0:
        batch, source = profile.protocol.batch_size, "the profile's training"
    if profile is not None:
        classes = classes or profile.dataset.get("classes")
    cap = capture(result.model, tuple(result.input_shape), batch=batch // micro, classes=classes)
    totals = {m: profile_captured(cap, "sparse", mode=m, scheme=result.scheme).totals for m in APPLIED_MODES}
    return AppliedCost(batch, source, totals)


def device_fit(result: SearchResult, model: str | nn.Module | None, classes: int | None) -> dict[str, Any] | None:
    """Whether training the scheme fits a device (``accounting.devices.fit``: peak in the device's
    mode at batch 1, SRAM and flash, bytes): ``--target``'s, else the device the zoo entry is built
    for; None with neither."""
    device = result.device
    if device is None:
        entry = find_entry(result.model if model is None else model)
        if entry is None or entry.device is None:
            return None
        device = load_device(entry.device)
    cap = capture(result.model, tuple(result.input_shape), batch=1, classes=classes)
    execution = result.scheme.execution
    single = {"batch": 1}
    if execution is not None:  # one sample is one micro-batch
        single["execution"] = execution.model_copy(update={"micro_batches": 1})
    prof = profile_captured(cap, "sparse", mode=device.mode, scheme=result.scheme.model_copy(update=single))
    return fit(prof, device, cap.graph)


def shipped_validation(scheme: Scheme) -> Scheme | None:
    """A shipped scheme (package data) with validation evidence that trains what ``scheme`` trains:
    same layer table, mode, optimizer, bias depth and weight updates."""

    def key(s: Scheme) -> tuple:
        weights = sorted((w.conv_index, w.ratio, w.select) for w in s.weight_updates)
        return (s.fingerprint, s.mode, s.optimizer, s.bias_update, tuple(weights), tuple(s.input_shape))

    for path in sorted(shipped("schemes").glob("*.json")):
        try:
            other = load_scheme(path)
        except MemplanError:
            continue
        if other.validation is not None and key(other) == key(scheme):
            return other
    return None
