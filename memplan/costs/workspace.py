"""Kernel workspaces: the temporary memory a kernel allocates while it runs, beyond its inputs,
outputs and saved tensors (oneDNN's reordered copies, im2col buffers, reduction scratch), in bytes.

How large they are depends on the kernels the machine picks (CPU ISA, GPU, torch version, thread
count), so they are measured, not modelled: ``memplan calibrate`` (:mod:`memplan.verify.calibrate`)
runs each distinct *kernel configuration* once and stores two numbers per configuration in a
per-machine calibration file:

* ``forward``: the most memory in use while the op's forward runs, less what is in use after
  it (its output and private saved tensors), never negative;
* ``backward``: the most memory in use while its backward runs, less the gradients it returns
  (grad-input, parameter gradients), never negative.

A configuration (:func:`kernel_key`) is the op (module ``repr`` or function and its constant
arguments), its input shapes / dtypes / strides, which inputs and parameters need gradients,
norm train / eval, and the torch thread count: configurations that repeat across models and
strategies share one entry. The file (:func:`calibration_path`) is keyed by backend, CPU ISA
(``torch.backends.cpu.get_cpu_capability()``) or GPU name, and torch version, and lives under
``$MEMPLAN_CACHE/calibration`` (default ``$XDG_CACHE_HOME/memplan`` or ``~/.cache/memplan``);
it is written atomically. The peak simulation (:mod:`.peak`) adds the workspace of the op
running at each step; a profile says whether it did (``Profile.workspace``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from ..errors import BadOption
from ..graph import TensorInfo, role
from ..graph.kinds import NO_KERNEL, NORM_KINDS
from ..io import read_json, write_text
from ..plan import OpView

#: calibration file format version
CALIBRATION_VERSION = 1
BACKENDS = ("cpu", "cuda")


def cache_dir() -> Path:
    """Where calibration files live: ``$MEMPLAN_CACHE/calibration``, else
    ``$XDG_CACHE_HOME/memplan/calibration``, else ``~/.cache/memplan/calibration``."""
    root = os.environ.get("MEMPLAN_CACHE")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "memplan")
    return Path(root) / "calibration"


def machine(backend: str = "cpu") -> dict[str, str]:
    """The identity a calibration is valid for: backend, CPU ISA or GPU name, torch version."""
    if backend not in BACKENDS:
        raise BadOption(f"unknown calibration backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
    if backend == "cuda":
        if not torch.cuda.is_available():
            raise BadOption("backend cuda requested but no CUDA device is available", "use cpu")
        device = torch.cuda.get_device_name(torch.cuda.current_device())
    else:
        device = torch.backends.cpu.get_cpu_capability()
    return {"backend": backend, "device": device, "torch": torch.__version__}


def calibration_path(ident: dict[str, str]) -> Path:
    """The calibration file of one machine identity."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{ident['backend']}-{ident['device']}-torch{ident['torch']}").strip("-")
    return cache_dir() / f"{slug}.json"


@dataclass
class Calibration:
    """Measured workspaces of one machine: ``entries[key] = {"forward": B, "backward": B, "label": str}``."""

    machine: dict[str, str]
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: Path | None = None

    @property
    def label(self) -> str:
        m = self.machine
        return f"{m['backend']} {m['device']}, torch {m['torch']}"

    def lookup(self, key: str) -> tuple[int, int] | None:
        e = self.entries.get(key)
        return None if e is None else (int(e["forward"]), int(e["backward"]))

    def save(self) -> Path:
        """Write atomically, merged with entries another process may have written meanwhile."""
        path = self.path or calibration_path(self.machine)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BadOption(f"cannot create calibration directory {path.parent}: {exc.strerror or exc}") from None
        if path.is_file():
            try:
                other = _read(path)
                if other.machine == self.machine:
                    self.entries = {**other.entries, **self.entries}
            except BadOption:
                pass  # a broken file is replaced
        doc = {
            "version": CALIBRATION_VERSION,
            "machine": self.machine,
            "units": "bytes: most memory in use during the op beyond its outputs (forward) or the gradients "
            "it returns (backward)",
            "entries": dict(sorted(self.entries.items())),
        }
        write_text(path, json.dumps(doc, indent=1) + "\n")
        self.path = path
        return path


def _read(path: Path) -> Calibration:
    data = read_json(path, "calibration file", BadOption)
    if (
        data.get("version") != CALIBRATION_VERSION
        or not isinstance(data.get("entries"), dict)
        or not isinstance(data.get("machine"), dict)
    ):
        raise BadOption(f"calibration file {path} has an unknown format", "run memplan calibrate again")
    return Calibration(dict(data["machine"]), dict(data["entries"]), path)


_LOADED: dict[str, tuple[float, Calibration]] = {}


def load_calibration(source: str | os.PathLike = "cpu") -> Calibration | None:
    """The calibration of this machine for backend ``source`` (``cpu`` | ``cuda``), or the file
    ``source``; None when this machine has none yet. Cached per file modification time."""
    if str(source) in BACKENDS:
        try:
            path = calibration_path(machine(str(source)))
        except BadOption:
            return None
        if not path.is_file():
            return None
    else:
        path = Path(source)
    stamp = path.stat().st_mtime_ns if path.is_file() else -1.0
    hit = _LOADED.get(str(path))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    cal = _read(path)
    _LOADED[str(path)] = (stamp, cal)
    return cal


def empty_calibration(backend: str = "cpu") -> Calibration:
    """This machine's calibration file (loaded if it exists), ready to add entries to."""
    ident = machine(backend)
    path = calibration_path(ident)
    if path.is_file():
        try:
            cal = _read(path)
            if cal.machine == ident:
                return cal
        except BadOption:
            pass
    return Calibration(ident, {}, path)


# --------------------------------------------------------------------------- configurations


def _tensor_sig(t: Any) -> str:
    strides = ",".join(map(str, t.strides)) if t.strides else "c"
    return f"{'x'.join(map(str, t.shape)) or '()'}:{str(t.dtype).removeprefix('torch.')}:{strides}"


def _call_sig(op: OpView) -> str:
    """What runs: a module's class and repr, or a function / method and its constant arguments."""
    node = op.node
    if node.fx is None:
        attrs = sorted((k, _tensor_sig(v) if isinstance(v, TensorInfo) else str(v)) for k, v in node.attrs.items())
        return f"{node.kind}:{node.target}:{attrs}"
    fxn = node.fx
    index = {a: i for i, a in enumerate(node.fx_inputs)}

    def arg(a: fx.Node) -> str:
        return f"<T{index[a]}>" if a in index else repr(node.fx_consts.get(a, a.name))

    args = fx.node.map_arg(fxn.args, arg)
    kwargs = fx.node.map_arg(fxn.kwargs, arg)
    if fxn.op == "call_module":
        mod = node.module
        what = f"{type(mod).__module__}.{type(mod).__qualname__}:{mod!r}"
    else:
        what = f"{fxn.op}:{getattr(fxn.target, '__qualname__', fxn.target)}"
    return f"{what}:{args}:{kwargs}"


def kernel_key(op: OpView, threads: int | None = None) -> str | None:
    """The configuration of ``op`` as a short stable key (None: the op runs no kernel). The
    readable form is :func:`kernel_label`; the key is its hash."""
    label = kernel_label(op, threads)
    return None if label is None else hashlib.sha1(label.encode()).hexdigest()[:20]


def kernel_label(op: OpView, threads: int | None = None) -> str | None:
    node = op.node
    if node.kind in NO_KERNEL:
        return None
    threads = torch.get_num_threads() if threads is None else threads
    params = ",".join(f"{k}{'*' if _trains(op, k) else ''}" for k in sorted(node.params))
    norm = f" train={op.norm_train}" if node.kind in NORM_KINDS else ""
    ins = " ".join(_tensor_sig(t) for t in node.in_tensors)
    req = "".join("1" if r else "0" for r in op.req_in)
    return (
        f"{node.kind} {_call_sig(op)} in=[{ins}] req={req} out={int(op.req_out)} params=[{params}]{norm} "
        f"threads={threads}"
    )


def _trains(op: OpView, pname: str) -> bool:
    return op.train.bias if role(pname) == "bias" else op.train.weight > 0


@dataclass
class Workspaces:
    """Per node: forward and backward workspace bytes, and how the lookup went."""

    forward: list[int]
    backward: list[int]
    status: str  # calibrated | partial | missing | not modelled
    source: str = ""  # the machine / file the figures come from
    missing: int = 0  # distinct configurations without an entry
    configs: int = 0  # distinct configurations of the graph

    def describe(self) -> dict[str, Any]:
        return {"status": self.status, "source": self.source, "configs": self.configs, "missing": self.missing}


def workspaces(views: list[OpView], calibration: Calibration | None, threads: int | None = None) -> Workspaces:
    """Look up every node's workspace in ``calibration`` (zeros where there is no entry)."""
    n = len(views)
    fwd, bwd = [0] * n, [0] * n
    keys: dict[str, list[int]] = {}
    for i, op in enumerate(views):
        key = kernel_key(op, threads)
        if key is not None:
            keys.setdefault(key, []).append(i)
    if calibration is None:
        return Workspaces(fwd, bwd, "missing", "", len(keys), len(keys))
    missing = 0
    for key, nodes in keys.items():
        hit = calibration.lookup(key)
        if hit is None:
            missing += 1
            continue
        for i in nodes:
            fwd[i], bwd[i] = hit
    status = "calibrated" if not missing else ("missing" if missing == len(keys) else "partial")
    return Workspaces(fwd, bwd, status, calibration.label, missing, len(keys))
