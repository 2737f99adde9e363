"""The two lines' steady step against the informed peer, each candidate in processes of its own.

``hasten bench compile`` interleaves candidates in one process: drift hits all alike, but every
candidate shares the process with the others' models, compiled code and allocator state. On the
base-size Llama that one-process figure and separate processes disagreed by several per cent
(2026-12-02, quiet Xeon: 0.996x interleaved, hasten 1.05-1.09x alternated in processes), so this
measures the same steps the other way: for each round, one new process per candidate, in
alternating order (A B, then B A, ...), each building the model from its config, compiling it,
running ``--warmup`` untimed steps and timing ``--steps`` steps (forward, backward,
``optimizer.step()``, ``zero_grad``; the step is ``hasten.bench.compile_bench``'s, so the
candidates and their labels are exactly those of ``hasten bench compile``). Compile time is not
the question here (the whole-run records time it); all processes share one Inductor cache, filled
by an untimed first process per candidate, so the timed ones start warm.

Reported per model: each candidate's per-process median step time, and per round the ratio
peer / hasten (> 1: the two lines are faster); the median of the per-round ratios with its range.

Usage::

    python benchmarks/two_lines_isolated.py --models llama --size base --rounds 4 \\
        --out benchmarks/results/compile-cpu-base-two-lines-isolated.json
    python benchmarks/render.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT = ("torch.compile+fused-AdamW", "hasten.compile")


def child(model: str, size: str, candidate: str, warmup: int, steps: int) -> dict[str, Any]:
    """One process: ``candidate``'s step times (seconds) on ``model`` after ``warmup`` steps."""
    from hasten.bench.compile_bench import candidates_for
    from hasten.bench.models import get_model_spec

    spec = get_model_spec(model, size)
    found = [c for c in candidates_for(spec, kinds=[candidate]) if c.name == candidate]
    if not found:
        raise ValueError(f"unknown candidate {candidate!r}")
    step = found[0].setup()
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"candidate": candidate, "step_s": times, "median_s": statistics.median(times)}


def _run(args: argparse.Namespace, model: str, cand: str, cache: str, steps: int) -> dict:
    cmd = [sys.executable, __file__, "--child", cand, "--models", model, "--size", args.size]
    cmd += ["--warmup", str(args.warmup), "--steps", str(steps)]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{model} {cand} failed:\n{proc.stderr[-3000:]}")
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    rec["process_s"] = time.perf_counter() - t0
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--models", default="llama", help="comma list from hasten.bench.models")
    p.add_argument("--size", default="base")
    p.add_argument("--candidates", default=",".join(DEFAULT), help="peer first, hasten second")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.models, args.size, args.child, args.warmup, args.steps)))
        return 0
    if args.rounds < 1 or args.steps < 1:
        p.error("--rounds and --steps must be at least 1")
    cands = args.candidates.split(",")
    if len(cands) != 2:
        p.error("--candidates takes two names: the peer, then hasten's")

    from hasten.bench.machine import machine_stamp

    machine = machine_stamp()
    results = []
    for model in args.models.split(","):
        cache = tempfile.mkdtemp(prefix="hasten-two-lines-")
        for cand in cands:  # fill the cache: compile once, untimed
            print(f"{model}: warming the cache for {cand}", file=sys.stderr, flush=True)
            _run(args, model, cand, cache, steps=1)
        runs: dict[str, list[dict]] = {c: [] for c in cands}
        ratios = []
        for r in range(args.rounds):
            order = cands if r % 2 == 0 else cands[::-1]
            for cand in order:
                rec = _run(args, model, cand, cache, args.steps)
                runs[cand].append(rec)
                print(
                    f"{model} round {r + 1}/{args.rounds}: {cand} "
                    f"{rec['median_s'] * 1e3:.1f} ms/step",
                    file=sys.stderr,
                    flush=True,
                )
            ratios.append(runs[cands[0]][-1]["median_s"] / runs[cands[1]][-1]["median_s"])
        results.append(
            {
                "model": model,
                "runs": runs,
                "ratios": ratios,
                "ratio_median": statistics.median(ratios),
                "medians_s": {c: statistics.median(x["median_s"] for x in runs[c]) for c in cands},
            }
        )
        line = f"{model}: {cands[0]} / {cands[1]} per round {[f'{x:.3f}' for x in ratios]}"
        print(line, file=sys.stderr)
    data = {
        "kind": "hasten.two_lines_isolated",
        "size": args.size,
        "candidates": cands,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "steps": args.steps,
        "results": results,
        "machine": machine,
        "load_after": list(os.getloadavg()),
    }
    text = json.dumps(data, indent=1)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
