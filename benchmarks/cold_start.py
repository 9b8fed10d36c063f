"""Cold start: wall time of a fresh ``memplan profile mcunet-5fps`` against a bare
``python -c "import torch"``, measured in the same run (alternating, several repetitions,
median of each); prints both and their ratio, with the machine's load average.

Run: ``python benchmarks/cold_start.py [--reps N]`` (the memplan of this interpreter's
environment; the console script next to it, else ``python -m memplan``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMAND = ["profile", "mcunet-5fps"]


def memplan_command() -> list[str]:
    script = Path(sys.executable).parent / "memplan"
    return [str(script)] if script.exists() else [sys.executable, "-m", "memplan"]


def run(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of ``cmd``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="repetitions of each command (default 7)")
    args = parser.parse_args()
    torch_cmd = [sys.executable, "-c", "import torch"]
    memplan_cmd = memplan_command() + COMMAND
    run(torch_cmd)  # warm the file cache: both commands then start from the same state
    runs: dict[str, list[tuple[float, float]]] = {"torch": [], "memplan": []}
    for _ in range(args.reps):
        runs["torch"].append(run(torch_cmd))
        runs["memplan"].append(run(memplan_cmd))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    for name, label in (("torch", "python -c 'import torch'"), ("memplan", f"memplan {' '.join(COMMAND)}")):
        walls = ", ".join(f"{w:.2f}" for w, _ in runs[name])
        print(f"{label:28s} wall median {med[name][0]:.2f} s ({walls}); CPU median {med[name][1]:.2f} s")
    load = os.getloadavg()
    print(
        f"ratio (wall medians) {med['memplan'][0] / med['torch'][0]:.2f}; CPU-time ratio "
        f"{med['memplan'][1] / med['torch'][1]:.2f}; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} "
        f"on {os.cpu_count()} CPUs; memplan: {memplan_cmd[0]}"
    )


if __name__ == "__main__":
    main()
