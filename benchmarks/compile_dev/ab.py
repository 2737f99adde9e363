"""Interleaved A/B timing of training-step variants (dev tool for the compiler; not the bench CLI).

    python benchmarks/compile_dev/ab.py gpt2 small eager tc tc_opt --rounds 5 --steps 3

Every variant trains its own copy of the same model (same seed) with AdamW; the optimizer step is
inside the timed step. Compile time (first steps) is reported apart. Rounds are interleaved so
background load hits every variant alike; the figure of merit is the ratio of medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch

from hasten.bench.models import get_model_spec

VARIANTS: dict[str, Callable] = {}


def variant(fn):
    VARIANTS[fn.__name__] = fn
    return fn


def _plain_step(spec, model, opt):
    def step(batch):
        loss = spec.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


@variant
def eager(spec, model):
    return _plain_step(spec, model, torch.optim.AdamW(model.parameters(), lr=1e-4))


@variant
def eager_fused(spec, model):
    return _plain_step(spec, model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True))


# torch.compile(model), not model.compile(): the in-place Module.compile() compiles nothing for
# modules whose forward is torch's own code (nn.Sequential), see hasten.compiler.traps.
@variant
def tc(spec, model):
    compiled = torch.compile(model)
    return _plain_step(spec, compiled, torch.optim.AdamW(model.parameters(), lr=1e-4))


@variant
def tc_fused(spec, model):
    compiled = torch.compile(model)
    return _plain_step(spec, compiled, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True))


@variant
def tc_opt(spec, model):
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-4))
    opt.step = torch.compile(opt.step)
    return _plain_step(spec, compiled, opt)


@variant
def tc_step(spec, model):
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-4))
    return torch.compile(_plain_step(spec, model, opt))


@variant
def bf16_tc(spec, model):
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = spec.loss(compiled, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _hasten(precision="fp32", fused=True, **kw):
    def make(spec, model):
        import hasten

        hasten.compile(model, precision=precision, **kw)
        return _plain_step(spec, model, torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused))

    return make


VARIANTS["hc"] = _hasten(fused=False)
VARIANTS["hc_fused"] = _hasten()
VARIANTS["hc_bf16"] = _hasten("bf16", fused=False)
VARIANTS["hc_bf16_fused"] = _hasten("bf16")
VARIANTS["hc_fb"] = _hasten(inductor_options={"fallback_random": True})
VARIANTS["hc_bf16_fb"] = _hasten("bf16", inductor_options={"fallback_random": True})
VARIANTS["hc_cppwrap"] = _hasten(inductor_options={"cpp_wrapper": True})
VARIANTS["hc_autotune"] = _hasten(mode="max-autotune")
VARIANTS["hc_nopass"] = _hasten(passes={"attention_to_sdpa": False, "simplify": False})
VARIANTS["hc_bf16_autotune"] = _hasten("bf16", mode="max-autotune")


def extra_variants(path: str | None) -> None:
    if path:
        import runpy

        ns = runpy.run_path(path)
        for k, v in ns.get("VARIANTS", {}).items():
            VARIANTS[k] = v


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("size")
    p.add_argument("variants", nargs="+")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--extra", default=None, help="python file defining more VARIANTS")
    a = p.parse_args(argv)
    extra_variants(a.extra)
    spec = get_model_spec(a.model, a.size)
    batch = spec.make_batch(torch.Generator().manual_seed(0))
    steps, first = {}, {}
    for name in a.variants:
        model = spec.build(seed=0)
        model.train()
        steps[name] = VARIANTS[name](spec, model)
        t0 = time.perf_counter()
        for _ in range(a.warmup):
            loss = steps[name](batch)
        first[name] = time.perf_counter() - t0
        print(f"{name}: warm-up {first[name]:.1f}s loss {float(loss):.5f}", flush=True)
    times: dict[str, list[float]] = {n: [] for n in a.variants}
    for _ in range(a.rounds):
        for name in a.variants:
            for _ in range(a.steps):
                t0 = time.perf_counter()
                steps[name](batch)
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times[a.variants[0]])
    print(
        f"\n{a.model}/{a.size}  ({a.rounds} rounds x {a.steps} steps, threads={torch.get_num_threads()})"
    )
    base_min = min(times[a.variants[0]])
    for name in a.variants:
        med = statistics.median(times[name])
        q = statistics.quantiles(times[name], n=5)
        print(
            f"{name:>16}: median {med * 1e3:8.1f} ms  p20 {q[0] * 1e3:8.1f}  p80 {q[-1] * 1e3:8.1f}"
            f"  min {min(times[name]) * 1e3:8.1f}  vs {a.variants[0]}: median {base / med:5.2f}x"
            f" min {base_min / min(times[name]):5.2f}x  warm-up {first[name]:6.1f}s"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
