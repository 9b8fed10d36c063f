"""Final evaluations on the test split: train sparse-update schemes end to end from the setup a
contribution profile was measured with, and report their test accuracy.

:class:`Evaluator` rebuilds the profile's setup (``memplan.contrib.setup.setup_of``: the same
backbone, the same data, checked by digest), trains the linear probe again on the training
split exactly as contribution analysis did (its validation accuracy is compared with the one
the profile recorded), and then trains every scheme it is given with the profile's protocol
(its optimizer, per-family learning rates, epochs, batch; ``seeds`` may differ) on the training
split, through the feature cache, evaluating on the **test** split. The test split is used
here only: no learning rate, epoch count or scheme is chosen on it. With ``split="validation"``
it evaluates on the profile's validation split instead (a check made while choosing, such as
the additivity check of ``memplan contrib validate``, never looks at test).
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..errors import BadOption
from ..names import DEFAULT_EXECUTOR
from ..plan import Scheme, scheme_to_plan
from .data import Data
from .executors import execute, num_threads
from .profile import ContribProfile
from .runner import (
    Context,
    SchemeRun,
    Worker,
    added_key,
    first_trained,
    linear_probe,
    resolve_device,
    with_added_modules,
)
from .setup import Setup, setup_of


@dataclass
class Result:
    """Test accuracy (%) per seed of one configuration, with its description."""

    label: str
    accuracy: list[float]
    trainable_params: int
    seconds: float

    @property
    def mean(self) -> float:
        return statistics.fmean(self.accuracy)

    @property
    def std(self) -> float:
        return statistics.stdev(self.accuracy) if len(self.accuracy) > 1 else 0.0


class Evaluator:
    """Trains configurations from ``profile``'s setup and measures them on the test split (or, with
    ``split="validation"``, on its validation split)."""

    def __init__(
        self,
        profile: ContribProfile,
        *,
        seeds: Sequence[int] | None = None,
        threads: int = 1,
        cache: bool = True,
        device: str = "cpu",
        split: str = "test",
    ):
        self.profile, self.split = profile, split
        self.protocol = (
            profile.protocol if seeds is None else profile.protocol.model_copy(update={"seeds": tuple(seeds)})
        )
        self.threads = threads
        device = resolve_device(device)
        with num_threads(threads):
            self.setup: Setup = setup_of(profile)
            task = self.setup.task
            if split == "validation" and task.x_val is None:
                raise BadOption("the profile has no validation split to measure on", "measure it with --validation N")
            seen = task.validation_task() if task.x_val is not None else task
            self.probe_validation = linear_probe(self.setup.net, self.setup.head, seen, profile.protocol, device)
            test_task = (
                seen
                if split == "validation"
                else Data(
                    task.name,
                    task.description + " [test split]",
                    task.x_train,
                    task.y_train,
                    task.x_test,
                    task.y_test,
                    task.classes,
                )
            )
            self.worker = Worker(
                Context(self.setup.name, self.setup.net, test_task, self.protocol, cache, threads, device)
            )

    def scheme(self, label: str, scheme: Scheme) -> Result:
        """A sparse-update scheme (biases of the last k convs, weights at ratios, norm modes, classifier;
        its added modules built on a copy of the model first: ``memplan.apply.add_modules``)."""
        return next(self.schemes([(label, scheme)]))

    def schemes(
        self,
        schemes: Sequence[tuple[str, Scheme]],
        *,
        workers: int = 1,
        executor: str = DEFAULT_EXECUTOR,
        address: str | None = None,
    ) -> Iterator[Result]:
        """Each ``(label, scheme)`` trained for every seed (one :class:`~memplan.contrib.runner.SchemeRun`
        per seed, at the protocol's rates), as each finishes. One worker: in this process, reusing
        its feature cache; more: on contribution analysis's executors
        (``memplan.contrib.executors``, a local process pool or Ray), each model (the plain one, and
        each set of added modules) on its own workers. Runs are ordered by split point, so that
        consecutive runs share a cached prefix."""
        seeds, rates = self.protocol.seeds, self.protocol.rates
        groups: dict[str, list[SchemeRun]] = {}
        for i, (_, scheme) in enumerate(schemes):
            groups.setdefault(added_key(scheme), []).extend(
                SchemeRun(f"{i}|{seed}", scheme, rates, seed) for seed in seeds
            )
        runs: dict[int, dict[int, dict]] = {}
        for added, jobs in groups.items():
            worker = Worker(with_added_modules(self.worker.ctx, jobs[0].scheme)) if added else self.worker
            jobs.sort(key=lambda job: self._split_index(worker, job.scheme))
            if workers == 1:
                records = (self._run_here(job, worker) for job in jobs)
            else:
                tag = f"evaluate:{self.setup.name}:{hashlib.sha256(added.encode()).hexdigest()[:8]}"
                records = execute(worker.ctx, jobs, workers=workers, executor=executor, address=address, key=tag)
            for rec in records:
                i, seed = map(int, rec["id"].split("|"))
                runs.setdefault(i, {})[seed] = rec
                if len(runs[i]) == len(seeds):
                    recs = [runs[i][s] for s in seeds]
                    seconds = sum(r["train_s"] + r["eval_s"] for r in recs) + max(r["cache_s"] for r in recs)
                    yield Result(schemes[i][0], [r["accuracy"] for r in recs], recs[0]["trainable_params"], seconds)

    def _run_here(self, job: SchemeRun, worker: Worker) -> dict:
        with num_threads(self.threads):
            return job.run_on(worker)

    @staticmethod
    def _split_index(worker: Worker, scheme: Scheme) -> int:
        """Position in ``worker``'s graph of the first layer ``scheme`` trains (where its cached prefix ends)."""
        split = first_trained(worker.graph, scheme_to_plan(worker.graph, scheme, method="sparse"))
        layers = [n.layer for n in worker.graph.nodes]
        return layers.index(split) if split in layers else len(layers)

    def _measured(self) -> str:
        t = self.setup.task
        if self.split == "validation":
            return f"{t.x_val.shape[0]} validation images (carved from the training data)"
        return f"{t.x_test.shape[0]} test images"

    def describe(self) -> str:
        t = self.setup.task
        p = self.protocol
        return (
            f"{self.setup.name} from {self.setup.weights.get('source')} on {t.name}: trained on the "
            f"{t.x_train.shape[0]} training images, measured on the {self._measured()} at "
            f"{'x'.join(map(str, self.setup.shape))}; the profile's protocol ({p.epochs} epochs {p.optimizer}, batch "
            f"{p.batch_size}, lr classifier {p.lr_classifier} / biases {p.lr_bias} / weights {p.lr_weight}), "
            f"seeds {list(p.seeds)}; linear probe {self.probe_validation:.2f}% on validation "
            f"(profile: {self.profile.probe_accuracy:.2f}%)"
        )
