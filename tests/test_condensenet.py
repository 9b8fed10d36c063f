"""CondenseNet (tests/condensenet.py: learned group convolutions, index-based channel permutations)
and the channel permutations by index that users write, to the byte.

Per model x strategy, batch 2, through the CNN corpus's checks (``tests/corpus.check_pair``):
``pytorch``-mode saved bytes == saved_tensors_hooks (unique storages, the model's parameters and
buffers left out) on a real CPU step, loss included; forward / backward FLOPs == FlopCounterMode
with the group-aware convolution backward; ``--check`` observes the same bytes and agrees; after
``apply_strategy`` on a copy, eval outputs bit-identical to plain PyTorch's, loss identical,
gradients close, and the ``applied`` prediction == the measurement of the applied model. Every pair
must be exact: an op costed by observation (``index_select``, ``gather``) is no excuse here.

The regression this guards (issue 40, item 7): CondenseNet selects its kept channels with
``torch.index_select(x, 1, Variable(self.index))`` of an int64 buffer. Symbolic tracing evaluates
``Variable(self.index)`` (an alias of the buffer) and lifts it as a ``_tensor_constant``; after
"saved constants count as activations" (96ddbc6) what ``index_select`` saved of it was counted,
although autograd saves the buffer's own storage, which the measurement leaves out with the model's
state: a held-out CondenseNet-74 (batch 2, 224 px) was 179,904 B over in full / bias / norm and in
``applied``. The same held for ``buffer.detach()`` as a ``getitem`` index, a buffer view as a
``gather`` index, the training-time form's ``conv.weight * Variable(self._mask)`` under ``full``,
and recorded captures. Python sequences as indices (``x[:, [2, 0, 1]]``) were missed (the int64
tensor PyTorch makes of them at each call) and a boolean mask was over-counted (an upper bound of
int64 indices, where autograd keeps the mask as given).

Default run: both CondenseNet forms (small) x the five strategies and every permutation construct x
full / bias / norm / last; CondenseNet-86 (the paper's CIFAR model) x every strategy under ``-m slow``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd import Variable

from . import corpus
from .condensenet import CondenseNet, condensenet

SHAPE = (corpus.BATCH, 3, 32, 32)
FORMS = {"learned-group-conv": False, "converted": True}
SMALL = {"stages": (2, 2, 2), "growth": (4, 8, 16)}


def problems(model: nn.Module, shape, methods, name: str) -> list[str]:
    """Everything that is not exact for ``model`` at ``shape`` under each of ``methods``."""
    graph = corpus.capture_entry(model, shape)
    out = []
    for method in methods:
        r = corpus.check_pair(model, graph, shape, method, name, raise_errors=True)
        where = f"{name}/{method} [{graph.capture}]"
        if not r.bytes_exact or r.unknown_ops:
            out.append(f"{where}: predicted {r.predicted_bytes} B, measured {r.measured_bytes} B {r.unknown_ops}")
        out += r.problems_beyond_bytes(where)
    return out


# ----------------------------------------------------------------------------- CondenseNet
@pytest.mark.parametrize("method", corpus.STRATEGIES)
@pytest.mark.parametrize("form", FORMS)
def test_condensenet_to_the_byte(form, method):
    torch.manual_seed(corpus.SEED)
    model = condensenet(**SMALL, converted=FORMS[form])
    assert problems(model, SHAPE, (method,), f"condensenet-{form}") == []


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
def test_condensenet86_every_strategy(form):
    torch.manual_seed(corpus.SEED)
    assert problems(condensenet(converted=FORMS[form]), SHAPE, corpus.STRATEGIES, f"condensenet86-{form}") == []


def test_published_size():
    """CondenseNet-86 (stages 14-14-14, growth 8-16-32, G = C = 4) on CIFAR-10, condensed: 0.52M
    parameters (the paper's Table 1); every dense layer gathers its kept channels by index and
    shuffles its grouped 1x1 conv's output, the classifier reads half of the features."""
    net = CondenseNet(converted=True)
    assert round(sum(p.numel() for p in net.parameters()) / 1e6, 2) == 0.52
    assert net.classifier.index.numel() == net.num_features // 2 == 400
    assert sum(1 for m in net.modules() if m.__class__.__name__ == "CondenseConv") == 42


# ----------------------------------------------------------------------------- permutations by index
C = 8


class Permuted(nn.Module):
    """Conv stem -> ``permute`` (the construct: channels reordered or selected by index) -> BN, ReLU,
    grouped 1x1 conv (so the order matters) -> mean -> head. ``perm``: an int64 buffer."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, C, 3, padding=1)
        self.bn = nn.BatchNorm2d(C)
        self.conv = nn.Conv2d(C, C, 1, groups=2)
        self.head = nn.Linear(C, corpus.CLASSES)
        self.register_buffer("perm", torch.randperm(C, generator=torch.Generator().manual_seed(0)))

    def permute(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(F.relu(self.bn(self.permute(self.stem(x)))))
        return self.head(x.mean((2, 3)))


class IndexSelectVariable(Permuted):
    """CondenseNet's gather (pytorchcv and the authors' code): ``Variable`` of the index buffer."""

    def permute(self, x):
        return torch.index_select(x, 1, Variable(self.perm))


class IndexSelectMethod(Permuted):
    def permute(self, x):
        return x.index_select(1, self.perm)


class GetitemBuffer(Permuted):
    def permute(self, x):
        return x[:, self.perm]


class GetitemDetached(Permuted):
    def permute(self, x):
        return x[:, self.perm.detach()]


class GatherExpanded(Permuted):
    """``torch.gather`` by a view of the buffer broadcast to the input."""

    def permute(self, x):
        return torch.gather(x, 1, self.perm.view(1, -1, 1, 1).expand_as(x))


class GetitemList(Permuted):
    """A fixed channel order written as a Python list (BGR <-> RGB style)."""

    def permute(self, x):
        return x[:, [3, 1, 0, 2, 7, 5, 4, 6]]


class GetitemTuple(Permuted):
    def permute(self, x):
        return x[:, (3, 1, 0, 2, 7, 5, 4, 6)]


class GetitemBoolList(Permuted):
    """Every other channel by a Python list of bools, twice."""

    def permute(self, x):
        y = x[:, [True, False] * (C // 2)]
        return torch.cat([y, y], 1)


class GetitemBoolMask(Permuted):
    """A boolean mask tensor made in forward; it selects no channel here (how many it selects is data,
    which capture on meta cannot know), the input follows in a ``cat``."""

    def permute(self, x):
        return torch.cat([x[:, x.new_zeros(C, dtype=torch.bool)], x], 1)


class ShuffleByArange(Permuted):
    """ShuffleNet's channel shuffle as an index built in forward: a new tensor each call, which the
    measurement counts as the prediction does."""

    def permute(self, x):
        return x[:, torch.arange(C).view(2, -1).t().reshape(-1)]


class RecordedIndexSelect(Permuted):
    """The CondenseNet gather after a Python int read from a shape: captured by recording."""

    def permute(self, x):
        n = int(x.shape[1])
        return torch.index_select(x, 1, Variable(self.perm[:n]))


class RecordedGetitem(Permuted):
    def permute(self, x):
        n = int(x.shape[1])
        return x[:, self.perm.detach()[:n]]


CASES = [
    IndexSelectVariable,
    IndexSelectMethod,
    GetitemBuffer,
    GetitemDetached,
    GatherExpanded,
    GetitemList,
    GetitemTuple,
    GetitemBoolList,
    GetitemBoolMask,
    ShuffleByArange,
    RecordedIndexSelect,
    RecordedGetitem,
]


@pytest.mark.parametrize("method", ("full", "bias", "norm", "last"))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_permutation_to_the_byte(case, method):
    torch.manual_seed(corpus.SEED)
    model = case().eval()
    assert problems(model, (corpus.BATCH, 3, 8, 8), (method,), case.__name__) == []


def test_captures_take_both_paths():
    """The recorded cases are recorded, the others traced: both capture paths are covered."""
    for case in CASES:
        graph = corpus.capture_entry(case(), (corpus.BATCH, 3, 8, 8))
        assert graph.capture == ("recorded" if case.__name__.startswith("Recorded") else "symbolic"), case
