"""Published figures of the seed papers, for ``memplan reproduce``: data files, one per paper
(``memplan/reproduce/data/<paper>.json``, read with ``importlib.resources``).

Each :class:`PublishedFigure` is one number printed in a paper (a memory size, a parameter or
MAC count, a FLOP count, a cache size, ...), with everything needed to rebuild it: zoo model,
strategy (``method``), options, and the accounting convention (``mode``) expected to
reproduce it. A paper's file holds ``paper`` (its title), ``readings`` (how the paper's
settings were read), ``figures`` (what memplan can model from a zoo network; some reproduce
exactly, others only approximately, ``note`` says which) and ``not_modelled`` (figures printed
in the same paper that no analytical mode can rebuild: hardware measurements, dataset file
sizes, networks outside the zoo, blocks whose shape the text does not give; ``reproduce``
shows them as "not modelled", never as a failure).

Units (``unit``), with the value quoted exactly as printed:

* ``"MB"``: 1e6 bytes. TinyTL and MobileTL print MB this way (TinyTL: "theoretically
  calculated"; accounting.md reproduces them with MB = 1e6).
* ``"KiB"``: 1024 bytes. The 256KB paper's "kB"/"KB" is bits / 8 / 1024; its code prints
  ``total_usage / 1024 / 8`` as "kB". MiniLearn's RAM / Flash "KB" is also 1024-based.
  Evidence: its flash shares, "42% / 23% / 6%" at 100 samples and "92% / 83% / 20%" at
  600, equal the Table 2 numbers divided by 1024 KB (1 MB flash), truncated.
* ``"kB"``: 1000 bytes (MiniLearn's upload sizes: 744 B x 600 samples = 446,400 B,
  printed "446 KB").
* ``"MiB"`` / ``"GiB"``: 2**20 / 2**30 bytes. Cache-and-Reuse prints "MB" but means MiB.
  For example, 50,000 CIFAR-100 samples x 96x14x14 fp32 = 3,763,200,000 B = 3589 MiB,
  printed "3589 MB".
* ``"GB"``: 1e9 bytes.
* ``"bytes"``: plain bytes (MiniLearn Table 1 "Output" column, int8 tensors).
* ``"M"`` / ``"G"``: millions / billions of a count (parameters, MACs).
* ``"count"``: a plain count (parameters, layers).
* ``"MFLOPs"``: millions of floating-point operations.
* ``"%"``: a percentage. ``"ratio"``: a plain ratio.

``UNIT_SCALE[unit]`` gives the factor to base units (bytes, counts, FLOPs, 1 for ratios,
0.01 for %). ``memplan.units.parse_bytes`` reads "KB" as 1000-based, so no figure uses "KB".

Figure modes (``mode``, :data:`FIGURE_MODES`): ``tinytl`` (TinyTL's profiler convention,
accounting.md section 3), ``tinytraining`` (the 256KB paper's analytic convention, section
4), ``pytorch`` (eager autograd, section 1), ``ideal`` (implementation-agnostic saved tensors
/ FLOPs / sizes, sections 2 and 5), ``mcu`` (the Tiny Training Engine's measured peak SRAM,
``memplan.modes.mcu``; ``tinytraining_measured.json``), ``inference`` (plain network statistics: params, MACs,
layer shapes), and ``measured`` (hardware measurements, only in ``not_modelled``).

How to add a figure
-------------------
1. Quote the value exactly as printed and give ``unit`` from the list above. Check which
   byte base the paper means (rebuild one number by hand) and explain it in ``note``.
2. ``key``: ``<paper>.<table-or-figure>.<model>.<method>[.<variant>].<quantity>``. It
   must be unique (checked when the files are read).
3. ``source``: exactly where it is printed ("TinyTL Table 2", "MobileTL Sec. 'Efficient
   Transfer Learning' (Fig. 4 text)", ...).
4. ``model``: a memplan zoo name; ``method``: a memplan strategy name (``"inference"`` for
   plain-network statistics); ``options``: the configuration. Each option is read by the
   capture (:data:`CAPTURE_OPTIONS`), by the quantity's evaluator (:data:`EVALUATOR_OPTIONS`),
   or is an option of the strategy (``memplan methods``: e.g. blocks, samples, stage, prune,
   and the architecture options every method takes: remove_se, activation, lite, lite_*), or
   is declared in :data:`DESCRIPTIVE_OPTIONS` with the reason it changes nothing memplan
   builds. A figure with any other option is reported "not modelled", never profiled on
   another configuration.
5. ``note``: one line saying how the paper counted it, whether the configuration is a
   best reading (and why), and whether accounting.md says it reproduces.
6. If no analytical mode can rebuild it (a measurement, an unknown architecture), put it in
   the paper's ``not_modelled`` list instead of ``figures``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

#: the data files, in report order
PAPERS = ("tinytl", "mobiletl", "tinytraining", "tinytraining_measured", "minilearn", "cache_reuse")

UNIT_SCALE: dict[str, float] = {
    "bytes": 1.0,
    "kB": 1e3,
    "KiB": 1024.0,
    "MB": 1e6,
    "MiB": float(2**20),
    "GB": 1e9,
    "GiB": float(2**30),
    "count": 1.0,
    "M": 1e6,
    "G": 1e9,
    "MFLOPs": 1e6,
    "%": 0.01,
    "ratio": 1.0,
}


@dataclass(frozen=True)
class FigureMode:
    """A convention a published figure may name: ``profile_mode``, the accounting mode its figures are
    profiled in unless the evaluator says otherwise; ``modelled``: False for hardware measurements
    (only in ``not_modelled``); ``floor_unit``: the unit in which the convention labels a scheme by its
    value rounded down (the 256KB paper labels schemes with the computed KiB, truncated), else None."""

    profile_mode: str
    modelled: bool = True
    floor_unit: str | None = None


#: the conventions a published figure may name: accounting modes plus ``inference`` and ``measured``
FIGURE_MODES: dict[str, FigureMode] = {
    "tinytl": FigureMode("tinytl"),
    "tinytraining": FigureMode("tinytraining", floor_unit="KiB"),
    "pytorch": FigureMode("pytorch"),
    "ideal": FigureMode("ideal"),
    "mcu": FigureMode("mcu"),
    "inference": FigureMode("pytorch"),
    "measured": FigureMode("pytorch", modelled=False),
}


@dataclass(frozen=True)
class FigureMethod:
    """What a figure's ``method`` builds: ``strategy``, the memplan strategy it is profiled with, and
    ``trains``: False for statistics of the plain network (no training)."""

    strategy: str
    trains: bool = True


#: figure methods that name no memplan strategy (every other figure method is one)
PLAIN_METHODS: dict[str, FigureMethod] = {"inference": FigureMethod("last", trains=False)}


def figure_method(method: str) -> FigureMethod:
    """The :class:`FigureMethod` of a figure's ``method``: a strategy name stands for itself."""
    return PLAIN_METHODS.get(method) or FigureMethod(method)


#: figure options the capture reads -> ``memplan.capture`` keyword (None: not printed, default)
CAPTURE_OPTIONS: dict[str, str] = {
    "batch": "batch",
    "resolution": "resolution",
    "num_classes": "classes",
    "norm": "norm",
}
#: figure options read by the evaluator of the figure's quantity (``memplan.reproduce``)
EVALUATOR_OPTIONS: dict[str, str] = {
    "layer_index": "row of a per-layer table (input = 0, then conv / pool / linear layers in order)",
    "block": "the figure is of one block: sums over that block's layers",
    "include_classifier": "false: parameters without the classifier",
    "other_ops": "true: FLOPs count every op (norms, activations, adds, pooling, loss), not only conv / linear",
    "plan": "measured SRAM figures: the update (full, or a scheme) whose training step is simulated",
    "scheme": "measured SRAM figures: the sparse-update scheme (layers, ratios, bias depth)",
    "schemes": "measured SRAM figures: the unstated schemes the range runs over",
    "schedule": "measured SRAM figures: tte (in-place update with reordering) or standard",
    "settings": "measured SRAM figures: the mcu mode's settings (patches, accumulation, ...)",
    "arena_only": "measured SRAM figures: trainable weights live outside the arena (TinyEngine's PEAK_MEM)",
    "numerator": "measured ratios: the figure whose value is divided",
    "denominator": "measured ratios: the figure it is divided by",
    "reference": "measured SRAM figures: the figure whose setting this one repeats",
    "tolerance": "measured SRAM figures: the agreement the paper's reading allows",
}
#: figure options that describe the figure without changing what memplan builds, and why
DESCRIPTIVE_OPTIONS: dict[str, str] = {
    "dataset": "names the data set; its sizes enter through resolution, classes and samples",
    "cut_shape": "the printed shape of the cached tensor: a check of the cut (tests), not an input",
    "layer": "the printed label of a per-layer table row",
    "shape": "the printed shape of a per-layer table row (its output bytes are a figure of their own)",
    "input_shape": "the fixed input of the zoo network the figure names",
    "original_classes": "the pre-trained head; the zoo network has it unless num_classes is given",
    "subset_classes": "the classes the device retrains for; num_classes gives the head where it is built",
    "train_split": "splits the stored samples between MiniLearn's stages; no memory figure depends on it",
    "lite_init": "the lite residual branches' initialisation; no size or count depends on it",
    "frozen_weight_bits": "the tinytl convention (mode) stores frozen weights in int8 already",
    "gn_channels_per_group": "memplan's GroupNorm swap uses 8 channels per group already",
    "activation_bits": "the tinytraining convention's bit width (mode)",
    "weight_bits": "the tinytraining convention's bit width (mode)",
    "bias_bits": "the tinytraining convention's bit width (mode)",
    "momentum_bits": "the tinytraining convention has no momentum (mode)",
    "in_channels": "describes the zoo block network the figure names",
    "out_channels": "describes the zoo block network the figure names",
    "kernel": "describes the zoo block network the figure names",
    "feature_map": "describes the zoo block network the figure names",
    "expand": "describes the zoo block network the figure names",
    "se_squeeze": "describes the zoo block network the figure names",
    "block_activation": "describes the zoo block network the figure names",
}


@dataclass(frozen=True)
class PublishedFigure:
    key: str  # stable id, e.g. "tinytl.table2.proxylessnas-mobile.full.memory"
    source: str  # exactly where it is printed
    quantity: str  # memory | activation_memory | trainable_params | params | macs | ...
    value: float  # as printed, in ``unit``
    unit: str  # see UNIT_SCALE
    model: str  # memplan zoo name
    method: str  # memplan strategy name, or one of PLAIN_METHODS
    options: dict[str, Any] = field(default_factory=dict, hash=False)  # excluded from hash
    mode: str = ""  # accounting convention expected to reproduce it
    note: str = ""  # how it was counted; whether / how well it reproduces

    def in_base_units(self) -> float:
        """``value`` converted to bytes / counts / FLOPs (ratios stay ratios, % -> fraction)."""
        return self.value * UNIT_SCALE[self.unit]


def _read(paper: str) -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath("data", f"{paper}.json").read_text(encoding="utf-8"))


def _load() -> tuple[list[PublishedFigure], list[PublishedFigure]]:
    figures: list[PublishedFigure] = []
    not_modelled: list[PublishedFigure] = []
    for paper in PAPERS:
        doc = _read(paper)
        figures += [PublishedFigure(**f) for f in doc["figures"]]
        not_modelled += [PublishedFigure(**f) for f in doc["not_modelled"]]
    return figures, not_modelled


FIGURES, NOT_MODELED = _load()
ALL_FIGURES: list[PublishedFigure] = FIGURES + NOT_MODELED

_BY_KEY: dict[str, PublishedFigure] = {}


def _validate() -> None:
    for fig in ALL_FIGURES:
        if fig.key in _BY_KEY:
            raise ValueError(f"duplicate published-figure key {fig.key!r}")
        if fig.unit not in UNIT_SCALE:
            raise ValueError(f"{fig.key}: unknown unit {fig.unit!r}")
        if fig.mode not in FIGURE_MODES:
            raise ValueError(f"{fig.key}: unknown mode {fig.mode!r}")
        if not (fig.source and fig.quantity and fig.model and fig.method and fig.note):
            raise ValueError(f"{fig.key}: empty source/quantity/model/method/note")
        if not isinstance(fig.value, (int, float)) or isinstance(fig.value, bool):
            raise ValueError(f"{fig.key}: value must be a number")
        _BY_KEY[fig.key] = fig
    for fig in FIGURES:
        if not FIGURE_MODES[fig.mode].modelled:
            raise ValueError(f"{fig.key}: measured figures belong in not_modelled")


_validate()


def by_key(key: str) -> PublishedFigure:
    """The figure with this key (``KeyError`` if none)."""
    return _BY_KEY[key]


def select(figures: list[PublishedFigure] | None = None, **match: Any) -> list[PublishedFigure]:
    """Figures whose attributes equal every ``match`` value; ``source`` and ``key`` match by prefix.

    Example: ``select(model="proxylessnas-mobile", mode="tinytl")``, ``select(key="tinytl.")``.
    """
    out = []
    for fig in FIGURES if figures is None else figures:
        ok = True
        for name, want in match.items():
            have = getattr(fig, name)
            if name in ("key", "source"):
                ok = ok and str(have).startswith(str(want))
            else:
                ok = ok and have == want
        if ok:
            out.append(fig)
    return out
