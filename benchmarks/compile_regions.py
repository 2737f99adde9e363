"""Regional against whole-model compilation: cold first call and steady step, one process each.

    /work/bin/cpu-exclusive .venv/bin/python benchmarks/compile_regions.py small --rounds 2
    /work/bin/cpu-exclusive .venv/bin/python benchmarks/compile_regions.py base --rounds 1

Each candidate runs in a fresh process with a fresh, empty Inductor cache, so its first training
step is a cold compile; then ``--steps`` more steps are timed one by one (median reported). The
candidates run in rotated order per round, so the machine's drift hits all of them alike. Every
candidate trains the same random-weight GPT-2 (``hasten.bench.models``) with the same
``torch.optim.AdamW(lr=1e-4)`` (for-loop/foreach default: no candidate gets the fused kernel), with
``config.use_cache=False`` (what a training script sets; with the cache, Transformers indexes it per
layer inside each block, see ``hasten.compiler.regions``), unless ``--use-cache``.

Candidates: ``eager``; ``torch.compile`` (whole model); ``torch.compile regional`` (PyTorch's
recipe: ``block.compile()`` for each transformer block, the rest eager); ``hasten whole``
(``regions="whole"``); ``hasten blocks`` (``regions="blocks"``, glue eager); ``hasten blocks+glue``
(``glue="modules"``: the glue's submodules compiled too); ``hasten whole+nested`` (an experiment: ``regions="whole"`` with
the block class's ``forward`` wrapped in ``torch.compiler.nested_compile_region``). ``first_cpu_s`` is the CPU time of the first step (this process and
its waited-for children: Inductor's compile workers, if any, are not counted).

Results go to ``benchmarks/results/compile-regions-<size>.json`` with the machine stamp.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CANDIDATES = (
    "eager",
    "torch.compile",
    "torch.compile regional",
    "hasten whole",
    "hasten blocks",
    "hasten blocks+glue",
    "hasten whole+nested",
)
SHAPES = {
    "tiny": (4, 16),
    "small": (8, 128),
    "base": (2, 256),
}  # batch x sequence (base as in issue 13)
RESULTS = Path(__file__).resolve().parent / "results"


def child(size: str, candidate: str, steps: int, use_cache: bool) -> dict:
    import resource
    import time

    import torch

    import hasten
    from hasten.bench.models import get_model_spec

    spec = get_model_spec("gpt2", size)
    model = spec.build(seed=0)
    model.config.use_cache = use_cache
    batch_size, seq = SHAPES[size]
    ids = torch.randint(0, spec.hparams["vocab"], (batch_size, seq), generator=torch.Generator())
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run = model
    if candidate == "torch.compile":
        run = torch.compile(model)
    elif candidate == "torch.compile regional":
        for block in model.transformer.h:
            block.compile()
    elif candidate == "hasten whole+nested":
        # an experiment: the whole model in one graph, its block traced once as a nested region
        cls = type(model.transformer.h[0])
        cls.forward = torch.compiler.nested_compile_region(cls.forward)
        hasten.compile(model, regions="whole")
    elif candidate.startswith("hasten"):
        if candidate == "hasten whole":
            hasten.compile(model, regions="whole")
        else:
            glue = "modules" if candidate == "hasten blocks+glue" else "eager"
            hasten.compile(model, regions="blocks", glue=glue)

    def step() -> float:
        t0 = time.perf_counter()
        run(**batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    def cpu() -> float:
        s, c = (
            resource.getrusage(resource.RUSAGE_SELF),
            resource.getrusage(resource.RUSAGE_CHILDREN),
        )
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    c0 = cpu()
    first = step()
    first_cpu = cpu() - c0
    times = [step() for _ in range(steps)]
    out = {
        "first_step_s": first,
        "first_cpu_s": first_cpu,
        "step_s": statistics.median(times),
        "step_times": times,
    }
    if candidate.startswith("hasten"):
        report = hasten.compiler.compile_report(model)
        out["graphs"] = len(report.graphs)
        out["recompiles"] = len(report.recompiles)
        out["notes"] = list(report.fixes)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("size", choices=sorted(SHAPES))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--steps", type=int, default=5, help="steady steps timed after the first")
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--use-cache", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child is not None:
        print("RESULT " + json.dumps(child(a.size, a.child, a.steps, a.use_cache)))
        return

    from hasten.bench.harness import rotated
    from hasten.bench.machine import machine_stamp

    names = [c.strip() for c in a.candidates.split(",") if c.strip()]
    unknown = set(names) - set(CANDIDATES)
    if unknown:
        raise SystemExit(f"unknown candidate(s) {sorted(unknown)}; choose from {CANDIDATES}")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(a.rounds):
        for name in rotated(names, r):
            with tempfile.TemporaryDirectory(prefix="hasten_regions_") as cache:
                env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, HF_HUB_OFFLINE="1")
                cmd = [sys.executable, __file__, a.size, "--child", name, "--steps", str(a.steps)]
                if a.use_cache:
                    cmd.append("--use-cache")
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                runs[name].append({"error": proc.stderr[-2000:]})
                print(f"round {r} {name}: FAILED\n{proc.stderr[-2000:]}", flush=True)
                continue
            res = json.loads(line[len("RESULT ") :])
            runs[name].append(res)
            print(
                f"round {r} {name:24s} first {res['first_step_s']:7.2f} s "
                f"(cpu {res['first_cpu_s']:7.2f} s)  step {res['step_s'] * 1e3:8.1f} ms",
                flush=True,
            )
    summary = {}
    for name, rs in runs.items():
        ok = [x for x in rs if "error" not in x]
        if ok:
            summary[name] = {
                "first_step_s": [x["first_step_s"] for x in ok],
                "first_cpu_s": [x["first_cpu_s"] for x in ok],
                "step_s_median": statistics.median(x["step_s"] for x in ok),
                "step_s_per_round": [x["step_s"] for x in ok],
            }
    batch_size, seq = SHAPES[a.size]
    doc = {
        "kind": "hasten.bench.compile_regions",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": f"gpt2-{a.size}",
        "batch": [batch_size, seq],
        "use_cache": a.use_cache,
        "optimizer": "AdamW(lr=1e-4), default implementation",
        "rounds": a.rounds,
        "steps": a.steps,
        "machine": machine_stamp(),
        "summary": summary,
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"compile-regions-{a.size}{'-use-cache' if a.use_cache else ''}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
