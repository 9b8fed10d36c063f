"""Where runs execute: in this process, a local process pool, or a Ray cluster.

Every executor runs :meth:`memplan.contrib.runner.Worker.execute` (a grid run, ``RunSpec``, or a
whole scheme, ``SchemeRun``) on long-lived workers
that received the :class:`~memplan.contrib.runner.Context` once, so a worker's feature cache
is reused by the consecutive runs it gets (the grid is ordered by split point). At most
``2 x workers`` runs are in flight at a time; records are yielded as runs finish, in
completion order. Each worker uses ``threads`` intra-op threads; ``default_threads`` keeps
workers x threads within the cores this process may use (oversubscribed threads make small
convolutions many times slower; on a machine shared with other jobs set
``MEMPLAN_NUM_THREADS=1``). The pool spawns its workers, so a script that calls
``run_contrib(workers=N)`` needs the usual ``if __name__ == "__main__":`` guard; pool
workers exit when their parent dies. Ray workers need memplan installed on every node.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass

import torch

from .. import names
from ..errors import BadOption, MemplanError
from ..models.loading import portable
from ..registry import Registry
from .protocol import RunSpec
from .runner import Context, SchemeRun, Worker

Job = RunSpec | SchemeRun
Run = Callable[[Context, Sequence[Job], int, "str | None", str], Iterator[dict]]


@dataclass(frozen=True)
class Executor:
    """``run(ctx, specs, workers, address, key)``: records as runs finish; ``remote``: it takes a
    cluster ``address``; ``needs``: the package it imports (checked before any work) and how to
    install it."""

    run: Run
    remote: bool = False
    needs: tuple[str, str] | None = None


#: executor name -> where and how the runs execute
EXECUTORS: Registry[Executor] = Registry("executor", names=names.EXECUTORS)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads(workers: int) -> int:
    """Intra-op threads per worker: ``$MEMPLAN_NUM_THREADS`` if set, else the available cores
    shared evenly, at least 1."""
    env = os.environ.get("MEMPLAN_NUM_THREADS", "").strip()
    if env:
        if not env.isdigit() or int(env) < 1:
            raise BadOption(f"MEMPLAN_NUM_THREADS must be a positive integer, got {env!r}")
        return int(env)
    return max(1, available_cores() // workers)


@contextlib.contextmanager
def num_threads(n: int) -> Iterator[None]:
    """torch intra-op threads set to ``n`` inside the block, restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- in this process
def run_here(ctx: Context, specs: Sequence[Job]) -> Iterator[dict]:
    """Runs one after another in this process (``workers=1``), with ``ctx.threads`` threads."""
    with num_threads(ctx.threads):
        worker = Worker(ctx)
        for spec in specs:
            yield worker.execute(spec)


# ----------------------------------------------------------------------------- process pool
_WORKER: Worker | None = None


def _exit_with_parent(parent: int) -> None:
    """Watchdog thread: a pool worker whose parent died (even by SIGKILL) exits at once
    instead of finishing runs nobody will record."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def _init_process(ctx: Context, parent: int) -> None:
    global _WORKER
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    _WORKER = Worker(ctx)


def _run_in_process(spec: Job) -> dict:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER.execute(spec)


def run_pool(ctx: Context, specs: Sequence[Job], workers: int) -> Iterator[dict]:
    """Runs on ``workers`` spawned processes (spawn: safe with torch's thread pools)."""
    pending = list(reversed(specs))
    pool = ProcessPoolExecutor(
        workers, mp_context=mp.get_context("spawn"), initializer=_init_process, initargs=(portable(ctx), os.getpid())
    )
    running: set[Future] = set()
    try:
        while pending or running:
            while pending and len(running) < 2 * workers:
                running.add(pool.submit(_run_in_process, pending.pop()))
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
    finally:
        pool.shutdown(wait=not running, cancel_futures=True)
        if running:  # interrupted: stop the workers now rather than after their current run
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()


# ----------------------------------------------------------------------------- Ray
_RAY_WORKERS: dict[str, Worker] = {}


def _run_on_ray(key: str, ctx_ref: list, spec: Job) -> dict:
    """Ray task body: the context travels by reference (wrapped in a list, so Ray does not
    resolve it) and is fetched once per Ray worker process."""
    import ray

    worker = _RAY_WORKERS.get(key)
    if worker is None:
        _RAY_WORKERS.clear()
        worker = _RAY_WORKERS[key] = Worker(ray.get(ctx_ref[0]))
    return worker.execute(spec)


def run_ray(ctx: Context, specs: Sequence[Job], workers: int, address: str | None, key: str) -> Iterator[dict]:
    """Runs as Ray tasks (``threads`` CPUs each) on the cluster at ``address`` (None: an already
    initialised Ray, else a local instance started here and shut down at the end)."""
    try:
        import ray
    except ImportError:
        raise MemplanError("the ray executor needs Ray", "pip install 'memplan[ray]'") from None
    started = False
    if not ray.is_initialized():
        try:
            if address is None:
                ray.init(num_cpus=workers * ctx.threads, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise MemplanError(f"cannot start or reach Ray{f' at {address}' if address else ''}: {first}") from None
        started = True
    task = ray.remote(num_cpus=ctx.threads, max_retries=0)(_run_on_ray)
    ctx_ref = [ray.put(portable(ctx))]
    pending = list(reversed(specs))
    running: list = []
    try:
        while pending or running:
            while pending and len(running) < 2 * workers:
                running.append(task.remote(key, ctx_ref, pending.pop()))
            done, running = ray.wait(running, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    finally:
        for ref in running:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def run_local(ctx: Context, specs: Sequence[Job], workers: int, address: str | None, key: str) -> Iterator[dict]:
    """In this process for one worker, else on a local process pool."""
    return run_here(ctx, specs) if workers == 1 else run_pool(ctx, specs, workers)


EXECUTORS.add("process", Executor(run_local))
EXECUTORS.add("ray", Executor(run_ray, remote=True, needs=("ray", "pip install 'memplan[ray]'")))


def execute(
    ctx: Context,
    specs: Sequence[Job],
    *,
    workers: int = 1,
    executor: str = names.DEFAULT_EXECUTOR,
    address: str | None = None,
    key: str = "",
) -> Iterator[dict]:
    """Records of ``specs`` as they finish, on the chosen executor (``key`` names the context)."""
    return check(workers, executor, address).run(ctx, specs, workers, address, key)


def check(workers: int, executor: str, address: str | None) -> Executor:
    """The executor named ``executor``, after a one-line error for a bad worker count, an address
    it cannot take or a package it needs that is missing (callers check before any expensive work)."""
    entry = EXECUTORS.choose(executor)
    if entry.needs is not None and importlib.util.find_spec(entry.needs[0]) is None:
        raise MemplanError(f"the {executor} executor needs {entry.needs[0]}, which is not installed", entry.needs[1])
    if not isinstance(workers, int) or workers < 1:
        raise BadOption(f"workers must be a positive integer, got {workers!r}")
    if address is not None and not entry.remote:
        remote = " or ".join(n for n, e in EXECUTORS.items() if e.remote)
        raise BadOption(f"an address applies only to the {remote} executor")
    return entry
