"""Why the default guard costs or saves what it does on a task: its per-epoch records (what the
rule proposed, what the guard held and why, what the learned threshold and the loss budget let
through), and guard settings other than the default, each run paired by seed with the full-data
run recorded in ``benchmarks/results/sift-guard-<task>.json`` (the runs are deterministic on one
thread: the script first re-runs the recorded default and checks it reproduces).

    python benchmarks/sift_guard_variants.py --task mnist1d --seeds 3 4 5 \\
        --variant budget0.03 '{"loss_budget": 0.03}' --variant learned0.1 '{"learned_below": 0.1}'

A variant's JSON holds the guard's fields; a ``"rule"`` key in it overrides the rule's own
fields instead (``'{"rule": {"anneal_fraction": 0.125}}'``). ``--fresh-full`` re-runs each
seed's full-data run with the code as it is (recorded beside the variants) and pairs with that
instead of the recorded one: needed once the data order of the recorded runs no longer
reproduces (the sampler's shuffle stream changed in 97a8f2f).

Writes ``benchmarks/results/sift-guard-variants-<task>.json``: every run with the guard's
records, and per variant the paired difference against full data and the saving.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from hasten.bench import _hasten_api
from hasten.bench.machine import machine_stamp
from hasten.bench.pruning_policies import PrunePolicy
from hasten.bench.tasks import get_task
from hasten.bench.training import FullData, train_run

RULE = {"policy": "stale_relative", "beta_value": 1.0, "max_loss_age": None, "anneal_fraction": 0.0}
EPOCHS = {"digits": 20, "mnist1d": 40, "text": 6, "mnist1d-large": 12}  # as sift_guard_grid.py


def _plain(value):
    if isinstance(value, float):
        return round(value, 4)
    return value


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", required=True)
    ap.add_argument("--variant", nargs=2, action="append", default=[], metavar=("NAME", "JSON"))
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--fresh-full", action="store_true", help="pair with full-data runs re-run now")
    a = ap.parse_args()
    torch.set_num_threads(1)
    recorded = json.loads((Path(a.out) / f"sift-guard-{a.task}.json").read_text())
    by = {(r["policy"], r["seed"]): r for r in recorded["runs"]}
    task = get_task(a.task)
    if a.task in EPOCHS:
        task = task.with_(epochs=EPOCHS[a.task])
    data = task.data()
    samplers = []
    make = _hasten_api.pruning_sampler

    def capture(*args, **kwargs):
        samplers.append(make(*args, **kwargs))
        return samplers[-1]

    _hasten_api.pruning_sampler = capture  # to read the guard's records after each run
    variants = [("default", None)] + [(n, json.loads(j)) for n, j in a.variant]
    stamp = machine_stamp()
    fresh = {}
    if a.fresh_full:
        for seed in a.seeds:
            rec = train_run(task, FullData(), seed, data=data)
            fresh[seed] = {"test_acc": rec.test_acc, "compute": rec.compute}
            print(json.dumps({"full (re-run)": seed, "test_acc": rec.test_acc}), flush=True)
    runs = []
    for name, guard in variants:
        for seed in a.seeds:
            settings = dict(guard or {})
            config = {**RULE, **settings.pop("rule", {})}
            if settings:
                config["guard"] = settings
            rec = train_run(task, PrunePolicy(f"guard-{name}", config), seed, data=data)
            full = fresh[seed] if a.fresh_full else by[("full", seed)]
            run = {
                "variant": name,
                "guard": guard,
                "paired_with_full": "re-run" if a.fresh_full else "recorded",
                "seed": seed,
                "test_acc": rec.test_acc,
                "acc_minus_full": rec.test_acc - full["test_acc"],
                "compute_vs_full": rec.compute / full["compute"],
                "guard_epochs": [
                    {k: _plain(v) for k, v in r.items()} for r in samplers[-1].guard.state.epochs
                ],
            }
            if guard is None and not a.fresh_full:
                recorded_acc = by[("stale-b1-guarded", seed)]["test_acc"]
                run["reproduces_recorded_default"] = rec.test_acc == recorded_acc
            runs.append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "guard_epochs"}), flush=True)
    out = Path(a.out) / f"sift-guard-variants-{a.task}.json"
    previous = json.loads(out.read_text()) if out.exists() else {"runs": []}
    done = {(r["variant"], r["seed"]) for r in runs}
    runs = [r for r in previous["runs"] if (r["variant"], r["seed"]) not in done] + runs
    summary = {}
    for name in dict.fromkeys(r["variant"] for r in runs):
        rs = [r for r in runs if r["variant"] == name]
        d = [r["acc_minus_full"] for r in rs]
        summary[name] = {
            "guard": rs[0]["guard"],
            "seeds": [r["seed"] for r in rs],
            "acc_minus_full_mean": statistics.fmean(d),
            "acc_minus_full_sem": statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else None,
            "saved_mean": 1 - statistics.fmean(r["compute_vs_full"] for r in rs),
        }
        print(name, json.dumps(summary[name]), flush=True)
    result = {
        "kind": "hasten.bench.sift-guard-variants",
        "task": a.task,
        "epochs": task.epochs,
        "paired_with": f"sift-guard-{a.task}.json",
        "fresh_full": fresh,
        "runs": runs,
        "summary": summary,
        "machines": [*previous.get("machines", []), stamp],
    }
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
