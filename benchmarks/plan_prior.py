"""The compile plan's prior: what a cold compile costs, against what the plan expects.

    python benchmarks/plan_prior.py [--models gpt2-tiny,...]
        [--out benchmarks/results/plan-compile-prior.json]

Before anything was compiled in a cache directory, ``regions="auto"`` expects a compile to cost
``PRIOR_S + PER_MODULE_S`` per submodule, and on a CPU, once it has profiled an eager training
step, ``PROFILED_PRIOR_S + PER_BACKWARD_NODE_S`` per node of that step's backward graph
(``hasten.compiler.plan``). This script measures, for each model, one process each with its own
empty Inductor cache: the module count; the backward nodes of the second eager training step
under the profiler (as the plan counts them); and the cold first call of
``hasten.compile(model, regions="whole")`` (fp32, the first call's check included), which is what
the plan records as a compile's cost. It then fits both lines (least squares on the relative
error) and reports each prior's error with the constants in the code, the fitted ones, and the
module prior the code had before (8 s + 0.22 s a module).

Models: the benchmark suite's GPT-2, BERT, RoBERTa and Llama-style decoder at tiny, small and base
size (random weights, batch 2; base at 2 x 256 tokens).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _interleaved import child_json

RESULTS = Path(__file__).resolve().parent / "results"
MARK = "PLAN_PRIOR "
MODELS = (
    "gpt2-tiny,bert-tiny,llama-tiny,gpt2-small,bert-small,roberta-small,llama-small,"
    "gpt2-base,bert-base,roberta-base,llama-base"
)
OLD_MODULE_PRIOR = (8.0, 0.22)  # the fit of 2026-12-02, replaced by this record's


def child(model_name: str) -> dict[str, Any]:
    import torch

    import hasten
    from hasten.bench.models import get_model_spec
    from hasten.compiler.plan import _BACKWARD_NODE

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    name, size = model_name.split("-")
    spec = get_model_spec(name, size)
    model = spec.build(0).train()
    data = spec.make_batch(torch.Generator().manual_seed(0), batch_size=2)
    if size == "base":
        data = {k: v[:, :256] if v.dim() == 2 else v for k, v in data.items()}
    modules = sum(1 for _ in model.modules())
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    for i in range(2):  # the plan profiles the second eager step
        if i == 1:
            prof.start()
        model(**data).loss.backward()
        model.zero_grad(set_to_none=True)
    prof.stop()
    nodes = sum(e.count for e in prof.key_averages() if e.key.startswith(_BACKWARD_NODE))
    hasten.compile(model, regions="whole")
    t0 = time.perf_counter()
    loss = model(**data).loss  # the call the plan times; the backward compiles within it
    compile_s = time.perf_counter() - t0
    loss.backward()
    return {
        "model": model_name,
        "modules": modules,
        "backward_nodes": nodes,
        "compile_s": round(compile_s, 2),
    }


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """``a + b x`` minimising the squared relative error."""
    import numpy as np

    x, y = np.asarray(xs, float), np.asarray(ys, float)
    a = np.vstack([np.ones_like(x), x]).T / y[:, None]
    coef = np.linalg.lstsq(a, np.ones_like(y), rcond=None)[0]
    return round(float(coef[0]), 2), round(float(coef[1]), 4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--out", type=Path, default=RESULTS / "plan-compile-prior.json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(MARK + json.dumps(child(args.child)), flush=True)
        return 0

    from hasten.bench.demo import save_json
    from hasten.compiler import plan
    from hasten.machine import machine_stamp

    out: dict[str, Any] = {
        "kind": "hasten.bench.plan_prior",
        "machine": machine_stamp(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "code": {
            "module": [plan.PRIOR_S, plan.PER_MODULE_S],
            "profiled": [plan.PROFILED_PRIOR_S, plan.PER_BACKWARD_NODE_S],
        },
        "results": [],
    }
    for name in args.models.split(","):
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="prior-")
        cmd = [sys.executable, __file__, "--child", name]
        row = child_json(cmd, MARK, name, env)
        out["results"].append(row)
        print(json.dumps(row), flush=True)
        save_json(out, args.out)
    rows = out["results"]
    ys = [r["compile_s"] for r in rows]
    out["fit"] = {
        "module": list(_fit([r["modules"] for r in rows], ys)),
        "profiled": list(_fit([r["backward_nodes"] for r in rows], ys)),
    }
    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    save_json(out, args.out)
    print(render(out))
    return 0


def render(out: dict[str, Any]) -> str:
    """Per model: the measured cold compile and each prior's relative error."""
    rows = out["results"]
    code, fit = out["code"], out.get("fit", {})

    def err(line: list[float] | tuple[float, float], x: float, y: float) -> str:
        return f"{(line[0] + line[1] * x) / y - 1:+.0%}"

    def worst(line: list[float] | tuple[float, float], key: str) -> str:
        errs = [abs((line[0] + line[1] * r[key]) / r["compile_s"] - 1) for r in rows]
        return f"{max(errs):.0%} at most, {sum(errs) / len(errs):.0%} on average"

    old = OLD_MODULE_PRIOR
    lines = [
        f"Load average {out['load_average_start']} at start, {out.get('load_average_end')} at "
        "end. Priors: by module count, in the code "
        f"{code['module'][0]} s + {code['module'][1]} s a module, fitted here "
        f"{fit.get('module')}; by backward node, in the code {code['profiled'][0]} s + "
        f"{code['profiled'][1]} s a node, fitted here {fit.get('profiled')}; before, "
        f"{old[0]} s + {old[1]} s a module.",
        "",
        "| model | modules | backward nodes | cold compile s | module prior | node prior "
        "| module prior before |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        y = r["compile_s"]
        lines.append(
            f"| {r['model']} | {r['modules']} | {r['backward_nodes']} | {y:.1f} "
            f"| {err(code['module'], r['modules'], y)} "
            f"| {err(code['profiled'], r['backward_nodes'], y)} "
            f"| {err(old, r['modules'], y)} |"
        )
    lines += [
        "",
        f"Error of each prior (code's constants): by module {worst(code['module'], 'modules')}; "
        f"by backward node {worst(code['profiled'], 'backward_nodes')}; the module prior "
        f"before {worst(old, 'modules')}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
