"""Search speed and quality at one budget: exact optimum (certified, additive memory), DEAP
evolution over several seeds, random search with the same number of evaluations.

Prints, per method: summed Δacc, gap to the exact optimum, evaluations, seconds, and for the
DEAP runs the evaluations / seconds until 99% of the optimum was first reached (seconds
pro-rated from the run's evaluation rate). The cost-table build (one ``memplan.accounting.engine.compute``
per bias depth and per weight option) is timed separately: it is shared by all methods.

Run: python benchmarks/search_speed.py [--budget 100KB] [--profile profiles/X.json] [--seeds 5]
(default: mcunet-5fps at 128 px with its shipped contribution profile, tinytraining mode).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from memplan.api import capture
from memplan.plan import fingerprint
from memplan.search.evolution import evolve
from memplan.search.exact import relative_gap, solve_exact
from memplan.search.inputs import DEFAULT_MODEL, find_profile
from memplan.search.memory import MemoryModel, build_table, check_additivity, probe_candidates
from memplan.search.random_search import random_search
from memplan.search.space import build_space, load_contributions
from memplan.search.toolbox import Problem, make_toolbox
from memplan.units import parse_bytes

torch.set_num_threads(1)


def to_99(trace, optimum: float) -> tuple[int | None, float | None]:
    """Evaluations and (pro-rated) seconds until the best first reached 99% of ``optimum``."""
    for i, v in enumerate(trace.best_per_evaluation):
        if v >= 0.99 * optimum:
            return i + 1, trace.seconds * (i + 1) / trace.evaluations
    return None, None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--resolution", type=int, default=64, help="input side (default: the shipped profile's, 64 px)")
    ap.add_argument("--budget", default="100KB")
    ap.add_argument("--profile", default=None, help="contribution profile JSON (default: the shipped one)")
    ap.add_argument("--mode", default="tinytraining")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--population", type=int, default=100)
    ap.add_argument("--generations", type=int, default=100)
    args = ap.parse_args()

    budget = parse_bytes(args.budget)
    t = time.perf_counter()
    cap = capture(args.model, resolution=args.resolution, classes=None)
    t_capture = time.perf_counter() - t
    path = args.profile or find_profile(fingerprint(cap.graph))
    contributions = load_contributions(path)
    if contributions.classes and contributions.classes != cap.classes:
        cap = capture(args.model, resolution=args.resolution, classes=contributions.classes)
    space = build_space(cap.graph, contributions, model=cap.name)
    memory = MemoryModel(space, args.mode)
    t = time.perf_counter()
    table = build_table(memory)
    t_table = time.perf_counter() - t
    table_calls = memory.calls
    t = time.perf_counter()
    additivity = check_additivity(memory, table, probe_candidates(space))
    t_check = time.perf_counter() - t
    print(f"{cap.name} {args.resolution}px, {cap.classes} classes, mode {args.mode}, budget {budget} B; profile {path}")
    print(
        f"space: {space.n_convs} convs, {len(space.ks)} bias depths, "
        f"{sum(len(c.ratios) for c in space.layers)} weight options on {len(space.layers)} layers"
    )
    print(
        f"capture {t_capture:.2f} s (cold, first meta op); cost table {t_table:.2f} s ({table_calls} compute calls); "
        f"additivity check {t_check:.2f} s ({additivity.checked} candidates): "
        f"{'additive' if additivity.additive else 'NOT additive'}"
    )
    if not additivity.additive:
        raise SystemExit("memory is not additive in this mode: no exact optimum to compare with")

    exact = solve_exact(space, table, budget)
    assert memory.measure(exact.candidate) == exact.estimate <= budget
    print(f"\n{'method':<12}{'seed':>5}{'Δacc':>10}{'gap':>9}{'evals':>8}{'seconds':>9}{'evals→99%':>11}{'s→99%':>8}")
    print(
        f"{'exact':<12}{'-':>5}{exact.value:>10.3f}{0:>8.2%} {'-':>7}{exact.seconds:>9.3f}"
        f"   (solver only; + table {t_table:.2f} s = {exact.seconds + t_table:.2f} s)"
    )
    problem = Problem(space, table, budget, table.estimate, True)
    rows = {"evolution": [], "random": []}
    for seed in range(args.seeds):
        evo = evolve(
            problem, make_toolbox(problem), population=args.population, generations=args.generations, seed=seed
        )
        rnd = random_search(problem, make_toolbox(problem), evaluations=evo.evaluations, seed=seed)
        for tr in (evo, rnd):
            n99, s99 = to_99(tr, exact.value)
            gap = relative_gap(tr.value, exact.value)
            rows[tr.method].append((gap, tr.seconds, s99))
            print(
                f"{tr.method:<12}{seed:>5}{tr.value:>10.3f}{gap:>9.2%}{tr.evaluations:>8}{tr.seconds:>9.2f}"
                f"{n99 if n99 else 'never':>11}{(f'{s99:.2f}' if s99 is not None else '-'):>8}"
            )
    print()
    for method, rs in rows.items():
        gaps = [g for g, _, _ in rs]
        reached = sum(s is not None for _, _, s in rs)
        print(
            f"{method}: gap median {statistics.median(gaps):.2%}, worst {max(gaps):.2%}; "
            f"reached 99% in {reached}/{len(rs)} seeds; run time median {statistics.median(s for _, s, _ in rs):.2f} s"
        )
    print(f"exact solver {exact.seconds:.3f} s (largest Pareto staircase {exact.frontier_max} entries)")


if __name__ == "__main__":
    main()
