"""Training: an optimizer by name and the one training loop memplan uses (``verify``'s steps,
contribution analysis runs, its linear probe and the digits pretraining), and the re-estimation
of norm statistics on the target data (:func:`reestimate_norm_stats`).

Optimizers come from the one table of :mod:`memplan.optim` (``make_optimizer`` is re-exported
here, so ``memplan.train.make_optimizer`` builds them in training code).

:func:`step_in_backward` is the Tiny Training Engine's in-place update in PyTorch: each
parameter is updated (and its gradient freed) as soon as backward has accumulated its gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import BadOption
from ..optim import make_optimizer  # noqa: F401 (re-exported: memplan.train.make_optimizer)

#: the inputs of one step: the sample indices (None = all) -> the forward's arguments
Inputs = Callable[[Tensor | None], Sequence[Tensor]]


class InBackwardStep:
    """The hooks installed by :func:`step_in_backward`; ``remove()`` restores ordinary training."""

    def __init__(self, handles: list[Any], optimizers: dict[Tensor, torch.optim.Optimizer]):
        self.handles = handles
        self.optimizers = optimizers  # one per parameter, sharing the original group's settings

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def step_in_backward(params: Iterable[Tensor] | torch.nn.Module, optimizer: torch.optim.Optimizer) -> InBackwardStep:
    """Apply ``optimizer``'s update to each parameter during backward, as soon as its gradient is
    complete, then free that gradient: the 256KB paper's in-place update (Tiny Training Engine,
    Sec. 2.3), with ``Tensor.register_post_accumulate_grad_hook``.

    After the call a training step is ``loss.backward()`` alone: do not call ``optimizer.step()``
    or ``zero_grad()`` (gradients are None after backward). Each parameter of ``params`` (a
    module or tensors) that ``optimizer`` holds gets an optimizer of the same class over itself
    alone, whose settings (``lr``, ``momentum``, ...) are copied from its group in ``optimizer``
    before every update, so learning-rate schedulers on ``optimizer`` keep working. For SGD
    without momentum (the paper's choice) the parameters equal those of an ordinary step;
    optimizers whose update mixes parameters (LBFGS) are refused. The autograd engine runs a
    parameter's accumulation as soon as its gradient is ready, before the next op's backward, so
    only one op's parameter gradients are alive at a time (``memplan profile --schedule tte``).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise BadOption("step_in_backward needs an optimizer that updates each parameter on its own (not LBFGS)")
    tensors = list(params.parameters()) if isinstance(params, torch.nn.Module) else list(params)
    wanted = {id(t) for t in tensors}
    handles: list[Any] = []
    optimizers: dict[Tensor, torch.optim.Optimizer] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in wanted or not p.requires_grad:
                continue
            settings = {k: v for k, v in group.items() if k != "params"}
            own = type(optimizer)([{**settings, "params": [p]}])
            optimizers[p] = own
            handles.append(p.register_post_accumulate_grad_hook(_update(own, group)))
    if not handles:
        raise BadOption("nothing to train: the optimizer holds none of these parameters with requires_grad")
    return InBackwardStep(handles, optimizers)


def _update(own: torch.optim.Optimizer, group: dict[str, Any]) -> Callable[[Tensor], None]:
    def hook(p: Tensor) -> None:
        own.param_groups[0].update({k: v for k, v in group.items() if k != "params"})
        own.step()
        p.grad = None

    return hook


def fit(  # public keyword API: one keyword per training setting
    forward: Callable[..., Tensor],
    optimizer: torch.optim.Optimizer,
    x: Tensor | Inputs,
    y: Tensor,
    *,
    steps: int | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    cosine: bool = False,
    micro_batches: int = 1,
) -> list[float]:
    """Cross-entropy training of ``forward`` on ``(x, y)``; returns the loss of each step,
    measured before its update.

    Either ``steps`` steps on the whole batch, or ``epochs`` passes in minibatches of
    ``batch_size`` samples, in an order drawn from ``seed`` (one ``torch.randperm`` per epoch;
    the last batch of an epoch may be smaller). ``x``: the input tensor, or a function of the
    sample indices returning the forward's arguments (e.g. cached features). ``cosine``: every
    learning rate decays to 0 along a cosine over all steps (so the end point does not depend on
    where an epoch happens to stop). Train / eval flags are left as they are (``apply_*`` set
    them per norm layer); gradients are released (set to None) before each step. Stochastic layers
    (dropout, drop-connect) draw from torch's global generators (CPU, and the CUDA device of ``y``)
    seeded with ``seed`` inside the call and restored after it, so a run does not depend on what
    ran before it in the process. ``micro_batches``: M, gradient accumulation: each step's batch
    runs as M micro-batches (``torch.tensor_split``: sizes differ by at most one), each a forward
    and a backward of its cross-entropy scaled by its share of the batch, so the accumulated
    gradient is the whole batch's mean-loss gradient (equal up to summation order where no norm
    uses batch statistics), then one optimizer step; the loss returned is the batch's.
    """
    if (steps is None) == (epochs is None) or (epochs is not None and batch_size is None):
        raise ValueError("give either steps, or epochs and batch_size")
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise BadOption(f"micro_batches must be a positive integer, got {micro_batches!r}")
    inputs: Inputs = x if callable(x) else (lambda idx: [x if idx is None else x[idx]])
    n = y.shape[0]
    total = steps if steps is not None else epochs * -(-n // batch_size)
    batches = [None] * steps if steps is not None else _shuffled(n, epochs, batch_size, seed)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, total) if cosine else None
    losses = []
    cuda = [y.device.index if y.device.index is not None else torch.cuda.current_device()] if y.is_cuda else []
    with torch.random.fork_rng(devices=cuda):  # the CPU generator and that of the CUDA device trained on
        torch.manual_seed(seed)
        for idx in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = _accumulate(forward, inputs, y, idx, micro_batches)
            optimizer.step()
            if schedule is not None:
                schedule.step()
            losses.append(loss.item())
    return losses


def _accumulate(
    forward: Callable[..., Tensor], inputs: Inputs, y: Tensor, idx: Tensor | None, micro_batches: int
) -> Tensor:
    """Forward and backward of the mean cross-entropy over the samples ``idx`` (None: all), in
    ``micro_batches`` micro-batches whose losses are scaled by their share of the batch (``fit``);
    returns the batch's loss, detached where it was split."""
    if micro_batches == 1:
        loss = F.cross_entropy(forward(*inputs(idx)), y if idx is None else y[idx])
        loss.backward()
        return loss
    full = torch.arange(y.shape[0], device=y.device) if idx is None else idx
    total = torch.zeros((), dtype=torch.float64)
    for part in torch.tensor_split(full, micro_batches):
        if part.numel() == 0:
            continue
        share = F.cross_entropy(forward(*inputs(part)), y[part]) * (part.numel() / full.numel())
        share.backward()
        total += share.detach().double().cpu()
    return total


def reestimate_norm_stats(
    model: torch.nn.Module, batches: Iterable[Tensor | Sequence[Tensor]], names: Iterable[str] | None = None
) -> torch.nn.Module:
    """Re-estimate the running statistics of BatchNorm layers on the target data; returns the model.

    The norms named in ``names`` (module qualnames; None: every BatchNorm that tracks running
    statistics) have their statistics reset and are run in train mode over ``batches`` (each a
    tensor or the forward's arguments), without gradient, with ``momentum=None``: torch's
    cumulative average, so each running mean / variance ends as the plain average over the
    batches of the batch mean / unbiased batch variance of the norm's input (per channel; equal
    batches: the data's mean). Every other module runs in eval mode (dropout off, the other norms
    on their own statistics). Afterwards the train / eval flags and momenta are what they were;
    the norms keep the new statistics, for a training that freezes them (eval mode: the norm mode
    ``reestimate``). A forward pass only: nothing is kept for backward. Run it on the plain model
    (before ``memplan.apply_*``, or on norms ``apply_*`` left as BatchNorm). MemplanError for a
    name that is not such a norm, or for no batch."""
    norms = {q: m for q, m in model.named_modules() if isinstance(m, _BatchNorm) and m.track_running_stats}
    chosen = list(norms.values()) if names is None else [_norm(model, norms, q) for q in names]
    flags = [(m, m.training) for m in model.modules()]
    momenta = [(m, m.momentum) for m in chosen]
    model.eval()
    for m in chosen:
        m.reset_running_stats()
        m.momentum = None
        m.train()
    seen = 0
    try:
        with torch.no_grad():
            for batch in batches:
                model(*([batch] if isinstance(batch, Tensor) else batch))
                seen += 1
    finally:
        for m, flag in flags:
            m.training = flag
        for m, momentum in momenta:
            m.momentum = momentum
    if not seen:
        raise BadOption("re-estimating norm statistics needs at least one batch of data")
    return model


def _norm(model: torch.nn.Module, norms: dict[str, _BatchNorm], name: str) -> _BatchNorm:
    if name not in norms:
        try:
            kind = type(model.get_submodule(name)).__name__
        except AttributeError:
            raise BadOption(f"the model has no module {name!r} to re-estimate") from None
        raise BadOption(
            f"module {name!r} is a {kind}, not a BatchNorm with running statistics; nothing to re-estimate",
            "re-estimate before memplan.apply_* (which may swap a norm for a lean module)",
        )
    return norms[name]


def batches_of(x: Tensor, batch_size: int) -> Iterator[Tensor]:
    """``x`` in consecutive chunks of ``batch_size`` samples, in order (the last may be smaller)."""
    for start in range(0, x.shape[0], batch_size):
        yield x[start : start + batch_size]


def _shuffled(n: int, epochs: int, batch_size: int, seed: int) -> Iterator[Tensor]:
    """Minibatch indices of ``epochs`` passes over ``n`` samples, each pass in a new seeded order."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=g)
        for start in range(0, n, batch_size):
            yield perm[start : start + batch_size]
