"""GPT-2 124M's training step against this machine's matmul limit, and where the rest goes.

    python benchmarks/gpt2_base_limit.py [--rounds 5] [--profile]

One process, interleaved rounds (:func:`hasten.bench.harness.run_benchmark`), the fp32 and bf16
matmul peaks measured in the same run. GPT-2 124M (12 x 768, random weights) at batch 2 x 256,
AdamW; candidates:

============================================  ==================================================
candidate                                     what runs
============================================  ==================================================
eager                                         ``model(**batch).loss``, default AdamW
torch.compile                                 ``torch.compile(model)``, default AdamW
hasten.compile+compile_step                   ``hasten.compile(model)`` + ``compile_step``
hasten.compile+compile_step-bf16              the same with ``precision="bf16"``
loss-only hasten.compile+compile_step, fused  a wrapper returning only ``.loss`` (so the logits
LM-head CE off / on                           feed nothing else), ``fused_linear_cross_entropy``
                                              off, then on (its default)
============================================  ==================================================

The limit of a step is its model FLOPs (matmuls, forward and backward, counted by
``torch.utils.flop_counter``) over the measured matmul peak of its precision. With ``--profile``,
one more hasten fp32 step runs under ``torch.profiler`` (Inductor's kernels named, via
``cpp.enable_kernel_profile``) and the time is split by op. Writes
``benchmarks/results/gpt2-base-limit.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hasten.bench.harness import BenchConfig, Candidate, count_flops, run_benchmark
from hasten.bench.models import get_model_spec

RESULTS = Path(__file__).resolve().parent / "results"


class LossOnly(nn.Module):
    """``model(**batch).loss``: the graph returns the loss and nothing else."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **batch: Any) -> torch.Tensor:
        return self.model(**batch).loss


def _setup(
    kind: str,
    precision: str = "fp32",
    fused_ce: bool = True,
    profile_kernels: bool = False,
    size: str = "base",
):
    import hasten

    spec = get_model_spec("gpt2", size)

    def setup():
        model = spec.build(0)
        model.train()
        if kind == "loss-only":
            model = LossOnly(model)
        if kind == "torch.compile":
            model = torch.compile(model)
        elif kind != "eager":
            opts = {"cpp.enable_kernel_profile": True} if profile_kernels else {}
            model = hasten.compile(
                model,
                precision=precision,
                passes={"fused_linear_cross_entropy": fused_ce},
                inductor_options=opts,
                reuse_host_memory=False,  # process-wide: it would speed eager's rounds too
            )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = spec.make_batch(torch.Generator().manual_seed(0))
        autocast = precision == "bf16" and kind in ("eager", "torch.compile")

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(**batch) if kind == "loss-only" else model(**batch).loss
            loss.backward()
            opt.step()

        if kind in ("eager", "torch.compile"):
            return step
        return hasten.compile_step(step, optimizers=opt)

    return setup


def _profile(step, steps: int = 2) -> list[dict[str, Any]]:
    """Self CPU time by op over ``steps`` steps (after one untimed), largest first."""
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    by_name: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        by_name[e.key] += e.self_cpu_time_total / 1e6 / steps
    total = sum(by_name.values())
    rows = sorted(by_name.items(), key=lambda kv: -kv[1])
    return [{"op": k, "s_per_step": v, "share": v / total} for k, v in rows[:40]]


def _model_flops(size: str) -> int:
    spec = get_model_spec("gpt2", size)
    model = spec.build(0)
    batch = spec.make_batch(torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def eager_step() -> None:
        model(**batch).loss.backward()
        opt.step()

    return count_flops(eager_step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--no-bf16", action="store_true")
    parser.add_argument("--size", default="base", help="model size (tiny: a smoke test)")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per round")
    parser.add_argument("--json", type=Path, default=RESULTS / "gpt2-base-limit.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    cands = [
        Candidate("eager", _setup("eager", size=args.size)),
        Candidate("torch.compile", _setup("torch.compile", size=args.size)),
        Candidate("hasten.compile+compile_step", _setup("hasten", size=args.size)),
    ]
    if not args.no_bf16:
        cands.append(
            Candidate(
                "hasten.compile+compile_step-bf16", _setup("hasten", "bf16", size=args.size), "bf16"
            )
        )
    cands += [
        Candidate(
            "loss-only hasten.compile+compile_step, fused LM-head CE off",
            _setup("loss-only", fused_ce=False, size=args.size),
        ),
        Candidate(
            "loss-only hasten.compile+compile_step, fused LM-head CE on",
            _setup("loss-only", fused_ce=True, size=args.size),
        ),
    ]
    flops = _model_flops(args.size)
    config = BenchConfig(warmup=3, rounds=args.rounds, steps_per_round=args.steps)
    result = run_benchmark(
        cands,
        config,
        name=f"gpt2-{args.size}",
        flops_per_step=flops,
        samples_per_step=get_model_spec("gpt2", args.size).batch_size,
        progress=True,
    )
    out = result.to_dict(baseline="eager")
    for c in out["candidates"]:
        peak = out["matmul_peak_flops_per_s"].get(c["precision"])
        c["limit_s"] = flops / peak if peak else None
    if args.profile:
        step = _setup("hasten", profile_kernels=True, size=args.size)()
        out["profile_hasten_fp32"] = _profile(step)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(
        f"model FLOPs per step: {flops / 1e9:.1f} G; matmul peak: "
        + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in out["matmul_peak_flops_per_s"].items())
    )
    for c in out["candidates"]:
        if c["error"]:
            print(f"{c['name']}: {c['error'][:200]}")
            continue
        print(
            f"{c['name']}: step {c['step_s']['median']:.3f} s [{c['step_s']['p20']:.3f}, "
            f"{c['step_s']['p80']:.3f}], limit {c['limit_s']:.3f} s, "
            f"{100 * c['fraction_of_matmul_peak']:.1f} % of limit, "
            f"peak step mem {c['peak_mem_bytes'] / 2**20:.0f} MiB"
        )
    for row in out.get("profile_hasten_fp32", [])[:20]:
        print(f"  {row['s_per_step'] * 1e3:8.1f} ms  {100 * row['share']:5.1f} %  {row['op'][:90]}")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
