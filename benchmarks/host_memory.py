"""``reuse_host_memory=True`` against glibc's default malloc: step time and peak RSS.

    python benchmarks/host_memory.py [--pairs 2] [--steps 12] [--thp]
        [--out benchmarks/results/host-memory.json]

With ``--thp`` the "on" arm is PyTorch's own ``THP_MEM_ALLOC_ENABLE=1`` in the process's
environment instead (large CPU buffers 2 MiB-aligned and marked for transparent huge pages, so a
fresh buffer faults in 2 MiB at a time; read once when torch starts, so it cannot be switched on
later), malloc left as it is; the default output is then ``results/host-memory-thp.json``.

The setting is process-wide (``hasten.compiler.host_memory``), so each measurement is its own
process: for each configuration, ``--pairs`` pairs of processes, malloc as it is and with the
setting, the order alternating (off-on, then on-off). Each process builds the base-size model
(random weights, batch 2 x 256), compiles it, runs 3 untimed steps (the first compiles; the
Inductor cache is shared and warm after the first process) and ``--steps`` timed steps
(``zero_grad``, forward, backward, the optimizer's ``step``), and reports the median and its
peak RSS (``getrusage``). Configurations:

=============================================  ==================================================
configuration                                  what runs
=============================================  ==================================================
gpt2 hasten-bf16                               ``hasten.compile(model, precision="bf16",
                                               regions="whole")``, default ``AdamW`` (fused by
                                               hasten)
gpt2 torch.compile+autocast+fused-AdamW        the informed peer; "on" applies the same malloc
                                               setting to its process
gpt2 hasten-fp32                               ``hasten.compile(model, regions="whole")``
llama hasten-bf16                              as gpt2's
=============================================  ==================================================
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _interleaved import build_step, child_json

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = (
    ("gpt2", "hasten-bf16"),
    ("gpt2", "torch.compile+autocast+fused-AdamW"),
    ("gpt2", "hasten-fp32"),
    ("llama", "hasten-bf16"),
)
MARK = "@@host_memory "


def child(model_name: str, candidate: str, reuse: bool, steps: int) -> dict[str, Any]:
    import resource

    import torch

    from hasten.compiler import host_memory

    torch.set_num_threads(2)
    peer = candidate.startswith("torch.compile")
    if peer and reuse:
        host_memory.reuse_freed_memory()
    options = {} if peer else {"reuse_host_memory": reuse}
    train_step = build_step(candidate, model_name, 2, 256, **options)

    page = os.sysconf("SC_PAGE_SIZE")
    rss: list[float] = []

    def step() -> float:
        started = time.perf_counter()
        train_step()
        took = time.perf_counter() - started
        with open("/proc/self/statm") as f:  # resident now, after the step
            rss.append(int(f.read().split()[1]) * page / 2**30)
        return took

    for _ in range(3):
        step()
    rss.clear()
    times = [step() for _ in range(steps)]
    return {
        "step_s": statistics.median(times),
        "times_s": times,
        "rss_gib": rss,
        "maxrss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "malloc": host_memory.state() or "as it is",
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--configs", default=",".join(f"{m}:{c}" for m, c in CONFIGS))
    ap.add_argument("--thp", action="store_true", help="compare THP_MEM_ALLOC_ENABLE=1 instead")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        model, candidate, reuse = args.child
        out = child(model, candidate, reuse == "on" and not args.thp, args.steps)
        print(MARK + json.dumps(out), flush=True)
        return 0

    from hasten.bench.demo import save_json
    from hasten.machine import machine_stamp

    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="hm-")
    )
    for name in (
        "LD_PRELOAD",
        "MALLOC_MMAP_MAX_",
        "MALLOC_TRIM_THRESHOLD_",
        "THP_MEM_ALLOC_ENABLE",
    ):
        env.pop(name, None)
    path = args.out or RESULTS / ("host-memory-thp.json" if args.thp else "host-memory.json")
    arm = "THP_MEM_ALLOC_ENABLE=1" if args.thp else "reuse_host_memory=True"
    out: dict[str, Any] = {
        "kind": "hasten.bench.host_memory",
        "settings": {"size": "base", "batch": 2, "seq": 256, "steps": args.steps, "arm": arm},
        "machine": machine_stamp(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "results": [],
    }
    for spec in args.configs.split(","):
        model, candidate = spec.split(":")
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for pair in range(args.pairs):
            for reuse in ("off", "on") if pair % 2 == 0 else ("on", "off"):
                cmd = [sys.executable, __file__, "--steps", str(args.steps)]
                cmd += ["--child", model, candidate, reuse] + (["--thp"] if args.thp else [])
                run_env = dict(env, THP_MEM_ALLOC_ENABLE="1") if args.thp and reuse == "on" else env
                run = child_json(cmd, MARK, f"{spec} {reuse}", run_env)
                runs[reuse].append(run)
                print(
                    f"{model} {candidate} {arm} {reuse}: {run['step_s']:.3f} s, "
                    f"peak RSS {run['maxrss_gib']:.2f} GiB",
                    flush=True,
                )
        out["results"].append({"model": model, "candidate": candidate, "runs": runs})
        save_json(out, path)
    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    save_json(out, path)
    print(render(out))
    return 0


def render(out: dict[str, Any]) -> str:
    """Per configuration: each process's step median and peak RSS, off and on."""
    s = out["settings"]
    head = (
        f"Base size, batch {s['batch']} x {s['seq']}, {s['steps']} timed steps a process "
        f"(median); one process per figure, off and on alternating; load average "
        f"{out['load_average_start']} at start, {out.get('load_average_end')} at end."
    )
    if s["steps"] >= 100:
        return head + "\n\n" + _render_long(out)
    lines = [
        head,
        "",
        "| model | candidate | as it is: step s / peak RSS GiB | with "
        f"`{s.get('arm', 'reuse_host_memory=True')}`: step s / peak RSS GiB | step speedup "
        "(median of processes) |",
        "|---|---|---|---|---|",
    ]
    for r in out["results"]:
        cells = {
            k: ", ".join(f"{x['step_s']:.3f} / {x['maxrss_gib']:.2f}" for x in r["runs"][k])
            for k in ("off", "on")
        }
        med = {k: statistics.median(x["step_s"] for x in r["runs"][k]) for k in ("off", "on")}
        lines.append(
            f"| {r['model']} | {r['candidate']} | {cells['off']} | {cells['on']} "
            f"| {med['off'] / med['on']:.2f}x |"
        )
    return "\n".join(lines)


def _render_long(out: dict[str, Any]) -> str:
    """A long run per process: does the step stay fast and the resident memory level?"""
    n = out["settings"]["steps"]
    q = n // 4
    lines = [
        f"| model | candidate | malloc | median step, steps 1-{q} / {n - q + 1}-{n} (s) | "
        f"resident after step {q} / {n} (GiB) | peak RSS GiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in out["results"]:
        for k, label in (("off", "as it is"), ("on", "reuse_host_memory=True")):
            for x in r["runs"][k]:
                t, m = x["times_s"], x["rss_gib"]
                lines.append(
                    f"| {r['model']} | {r['candidate']} | {label} | "
                    f"{statistics.median(t[:q]):.3f} / {statistics.median(t[-q:]):.3f} | "
                    f"{m[q - 1]:.2f} / {m[-1]:.2f} | {x['maxrss_gib']:.2f} |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
