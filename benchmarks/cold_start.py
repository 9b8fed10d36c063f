"""Cold start: wall time of fresh ``memplan`` processes against bare Python starts, measured in the
same run (alternating, several repetitions, median of each), with the machine's load average.

* the answers that must not import torch (help, ``--version``, a usage error) against a bare
  ``python -c pass`` (goal: under 0.5 s);
* a real command, ``memplan profile mcunet-5fps``, against a bare ``python -c "import torch"``.

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

#: label -> (memplan arguments, the bare start it is compared with)
COMMANDS: dict[str, tuple[list[str], str]] = {
    "memplan --help": (["--help"], "python"),
    "memplan --version": (["--version"], "python"),
    "memplan profile --help": (["profile", "--help"], "python"),
    "memplan profile (usage error)": (["profile"], "python"),
    "memplan profile mcunet-5fps": (["profile", "mcunet-5fps"], "torch"),
}
BARE = {"python": [sys.executable, "-c", "pass"], "torch": [sys.executable, "-c", "import torch"]}
#: the goal for the answers compared with a bare Python start, seconds
GOAL_S = 0.5


def memplan_command() -> list[str]:
    script = Path(sys.executable).parent / "memplan"
    return [str(script)] if script.exists() else [sys.executable, "-m", "memplan"]


def run(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of ``cmd`` (its exit code is not checked:
    a usage error exits 2 on purpose)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return took, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="repetitions of each command (default 7)")
    args = parser.parse_args()
    memplan = memplan_command()
    cmds = {**{k: v for k, v in BARE.items()}, **{label: memplan + a for label, (a, _) in COMMANDS.items()}}
    for cmd in cmds.values():  # warm the file cache: every command then starts from the same state
        run(cmd)
    runs: dict[str, list[tuple[float, float]]] = {label: [] for label in cmds}
    for _ in range(args.reps):
        for label, cmd in cmds.items():
            runs[label].append(run(cmd))
    wall = {k: statistics.median(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    print(f"{'python -c pass':32s} wall median {wall['python']:.3f} s; CPU {cpu['python']:.3f} s")
    print(f"{'python -c import torch':32s} wall median {wall['torch']:.3f} s; CPU {cpu['torch']:.3f} s")
    for label, (_, bare) in COMMANDS.items():
        goal = f"; goal < {GOAL_S} s: {'met' if wall[label] < GOAL_S else 'NOT met'}" if bare == "python" else ""
        print(
            f"{label:32s} wall median {wall[label]:.3f} s = {wall[label] / wall[bare]:.2f}x {BARE[bare][-1]!r} "
            f"(CPU {cpu[label] / cpu[bare]:.2f}x){goal}"
        )
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} on {os.cpu_count()} CPUs; memplan: {memplan[0]}")


if __name__ == "__main__":
    main()
