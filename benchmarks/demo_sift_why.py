"""Why ``make demo``'s sifting row is (or is not) faster to the target than eager: the demo's
task and evaluation schedule run to the end (no early stop) for a few seeds, eager and sifting
arms paired by seed, one torch thread, with the guard's per-epoch records, so the time and
compute at which each arm first reaches the target can be compared across seeds instead of on
the demo's one seed.

    python benchmarks/demo_sift_why.py --seeds 0 1 2 --arm sifting default \\
        --arm rule-alone '{"guard": null}'

Arms: ``eager`` always; ``--arm NAME JSON`` the demo's sifting config (``hasten.bench.demo``)
with the JSON's fields merged into it. Writes ``--out`` (JSON): curves, guard records, and per
arm the target's compute and seconds (mean over seeds; a seed that never reaches it counts as
not reached).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from hasten.bench import _hasten_api
from hasten.bench.demo import DemoConfig, _sift_policy
from hasten.bench.pruning_policies import PrunePolicy
from hasten.bench.tasks import get_task
from hasten.bench.training import FullData, train_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arm", nargs=2, action="append", default=[], metavar=("NAME", "JSON"))
    ap.add_argument("--target", type=float, default=DemoConfig().target)
    ap.add_argument("--no-eager", action="store_true")
    ap.add_argument("--out", default="out/demo-sift-why.json")
    a = ap.parse_args()
    torch.set_num_threads(1)
    config = DemoConfig()
    task = get_task(config.task)
    data = task.data()
    full_steps = task.epochs * -(-len(data.y_train) // task.batch_size)
    base = _sift_policy(config, full_steps)
    samplers = []
    make = _hasten_api.pruning_sampler

    def capture(*args, **kwargs):
        samplers.append(make(*args, **kwargs))
        return samplers[-1]

    _hasten_api.pruning_sampler = capture
    arms = [] if a.no_eager else [("eager", None)]
    arms += [(n, json.loads(j)) for n, j in a.arm]
    out = Path(a.out)
    runs = json.loads(out.read_text())["runs"] if out.exists() else []
    for seed in a.seeds:
        for name, extra in arms:
            if extra is None:
                policy = FullData()
            else:
                policy = PrunePolicy(name, {**base.config, **extra})
            n0 = len(samplers)
            t0 = time.perf_counter()
            rec = train_run(task, policy, seed, data=data, evals_per_epoch=config.evals_per_epoch)
            hit = next((p for p in rec.curve if p["test_acc"] >= a.target), None)
            run = {
                "arm": name,
                "extra": extra,
                "seed": seed,
                "test_acc": rec.test_acc,
                "compute": rec.compute,
                "wall_s": rec.wall_s,
                "elapsed_s": time.perf_counter() - t0,
                "target_compute": None if hit is None else hit["compute"],
                "target_wall_s": None if hit is None else hit["wall_s"],
                "curve": rec.curve,
                "guard_epochs": samplers[-1].guard.state.epochs
                if len(samplers) > n0 and samplers[-1].guard is not None
                else None,
            }
            runs = [r for r in runs if (r["arm"], r["seed"]) != (name, seed)] + [run]
            print(
                json.dumps(
                    {
                        k: run[k]
                        for k in (
                            "arm",
                            "seed",
                            "test_acc",
                            "compute",
                            "target_compute",
                            "target_wall_s",
                            "wall_s",
                        )
                    }
                ),
                flush=True,
            )
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps({"target": a.target, "runs": runs}, indent=1, default=str))


if __name__ == "__main__":
    main()
