"""The options of ``profile`` and the commands built on it (``compare``, ``verify``, ``calibrate``),
each declared once (:mod:`memplan.options`; the ones search shares are the annotated types there):

* :class:`Capture`: how the model is built and traced (``memplan.api.capture``);
* :class:`StrategyOptions`: a strategy's options (``--blocks``, ``--scheme``, ``-o key=value``);
* :class:`Costing`: how the plan is counted (mode, optimizer state, frozen weights, the simulated
  step's schedule and kernel workspaces, the hardware it should fit);

grouped by command: :class:`ProfileOptions`, :class:`CompareOptions`, :class:`VerifyOptions`,
:class:`CalibrateOptions`. No torch import: the command line reads the fields before any command runs.
"""

from __future__ import annotations

import os
from typing import Annotated, Any, ClassVar

from .names import DEFAULT_OPTIMIZER, SCHEDULES, choices
from .options import (
    Batch,
    Classes,
    FrozenBits,
    InputShape,
    Mode,
    ModeOptions,
    Norm,
    Optimizer,
    Options,
    Resolution,
    Target,
    option,
)

Method = Annotated[str, option("full", "strategy (see `memplan methods`)", flags=("--method", "-m"))]


class Capture(Options):
    """How the model is built and traced (:func:`memplan.api.capture`)."""

    batch: Batch = 1
    resolution: Resolution = None
    classes: Classes = None
    input_shape: InputShape = None
    norm: Norm = None
    leaf_modules: tuple[str | type, ...] = option(
        (), "module class or qualname to treat as one op (repeatable)", flags=("--leaf",), parse="repeated"
    )
    block_names: tuple[str, ...] | None = option(
        None, "comma-separated block module qualnames (overrides the structural rule)", parse="texts"
    )
    output: str | int | None = option(
        None,
        "the key / field / index of the logits when the model returns a tuple, dict or namedtuple "
        "(default: its first tensor)",
    )
    amp: str | None = option(
        None,
        "mixed precision: the training step (forward and loss) under torch.autocast with bf16 or fp16 on the CPU; "
        "an autocast inside the model's forward is honoured without it",
    )


class StrategyOptions(Options):
    """A strategy's options (``memplan methods`` lists which strategy takes which): the common ones
    as flags, any other as ``-o key=value`` (:meth:`given`)."""

    blocks: int | None = option(
        None,
        "number of last blocks that train (the strategies that take it: memplan methods)",
        flags=("--blocks", "-k"),
    )
    layers: int | None = option(
        None, "number of last conv/linear layers that train (the strategies that take it: memplan methods)"
    )
    scheme: Any = option(  # a path, a shipped scheme's name, a dict or a memplan.plan.Scheme
        None,
        "sparse-update scheme: memplan scheme JSON, tiny-training backward_config, or the name of a shipped scheme "
        "(e.g. mcunet-5fps-100KB); the model is traced at the scheme's input shape (its channels at --resolution "
        "when given) unless --input-shape says otherwise",
        parse="scheme",
    )
    bits: int | None = option(None, "bits per cached feature (the strategies that take it: memplan methods)")
    samples: int | None = option(None, "number of training samples (the strategies that take it: memplan methods)")
    epochs: int | None = option(None, "training epochs (the strategies that take it: memplan methods)")
    strategy_options: dict[str, Any] | None = option(
        None,
        "other strategy option as key=value (repeatable), e.g. -o lite_kernel=3",
        flags=("--option", "-o"),
        parse="key_values",
    )

    @classmethod
    def flags(cls) -> tuple[str, ...]:
        """The strategy options named as flags (every field but ``strategy_options``, the ``-o`` ones)."""
        return tuple(name for name in cls.model_fields if name != "strategy_options")

    def given(self, **more: Any) -> dict[str, Any]:
        """The strategy options that were given: the flags, then ``-o`` ones, then ``more``."""
        named = {k: getattr(self, k) for k in self.flags() if getattr(self, k) is not None}
        return {**named, **(self.strategy_options or {}), **more}


class Costing(Options):
    """How a plan is counted (:func:`memplan.api.profile_captured`): the mode and its options, the
    optimizer state, frozen weights, the simulated step's peak, and the hardware it should fit."""

    mode: Mode = None
    optimizer: Optimizer = None
    frozen_bits: FrozenBits = 32
    mode_options: ModeOptions = None
    schedule: str | None = option(
        None,
        f"training step of the simulated peak: {choices(SCHEDULES)}; default: the mode's",
    )
    calibration: str | os.PathLike | None = option(
        "cpu",
        "kernel workspaces in the peak: this machine's calibration for cpu or cuda (see memplan calibrate), a "
        "calibration JSON file, or none",
        parse="none",
    )
    target: Target = None


class ProfileOptions(Options):
    """Every option of :func:`memplan.api.profile` and ``memplan profile``."""

    what: ClassVar[str] = "profile"

    method: Method = "full"
    capture: Capture = Capture()
    strategy: StrategyOptions = StrategyOptions()
    costing: Costing = Costing()
    check: bool = option(
        False,
        "also run one real CPU forward + loss of the model at batch <= 2 under saved_tensors_hooks and compare "
        "with the prediction (exit 1 if they differ)",
    )
    micro_batch: int | None = option(
        None,
        "gradient accumulation: the batch as M micro-batches of batch / M; saved activations of one micro-batch, "
        "the peak of a later one (warns where a BatchNorm's batch statistics make it compute something else)",
    )


class CompareOptions(Options):
    """Every option of :func:`memplan.api.compare` and ``memplan compare``."""

    what: ClassVar[str] = "compare"

    capture: Capture = Capture()
    costing: Costing = Costing()


class VerifyOptions(Options):
    """Every option of :func:`memplan.verify.verify` and ``memplan verify``."""

    what: ClassVar[str] = "verify"

    method: Method = "full"
    strategy: StrategyOptions = StrategyOptions()
    batch: Batch = 2
    resolution: Resolution = None
    input_shape: InputShape = None
    classes: Classes = None
    norm: Norm = None
    steps: int = option(2, "real training steps on random data")
    device: str = option("auto", "torch device: auto (CUDA when present), cpu or cuda")
    optimizer: Optimizer = DEFAULT_OPTIMIZER
    tolerance: int = option(0, "allowed |measured - predicted| saved bytes")
    lr: float = option(0.01, "learning rate of the training steps", cli=False)
    seed: int = option(0, "seed of the model's initialisation and the random batch", cli=False)


class CalibrateOptions(Options):
    """Every option of :func:`memplan.verify.calibrate.calibrate` and ``memplan calibrate``."""

    what: ClassVar[str] = "calibrate"

    methods: tuple[str, ...] | None = option(
        None,
        "comma-separated strategies to calibrate, e.g. full,bias (default: the strategies memplan compare shows)",
        parse="texts",
    )
    batch: Batch = 1
    resolution: Resolution = None
    classes: Classes = None
    strategy: StrategyOptions = StrategyOptions()
    backend: str = option("cpu", "cpu or cuda")
    threads: int | None = option(
        None,
        "torch threads to measure with (default: torch's); profiles look up the workspaces of their own thread count",
    )
