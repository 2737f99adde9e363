"""The pruning guard on the recorded sifting tasks: the README's rule alone against the same rule
guarded (the default), each against full data, the compute-matched cut and RS2, paired seeds.

    python benchmarks/sift_guard_grid.py --tasks digits text mnist1d --seeds 10
    python benchmarks/sift_guard_grid.py --tasks finetune-mnist1d finetune-text --seeds 10
    python benchmarks/sift_guard_grid.py --tasks mnist1d --first-seed 3 --seeds 7 --merge

Writes ``benchmarks/results/sift-guard-<task>.json`` (the ``hasten bench sift`` record format:
every run, the paired summary, the machine) and prints each task's summary rows. With
``--merge`` the new seeds are added to the runs already in that file (seeds must not repeat;
the summary is recomputed from all runs and every part's machine stamp is kept). Each seed's
part is also written to ``--parts`` (``out/sift-guard-parts/``) as soon as the seed is done, so a stopped run keeps
its finished seeds. A fine-tune task (``finetune-*``) first builds its checkpoint offline
(``hasten.bench.tasks.pretrained_checkpoint``, cached under ``$TMPDIR/hasten-pretrained``); the
record names it (recipe, what pretraining reached, sha256) and adds ``scratch_reference``: the
same full-data recipe from random initialisation, per seed (not an arm: what the checkpoint
gives). Run it pinned to one core, one thread: ``taskset -c 1 python benchmarks/...``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from hasten.bench.pruning_policies import PrunePolicy
from hasten.bench.sift_experiment import (
    SiftExperimentConfig,
    register_policy_family,
    run_sift_experiment,
    summarize_runs,
)
from hasten.bench.tasks import get_task, pretrained_checkpoint
from hasten.bench.training import FullData, RunRecord, train_run

EPOCHS = {"digits": 20, "mnist1d": 40, "text": 6, "mnist1d-large": 12}  # sift-policies.json's
# the fine-tunes keep their own few epochs (hasten.bench.tasks.FINETUNE_EPOCHS)
RULE = {"policy": "stale_relative", "beta_value": 1.0, "max_loss_age": None, "anneal_fraction": 0.0}


def guard_family(config, full_steps):
    return [
        PrunePolicy("stale-b1-fed", {**RULE, "guard": None}),  # the rule alone (the old default)
        PrunePolicy("stale-b1-guarded", dict(RULE)),  # the default guard
    ]


def merge_seeds(parts: list[dict]) -> dict:
    """One record of one task from records of disjoint seeds (the first part's config, with
    ``seeds``/``first_seed`` describing the union)."""
    runs = [r for p in parts for r in p["runs"]]
    keys = [(r["policy"], r["seed"]) for r in runs]
    if len(keys) != len(set(keys)):
        raise ValueError("the parts to merge repeat a (run, seed)")
    seeds = sorted({r["seed"] for r in runs})
    machines = []
    for p in parts:
        machines += p.get("machines") or [p["machine"]]
    scratch = [r for p in parts for r in p.get("scratch_reference", [])]
    extra = {"scratch_reference": scratch} if scratch else {}
    return {
        **parts[0],
        **extra,
        "config": {**parts[0]["config"], "seeds": len(seeds), "first_seed": seeds[0]},
        "seed_list": seeds,
        "runs": runs,
        "summary": summarize_runs([RunRecord(**r) for r in runs]),
        "machines": machines,
        "load_average_end": [p.get("load_average_end") for p in parts],
        "finished_utc": max(str(p.get("finished_utc")) for p in parts),
    }


def scratch_reference(task_name: str, seed: int) -> dict:
    """A fine-tune task's full-data run from random initialisation (no checkpoint): how much the
    checkpoint gives. Not an arm of the comparison; recorded beside it."""
    task = get_task(task_name)
    base = task._build
    scratch = task.with_(pretrain=None, _build=lambda d: base(d, {}))  # nothing loaded
    rec = train_run(scratch, FullData(name="scratch-full"), seed)
    return {"seed": seed, "test_acc": rec.test_acc, "compute": rec.compute, "wall_s": rec.wall_s}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", nargs="+", default=["digits", "text", "mnist1d", "mnist1d-large"])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--merge", action="store_true", help="add to the task's existing record")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--parts", default="out/sift-guard-parts", help="per-seed records")
    a = ap.parse_args()
    torch.set_num_threads(1)
    register_policy_family("guard", guard_family)
    parts_dir = Path(a.parts)
    for task in a.tasks:
        path = Path(a.out) / f"sift-guard-{task}.json"
        done = []
        for seed in range(a.first_seed, a.first_seed + a.seeds):  # one seed per record
            cfg = SiftExperimentConfig(
                tasks=(task,),
                seeds=1,
                first_seed=seed,
                families=("guard",),
                epochs=EPOCHS,
                threads=1,
            )
            done.append(run_sift_experiment(cfg))
            spec = get_task(task).pretrain
            if spec is not None:
                ckpt = pretrained_checkpoint(spec)
                done[-1]["pretrained"] = {"spec": ckpt["spec"], "info": ckpt["info"]}
                done[-1]["scratch_reference"] = [scratch_reference(task, seed)]
            parts_dir.mkdir(parents=True, exist_ok=True)
            (parts_dir / f"sift-guard-{task}-seed{seed}.json").write_text(json.dumps(done[-1]))
            print(task, "seed", seed, "done", flush=True)
        before = [json.loads(path.read_text())] if a.merge and path.exists() else []
        result = merge_seeds(before + done)
        path.write_text(json.dumps(result, indent=1))
        for row in result["summary"][task]["rows"]:
            print(task, json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
