"""Compile CPU-seconds of a 2-rank torchrun job against one process (issue 13's target: <= 1.2x).

    /work/bin/cpu-exclusive .venv/bin/python benchmarks/compile_ranks.py [--model gpt2-small]

Runs ``tests/integration/scripts/ddp_compile_once.py`` (DDP, gloo, 3 AdamW steps) three ways, each
with a fresh Inductor cache and ``TORCHINDUCTOR_COMPILE_THREADS=1`` (so every compile's CPU time is
in the rank's own count: the process and its waited-for children): one rank; two ranks where
local rank 0 compiles and rank 1 reuses its cache (hasten's default); two ranks compiling on their
own (``rank_wait_s=0``). The figure is the CPU time of each rank's first training step (the step
that compiles), summed over ranks, and its ratio to the one-rank job's. GPT-2 small is compiled
with ``regions="blocks"`` (whole, under DDP, it fell back to eager when this was recorded: see the script). Results go to
``benchmarks/results/compile-ranks.json`` with the machine stamp.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "integration" / "scripts" / "ddp_compile_once.py"


def job(nproc: int, mode: str, model: str) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="hasten_ranks_") as tmp:
        out = Path(tmp)
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
        cmd += ["--standalone", str(SCRIPT), str(out), mode, model]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
        env["TORCHINDUCTOR_CACHE_DIR"] = str(out / "inductor-cache")
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"torchrun failed:\n{proc.stderr[-3000:]}")
        return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt2-small", choices=["tiny", "gpt2-small"])
    a = p.parse_args()
    from hasten.bench.machine import machine_stamp

    runs = {
        "1 rank": job(1, "normal", a.model),
        "2 ranks, rank 0 compiles": job(2, "normal", a.model),
        "2 ranks, each compiles": job(2, "independent", a.model),
    }
    base = sum(r["first_cpu_s"] for r in runs["1 rank"])
    summary = {}
    for name, ranks in runs.items():
        total = sum(r["first_cpu_s"] for r in ranks)
        summary[name] = {
            "first_step_cpu_s": [round(r["first_cpu_s"], 2) for r in ranks],
            "first_step_wall_s": [round(r["first_step_s"], 2) for r in ranks],
            "outcomes": [r["outcomes"] for r in ranks],
            "fallback": [r["fallback"] for r in ranks],
            "total_cpu_s": round(total, 2),
            "ratio_to_1_rank": round(total / base, 3),
        }
        print(
            f"{name:26s} cpu {summary[name]['first_step_cpu_s']} -> {total:.1f} s "
            f"({total / base:.2f}x)  wall {summary[name]['first_step_wall_s']}",
            flush=True,
        )
    doc = {
        "kind": "hasten.bench.compile_ranks",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": a.model,
        "setup": "DDP (gloo), OMP_NUM_THREADS=1, TORCHINDUCTOR_COMPILE_THREADS=1, fresh cache",
        "machine": machine_stamp(),
        "summary": summary,
        "runs": runs,
    }
    out = ROOT / "benchmarks" / "results" / "compile-ranks.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
