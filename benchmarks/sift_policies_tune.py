"""Tune the pruning policies on a validation split, never on the reported test set or seeds.

The training set of a task is split once (a fixed permutation, seed 12345): 80 % trains, 20 %
validates. Candidates and full-data runs at several epoch budgets run interleaved on seeds 1000+
(the reported benchmark uses seeds 0-9), through the same ``train_iter`` as ``hasten bench
sift``. A candidate is judged against full data at the budget and against full data cut to the
candidate's compute (the full-data curve of the same seeds, interpolated), paired by seed::

    python benchmarks/sift_policies_tune.py --task mnist1d --epochs 40 --seeds 1000,1001,1002 \\
        --full-epochs 40,22,19 --candidates benchmarks/tuning/mnist1d.json --out tune.jsonl

A candidate file is a JSON list of ``{"label", "config"[, "scorer"]}`` (a pruning config dict,
``hasten.bench.pruning_policies.ScorerSettings`` arguments) or ``{"label", "sagemaker_beta"}``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import torch

from hasten.bench.datasets import SplitData
from hasten.bench.pruning_policies import PrunePolicy, ScorerSettings
from hasten.bench.sift_experiment import SageMakerSift
from hasten.bench.tasks import get_task
from hasten.bench.training import (
    FullData,
    Policy,
    forward_flops_per_sample,
    run_interleaved,
    train_iter,
)

SPLIT_SEED = 12345


def validation_split(data: SplitData) -> SplitData:
    """The training set split 80/20; the 20 % takes the test set's place."""
    n = len(data.y_train)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, train = perm[: n // 5], perm[n // 5 :]
    return dataclasses.replace(
        data,
        x_train=data.x_train[train],
        y_train=data.y_train[train],
        x_test=data.x_train[val],
        y_test=data.y_train[val],
    )


def _policy(c: dict[str, Any], delay: int) -> Policy:
    if "sagemaker_beta" in c:
        return SageMakerSift(float(c["sagemaker_beta"]), 500, delay)
    scorer = ScorerSettings(**c["scorer"]) if c.get("scorer") else None
    return PrunePolicy(c["label"], c["config"], scorer)


def summarize(rows: list[dict[str, Any]], budget: int) -> dict[str, Any]:
    """Per candidate: mean accuracy, compute share, paired Δ vs full and vs the full-data curve."""
    full_key = f"full{budget}"
    curve_keys = sorted((k for k in rows[0] if k.startswith("full")), key=lambda k: int(k[4:]))
    out: dict[str, Any] = {}
    for key in rows[0]:
        if not isinstance(rows[0][key], dict):
            continue
        d_full, d_curve, accs, shares = [], [], [], []
        for r in rows:
            full = r[full_key]
            share = r[key]["compute"] / full["compute"]
            accs.append(r[key]["acc"])
            shares.append(share)
            d_full.append(r[key]["acc"] - full["acc"])
            pts = [(r[k]["compute"] / full["compute"], r[k]["acc"]) for k in curve_keys]
            d_curve.append(r[key]["acc"] - _interpolate(pts, share))
        n = len(rows)
        out[key] = {
            "seeds": n,
            "acc": statistics.mean(accs),
            "compute_share": statistics.mean(shares),
            "acc_minus_full": statistics.mean(d_full),
            "acc_minus_full_sem": statistics.stdev(d_full) / math.sqrt(n) if n > 1 else None,
            "acc_minus_curve": statistics.mean(d_curve),
            "acc_minus_curve_sem": statistics.stdev(d_curve) / math.sqrt(n) if n > 1 else None,
        }
    return out


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--epochs", type=int, required=True, help="the budget being tuned for")
    parser.add_argument("--seeds", required=True, help="comma-separated, e.g. 1000,1001,1002")
    parser.add_argument("--full-epochs", required=True, help="full-data budgets for the curve")
    parser.add_argument("--candidates", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per seed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    base = get_task(args.task)
    data = validation_split(base.data())
    task = base.with_(epochs=args.epochs)
    cands = json.loads(args.candidates.read_text())
    steps = args.epochs * math.ceil(len(data.y_train) / task.batch_size)
    flops = forward_flops_per_sample(task.build_model(0, data), data.x_test[: task.batch_size])
    common = {"data": data, "flops_per_sample": flops, "evals_per_epoch": 1}
    fulls = [int(e) for e in args.full_epochs.split(",")]
    if args.epochs not in fulls:
        fulls.insert(0, args.epochs)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        runs = {
            c["label"]: train_iter(task, _policy(c, math.ceil(0.1 * steps)), seed, **common)
            for c in cands
        }
        for e in fulls:
            runs[f"full{e}"] = train_iter(base.with_(epochs=e), FullData(), seed, **common)
        done = run_interleaved(runs)
        row: dict[str, Any] = {"seed": seed, "epochs": args.epochs}
        row.update(
            {
                k: {"acc": r.test_acc, "compute": r.compute, "wall": r.wall_s}
                for k, r in done.items()
            }
        )
        rows.append(row)
        with args.out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    for key, s in summarize(rows, args.epochs).items():
        print(
            f"{key:24} acc {100 * s['acc']:6.2f}  compute {s['compute_share']:.3f}  "
            f"Δfull {100 * s['acc_minus_full']:+.2f}  Δcurve {100 * s['acc_minus_curve']:+.2f}"
        )


if __name__ == "__main__":
    main()
