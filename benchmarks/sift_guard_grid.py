"""The pruning guard on the recorded sifting tasks: the README's rule alone against the same rule
guarded (the default), each against full data, the compute-matched cut and RS2, paired seeds.

    python benchmarks/sift_guard_grid.py --tasks digits text mnist1d --seeds 10

Writes ``benchmarks/results/sift-guard-<task>.json`` (the ``hasten bench sift`` record format:
every run, the paired summary, the machine) and prints each task's summary rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hasten.bench.pruning_policies import PrunePolicy
from hasten.bench.sift_experiment import (
    SiftExperimentConfig,
    register_policy_family,
    run_sift_experiment,
)

EPOCHS = {"digits": 20, "mnist1d": 40, "text": 6, "mnist1d-large": 12}  # sift-policies.json's
RULE = {"policy": "stale_relative", "beta_value": 1.0, "max_loss_age": None, "anneal_fraction": 0.0}


def guard_family(config, full_steps):
    return [
        PrunePolicy("stale-b1-fed", {**RULE, "guard": None}),  # the rule alone (the old default)
        PrunePolicy("stale-b1-guarded", dict(RULE)),  # the default guard
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=["digits", "text", "mnist1d", "mnist1d-large"])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    register_policy_family("guard", guard_family)
    for task in a.tasks:
        cfg = SiftExperimentConfig(
            tasks=(task,), seeds=a.seeds, families=("guard",), epochs=EPOCHS, threads=1
        )
        result = run_sift_experiment(cfg)
        path = Path(a.out) / f"sift-guard-{task}.json"
        path.write_text(json.dumps(result, indent=1))
        for row in result["summary"][task]["rows"]:
            print(task, json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
