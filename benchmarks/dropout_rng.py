"""Compiled dropout's noise: the hashed key (today) against ATen's ``random_`` (before), per step.

    python benchmarks/dropout_rng.py [--models gpt2,bert] [--rounds 10]
        [--out benchmarks/results/dropout-rng.json]

The ``cheap_dropout_rng`` pass draws each training dropout's mask on CPU. Before, it drew 31-bit
integers with ATen's ``random_`` (a serial Mersenne Twister, ~2 ns an element: 54-59 ms of a
0.6-0.9 s bf16 step on GPT-2 124M and BERT-base in the no-AMX profile of BENCHMARKS.md); now it
hashes each element's index under one drawn key, inside the fused kernels
(``passes/dropout.py``). This measures whole training steps both ways, in one process per
model and precision, the candidates' steps interleaved with the order rotated each round:

=====================================  =========================================================
candidate                              what runs
=====================================  =========================================================
hasten-{bf16,fp32}-hash                ``hasten.compile(model, precision=..., regions="whole")``
                                       and a default ``AdamW`` (hasten fuses it): the library as
                                       it is
hasten-{bf16,fp32}-random_             the same, with the pass's ``cheap_dropout`` swapped for
                                       the previous one (``random_`` noise) while it compiles
torch.compile+autocast+fused-AdamW     the bf16 peer: ``torch.compile(model)``, bf16 autocast
                                       around the call, ``AdamW(fused=True)``
torch.compile+fused-AdamW              the fp32 peer
=====================================  =========================================================

Base-size models (random weights), batch 2 x 256 tokens, AdamW(lr 1e-4, weight decay 0.01), the
model's own loss; each step is ``zero_grad``, forward, backward and ``step()``, all timed. The
first step (compile and hasten's first-call check) is timed apart, then 2 warm-up steps.
Inductor's FX-graph and AOTAutograd caches are off, so the two hasten candidates (whose graphs
differ only in the pass's function, which the cache key does not see) each compile their own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from _interleaved import build_step, candidate_rows, interleave, record, run_child

RESULTS = Path(__file__).resolve().parent / "results"
GROUPS = {
    "bf16": ("torch.compile+autocast+fused-AdamW", "hasten-bf16-random_", "hasten-bf16-hash"),
    "fp32": ("torch.compile+fused-AdamW", "hasten-fp32-random_", "hasten-fp32-hash"),
}


def _random_dropout(x: Any, p: float) -> Any:
    """The pass's dropout before the hash: ATen ``random_`` int32 noise (31 bits)."""
    import torch

    noise = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
    keep = ((noise - round(p * 2**31)) >> 31) + 1
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


def _build(name: str, model_name: str, batch: int, seq: int) -> Any:
    import hasten.compiler.passes.dropout as dm

    step = build_step(name, model_name, batch, seq)
    hashed = dm.cheap_dropout
    if name.endswith("random_"):
        dm.cheap_dropout = _random_dropout  # the pass inserts whatever the module holds
    try:
        started = time.perf_counter()
        step()  # compiles (the forward while the pass runs, the backward with it)
        first = time.perf_counter() - started
    finally:
        dm.cheap_dropout = hashed
    return step, first


def child(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    names = GROUPS[args.group]
    steps, first = {}, {}
    for name in names:
        steps[name], first[name] = _build(name, args.model, args.batch, args.seq)
        for _ in range(2):
            steps[name]()
    times = interleave(steps, args.rounds)
    print("@@dropout_rng " + json.dumps({"first_step_s": first, "step_s": times}), flush=True)
    return 0


def render(out: dict[str, Any]) -> str:
    """The record as markdown: per model and precision, each candidate's step and first step."""
    s = out["settings"]
    lines = [
        f"Base size, batch {s['batch']} x {s['seq']} tokens, {s['rounds']} interleaved rounds "
        f"(median, min-max), {s['threads']} threads, Inductor caches off; load average "
        f"{out['load_average_start']} at start, {out.get('load_average_end')} at end.",
        "",
        "| model | candidate | step s (min-max) | vs peer | vs `random_` | first step s |",
        "|---|---|---|---|---|---|",
    ]
    for r in out["results"]:
        rows = {c["candidate"]: c for c in r["candidates"]}
        before = next((c for n, c in rows.items() if n.endswith("random_")), None)
        for c in r["candidates"]:
            vs = (
                f"{before['step_s'] / c['step_s']:.2f}x"
                if before and "hasten" in c["candidate"]
                else ""
            )
            lines.append(
                f"| {r['model']} | {c['candidate']} | {c['step_s']:.3f} ({c['min_s']:.3f}-"
                f"{c['max_s']:.3f}) | {c['vs_peer']:.2f}x | {vs} | {c['first_step_s']:.1f} |"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2,bert")
    ap.add_argument("--groups", default="bf16,fp32")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS / "dropout-rng.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    from hasten.bench.demo import save_json

    out = record("hasten.bench.dropout_rng", args)
    for model in args.models.split(","):
        for group in args.groups.split(","):
            cmd = [sys.executable, __file__, "--child", "--model", model, "--group", group]
            cmd += ["--rounds", str(args.rounds), "--batch", str(args.batch)]
            cmd += ["--seq", str(args.seq), "--threads", str(args.threads)]
            rows = candidate_rows(run_child(cmd, "@@dropout_rng ", f"{model}/{group}"))
            out["results"].append({"model": model, "group": group, "candidates": rows})
            save_json(out, args.out)
            for row in rows:
                print(
                    f"{model} {row['candidate']:36s} {row['step_s']:.3f} s "
                    f"({row['min_s']:.3f}-{row['max_s']:.3f}) {row['vs_peer']:.2f}x peer, "
                    f"first step {row['first_step_s']:.1f} s",
                    flush=True,
                )
    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    save_json(out, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
