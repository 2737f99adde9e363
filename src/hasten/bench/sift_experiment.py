"""Does sifting beat simply training less? The data-efficiency experiment behind ``hasten bench sift``.

On the same data, from the same seeds (same initial weights, same shuffles), for every task::

    full          all data for the task's epoch budget                       (the reference)
    <policy>      e.g. sift-b0.5, sift-b1: SageMaker's relative rule          (what we sell)
    matched:<p>   all data, cut to the compute <policy> used, with a learning-rate
                  schedule fitted to that shorter run                         (the honest bar)
    rs2:<p>       RS2 (Okanovic et al. 2023): the same epochs, each on a fresh random
                  subset (no replacement across epochs) sized to <policy>'s compute,
                  with its own schedule over its own steps                    (the other bar)

Compute counts forward = 1 and backward = 2 per sample, scoring forwards included: a sifted run
costs 3 × samples backpropagated + 1 × samples scored. Results are paired by seed: differences
are taken seed by seed and quoted as mean ± standard error.

Policies are pluggable: a *policy family* turns the experiment config into policies (see
:func:`register_policy_family`); ``"sagemaker"`` (SageMaker's rule through
``hasten.SiftingDataloader``) ships here, later policies register themselves the same way.

Example::

    from hasten.bench.sift_experiment import SiftExperimentConfig, run_sift_experiment

    result = run_sift_experiment(SiftExperimentConfig(tasks=("digits",), seeds=3))
    for row in result["summary"]["digits"]["rows"]:
        print(row["run"], row["test_acc"]["mean"], row["compute_vs_full"]["mean"])
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from hasten.bench import _hasten_api
from hasten.bench.machine import machine_stamp, torch_threads
from hasten.bench.stats import mean_std
from hasten.bench.tasks import TASK_NAMES, Task, get_task
from hasten.bench.training import (
    RS2,
    Batch,
    FullData,
    Policy,
    PolicyContext,
    RunRecord,
    forward_flops_per_sample,
    run_interleaved,
    train_iter,
)

__all__ = [
    "POLICY_FAMILIES",
    "SageMakerSift",
    "SiftExperimentConfig",
    "merge_results",
    "register_policy_family",
    "run_sift_experiment",
    "summarize_runs",
]


@dataclass(frozen=True, kw_only=True)
class SiftExperimentConfig:
    """What the experiment runs.

    Attributes:
        tasks: Task names (see :mod:`hasten.bench.tasks`); ``"text"`` is BBC News.
        seeds: Number of seeds (paired runs) per task; ≥ 10 resolves effects of a few tenths
            of a point.
        first_seed: First seed; seeds are ``first_seed .. first_seed + seeds - 1``.
        families: Policy families to compare with full data (see :data:`POLICY_FAMILIES`).
        betas: ``beta_value`` of SageMaker's rule: keep probability ``percentile ** beta``.
        loss_history_length: Losses the sifting percentile is computed over.
        sift_delay_fraction: Sifting starts after this fraction of the full run's steps.
        compute_matched: Also run full data cut to each policy's compute.
        rs2: Also run RS2 (a fresh random subset each epoch, no replacement across epochs) at
            each policy's compute.
        epochs: Override the tasks' epoch budgets: one number for every task, or a dict
            ``{task: epochs}`` for some (``None`` / tasks not named: the task's own).
        device: Where to train.
        threads: torch CPU threads during the runs (``None``: torch's setting), restored after.
    """

    tasks: tuple[str, ...] = ("digits", "mnist1d", "text")
    seeds: int = 5
    first_seed: int = 0
    families: tuple[str, ...] = ("sagemaker",)
    betas: tuple[float, ...] = (0.5, 1.0)
    loss_history_length: int = 500
    sift_delay_fraction: float = 0.1
    compute_matched: bool = True
    rs2: bool = True
    epochs: int | dict[str, int] | None = None
    device: str = "cpu"
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 or None, got {self.threads}")
        for name in self.tasks:
            if name not in TASK_NAMES:
                raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASK_NAMES)}")
        if not self.tasks:
            raise ValueError("SiftExperimentConfig.tasks is empty; name at least one task")
        if self.seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {self.seeds}")
        for fam in self.families:
            if fam not in POLICY_FAMILIES:
                raise ValueError(
                    f"unknown policy family {fam!r}; choose from {', '.join(POLICY_FAMILIES)}"
                )
        for beta in self.betas:
            if not (isinstance(beta, (int, float)) and beta > 0 and math.isfinite(beta)):
                raise ValueError(f"beta must be a positive number, got {beta!r}")
        if self.loss_history_length < 1:
            raise ValueError(f"loss_history_length must be >= 1, got {self.loss_history_length}")
        if not 0.0 <= self.sift_delay_fraction < 1.0:
            raise ValueError(
                f"sift_delay_fraction must be in [0, 1), got {self.sift_delay_fraction}"
            )
        per_task = self.epochs if isinstance(self.epochs, dict) else {"": self.epochs}
        for name, epochs in per_task.items():
            if name and name not in TASK_NAMES:
                raise ValueError(f"epochs names unknown task {name!r}; tasks: {TASK_NAMES}")
            if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
                raise ValueError(f"epochs must be >= 1 or None, got {epochs!r}")

    def epochs_for(self, task: str) -> int | None:
        """The epoch budget override for ``task`` (``None``: the task's own)."""
        if isinstance(self.epochs, dict):
            return self.epochs.get(task)
        return self.epochs


# --------------------------------------------------------------------------- SageMaker's rule


class _SiftRun:
    def __init__(self, sifted: Iterable[Batch]) -> None:
        self.sifted = sifted

    def batches(self, loader: Any, epoch: int) -> Iterable[Batch]:
        return self.sifted

    def loss(self, losses: Any, batch: Batch) -> Any:
        return losses.mean()

    def epoch_reads(self, epoch: int, dataset_size: int) -> int:
        return dataset_size


@dataclass(frozen=True)
class SageMakerSift:
    """SageMaker's relative probabilistic rule through ``hasten.SiftingDataloader``.

    Every incoming batch is scored by an extra forward; a sample at percentile p of the recent
    losses is kept with probability ``p ** beta``; kept samples refill full batches.
    """

    beta: float
    loss_history_length: int = 500
    sift_delay: int = 0

    @property
    def name(self) -> str:
        return f"sift-b{self.beta:g}"

    def describe(self) -> dict[str, Any]:
        return {"policy": "sagemaker", **asdict(self)}

    def start(self, ctx: PolicyContext) -> _SiftRun:
        sifted = _hasten_api.sifting_loader(
            ctx.make_loader(None),
            ctx.model,
            ctx.loss_fn,
            beta=self.beta,
            loss_history_length=self.loss_history_length,
            sift_delay=self.sift_delay,
            seed=ctx.seed,
            on_scored=ctx.count_scored,
        )
        return _SiftRun(sifted)


def _sagemaker_family(config: SiftExperimentConfig, full_steps: int) -> list[Policy]:
    reason = _hasten_api.sifting_unavailable()
    if reason:
        raise RuntimeError(f"policy family 'sagemaker' needs hasten.sifting: {reason}")
    delay = math.ceil(config.sift_delay_fraction * full_steps)
    return [SageMakerSift(b, config.loss_history_length, delay) for b in config.betas]


def _full_only(config: SiftExperimentConfig, full_steps: int) -> list[Policy]:
    return []


PolicyFamily = Callable[[SiftExperimentConfig, int], list[Policy]]


def _lazy_family(module: str, attr: str) -> PolicyFamily:
    def family(config: SiftExperimentConfig, full_steps: int) -> list[Policy]:
        return getattr(importlib.import_module(module), attr)(config, full_steps)

    return family


POLICY_FAMILIES: dict[str, PolicyFamily] = {
    "sagemaker": _sagemaker_family,
    "none": _full_only,
    # hasten.sifting.PruningSampler, no extra forward (see hasten.bench.pruning_policies)
    "unbiased": _lazy_family("hasten.bench.pruning_policies", "unbiased_family"),
    "stale": _lazy_family("hasten.bench.pruning_policies", "stale_family"),
    "tuned": _lazy_family("hasten.bench.pruning_policies", "tuned_family"),
}


def register_policy_family(name: str, family: PolicyFamily) -> None:
    """Make ``family`` selectable as ``SiftExperimentConfig(families=(name, ...))``.

    Args:
        name: The family's name (``--policies`` on the command line).
        family: ``(config, full_run_steps) -> [Policy, ...]``.

    Raises:
        ValueError: if ``name`` is taken.
    """
    if name in POLICY_FAMILIES:
        raise ValueError(f"policy family {name!r} is already registered")
    POLICY_FAMILIES[name] = family


# --------------------------------------------------------------------------- runner


@dataclass
class _Progress:
    callback: Callable[[str, RunRecord], None] | None = None
    runs: list[RunRecord] = field(default_factory=list)

    def add(self, label: str, rec: RunRecord) -> None:
        self.runs.append(rec)
        if self.callback:
            self.callback(label, rec)


def run_sift_experiment(
    config: SiftExperimentConfig,
    *,
    on_run: Callable[[str, RunRecord], None] | None = None,
    tasks: dict[str, Task] | None = None,
) -> dict[str, Any]:
    """Run the experiment; return a JSON-ready dict with every run, the summary and the machine.

    Args:
        config: What to run.
        on_run: Called after each run with a label and its record (progress display).
        tasks: Task objects to use instead of the named ones (tests use tiny budgets).

    Raises:
        RuntimeError: when a policy family cannot run here (for example hasten.sifting missing).
    """
    progress = _Progress(on_run)
    with torch_threads(config.threads):
        stamp = machine_stamp()
        _run_all(config, progress, tasks or {})
    end = machine_stamp()  # a long run: the load at its end too
    return {
        "kind": "hasten.bench.sift",
        "config": asdict(config),
        "compute_convention": "forward=1, backward=2 per sample; scoring forwards included",
        "runs": [r.to_dict() for r in progress.runs],
        "summary": summarize_runs(progress.runs),
        "machine": stamp,
        "load_average_end": end["load_average"],
        "finished_utc": end["date_utc"],
    }


def _run_all(config: SiftExperimentConfig, progress: _Progress, tasks: dict[str, Task]) -> None:
    for task_name in config.tasks:
        task = tasks.get(task_name) or get_task(task_name)
        epochs = config.epochs_for(task_name)
        if epochs is not None:
            task = task.with_(epochs=epochs)
        data = task.data()
        full_steps = task.epochs * math.ceil(len(data.y_train) / task.batch_size)
        policies = [p for fam in config.families for p in POLICY_FAMILIES[fam](config, full_steps)]
        probe = task.build_model(0, data)
        flops = forward_flops_per_sample(probe, data.x_test[: task.batch_size])
        common = {
            "data": data,
            "device": config.device,
            "flops_per_sample": flops,
            "evals_per_epoch": 1,  # yields once per epoch: the interleaving granularity
        }
        for seed in range(config.first_seed, config.first_seed + config.seeds):
            # Runs of one seed are interleaved (one epoch at a time) so machine drift hits them
            # alike; the compute-matched baselines (full-data cut, RS2) need the sifted runs'
            # compute, so they come second.
            first = {"full": train_iter(task, FullData(), seed, **common)}
            first.update({p.name: train_iter(task, p, seed, **common) for p in policies})
            done = run_interleaved(first)
            progress.add(task.name, done["full"])
            baselines = {}
            for policy in policies:
                progress.add(task.name, done[policy.name])
                budget = math.ceil(done[policy.name].compute / 3)
                if config.compute_matched:
                    baselines[f"matched:{policy.name}"] = train_iter(
                        task, FullData(), seed, budget=budget, **common
                    )
                if config.rs2:
                    rs2 = RS2(budget, f"rs2:{policy.name}")
                    baselines[rs2.name] = train_iter(task, rs2, seed, budget=budget, **common)
            for name, rec in run_interleaved(baselines).items():
                rec.policy = name
                progress.add(task.name, rec)


def summarize_runs(runs: list[RunRecord]) -> dict[str, Any]:
    """Per task and run kind: accuracy mean ± std (± sem), compute relative to full data and the
    paired accuracy differences (vs full data, and a policy vs its compute-matched baselines:
    ``acc_minus_matched`` for the full-data cut, ``acc_minus_rs2`` for RS2)."""
    out: dict[str, Any] = {}
    for task in dict.fromkeys(r.task for r in runs):
        by_kind: dict[str, dict[int, RunRecord]] = {}
        for r in runs:
            if r.task == task:
                by_kind.setdefault(r.policy, {})[r.seed] = r
        full = by_kind.get("full", {})
        rows = []
        for kind, recs in by_kind.items():
            seeds = sorted(recs)
            row: dict[str, Any] = {
                "run": kind,
                "seeds": seeds,
                "test_acc": mean_std([recs[s].test_acc for s in seeds]).to_dict(),
                "samples_backprop": mean_std([recs[s].samples_backprop for s in seeds]).to_dict(),
                "samples_scored": mean_std([recs[s].samples_scored for s in seeds]).to_dict(),
                "samples_forwarded": mean_std(
                    [recs[s].samples_backprop + recs[s].samples_scored for s in seeds]
                ).to_dict(),
                "compute": mean_std([recs[s].compute for s in seeds]).to_dict(),
                "flops": mean_std([recs[s].flops for s in seeds]).to_dict(),
                "wall_s": mean_std([recs[s].wall_s for s in seeds]).to_dict(),
            }
            paired = [s for s in seeds if s in full]
            if paired and kind != "full":
                row["compute_vs_full"] = mean_std(
                    [recs[s].compute / full[s].compute for s in paired]
                ).to_dict()
                row["acc_minus_full"] = mean_std(
                    [recs[s].test_acc - full[s].test_acc for s in paired]
                ).to_dict()
                row["wall_vs_full"] = mean_std(
                    [recs[s].wall_s / full[s].wall_s for s in paired]
                ).to_dict()
            for prefix, key in (("matched", "acc_minus_matched"), ("rs2", "acc_minus_rs2")):
                base = by_kind.get(f"{prefix}:{kind}", {})
                both = [s for s in seeds if s in base]
                if both:
                    row[key] = mean_std(
                        [recs[s].test_acc - base[s].test_acc for s in both]
                    ).to_dict()
            rows.append(row)
        out[task] = {"rows": rows}
    return out


def merge_results(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from several :func:`run_sift_experiment` results on different tasks (for
    example two processes run side by side), with the summary recomputed from all the runs.

    The configs must agree except for ``tasks`` and ``epochs``; every part's machine stamp is
    kept (``machines``), the first is ``machine``.

    Raises:
        ValueError: for no parts, a task in two parts, or configs that differ otherwise.
    """
    if not parts:
        raise ValueError("merge_results needs at least one result")
    tasks: list[str] = []
    epochs: dict[str, int | None] = {}
    for part in parts:
        config = part["config"]
        for task in config["tasks"]:
            if task in tasks:
                raise ValueError(f"task {task!r} is in two of the results to merge")
            tasks.append(task)
            per_task = config["epochs"]
            epochs[task] = per_task.get(task) if isinstance(per_task, dict) else per_task
        rest = {k: v for k, v in config.items() if k not in ("tasks", "epochs")}
        first = {k: v for k, v in parts[0]["config"].items() if k not in ("tasks", "epochs")}
        if rest != first:
            diff = sorted(k for k in rest if rest[k] != first.get(k))
            raise ValueError(f"the results to merge differ in config fields {diff}")
    runs = [r for part in parts for r in part["runs"]]
    records = [RunRecord(**r) for r in runs]
    return {
        **parts[0],
        "config": {**parts[0]["config"], "tasks": tasks, "epochs": epochs},
        "runs": runs,
        "summary": summarize_runs(records),
        "machine": parts[0]["machine"],
        "machines": [p["machine"] for p in parts],
        "load_average_end": [p.get("load_average_end") for p in parts],
        "finished_utc": max(str(p.get("finished_utc")) for p in parts),
        "merged_from_tasks": [p["config"]["tasks"] for p in parts],
    }
