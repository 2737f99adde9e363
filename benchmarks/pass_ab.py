"""One graph pass on and off, per training step, beside the informed peer.

    python benchmarks/pass_ab.py --pass tied_embedding_grad [--models gpt2]
        [--groups bf16,fp32] [--rounds 12] [--out benchmarks/results/pass-<name>.json]

For each model and precision, one process builds three candidates and interleaves their steps,
the order rotated each round:

=====================================  =========================================================
candidate                              what runs
=====================================  =========================================================
hasten-{bf16,fp32}                     ``hasten.compile(model, precision=..., regions="whole")``
                                       and a default ``AdamW`` (hasten fuses it): the library as
                                       it is
hasten-{bf16,fp32}-without-<pass>      the same with ``passes={<pass>: False}``
torch.compile+autocast+fused-AdamW     the bf16 peer: ``torch.compile(model)``, bf16 autocast
                                       around the call, ``AdamW(fused=True)``
torch.compile+fused-AdamW              the fp32 peer
=====================================  =========================================================

Base-size models (random weights), batch 2 x 256 tokens, AdamW(lr 1e-4, weight decay 0.01), the
model's own loss; each step is ``zero_grad``, forward, backward and ``step()``, all timed. The
first step (compile, and hasten's first-call check) is timed apart, then 3 warm-up steps.
Inductor's FX-graph and AOTAutograd caches are off, so each candidate compiles its own graphs.
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
MARK = "@@pass_ab "
PEERS = {"bf16": "torch.compile+autocast+fused-AdamW", "fp32": "torch.compile+fused-AdamW"}


def _candidates(group: str, pass_name: str) -> tuple[str, ...]:
    return (PEERS[group], f"hasten-{group}-without-{pass_name}", f"hasten-{group}")


def _build(name: str, pass_name: str, model_name: str, batch: int, seq: int) -> Any:
    passes = {pass_name: False} if name.endswith(f"-without-{pass_name}") else {}
    options = {} if name.startswith("torch.compile") else {"passes": passes}
    step = build_step(name, model_name, batch, seq, **options)
    started = time.perf_counter()
    step()
    return step, time.perf_counter() - started


def child(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    names = _candidates(args.group, args.pass_name)
    steps, first = {}, {}
    for name in names:
        steps[name], first[name] = _build(name, args.pass_name, args.model, args.batch, args.seq)
        for _ in range(3):
            steps[name]()
    times = interleave(steps, args.rounds)
    print(MARK + json.dumps({"first_step_s": first, "step_s": times}), flush=True)
    return 0


def render(out: dict[str, Any]) -> str:
    """Per model and precision: each candidate's step, against the peer and without the pass."""
    s = out["settings"]
    lines = [
        f"Pass `{s['pass']}`. Base size, batch {s['batch']} x {s['seq']} tokens, {s['rounds']} "
        f"interleaved rounds (median, min-max), {s['threads']} threads, Inductor caches off; "
        f"load average {out['load_average_start']} at start, {out.get('load_average_end')} at "
        "end.",
        "",
        "| model | candidate | step s (min-max) | vs peer | vs without the pass | first step s |",
        "|---|---|---|---|---|---|",
    ]
    for r in out["results"]:
        without = next(c for c in r["candidates"] if "-without-" in c["candidate"])
        for c in r["candidates"]:
            vs = ""
            if c["candidate"].startswith("hasten") and c is not without:
                vs = f"{without['step_s'] / c['step_s']:.2f}x"
            lines.append(
                f"| {r['model']} | {c['candidate']} | {c['step_s']:.3f} ({c['min_s']:.3f}-"
                f"{c['max_s']:.3f}) | {c['vs_peer']:.2f}x | {vs} | {c['first_step_s']:.1f} |"
            )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pass", dest="pass_name", required=True)
    ap.add_argument("--models", default="gpt2")
    ap.add_argument("--groups", default="bf16,fp32")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    from hasten.bench.demo import save_json
    from hasten.compiler.passes import pass_names

    if args.pass_name not in pass_names():
        raise SystemExit(f"unknown pass {args.pass_name!r}; hasten's passes: {pass_names()}")
    path = args.out or RESULTS / f"pass-{args.pass_name.replace('_', '-')}.json"
    out = record("hasten.bench.pass_ab", args, **{"pass": args.pass_name})
    for model in args.models.split(","):
        for group in args.groups.split(","):
            cmd = [sys.executable, __file__, "--child", "--pass", args.pass_name]
            cmd += ["--model", model, "--group", group, "--rounds", str(args.rounds)]
            cmd += ["--batch", str(args.batch), "--seq", str(args.seq)]
            cmd += ["--threads", str(args.threads)]
            rows = candidate_rows(run_child(cmd, MARK, f"{model}/{group}"))
            out["results"].append({"model": model, "group": group, "candidates": rows})
            print(f"{model}/{group}: " + ", ".join(
                f"{c['candidate']} {c['step_s']:.3f} s" for c in rows), flush=True)  # fmt: skip
            save_json(out, path)
    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    save_json(out, path)
    print(render(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
