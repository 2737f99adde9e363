"""Time AdamW.step alone on a model's parameters: for-loop, foreach, fused, torch.compile'd."""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch

from hasten.bench.models import get_model_spec


def main(name: str, size: str, rounds: int = 15) -> None:
    spec = get_model_spec(name, size)
    variants = {}
    for v in ["loop", "foreach", "fused", "compiled", "compiled_fused"]:
        model = spec.build(0)
        params = [p for p in model.parameters()]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        kw = {
            "loop": dict(foreach=False),
            "foreach": dict(foreach=True),
            "fused": dict(fused=True),
            "compiled": dict(lr=torch.tensor(1e-3)),
            "compiled_fused": dict(fused=True, lr=torch.tensor(1e-3)),
        }[v]
        kw.setdefault("lr", 1e-3)
        opt = torch.optim.AdamW(params, **kw)
        step = torch.compile(opt.step) if v.startswith("compiled") else opt.step
        t0 = time.perf_counter()
        for _ in range(2):
            step()
        print(v, f"warm-up {time.perf_counter() - t0:.1f}s", flush=True)
        variants[v] = step
    times = {v: [] for v in variants}
    for _ in range(rounds):
        for v, step in variants.items():
            t0 = time.perf_counter()
            step()
            times[v].append(time.perf_counter() - t0)
    n = sum(p.numel() for p in spec.build(0).parameters())
    print(f"{name}/{size}: {n / 1e6:.2f}M params, {len(list(spec.build(0).parameters()))} tensors")
    for v, t in times.items():
        print(f"{v:>15}: median {statistics.median(t) * 1e3:7.2f} ms  min {min(t) * 1e3:7.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
