"""The 256KB paper's own setting: the int8 mcunet-5fps (ImageNet weights) fine-tuned on CIFAR-10.

Two experiments, each a list of methods (a model form, what trains, an optimizer):

* ``table1``: Table 1's CIFAR-10 column, the last two blocks of mcunet-5fps (+ the new head):
  fp32 SGD-M, int8 SGD-M, int8 Adam, int8 SGD-M + QAS (paper: 86.0 / 75.4 / 84.5 / 86.9);
* ``fig9``: Figure 9's baselines on the int8 graph with SGD + QAS (no momentum, the paper's main
  setting): classifier only, biases of the last k convs, weights and biases of the last k convs
  (the full update included), the paper's own 100 KB scheme.

Protocol (``PROTOCOL``, written into the results): a seeded training subset of CIFAR-10's train
split, a disjoint validation subset of it for choosing the rate, the whole test split for test
accuracy; 128 px; the paper's augmentation (random-resized crop, scale 0.08-1, aspect 3/4-4/3,
horizontal flip, colour jitter 0.4 on brightness / contrast / saturation), the MCU transform
(``pixel - 127.5``; the fp32 form takes the same input times ``2/255``, its real scale); batch
64; linear warm-up then cosine; no weight decay. Rates are chosen per method on the selection
seed (100: never a test seed) from one grid per optimizer family, widened until the
choice is interior; ties go to the smaller rate. Test seeds 0-4 (mean ± 95% CI, Student t).

Every finished run is one line of ``runs.jsonl`` in ``--out`` (resume skips them); the report
(``report.json`` and a Markdown table on stdout) is rebuilt from it. ``--device cuda`` and
``--workers`` (processes; several share one GPU) make it fast where a GPU is lent; the numbers
then say which device gave them.

    python benchmarks/mcu_transfer.py --out benchmarks/mcu_results --experiments table1 fig9
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from mcu_protocol import PROTOCOL, job_id, methods, read_runs, reuse, select, spec_of
from mcu_report import profile_document, record_evidence, report, write_report
from mcu_runs import _init_worker, _worker

from memplan.io import write_text


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared/datasets/cifar10")
    ap.add_argument("--experiments", nargs="+", default=["table1", "fig9"])
    ap.add_argument("--methods", nargs="*", default=None, help="only these methods")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--set", nargs="*", default=[], help="protocol overrides KEY=JSON (cheap forms)")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="start no run after this many seconds")
    ap.add_argument("--report-only", action="store_true", help="rebuild the report from runs.jsonl, train nothing")
    ap.add_argument("--write-profile", type=Path, help="write the profile experiment's runs as a contribution profile")
    ap.add_argument("--record-evidence", action="store_true", help="write searched rows' results into their schemes")
    ap.add_argument(
        "--at-rate",
        type=float,
        help="a diagnostic: train the test seeds of --methods at this "
        "rate, not the chosen one (rows keep the chosen rate; the report compares rows at a shared rate)",
    )
    ap.add_argument("--eager", action="store_true", help="do not compile the int8 kernels (same bits; no compile wait)")
    return ap


def read_protocol(path: Path) -> dict:
    """The protocol a results folder was trained under; exits with one line where it is missing,
    unreadable, or older than this script's settings (a key of :data:`PROTOCOL` it lacks, other
    than ``divergence_rule``, which a protocol from before that rule lacks on purpose)."""
    try:
        p = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"cannot read {path} ({e.__class__.__name__}): run a training command into that folder first")
    missing = sorted(set(PROTOCOL) - set(p) - {"divergence_rule"})
    if missing:
        sys.exit(f"{path} lacks {', '.join(missing)}: written by an older mcu_transfer.py; train into a new folder")
    return p


def overrides(p: dict, pairs: list[str]) -> dict:
    """``p`` with each ``KEY=JSON`` of ``--set`` applied; exits with one line on a malformed pair or
    a key that :data:`PROTOCOL` does not have."""
    for kv in pairs:
        k, sep, v = kv.partition("=")
        if not sep or k not in PROTOCOL:
            sys.exit(f"--set {kv!r}: expected KEY=JSON with KEY one of {', '.join(sorted(PROTOCOL))}")
        try:
            p[k] = json.loads(v)
        except json.JSONDecodeError as e:
            sys.exit(f"--set {kv!r}: the value is not JSON ({e.msg})")
    return p


def offline(args: argparse.Namespace, log: Path) -> int | None:
    """The commands that train nothing (the profile, the evidence, the report); None for a training run."""
    if not (args.write_profile or args.record_evidence or args.report_only):
        return None
    p = read_protocol(args.out / "protocol.json")
    runs = read_runs(log, methods(p))
    if args.write_profile:
        doc = profile_document(runs, p)
        if doc is None:
            sys.exit("the profile experiment has not finished: run --experiments profile first")
        write_text(args.write_profile, json.dumps(doc, indent=1) + "\n")
    elif args.record_evidence:
        for path in record_evidence(runs, p):
            print(f"evidence written to {path}")
    else:
        return write_report(args.out, report(runs, [e for e in args.experiments if e != "profile"], p))
    return 0


def missing_jobs(args: argparse.Namespace, p: dict, log: Path, t0: float) -> list[dict]:
    """The runs still to train under protocol ``p``, given the finished runs in ``log``: each row's
    :func:`select` (only the ``--methods`` rows when named, in the order asked for; at
    ``--at-rate`` their test seeds at that rate)."""
    table = methods(p)
    runs = read_runs(log, table)
    reuse(runs, log, table)
    jobs = [
        {
            "id": job_id(e, m, lr, s),
            "experiment": e,
            "method": m,
            "lr": lr,
            "seed": s,
            "spec": spec_of(table[e][m]),
            "device": args.device,
            "protocol": p,
            "deadline": t0 + args.budget_s,
        }  # fmt: skip
        for e in args.experiments
        for m, (_, _, opt) in table[e].items()
        if args.methods is None or m in args.methods
        for lr, s in (
            select(runs, e, m, opt, p).missing
            if args.at_rate is None
            else [(args.at_rate, s) for s in p["test_seeds"] if job_id(e, m, args.at_rate, s) not in runs]
        )
    ]
    if args.methods:
        jobs.sort(key=lambda j: args.methods.index(j["method"]))
    return jobs


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.at_rate is not None and not args.methods:
        sys.exit("--at-rate trains the rows named by --methods: name them")
    p = overrides(dict(PROTOCOL), args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / "runs.jsonl"
    done = offline(args, log)
    if done is not None:
        return done
    (args.out / "protocol.json").write_text(json.dumps(p, indent=1))
    t0 = time.time()
    ctx = mp.get_context("spawn" if args.device == "cuda" or os.environ.get("MCU_SPAWN") else "fork")
    init = (str(args.data), args.device, p, not args.eager)
    with ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=_init_worker, initargs=init) as ex:
        running: dict[Future, str] = {}
        while True:
            # choose again after every finished run, so a selection that finishes lets its test
            # seeds start at once and no core waits for the slowest run of a batch
            free = args.workers - len(running)
            todo = [j for j in missing_jobs(args, p, log, t0) if j["id"] not in running.values()]
            if time.time() - t0 < args.budget_s:
                for job in todo[:free]:
                    running[ex.submit(_worker, job)] = job["id"]
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                del running[fut]
                r = fut.result()
                if r is None:
                    continue
                with open(log, "a") as f:
                    f.write(json.dumps(r) + "\n")
                print(f"{time.time() - t0:6.0f}s {r['experiment']:6} {r['method'][:38]:38} lr {r['lr']:<8g} "
                      f"seed {r['seed']:<3} "
                      f"{r['split']:4} {r['acc']:6.2f}% {r['seconds']:6.1f}s", flush=True)  # fmt: skip
    runs = read_runs(log, methods(p))
    return write_report(args.out, report(runs, [e for e in args.experiments if e != "profile"], p))


if __name__ == "__main__":
    sys.exit(main())
