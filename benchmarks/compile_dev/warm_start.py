"""Cold vs warm compile time, each in a fresh process (the warm one finds Inductor's caches).

    python benchmarks/compile_dev/warm_start.py gpt2 small hasten --cache-dir /tmp/hc_cache

Runs the child twice with the same (initially empty) cache dir: the first is cold, the second warm.
The figure is the wall time of the first training step minus one eager step, so it is compile time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
t_import = time.perf_counter()
import torch
import hasten
from hasten.bench.models import get_model_spec
name, size, how, precision = sys.argv[1:5]
spec = get_model_spec(name, size)
model = spec.build(0)
batch = spec.make_batch(torch.Generator().manual_seed(0))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
def step(m):
    loss = spec.loss(m, batch); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
t0 = time.perf_counter(); step(model); t_eager = time.perf_counter() - t0
if how == "hasten":
    run = hasten.compile(model, precision=precision)
else:
    run = torch.compile(model)
t0 = time.perf_counter(); step(run); first = time.perf_counter() - t0
t0 = time.perf_counter(); step(run); second = time.perf_counter() - t0
print(json.dumps({"compile_s": first - second, "first_step_s": first, "step_s": second}))
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("size")
    p.add_argument("how", choices=["hasten", "torch"])
    p.add_argument("--precision", default="fp32")
    p.add_argument("--cache-dir", default=None)
    a = p.parse_args()
    cache = a.cache_dir or tempfile.mkdtemp(prefix="hasten_warm_")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    for label in ("cold", "warm"):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", CHILD, a.model, a.size, a.how, a.precision],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        res = json.loads(out.stdout.strip().splitlines()[-1])
        res["process_s"] = time.perf_counter() - t0
        print(f"{a.model}/{a.size} {a.how} {a.precision} {label}: " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
