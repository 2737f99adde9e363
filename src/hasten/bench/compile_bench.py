"""Eager vs ``torch.compile`` vs ``hasten.compile``, side by side: ``hasten bench compile``.

For every model (built from its config with random weights, see :mod:`hasten.bench.models`) one
:func:`~hasten.bench.harness.run_benchmark` interleaves the candidates in one process:

==================  ==========================================================================
candidate           what runs
==================  ==========================================================================
eager               the model as is, fp32 — the baseline every speedup is quoted against
torch.compile       ``torch.compile(model)`` (Inductor, default mode), fp32
hasten              ``hasten.compile(model)``, precision fp32, and ``hasten.compile_step`` for the
                    optimizer update (the fused AdamW kernel)
eager-bf16          eager under ``torch.autocast(dtype=torch.bfloat16)``
torch.compile-bf16  ``torch.compile(model)`` under the same autocast
hasten-bf16         ``hasten.compile(model, precision="bf16")``
==================  ==========================================================================

Every candidate trains with AdamW (lr 1e-4) on one fixed batch; a step is forward, backward and
the optimizer update. Model FLOPs are counted once, on the eager model.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hasten.bench import _hasten_api
from hasten.bench.harness import BenchConfig, BenchResult, Candidate, count_flops, run_benchmark
from hasten.bench.models import ModelSpec, get_model_spec

__all__ = ["CANDIDATES", "PRECISIONS", "candidates_for", "run_compile_bench"]

PRECISIONS = ("fp32", "bf16")
CANDIDATES = ("eager", "torch.compile", "hasten")


def _make_setup(
    spec: ModelSpec, kind: str, precision: str, device: torch.device, seed: int
) -> Callable[[], Callable[[], Any]]:
    def setup() -> Callable[[], Any]:
        if kind == "hasten":
            reason = _hasten_api.compiler_unavailable()
            if reason:
                raise RuntimeError(reason)
        model = spec.build(seed).to(device)
        model.train()
        if kind == "torch.compile":
            # The wrapper users write. (In torch 2.13 in-place `Module.compile()` compiles
            # nothing on modules whose code lives in torch.nn, such as nn.Sequential.)
            model = torch.compile(model)
        elif kind == "hasten":
            model = _hasten_api.hasten_compile(model, precision=precision)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = spec.make_batch(torch.Generator().manual_seed(seed), device=device)
        autocast = precision == "bf16" and kind != "hasten"  # hasten applies its own precision

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = spec.loss(model, batch)
            loss.backward()
            opt.step()

        if kind == "hasten":  # hasten's recipe: compile the model and the optimizer update
            return _hasten_api.hasten_compile_step(step, opt)
        return step

    return setup


def candidates_for(
    spec: ModelSpec,
    precisions: Sequence[str] = ("fp32",),
    kinds: Sequence[str] = CANDIDATES,
    device: str | torch.device = "cpu",
    seed: int = 0,
) -> list[Candidate]:
    """The candidates for one model: eager fp32 always first (the baseline), then ``kinds`` at
    each precision.

    Raises:
        ValueError: for an unknown precision or candidate kind.
    """
    device = torch.device(device)
    for p in precisions:
        if p not in PRECISIONS:
            raise ValueError(f"unknown precision {p!r}; choose from {', '.join(PRECISIONS)}")
    for k in kinds:
        if k not in CANDIDATES:
            raise ValueError(f"unknown candidate {k!r}; choose from {', '.join(CANDIDATES)}")
    out = [Candidate("eager", _make_setup(spec, "eager", "fp32", device, seed), "fp32")]
    for p in precisions:
        for k in kinds:
            name = k if p == "fp32" else f"{k}-{p}"
            if name == "eager":
                continue
            info = {"kind": k, "optimizer": "AdamW(lr=1e-4)"}
            out.append(Candidate(name, _make_setup(spec, k, p, device, seed), p, info))
    return out


def _model_flops(spec: ModelSpec, device: torch.device, seed: int) -> int:
    model = spec.build(seed).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = spec.make_batch(torch.Generator().manual_seed(seed), device=device)

    def step() -> None:
        spec.loss(model, batch).backward()
        opt.step()

    return count_flops(step)


def run_compile_bench(
    models: Sequence[str],
    size: str = "small",
    precisions: Sequence[str] = ("fp32",),
    kinds: Sequence[str] = CANDIDATES,
    config: BenchConfig | None = None,
    progress: bool = False,
    on_result: Callable[[BenchResult], None] | None = None,
) -> list[BenchResult]:
    """Benchmark each model in ``models`` at ``size``; one :class:`BenchResult` per model.

    Dynamo's caches are reset between models (not between candidates: each candidate has its
    own model object, and the first-step time of each shows its compile cost).

    Raises:
        ValueError: for unknown models, sizes, precisions or candidates.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from configs; never the hub
    config = config or BenchConfig()
    device = torch.device(config.device)
    specs = [get_model_spec(m, size) for m in models]  # validate all names up front
    results = []
    for spec in specs:
        torch._dynamo.reset()
        cands = candidates_for(spec, precisions, kinds, device)
        result = run_benchmark(
            cands,
            config,
            name=f"{spec.name}-{spec.size}",
            flops_per_step=_model_flops(spec, device, 0),
            samples_per_step=spec.batch_size,
            progress=progress,
        )
        result.machine["model"] = {"name": spec.name, "size": spec.size, **spec.hparams}
        results.append(result)
        if on_result:
            on_result(result)
    return results
