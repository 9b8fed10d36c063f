"""memplan against the peer profilers and against measurement, in one table.

Run: ``python benchmarks/peers.py`` (``--repeat N`` timing repeats, ``--out DIR``). Installs
nothing: uses whichever of torchinfo, fvcore, ptflops, thop and calflops are importable
(``pip install -e '.[bench]'``) plus ``torch.utils.flop_counter.FlopCounterMode``.

For each model x strategy (``memplan.apply.apply_plain`` sets ``requires_grad`` and norm
modes the plain way) every tool reports what it can of:

* forward FLOPs, converted to FLOPs = 2 x MACs where the tool reports MACs;
* backward FLOPs;
* activation memory (bytes autograd keeps for backward) and the step peak (whole training
  step incl. weights, buffers and the input batch).

The truth each is compared with (relative error, %):

* FLOPs: conv / linear / matmul only (2 x MACs). Forward: FlopCounterMode (exact for these
  ops). Backward: FlopCounterMode with a group-aware ``convolution_backward`` formula (torch
  over-counts the weight gradient of grouped / depthwise convs by the group factor), i.e. what
  autograd actually runs for this strategy: grad-input + grad-weight, bias gradients excluded.
  Peers that also count norms / activations / pooling land a few % above it on plain CNNs by
  convention; the failure-mode models show real miscounts.
* activation memory: ``memplan.verify.measure.saved_bytes`` (saved-tensor hooks, unique storages,
  parameters and buffers excluded) -- memplan ``pytorch`` mode must match it to the byte;
* step peak: ``memplan.verify.measure.step_peak_bytes`` (torch.profiler allocation records of one
  forward + cross-entropy + backward) + parameter, buffer and input bytes. The profiler nets
  allocations inside one op, so this truth is itself approximate (kernel workspaces).

Wall time: each tool's call on a warm process (best of ``--repeat``), divided by the time of
``memplan.profile(model, method, mode="pytorch")`` on the same model.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import import_module, metadata
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import memplan
from memplan.apply import apply_plain
from memplan.costs.observe import conv_backward_flops
from memplan.graph.capture import capture_graph
from memplan.io import write_text
from memplan.models import zoo
from memplan.strategies import make_plan
from memplan.verify.measure import model_modules, saved_bytes, step_peak_bytes

CLASSES = 100
BATCH = 8
METHODS = ("full", "bias", "last")
RESULTS = Path(__file__).with_name("peers_results")
aten = torch.ops.aten


# --------------------------------------------------------------------------- failure-mode models


class FunctionalNet(nn.Module):
    """Parameters only in nn.Conv2d / nn.Linear; everything between them is functional:
    F.relu, x + y, an SE-style x * gate, torch.flatten, F.adaptive_avg_pool2d, softmax and two
    activation @ activation matmuls (spatial self-attention, written with the ``@`` operator,
    about half of the forward MACs)."""

    def __init__(self, num_classes: int = CLASSES, width: int = 64):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, stride=2, padding=1)
        self.down = nn.Conv2d(width, width, 3, stride=2, padding=1)
        self.conv = nn.Conv2d(width, width, 3, padding=1)
        self.gate = nn.Linear(width, width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.down(F.relu(self.stem(x))))
        x = x + F.relu(self.conv(x))
        g = torch.sigmoid(self.gate(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))
        x = x * g.unsqueeze(-1).unsqueeze(-1)
        t = torch.flatten(x, 2)  # B x C x N
        attn = torch.softmax(t.transpose(1, 2) @ t, dim=-1)  # B x N x N: B*N*N*C MACs
        t = t + t @ attn  # B x C x N: B*C*N*N MACs
        return self.head(t.mean(2))


class DepthwiseNet(nn.Module):
    """Depthwise-heavy: a strided stem, four 7x7 depthwise convs (groups = channels) and one
    grouped 3x3 conv (8 groups), each with BatchNorm + ReLU6, then pooling and a classifier."""

    def __init__(self, num_classes: int = CLASSES, width: int = 128):
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(3, width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU6(),
        ]
        for _ in range(4):
            layers += [
                nn.Conv2d(width, width, 7, padding=3, groups=width, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU6(),
            ]
        layers += [nn.Conv2d(width, width, 3, padding=1, groups=8, bias=False), nn.BatchNorm2d(width), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


@dataclass(frozen=True)
class Case:
    """One model at one input size: ``build()`` returns a freshly initialised model."""

    name: str
    build: Callable[[], nn.Module]
    batch: int
    resolution: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, 3, self.resolution, self.resolution)


def zoo_case(name: str, resolution: int = 128) -> Case:
    return Case(name, lambda: zoo.build(name, num_classes=CLASSES), BATCH, resolution)


CASES = [
    zoo_case("mcunet-5fps"),
    zoo_case("mobilenetv2"),
    zoo_case("proxylessnas-mobile"),
    zoo_case("resnet18"),
    Case("functional-ops", FunctionalNet, BATCH, 96),
    Case("depthwise-heavy", DepthwiseNet, BATCH, 64),
]


# --------------------------------------------------------------------------- numbers


@dataclass
class Estimate:
    """One tool's answer for one model x strategy. FLOPs = 2 x MACs, memory in bytes; None =
    the tool has no such figure."""

    forward_flops: int | None = None
    backward_flops: int | None = None
    activation_bytes: int | None = None
    peak_bytes: int | None = None
    seconds: float = 0.0
    failed: str | None = None  # the tool raised / returned nothing: first line of why


@dataclass
class Row:
    model: str
    method: str
    tool: str
    estimate: Estimate
    errors: dict[str, float | None] = field(default_factory=dict)  # metric -> relative error in %
    time_vs_memplan: float | None = None


@dataclass(frozen=True)
class Tool:
    """A peer profiler: ``run(model, x) -> Estimate`` (seconds filled in by the caller)."""

    name: str
    module: str  # import name, to test availability and read the version
    reports: str  # the tool's own unit and what it counts (the convention)
    run: Callable[[nn.Module, torch.Tensor], Estimate]


def _torchinfo(model: nn.Module, x: torch.Tensor) -> Estimate:
    from torchinfo import summary

    s = summary(model, input_size=tuple(x.shape), verbose=0)
    # "Forward/backward pass size" = 2 x outputs of leaf layers with parameters;
    # "Estimated Total Size" = input + that + parameters
    return Estimate(
        2 * s.total_mult_adds, None, s.total_output_bytes, s.total_input + s.total_output_bytes + s.total_param_bytes
    )


def _fvcore(model: nn.Module, x: torch.Tensor) -> Estimate:
    from fvcore.nn import ActivationCountAnalysis, FlopCountAnalysis

    counts = []
    for analysis in (FlopCountAnalysis(model, (x,)), ActivationCountAnalysis(model, (x,))):
        analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
        counts.append(int(analysis.total()))
    return Estimate(2 * counts[0], None, counts[1] * x.element_size(), None)  # fvcore "flop" = one MAC


def _ptflops(backend: str) -> Callable[[nn.Module, torch.Tensor], Estimate]:
    def run(model: nn.Module, x: torch.Tensor) -> Estimate:
        from ptflops import get_model_complexity_info

        # its API takes the per-sample shape and runs batch 1; MACs x batch
        macs, _ = get_model_complexity_info(
            model, tuple(x.shape[1:]), print_per_layer_stat=False, as_strings=False, backend=backend
        )
        if macs is None:
            raise RuntimeError("returned None")
        return Estimate(int(2 * macs * x.shape[0]))

    return run


def _thop(model: nn.Module, x: torch.Tensor) -> Estimate:
    from thop import profile

    macs, _ = profile(model, inputs=(x,), verbose=False)
    return Estimate(int(2 * macs))


def _calflops(model: nn.Module, x: torch.Tensor) -> Estimate:
    from calflops import calculate_flops

    factor = 2.0  # calflops' compute_bp_factor default: backward = 2 x forward
    flops, _, _ = calculate_flops(
        model,
        input_shape=tuple(x.shape),
        include_backPropagation=True,
        compute_bp_factor=factor,
        print_results=False,
        print_detailed=False,
        output_as_string=False,
    )
    forward = int(flops / (1 + factor))
    return Estimate(forward, int(flops) - forward)


def flop_counter_step(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, backward_mapping: dict | None = None
) -> tuple[int, int]:
    """(forward, backward) FLOPs of one forward + cross-entropy + backward under FlopCounterMode."""
    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as fwd:
        loss = F.cross_entropy(model(x), y)
    with FlopCounterMode(display=False, custom_mapping=backward_mapping or {}) as bwd:
        if loss.requires_grad:
            loss.backward()
    model.zero_grad(set_to_none=True)
    return fwd.get_total_flops(), bwd.get_total_flops()


def _flop_counter(model: nn.Module, x: torch.Tensor) -> Estimate:
    y = torch.zeros(x.shape[0], dtype=torch.long)
    return Estimate(*flop_counter_step(model, x, y))


PEERS = [
    Tool(
        "torchinfo",
        "torchinfo",
        "MACs of leaf modules (conv/linear/norm); memory = 2 x outputs of layers "
        "with parameters (+ input + parameters for the step peak)",
        _torchinfo,
    ),
    Tool(
        "fvcore",
        "fvcore",
        "MACs (its 'flop' = one fused multiply-add), jit-traced aten ops incl. norms; "
        "activation memory = ActivationCountAnalysis x 4 B",
        _fvcore,
    ),
    Tool(
        "ptflops",
        "ptflops",
        "MACs of one sample (its API runs batch 1: x batch here, and its time is for "
        "batch 1); module hooks + patched functionals incl. norm / activation / pool",
        _ptflops("pytorch"),
    ),
    Tool("ptflops-aten", "ptflops", "as ptflops, aten backend: aten mm / bmm / addmm / convolution", _ptflops("aten")),
    Tool("thop", "thop", "MACs of module hooks incl. norm / activation / pool; functional ops uncounted", _thop),
    Tool(
        "calflops",
        "calflops",
        "FLOPs = 2 x MACs incl. functional elementwise ops; backward = compute_bp_factor (2) x forward",
        _calflops,
    ),
    Tool(
        "FlopCounterMode",
        "torch",
        "FLOPs = 2 x MACs of mm / bmm / conv ops, forward and the real backward "
        "(grouped-conv weight gradient counted x groups)",
        _flop_counter,
    ),
]
MEMPLAN_REPORTS = (
    "FLOPs = 2 x MACs of conv / linear / matmul (other ops reported separately); backward = "
    "grad-input + grad-weight; pytorch-mode saved bytes and simulated step peak"
)
TRUTH_REPORTS = (
    "FlopCounterMode forward, group-aware backward; saved-tensor hooks; torch.profiler step "
    "peak + weights, buffers, input; time = one real step with saved-tensor hooks"
)


def available_peers(peers: Sequence[Tool] = PEERS) -> list[Tool]:
    """The peers whose package imports (a broken install counts as absent)."""
    out = []
    for tool in peers:
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import_module(tool.module)
        except Exception:
            continue
        out.append(tool)
    return out


def version(module: str) -> str:
    try:
        return metadata.version(module)
    except metadata.PackageNotFoundError:
        return "?"


def timed(fn: Callable[[], Estimate], repeat: int) -> Estimate:
    """``fn()``'s estimate with ``seconds`` = best of ``repeat`` wall times."""
    best, est = float("inf"), Estimate()
    for _ in range(repeat):
        t = time.perf_counter()
        est = fn()
        best = min(best, time.perf_counter() - t)
    est.seconds = best
    return est


def run_peer(tool: Tool, model: nn.Module, x: torch.Tensor, repeat: int) -> Estimate:
    """Run a peer on deep copies of ``model`` (peers switch train / eval and attach hooks),
    silencing its console output; a failure becomes ``Estimate.failed``."""

    def once() -> Estimate:
        m = copy.deepcopy(model)
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tool.run(m, x)

    try:
        return timed(once, repeat)
    except Exception as exc:  # a peer failing on a model is a result, not a crash
        return Estimate(failed=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:120])


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (C-level writes included) for the duration."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def measure_truth(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Estimate:
    """Independent measurements on ``model`` (already set up by ``apply_plain``)."""
    fwd, bwd = flop_counter_step(model, x, y, {aten.convolution_backward: conv_backward_flops})
    static = sum(t.nbytes for t in [*model.parameters(), *model.buffers()]) + x.nbytes + y.nbytes  # the batch is held
    t = time.perf_counter()
    saved = saved_bytes(model, x, y, backward=True).bytes
    seconds = time.perf_counter() - t
    model.zero_grad(set_to_none=True)
    with quiet_stderr():  # torch.profiler's C++ side prints start / stop lines
        peak = step_peak_bytes(model, x, y) + static
    model.zero_grad(set_to_none=True)
    return Estimate(fwd, bwd, saved, peak, seconds)


def run_memplan(model: nn.Module, method: str, case: Case, repeat: int) -> Estimate:
    """``memplan.profile`` in ``pytorch`` mode, timed; unknown ops abort (never costed as zero)."""

    def once() -> Estimate:
        p = memplan.profile(model, method, mode="pytorch", batch=case.batch, resolution=case.resolution)
        if p.unknown_ops:
            raise RuntimeError(f"memplan: unknown ops on {case.name}: {p.unknown_ops}")
        t = p.totals
        return Estimate(
            t.forward_flops,
            t.backward_grad_input_flops + t.backward_grad_weight_flops,
            t.saved_activation_bytes,
            t.peak_bytes,
        )

    return timed(once, repeat)


METRICS = ("forward_flops", "backward_flops", "activation_bytes", "peak_bytes")


def relative_error(est: int | None, truth: int) -> float | None:
    """100 x (est - truth) / truth; None where the tool has no figure."""
    if est is None:
        return None
    if truth == 0:
        return 0.0 if est == 0 else float("inf")
    return 100.0 * (est - truth) / truth


def run_case(
    case: Case, methods: Sequence[str] = METHODS, peers: Sequence[Tool] | None = None, repeat: int = 1
) -> list[Row]:
    """Truth, memplan and every available peer for ``case`` x each of ``methods``."""
    peers = available_peers() if peers is None else peers
    torch.manual_seed(0)
    base = case.build()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(case.shape, generator=g)
    y = torch.randint(0, CLASSES, (case.batch,), generator=g)
    graph = capture_graph(copy.deepcopy(base), case.shape)
    rows: list[Row] = []
    for method in methods:
        model = copy.deepcopy(base)
        model_modules(model, graph)
        apply_plain(model, graph, make_plan(graph, method))
        truth = measure_truth(model, x, y)
        mine = run_memplan(copy.deepcopy(model), method, case, repeat)
        found = [("truth", truth), ("memplan", mine)] + [(p.name, run_peer(p, model, x, repeat)) for p in peers]
        for tool, est in found:
            row = Row(case.name, method, tool, est)
            if tool != "truth":
                row.errors = {m: relative_error(getattr(est, m), getattr(truth, m)) for m in METRICS}
            if est.failed is None:
                row.time_vs_memplan = est.seconds / mine.seconds
            rows.append(row)
    return rows


# --------------------------------------------------------------------------- rendering

COLUMNS = (
    "model",
    "strategy",
    "tool",
    "fwd MFLOP",
    "err",
    "bwd MFLOP",
    "err",
    "act. MB",
    "err",
    "peak MB",
    "err",
    "time",
)


def _err(e: float | None, exact: bool = False) -> str:
    if e is None:
        return "n/a"
    if exact:
        return "exact"
    if abs(e) >= 1000:
        return f"{e:+,.0f}%"
    return f"{e:+.1f}%" if abs(e) >= 0.05 else f"{e:+.3f}%"


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    """The printed / Markdown table: one line per model x strategy x tool."""
    truths = {(r.model, r.method): r.estimate for r in rows if r.tool == "truth"}
    out = []
    for r in rows:
        e, t = r.estimate, truths[(r.model, r.method)]
        if e.failed:
            out.append([r.model, r.method, r.tool, f"failed: {e.failed}"] + [""] * (len(COLUMNS) - 4))
            continue
        cells = [r.model, r.method, r.tool]
        for metric in METRICS:  # MFLOP and MB: both 1e6
            v = getattr(e, metric)
            cells.append("n/a" if v is None else f"{v / 1e6:,.2f}")
            cells.append("" if r.tool == "truth" else _err(r.errors[metric], v == getattr(t, metric)))
        cells.append(f"{r.time_vs_memplan:.1f}x")
        out.append(cells)
    return out


def render_text(rows: Sequence[Row]) -> str:
    body = [list(COLUMNS)] + table_rows(rows)
    widths = [max(len(line[i]) for line in body if len(line) > i) for i in range(len(COLUMNS))]
    lines = []
    for k, line in enumerate(body):
        if line[3].startswith("failed"):
            lines.append("  ".join(c.ljust(w) for c, w in zip(line[:3], widths)) + "  " + line[3])
        else:
            lines.append("  ".join(c.rjust(w) if i >= 3 else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))))
        if k == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


def legend(peers: Sequence[Tool]) -> list[tuple[str, str]]:
    return [("truth", TRUTH_REPORTS), ("memplan", MEMPLAN_REPORTS)] + [
        (p.name, f"{p.reports} ({p.module} {version(p.module)})") for p in peers
    ]


def worst(rows: Sequence[Row], tool: str, metric: str) -> str:
    """Largest |error| of ``tool`` on ``metric`` over all rows, with where it occurs."""
    mine = [r for r in rows if r.tool == tool and r.estimate.failed is None and r.errors.get(metric) is not None]
    if not mine:
        return "n/a"
    truths = {(r.model, r.method): r.estimate for r in rows if r.tool == "truth"}
    exact = [r for r in mine if getattr(r.estimate, metric) == getattr(truths[(r.model, r.method)], metric)]
    if len(exact) == len(mine):
        return f"exact ({len(mine)}/{len(mine)})"
    r = max(mine, key=lambda r: abs(r.errors[metric]))
    return f"{_err(r.errors[metric])} ({r.model} / {r.method})"


def summary_rows(rows: Sequence[Row]) -> list[list[str]]:
    """Per tool: worst error per metric and the median time relative to memplan."""
    out = []
    for tool in dict.fromkeys(r.tool for r in rows if r.tool != "truth"):
        times = sorted(r.time_vs_memplan for r in rows if r.tool == tool and r.time_vs_memplan is not None)
        failed = sum(r.estimate.failed is not None for r in rows if r.tool == tool)
        cells = [tool] + [worst(rows, tool, m) for m in METRICS]
        cells.append(f"{times[len(times) // 2]:.1f}x" if times else "n/a")
        cells.append(str(failed))
        out.append(cells)
    return out


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]], left: int) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i < left else "---:" for i in range(len(header))) + "|",
    ]
    return lines + ["| " + " | ".join(list(cells) + [""] * (len(header) - len(cells))) + " |" for cells in body]


def render_markdown(rows: Sequence[Row], peers: Sequence[Tool], settings: dict) -> str:
    sizes = ", ".join(f"{name} {r} px" for name, r in settings["resolutions"].items())
    lines = [
        "# memplan vs peer profilers vs measurement",
        "",
        f"Generated by `python benchmarks/peers.py` ({settings['torch']}, {settings['threads']} CPU thread, "
        f"batch {settings['batch']}, {settings['classes']} classes; {sizes}; total {settings['seconds']:.0f} s). "
        "FLOPs = 2 x MACs of conv / linear / matmul (tools that report MACs are converted); memory in "
        "1000-based MB; err = (tool - truth) / truth; time = tool wall time / `memplan.profile` wall time "
        "(warm process, best of repeats).",
        "",
        "## Worst error per tool",
        "",
        *_md_table(
            ["tool", "fwd FLOPs", "bwd FLOPs", "activation memory", "step peak", "median time", "failed"],
            summary_rows(rows),
            1,
        ),
        "",
        "## Every model x strategy",
        "",
        *_md_table(COLUMNS, table_rows(rows), 3),
        "",
        "## What each tool reports",
        "",
        *_md_table(["tool", "reports / counts"], legend(peers), 2),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2, help="timing repeats per tool (best of)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for peers.json and peers.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    peers = available_peers()
    missing = sorted({p.module for p in PEERS} - {p.module for p in peers})
    if missing:
        print(f"not installed (skipped): {', '.join(missing)}; pip install -e '.[bench]'", file=sys.stderr)
    warm = Case("warm-up", lambda: DepthwiseNet(width=16), 2, 16)  # imports and first-call costs of every tool
    run_case(warm, ("full",), peers)
    rows = [r for case in CASES for r in run_case(case, METHODS, peers, args.repeat)]
    seconds = time.perf_counter() - start
    settings = {
        "torch": f"torch {torch.__version__}",
        "python": platform.python_version(),
        "threads": 1,
        "batch": BATCH,
        "classes": CLASSES,
        "repeat": args.repeat,
        "seconds": seconds,
        "resolutions": {c.name: c.resolution for c in CASES},
    }
    print(render_text(rows))
    print()
    for name, text in legend(peers):
        print(f"{name}: {text}")
    print(f"\ntotal {seconds:.0f} s")
    args.out.mkdir(parents=True, exist_ok=True)
    data = {"settings": settings, "tools": dict(legend(peers)), "rows": [asdict(r) for r in rows]}
    write_text(args.out / "peers.json", json.dumps(data, indent=1) + "\n")
    write_text(args.out / "peers.md", render_markdown(rows, peers, settings))


if __name__ == "__main__":
    main()
