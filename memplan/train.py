"""``memplan.train``: training code for a scheme, as memplan itself trains it.

The training loop and the optimizers (:mod:`memplan.nn.train`: :func:`fit`, :func:`make_optimizer`,
:func:`step_in_backward`, :func:`reestimate_norm_stats`, :func:`batches_of`), and the setup a
scheme's validation accuracy was measured in, for training code that should reach it:

* :func:`prepare`: the profile's data as its runs saw it (resized to the model's input and
  standardised per channel with the training images' mean and std; the validation split carved
  as contribution analysis carved it) and the model with the linear-probe head every run started
  from (``<profile>.head.pt``, written by ``memplan contrib measure --out <profile>.json``);
  :meth:`Prepared.transform` readies new images the same way;
* :func:`fit_scheme`: the scheme's recorded training (``Scheme.training``: optimizer, rates per
  parameter family, epochs, batch) in the stage's loop (seeded order, cosine decay);
* :func:`accuracy`: top-1 accuracy in eval mode, as the validation stage evaluates.

So ``prepare`` -> ``memplan.apply_scheme`` -> ``fit_scheme(seed=s)`` -> ``accuracy`` on the
validation split gives, for each seed of ``scheme.validation.seeds``, what ``memplan search
--validate`` measured (the same numbers up to floating-point order: the stage trains the
cached suffix of the model in channels-last layout).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from .apply import plan_scheme
from .contrib.checkpoint import state_digest
from .contrib.data import Data, model_input
from .contrib.profile import ContribProfile, load_profile
from .contrib.runner import accuracy as _accuracy, linear_probe, norm_module
from .contrib.setup import setup_of
from .errors import BadOption, MemplanError
from .nn.train import batches_of, fit, reestimate_norm_stats, step_in_backward
from .nn.transforms import replace_module
from .optim import make_optimizer
from .plan import Scheme, load_scheme

__all__ = [
    "Prepared",
    "prepare",
    "fit_scheme",
    "accuracy",
    "fit",
    "make_optimizer",
    "step_in_backward",
    "reestimate_norm_stats",
    "batches_of",
]

#: what follows a profile's stem in the name of its linear-probe head (``contrib measure --out``)
HEAD_SUFFIX = ".head.pt"


@dataclass
class Prepared:
    """A contribution profile's setup for training code (:func:`prepare`)."""

    model: nn.Module  # the backbone as measured, with the linear-probe head (eval mode)
    data: Data  # x_train / y_train, x_val / y_val, x_test / y_test: float32 N x C x H x W, standardised
    classifier: str  # the head's module name
    head: str  # where the head came from: the head file, or "linear probe" (trained again)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The model's per-sample input shape (C, H, W)."""
        return tuple(self.data.x_train.shape[1:])

    def transform(self, images: Any) -> Tensor:
        """New images (N x H x W grey, N x H x W x C or N x C x H x W; uint8 or values above 1 scaled
        by 1/255) as the model's input: resized and standardised with the training split's
        per-channel mean and std, exactly as every split of :attr:`data` is."""
        return model_input(images, self.sample_shape, self.data.mean, self.data.std)


def _head_file(profile_path: Path | None, head: str | os.PathLike | None) -> Path | None:
    if head is not None:
        return Path(head)
    if profile_path is None:
        return None
    beside = profile_path.with_suffix(HEAD_SUFFIX)
    return beside if beside.is_file() else None


def _load_head(model: nn.Module, classifier: str, path: Path) -> None:
    try:
        stored = torch.load(path, map_location="cpu", weights_only=True)
        model.get_submodule(classifier).load_state_dict(stored["head"])
    except (OSError, RuntimeError, KeyError, TypeError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise MemplanError(
            f"cannot load the linear-probe head {path} into {classifier!r}: {first}",
            "give the head file contrib measure wrote beside this profile, and a model with its class count",
        ) from None


def _backbone(model: nn.Module | None, setup: Any) -> nn.Module:
    """``model`` when its weights are the profile's backbone (the head left out), else a one-line error;
    the profile's own rebuilt model for None."""
    if model is None:
        return setup.net
    try:
        same = state_digest(model, setup.head) == state_digest(setup.net, setup.head)
    except (KeyError, RuntimeError, AttributeError):
        same = False
    if not same:
        raise BadOption(
            "the model's backbone weights (or layers) differ from those the profile was measured with",
            "load the weights contrib measure used (--weights), or pass model=None for the profile's own",
        )
    head, sized = model.get_submodule(setup.head), setup.net.get_submodule(setup.head)
    if isinstance(head, nn.Linear) and head.weight.shape != sized.weight.shape:  # another class count: re-headed
        replace_module(model, setup.head, copy.deepcopy(sized).train(head.training))
    return model


def prepare(
    profile: str | os.PathLike | ContribProfile,
    model: nn.Module | None = None,
    *,
    head: str | os.PathLike | None = None,
    scheme: Scheme | str | os.PathLike | None = None,
) -> Prepared:
    """The setup a contribution profile's runs and ``memplan search --validate`` trained in.

    ``profile``: the profile JSON (or object) ``memplan contrib measure`` wrote; its data is read again
    from the spec it records (the same file, split and preprocessing; refused when it changed).
    ``model``: your model, whose weights must be the backbone the profile was measured with
    (checked; default: the profile's model rebuilt with those weights; a linear head of another
    class count is replaced by one of the profile's); it gets the profile's
    linear-probe head (``head``: the file; default ``<profile>.head.pt`` beside the profile, else
    the probe is trained again, deterministically) and is changed in place. ``scheme``: for a
    scheme whose norms re-estimate their statistics (norm mode ``reestimate``): they are
    re-estimated on the training split and the head re-fit, as the validation stage does; then
    ``memplan.apply_scheme`` as usual."""
    path = None if isinstance(profile, ContribProfile) else Path(profile)
    prof = profile if isinstance(profile, ContribProfile) else load_profile(profile)
    setup = setup_of(prof)
    net = _backbone(model, setup)
    seen = setup.task.validation_task() if setup.task.x_val is not None else setup.task
    file = _head_file(path, head)
    if file is not None:
        _load_head(net, setup.head, file)
    else:
        linear_probe(net, setup.head, seen, prof.protocol)
    if scheme is not None:
        _reestimate(net, setup.head, seen, prof, scheme)
    net.eval()
    task = setup.task
    return Prepared(net, task, setup.head, str(file) if file is not None else "linear probe")


def _reestimate(net: nn.Module, classifier: str, seen: Data, prof: ContribProfile, scheme: Any) -> None:
    """Norm statistics of the scheme's ``reestimate`` norms on the training split, then the head re-fit
    on them (``memplan.contrib.runner.Worker.refit_statistics``)."""
    scheme = scheme if isinstance(scheme, Scheme) else load_scheme(scheme)
    graph, plan = plan_scheme(net, scheme)
    if not plan.reestimate:
        return
    names = sorted({norm_module(graph.by_name(n)) for n in plan.reestimate})
    reestimate_norm_stats(net, batches_of(seen.x_train, prof.protocol.batch_size), names)
    linear_probe(net, classifier, seen, prof.protocol)


def fit_scheme(
    model: nn.Module, scheme: Scheme | str | os.PathLike, x: Tensor, y: Tensor, *, seed: int = 0
) -> list[float]:
    """Train ``model`` (after ``memplan.apply_scheme``) on ``(x, y)`` as the scheme's validation stage
    did: its ``training`` (optimizer, rates per parameter family through
    ``make_optimizer(model, scheme=...)``, epochs, batch size), minibatches in an order drawn from
    ``seed``, every rate decaying to 0 along a cosine; a batch in the scheme's micro-batches
    (``Scheme.execution.micro_batches``: gradient accumulation, the same gradients). Returns the
    loss of each step. A scheme
    without ``training`` (searched without ``--validate`` or a profile ``--lr-grid``) is refused."""
    scheme = scheme if isinstance(scheme, Scheme) else load_scheme(scheme)
    training = scheme.training
    if training is None:
        raise BadOption(
            "the scheme records no training (optimizer, rates, epochs, batch)",
            "search it with --validate N, or train it with your own loop (memplan.train.make_optimizer)",
        )
    opt = make_optimizer(model, scheme=scheme)
    micro = scheme.execution.micro_batches if scheme.execution is not None else 1
    return fit(
        model,
        opt,
        x,
        y,
        epochs=training.epochs,
        batch_size=training.batch_size,
        seed=seed,
        cosine=True,
        micro_batches=micro,
    )


def accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """Top-1 accuracy of ``model`` on ``(x, y)`` in %, in eval mode and without gradients (as the
    validation stage evaluates); the model is left in eval mode."""
    model.eval()
    return _accuracy(model, lambda idx: [x[idx]], y)
