"""Speed of the int8 graph's training step with the forward's elementwise chains compiled
(``memplan.models.int8.ops.fuse_kernels``) against the eager kernels, measured in the same run on
the same inputs: the ratio of median step times (eager / fused; above 1: fused is faster). One
thread, the benchmark's batch and resolution, biases of the last 22 convs + head training (SGD + QAS).

    python benchmarks/int8_kernels.py --steps 6
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from memplan.models.int8 import int8_model
from memplan.models.int8.ops import fuse_kernels
from memplan.models.int8.updates import Update, apply_update, trained
from memplan.optim import make_optimizer


def step_seconds(steps: int, batch: int, res: int) -> list[float]:
    """Seconds of each training step after one warm-up step."""
    torch.manual_seed(0)
    model = apply_update(int8_model("mcunet-5fps", 10), Update(bias_last=22))
    opt = make_optimizer(trained(model), "sgd-qas", 0.01)
    x = torch.randint(0, 256, (batch, 3, res, res)).float() - 127.5
    y = torch.randint(0, 10, (batch,))
    times = []
    for _ in range(steps + 1):
        t = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return times[1:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--resolution", type=int, default=128)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    eager = statistics.median(step_seconds(args.steps, args.batch, args.resolution))
    if not fuse_kernels():
        print("this torch cannot compile here: nothing to compare")
        return 0
    fused = statistics.median(step_seconds(args.steps, args.batch, args.resolution))
    fuse_kernels(False)
    print(f"median step: eager {eager:.3f} s, fused {fused:.3f} s; eager / fused = {eager / fused:.2f}x "
          f"(batch {args.batch}, {args.resolution} px, 1 thread)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
