"""Sifting's own overhead, beyond the scoring forward, as a share of one training step.

For each benchmark model, on the same batches:

- ``overhead`` (the headline): the batches go through ``SiftingDataloader`` (sift_delay 0,
  beta 1) with a loss that replays losses the model computed beforehand, so the timed pass holds
  sifting's own work only: flattening, eval-mode switching, ranking against the history,
  selection, accumulation, rebuilding. Short passes, many rounds, median: robust on a busy
  machine.
- ``step``: one training step (forward + backward + AdamW step), median of many.
- cross-check: the same batches through the loader with the real scoring forward, minus the
  scoring forward alone (eval, ``inference_mode``, per-sample loss), interleaved round by round.
  Noisier (it subtracts two long timings), reported as ``end_to_end_overhead_ms``.

Overhead per incoming batch is reported as % of a training step (the median over rounds of the
ratio within a round, so load on a shared machine cancels), and per training step: times the
incoming batches consumed per yielded batch (about 1 / keep rate: 2 at beta 1).

Run: ``python benchmarks/sift_overhead.py [--models mlp cnn bert] [--device cuda]``; results go to
``benchmarks/results/sift_overhead.json`` with the machine they ran on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch

from hasten.bench.models import get_model_spec
from hasten.sifting import RelativeProbabilisticSiftConfig, SiftingDataloader

# batches per timed pass: ~0.2-0.6 s per pass on 2 CPU cores
N_BATCHES = {"mlp": 64, "cnn": 24, "bert": 12, "gpt2": 12, "roberta": 12}


def machine_info(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        info["git_commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    return info


def _timed(fn: Any, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


class _ReplayLoss:
    """Returns losses computed beforehand by the real model, batch after batch."""

    def __init__(self, losses: list[torch.Tensor]) -> None:
        self.losses, self.i = losses, 0

    def loss(self, model: Any, transformed_batch: Any, original_batch: Any = None) -> torch.Tensor:
        out = self.losses[self.i % len(self.losses)]
        self.i += 1
        return out


def bench_model(
    name: str, size: str, device: torch.device, rounds: int, beta: float
) -> dict[str, Any]:
    spec = get_model_spec(name, size)
    model = spec.build(seed=0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    n = N_BATCHES.get(name, 16)
    batches = [spec.make_batch(gen, device=device) for _ in range(n)]
    config = RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=500,
        loss_based_sift_config={"sift_config": {"sift_delay": 0}},
    )
    model.eval()
    with torch.inference_mode():
        planted = [spec.per_sample_loss(model, b) for b in batches]
    model.train()
    last_stats: list[Any] = []

    def sift(loss_impl: Any) -> None:
        loader = SiftingDataloader(
            config, batches, model=model, loss_impl=loss_impl, seed=0, log_interval=0
        )
        for _ in loader:
            pass
        last_stats[:] = [loader.stats]

    def overhead() -> None:
        sift(_ReplayLoss(planted))

    def score() -> None:
        model.eval()
        with torch.inference_mode():
            for b in batches:
                spec.per_sample_loss(model, b)
        model.train()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        spec.loss(model, batches[0]).backward()
        opt.step()

    for _ in range(2):  # warm-up: allocator, kernels, first optimizer step
        overhead()
        score()
        sift(spec.per_sample_loss)
        step()
    # paired rounds: the ratio overhead / step is taken within a round, so load that comes and
    # goes on a shared machine scales both alike
    t_over, t_step = [], []
    for _ in range(4 * rounds):
        t_over.append(_timed(overhead, device))
        t_step.append(statistics.median(_timed(step, device) for _ in range(2)))
    stats = last_stats[0]
    t_score, t_sift = [], []
    for _ in range(rounds):
        t_score.append(_timed(score, device))
        t_sift.append(_timed(lambda: sift(spec.per_sample_loss), device))
    real_stats = last_stats[0]
    step_s = statistics.median(t_step)
    per_in = statistics.median(t_over) / n
    e2e = statistics.median((s - c) / n for s, c in zip(t_sift, t_score))
    ratio = statistics.median(o / n / st for o, st in zip(t_over, t_step))
    in_per_out = stats.num_batches_in / max(stats.num_batches_out, 1)
    return {
        "model": name,
        "size": size,
        "batch_size": spec.batch_size,
        "batches_per_pass": n,
        "rounds": rounds,
        "beta_value": beta,
        "train_step_ms": 1e3 * step_s,
        "score_forward_ms": 1e3 * statistics.median(t_score) / n,
        "overhead_ms_per_incoming_batch": 1e3 * per_in,
        "end_to_end_overhead_ms": 1e3 * e2e,
        "end_to_end_pct_of_step_per_training_step": 100 * e2e * in_per_out / step_s,
        "incoming_batches_per_step": in_per_out,
        "overhead_pct_of_step_per_incoming_batch": 100 * ratio,
        "overhead_pct_of_step_per_training_step": 100 * ratio * in_per_out,
        "keep_rate": stats.keep_rate,
        "loader_stage_ms_per_batch": stats.stage_latency_ms(),
        "loader_stage_ms_per_batch_real_scoring": real_stats.stage_latency_ms(),
        "raw_seconds": {"overhead": t_over, "step": t_step, "score": t_score, "sift": t_sift},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "bert"])
    parser.add_argument("--size", default="small")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "sift_overhead.json")
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    device = torch.device(args.device)
    results = []
    for name in args.models:
        load_before = os.getloadavg()[0]
        r = bench_model(name, args.size, device, args.rounds, args.beta)
        # a shared machine's load skews timings: record it so readers can judge
        r["load_average_1min"] = {"before": load_before, "after": os.getloadavg()[0]}
        results.append(r)
        print(
            f"{name:>5} {args.size}: step {r['train_step_ms']:.2f} ms, scoring forward "
            f"{r['score_forward_ms']:.2f} ms, overhead {r['overhead_ms_per_incoming_batch']:.3f} ms"
            f" (end-to-end check {r['end_to_end_overhead_ms']:.3f} ms)"
            f"/incoming batch = {r['overhead_pct_of_step_per_incoming_batch']:.2f} % of a step "
            f"({r['overhead_pct_of_step_per_training_step']:.2f} % per training step at keep "
            f"rate {r['keep_rate']:.2f})",
            flush=True,
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {
        "benchmark": "sift_overhead",
        "description": __doc__.split("\n\n")[1],
        "machine": machine_info(device),
        "results": results,
    }
    peak = max(max(r["load_average_1min"].values()) for r in results)
    cores = os.cpu_count() or 1
    if peak > cores:
        payload["warning"] = (
            f"the machine was oversubscribed (1-min load average up to {peak:.1f} on {cores} "
            "cores): absolute times are inflated and the end-to-end check is unreliable; the "
            "overhead percentages are medians of per-round ratios, which load affects less"
        )
        print(payload["warning"])
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
