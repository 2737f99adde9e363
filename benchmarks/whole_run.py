"""Whole runs: time to step N, compile included, each candidate in a process of its own.

A user's run is a whole job; most fine-tunes are short. This times what the user waits for:
from the moment the model is wrapped (``import hasten`` and ``hasten.compile`` included, or
``torch.compile``) to the end of optimizer step N (forward, backward, ``optimizer.step()``,
``zero_grad``), for N in ``--ns``. Each (candidate, cache state) is one new Python process;
"cold" gives it a new, empty ``TORCHINDUCTOR_CACHE_DIR`` (Inductor's cache and hasten's plan
history both live there), "warm" runs the same candidate again on the directory its cold run
filled. Candidates run interleaved (eager, peers, hasten, eager, ...) so drift hits them alike.

Steps past ``--measure`` are not run: time to step N > measure is the measured time to step
``measure`` plus ``N - measure`` times the median of the last ``--tail`` measured steps, and the
record marks it ``extrapolated``. ``hasten.compile(model, steps=N)`` is told each N (a trainer
integration tells it the run's length), so it is one run per N; its decision is made at the
third step, inside the measured part.

Candidates (the label says exactly what runs):

* ``eager``: the model as built, ``AdamW`` (PyTorch's default foreach kernel).
* ``torch.compile``: ``torch.compile(model)``, ``AdamW``.
* ``torch.compile+fused``: ``torch.compile(model)``, ``AdamW(fused=True)``.
* ``regional+fused``: ``block.compile()`` on every transformer block (PyTorch's regional
  compilation recipe), ``AdamW(fused=True)``.
* ``hasten(steps=N)``: ``hasten.compile(model, steps=N)`` (default ``regions="auto"``: the
  compile plan), ``AdamW`` as a user writes it (hasten fuses its step by default).
* ``hasten(no hint)``: ``hasten.compile(model)`` with no run length (the ski-rental rule).
* ``hasten-eager-or-whole(steps=N)``: as ``hasten(steps=N)``, with the plan's blocks choice
  switched off in the child (``regions.repeated_blocks`` patched to find none for the plan):
  the rule before the plan weighed blocks, eager or the whole model only. Only with
  ``--old-rule``.
* ``hasten(regions=whole)``: ``hasten.compile(model, regions="whole")``: the whole model
  compiled at the first call, no plan. Only with ``--old-rule``.

``--rounds R`` repeats the whole interleaved sequence R times, each round on new cold cache
directories, so per-round ratios (eager's time / the candidate's in the same round) can be
taken; the record keeps every run with its round.

Usage::

    python benchmarks/whole_run.py --model gpt2 --size base --batch 1 --seq 128 \\
        --ns 10,50,200,1000 --measure 60 --out benchmarks/results/compile-whole-run-gpt2.json
    python benchmarks/whole_run.py --model bert --size base --batch 1 --seq 128 --ns 300 \\
        --old-rule --caches cold --rounds 3 --measure 60 --tail 20 \\
        --candidates "eager,hasten(steps=300),hasten-eager-or-whole(steps=300),hasten(regions=whole)" \\
        --out benchmarks/results/compile-whole-run-bert-blocks.json
    python benchmarks/render.py   # tables from the results
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PEERS = ("eager", "torch.compile", "torch.compile+fused", "regional+fused")


def _blocks(model: Any) -> list[Any]:
    """The repeated transformer blocks of a Transformers model (GPT-2, BERT, Llama)."""
    import torch

    lists = [
        m
        for m in model.modules()
        if isinstance(m, torch.nn.ModuleList) and len(m) > 1 and len({type(b) for b in m}) == 1
    ]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no ModuleList of repeated blocks")
    return list(max(lists, key=len))


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One run in this process: step times of ``args.candidate``, as JSON-ready dict."""
    import torch

    from hasten.bench.models import get_model_spec

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = get_model_spec(args.model, args.size)
    model = spec.build(seed=0)
    if hasattr(model, "config"):
        model.config.use_cache = False
    model.train()
    gen = torch.Generator().manual_seed(0)
    batches = [
        spec.make_batch(gen, batch_size=args.batch or None) for _ in range(4)
    ]  # a few different batches of one shape, cycled
    if args.seq:
        batches = [
            {k: v[:, : args.seq] if v.dim() > 1 else v for k, v in b.items()} for b in batches
        ]
    cand = args.child
    t0 = time.perf_counter()
    fused = False
    said: list[str] = []  # hasten's log lines (the plan's decisions), for the record
    if cand.startswith("hasten"):
        import logging

        import hasten

        class Keep(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                said.append(record.getMessage())

        logging.getLogger("hasten").addHandler(Keep())
        logging.getLogger("hasten").setLevel(logging.INFO)
        if cand.startswith("hasten-eager-or-whole"):  # the plan offers no blocks: the old rule
            from hasten.compiler import regions

            regions.repeated_blocks = lambda model, min_count=2: []
        if cand == "hasten(regions=whole)":
            model = hasten.compile(model, regions="whole")
        else:
            model = hasten.compile(model, steps=_steps_of(cand))
    elif cand.startswith("torch.compile"):
        model = torch.compile(model)
        fused = cand.endswith("+fused")
    elif cand == "regional+fused":
        for block in _blocks(model):
            block.compile()
        fused = True
    elif cand != "eager":
        raise ValueError(f"unknown candidate {cand!r}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if fused else None)
    cum: list[float] = []
    losses: list[float] = []
    for i in range(args.run_steps):
        loss = spec.loss(model, batches[i % len(batches)])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i in (0, args.run_steps - 1):
            losses.append(float(loss))  # two host syncs in the run, the same for everyone
        cum.append(time.perf_counter() - t0)
    out: dict[str, Any] = {"candidate": cand, "cum_s": cum, "loss_first_last": losses}
    if cand.startswith("hasten"):
        from hasten.compiler import compile_report

        rep = compile_report(model)
        out["compile_seconds"] = rep.compile_seconds
        out["hasten_log"] = said
        out["report"] = str(rep)[:2000]
    return out


def _steps_of(cand: str) -> int | None:
    """The run length a hasten candidate is told (``None``: no hint)."""
    m = re.match(r"hasten[a-z-]*\(steps=(\d+)\)", cand)
    return int(m.group(1)) if m else None


def time_to(cum: list[float], n: int, tail: int) -> tuple[float, bool]:
    """Seconds to step ``n`` from a run's cumulative times; extrapolated past its end."""
    if n <= len(cum):
        return cum[n - 1], False
    steps = [b - a for a, b in itertools.pairwise(cum)]
    per_step = statistics.median(steps[-tail:])
    return cum[-1] + (n - len(cum)) * per_step, True


def _run_child(args: argparse.Namespace, cand: str, run_steps: int, cache: str) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        cand,
        "--model",
        args.model,
        "--size",
        args.size,
        "--run-steps",
        str(run_steps),
    ]
    for flag in ("batch", "seq", "threads"):
        if getattr(args, flag):
            cmd += [f"--{flag}", str(getattr(args, flag))]
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"candidate": cand, "error": proc.stderr[-3000:], "process_s": wall}
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    rec["process_s"] = wall
    rec["log_tail"] = proc.stderr[-1500:]
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--run-steps", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--model", default="gpt2")
    p.add_argument("--size", default="base")
    p.add_argument("--batch", type=int, default=0, help="batch size (0: the spec's)")
    p.add_argument("--seq", type=int, default=0, help="sequence length cut (0: the spec's)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--ns", default="10,50,200,1000")
    p.add_argument("--measure", type=int, default=60, help="most steps actually run")
    p.add_argument("--tail", type=int, default=20, help="steps whose median extrapolates")
    p.add_argument("--candidates", default="", help="comma list (default: all)")
    p.add_argument("--caches", default="cold,warm")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--rounds", type=int, default=1, help="interleaved sequences, new caches each")
    p.add_argument(
        "--old-rule",
        action="store_true",
        help="add hasten-eager-or-whole(steps=N), the plan without its blocks choice, and "
        "hasten(regions=whole)",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return 0

    from hasten.bench.machine import machine_stamp

    ns = [int(n) for n in args.ns.split(",")]
    cands = [*PEERS, *(f"hasten(steps={n})" for n in ns), "hasten(no hint)"]
    if args.old_rule:
        cands += [f"hasten-eager-or-whole(steps={n})" for n in ns] + ["hasten(regions=whole)"]
    if args.candidates:
        cands = [c for c in cands if c in args.candidates.split(",")]
    caches = args.caches.split(",")
    stamp_before = machine_stamp()
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        dirs = {c: tempfile.mkdtemp(prefix="hasten-whole-run-") for c in cands}
        for cache in caches:  # every candidate cold first, then warm on its own directory
            for cand in cands:
                told = _steps_of(cand)
                run_steps = min(told or max(ns), args.measure)
                rec = _run_child(args, cand, run_steps, dirs[cand])
                rec.update(cache=cache, run_steps=run_steps, round=round_)
                if "cum_s" in rec:
                    rec["time_to"] = {}
                    for n in ns:
                        if told is not None and n != told:
                            continue  # told another length: not this run's figure
                        t, extra = time_to(rec["cum_s"], n, args.tail)
                        rec["time_to"][str(n)] = {"s": t, "extrapolated": extra}
                runs.append(rec)
                figs = {n: round(v["s"], 1) for n, v in rec.get("time_to", {}).items()}
                print(
                    f"{round_} {cache:4} {cand:34} {figs or rec.get('error', '')[-300:]}",
                    flush=True,
                )
    result = {
        "kind": "hasten.whole_run",
        "model": args.model,
        "size": args.size,
        "batch": args.batch or None,
        "seq": args.seq or None,
        "ns": ns,
        "measure": args.measure,
        "tail": args.tail,
        "rounds": args.rounds,
        "command": " ".join(sys.argv),
        "runs": runs,
        "machine": stamp_before,
        "load_after": os.getloadavg(),
    }
    if args.out:
        from hasten.bench.demo import save_json

        print(f"wrote {save_json(result, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
