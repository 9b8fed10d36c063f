"""Time of memplan.profile (meta-device shape propagation) vs one real forward + backward with
saved-tensor hooks, for three zoo models. Prints ratios; run: python benchmarks/profile_speed.py"""

from __future__ import annotations

import time
from functools import partial

import torch

import memplan
from memplan.apply import apply_plain
from memplan.graph.capture import capture_graph
from memplan.models import zoo
from memplan.strategies import make_plan
from memplan.verify.measure import saved_bytes

torch.set_num_threads(1)
MODELS = [("mcunet-5fps", 8, 128), ("proxylessnas-mobile", 8, 224), ("resnet50", 8, 224)]


def best_of(fn, n=3):
    """(wall s, CPU s) of the fastest of ``n`` calls (CPU time: this process only, so a loaded
    machine shows up as wall > CPU)."""
    times = []
    for _ in range(n):
        t, c = time.perf_counter(), time.process_time()
        fn()
        times.append((time.perf_counter() - t, time.process_time() - c))
    return min(times)


def main() -> None:
    t = time.perf_counter()
    memplan.profile("mcunet-5fps", batch=1)
    cold = time.perf_counter() - t
    print(f"cold start (first profile in this process, incl. torch meta-kernel imports): {cold:.2f} s\n")
    print(
        f"{'model':22s} {'batch':>5s} {'res':>4s} {'memplan.profile':>16s} {'(CPU)':>7s} {'real fwd+bwd':>13s} "
        f"{'ratio':>7s}"
    )
    for name, batch, res in MODELS:
        prof_t, prof_cpu = best_of(partial(memplan.profile, name, "full", batch=batch, resolution=res), n=5)
        torch.manual_seed(0)
        model = zoo.build(name, num_classes=1000)
        shape = (batch, *zoo.get_entry(name).input_shape(res))
        graph = capture_graph(model, shape)
        apply_plain(model, graph, make_plan(graph, "full"))
        x, y = torch.randn(shape), torch.randint(0, 1000, (batch,))
        real_t, _ = best_of(partial(saved_bytes, model, x, y, backward=True), n=1)
        print(
            f"{name:22s} {batch:5d} {res:4d} {prof_t:15.3f}s {prof_cpu:6.3f}s {real_t:12.3f}s {real_t / prof_t:6.1f}x"
        )
    print("\nratio = real step time / profile time (higher is better for memplan).")


if __name__ == "__main__":
    main()
