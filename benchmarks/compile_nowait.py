"""No-wait start against waiting for the compile: time to the N-th training step, compile included.

    /work/bin/cpu-exclusive .venv/bin/python benchmarks/compile_nowait.py --steps 150

Each run is a fresh process with a fresh, empty Inductor cache: GPT-2 small (``hasten.bench.models``,
``config.use_cache=False``, batch 8 x 128) trained with ``torch.optim.AdamW(lr=1e-4)`` for
``--steps`` steps, ``hasten.compile(model, start=...)`` with ``start="wait"`` (the first step
compiles) and ``start="eager"`` (a helper process compiles while the steps run eagerly). Recorded:
the wall time from the first step's start to the end of every step, so time to step N can be read
for any N. Results go to ``benchmarks/results/compile-nowait.json`` with the machine stamp.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def child(start: str, steps: int, regions: str) -> dict:
    import time

    import torch

    import hasten
    from hasten.bench.models import get_model_spec

    spec = get_model_spec("gpt2", "small")
    model = spec.build(seed=0)
    model.config.use_cache = False
    batch = spec.make_batch(torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    hasten.compile(model, start=start, regions=regions)
    t0 = time.perf_counter()
    ends, losses = [], []
    for _ in range(steps):
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        ends.append(time.perf_counter() - t0)
    report = hasten.compiler.compile_report(model)
    return {"ends": ends, "losses": losses, "graphs": len(report.graphs), "notes": report.fixes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--regions", default="whole", choices=["whole", "blocks", "auto"])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        print("RESULT " + json.dumps(child(a.child, a.steps, a.regions)))
        return
    from hasten.bench.harness import rotated
    from hasten.bench.machine import machine_stamp

    runs: dict[str, list[dict]] = {"wait": [], "eager": []}
    for r in range(a.rounds):
        for start in rotated(list(runs), r):
            with tempfile.TemporaryDirectory(prefix="hasten_nowait_") as cache:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, HF_HUB_OFFLINE="1")
                cmd = [sys.executable, __file__, "--child", start, "--steps", str(a.steps)]
                cmd += ["--regions", a.regions]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                raise SystemExit(f"{start} failed:\n{proc.stderr[-3000:]}")
            res = json.loads(line[len("RESULT ") :])
            runs[start].append(res)
            marks = {
                n: round(res["ends"][n - 1], 1) for n in (1, 10, 50, 100, a.steps) if n <= a.steps
            }
            print(f"round {r} start={start:5s} time to step {marks}", flush=True)
    doc = {
        "kind": "hasten.bench.compile_nowait",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": "gpt2-small",
        "regions": a.regions,
        "machine": machine_stamp(),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "compile-nowait.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
