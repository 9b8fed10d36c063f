"""Standard step vs the Tiny Training Engine's in-place update (``--schedule tte`` /
``memplan.train.step_in_backward``), predicted and measured, for full / lastk / sparse updates.

For each case: calibrate this machine's kernel workspaces (``memplan calibrate``, shared entries
are measured once), predict the step peak in the ``pytorch`` mode for both schedules, and measure
both with torch.profiler's allocation replay (``memplan.verify.measure.step_peak_bytes``) on the
same model and batch. Printed: bytes above the resident memory (weights, buffers, the batch),
the prediction's error and the measured tte / standard ratio (the two steps run in the same
process, so the ratio does not depend on the machine's load). The sparse scheme is the shipped
100KB one, applied the plain way (``apply_plain``: a partially updated weight trains whole).

Run: python benchmarks/peak_schedules.py [--batch 1] [--resolution 128] (the paper: batch 1, 128 px)
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from memplan.accounting.engine import compute
from memplan.apply import apply_plain
from memplan.graph.capture import capture_graph
from memplan.io import shipped
from memplan.models import zoo
from memplan.modes import get_mode
from memplan.nn.train import make_optimizer, step_in_backward
from memplan.strategies import make_plan
from memplan.verify.calibrate import calibrate_graphs
from memplan.verify.measure import step_peak_bytes

torch.set_num_threads(1)
CASES = [
    ("mcunet-5fps", "full", {}),
    ("mcunet-5fps", "lastk", {"blocks": 4}),
    ("mcunet-5fps", "sparse", {"scheme": str(shipped("schemes", "mcunet-5fps-100KB.json"))}),
    ("mbv2-w0.35", "full", {}),
    ("mbv2-w0.35", "lastk", {"blocks": 4}),
    ("mbv2-w0.35", "sparse", {"scheme": str(shipped("schemes", "mbv2-w0.35-100KB.json"))}),
    ("resnet18", "full", {}),
    ("resnet18", "lastk", {"blocks": 2}),
]


def resident(model: torch.nn.Module, *batch: torch.Tensor) -> int:
    tensors = [*model.parameters(), *model.buffers(), *batch]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def run(name: str, method: str, opts: dict, batch: int, resolution: int) -> dict[str, int]:
    shape = (batch, *zoo.get_entry(name).input_shape(resolution))
    out: dict[str, int] = {}
    for schedule in ("standard", "tte"):
        torch.manual_seed(0)
        model = zoo.build(name, num_classes=10)
        graph = capture_graph(model, shape)
        plan = make_plan(graph, method, **opts)
        calibrate_graphs([(graph, plan)])
        prof = compute(graph, plan, get_mode("pytorch"), schedule=schedule)
        apply_plain(model, graph, plan)
        model.zero_grad(set_to_none=True)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(shape, generator=g), torch.randint(0, 10, (batch,), generator=g)
        if schedule == "tte":
            step_in_backward(model, make_optimizer(model.parameters(), "sgd", 0.01))
        torch.manual_seed(0)
        out[f"{schedule} measured"] = step_peak_bytes(model, x, y)
        out[f"{schedule} predicted"] = prof.totals.peak_bytes - resident(model, x, y)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--resolution", type=int, default=128)
    args = ap.parse_args()
    os.environ.setdefault("MEMPLAN_CACHE", tempfile.mkdtemp(prefix="memplan-bench-"))
    print(
        f"batch {args.batch}, {args.resolution} px, torch {torch.__version__}, "
        f"CPU {torch.backends.cpu.get_cpu_capability()}, 1 thread; MB = 1e6 B above the resident memory\n"
    )
    head = (
        f"{'model':18s} {'method':7s} {'std pred':>9s} {'std meas':>9s} {'err':>6s} "
        f"{'tte pred':>9s} {'tte meas':>9s} {'err':>6s} {'tte/std':>8s}"
    )
    print(head)
    print("-" * len(head))
    for name, method, opts in CASES:
        r = run(name, method, opts, args.batch, args.resolution)
        err = {s: (r[f"{s} predicted"] - r[f"{s} measured"]) / r[f"{s} measured"] for s in ("standard", "tte")}
        print(
            f"{name:18s} {method:7s} {r['standard predicted'] / 1e6:9.2f} {r['standard measured'] / 1e6:9.2f} "
            f"{100 * err['standard']:+5.1f}% {r['tte predicted'] / 1e6:9.2f} {r['tte measured'] / 1e6:9.2f} "
            f"{100 * err['tte']:+5.1f}% {r['tte measured'] / r['standard measured']:8.2f}"
        )


if __name__ == "__main__":
    main()
