"""What one scoring forward costs, per sample, against one training step's share of a sample.

SageMaker's rule scores every incoming batch with an extra forward at the training batch size,
in fp32 (``SiftingDataloader``'s ``calculate_relevance_values`` stage). hasten's ``Scorer`` scores
the samples a policy needs in one pass, in large batches, optionally in bf16 or with a compiled
model. This script times, on each sift-experiment task's model and data, per sample:

    train-b{B}         forward + backward + AdamW at the task's batch size (the reference)
    stream-fp32-b{B}   the loader's scoring forward: eval mode, inference mode, batch B, fp32
    pass-fp32-b1024    Scorer, batches of 1024, fp32 (data gathered through a DataLoader)
    pass-bf16-b1024    Scorer, batches of 1024, bf16 autocast
    pass-compiled-...  Scorer with torch.compile(model) (--compile; compile time reported apart)

Every candidate's "step" handles the same 2048 samples; rounds are interleaved (the harness), and
the ratios are medians. Run from the repository root::

    python benchmarks/scoring_cost.py --threads 1 --json benchmarks/results/scoring_cost.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from hasten.bench.harness import BenchConfig, Candidate, run_benchmark
from hasten.bench.machine import machine_stamp
from hasten.bench.tasks import get_task
from hasten.sifting import Scorer, scoring_mode

SAMPLES = 2048


class _Rows(torch.utils.data.Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.as_tensor(indices)
        return self.x[idx], self.y[idx]


def _loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")


def _candidates(task_name: str, compile_model: bool) -> tuple[list[Candidate], int]:
    task = get_task(task_name)
    data = task.data()
    n = min(SAMPLES, len(data.y_train))
    x, y = data.x_train[:n], data.y_train[:n]
    b = task.batch_size
    idx = torch.arange(n)

    def train():
        model = task.build_model(0, data)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            for i in range(0, n, b):
                opt.zero_grad(set_to_none=True)
                _loss(model, (x[i : i + b], y[i : i + b])).mean().backward()
                opt.step()

        return step

    def stream():
        model = task.build_model(0, data)

        def step():
            with scoring_mode(model):
                for i in range(0, n, b):
                    _loss(model, (x[i : i + b], y[i : i + b]))

        return step

    def scorer(dtype: torch.dtype | None, compiled: bool = False):
        def setup():
            model = task.build_model(0, data)
            if compiled:
                model = torch.compile(model)
            s = Scorer(
                model,
                _Rows(x, y),
                _loss,
                batch_size=1024,
                collate_fn=lambda t: t,
                autocast_dtype=dtype,
            )
            return lambda: s(idx)

        return setup

    cands = [
        Candidate(f"train-b{b}", train),
        Candidate(f"stream-fp32-b{b}", stream),
        Candidate("pass-fp32-b1024", scorer(None)),
        Candidate("pass-bf16-b1024", scorer(torch.bfloat16), precision="bf16"),
    ]
    if compile_model:
        cands.append(Candidate("pass-compiled-fp32-b1024", scorer(None, compiled=True)))
    return cands, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="mnist1d,digits,text")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--compile", action="store_true", help="also a torch.compile'd scorer")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict[str, Any] = {"kind": "hasten.bench.scoring_cost", "samples": SAMPLES, "tasks": {}}
    for name in args.tasks.split(","):
        cands, n = _candidates(name, args.compile)
        cfg = BenchConfig(
            warmup=2,
            rounds=args.rounds,
            steps_per_round=1,
            measure_memory=False,
            matmul_n=0,
            threads=args.threads,
        )
        res = run_benchmark(cands, cfg)
        train = res.candidates[0].step_s
        rows = {}
        for c in res.candidates:
            if not c.ok:
                rows[c.name] = {"error": c.error}
                continue
            s = c.step_s
            rows[c.name] = {
                "us_per_sample": 1e6 * s.median / n,
                "p20_p80_us": [1e6 * s.p20 / n, 1e6 * s.p80 / n],
                "vs_train_step": s.median / train.median,
                "compile_s": c.compile_s,
            }
        out["tasks"][name] = {"samples": n, "rows": rows}
        print(f"\n{name} ({n} samples; per sample, median [p20, p80]; share of a training step)")
        for k, r in rows.items():
            if "error" in r:
                print(f"  {k:<26} error: {r['error']}")
                continue
            lo, hi = r["p20_p80_us"]
            extra = f"  compile {r['compile_s']:.1f} s" if k.startswith("pass-compiled") else ""
            print(
                f"  {k:<26} {r['us_per_sample']:8.2f} us [{lo:.2f}, {hi:.2f}]"
                f"  {r['vs_train_step']:6.3f} of a training step{extra}"
            )
    out["machine"] = machine_stamp()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
