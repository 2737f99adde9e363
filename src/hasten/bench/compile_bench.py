"""Eager vs ``torch.compile`` vs ``hasten.compile``, side by side: ``hasten bench compile``.

For every model (built from its config with random weights, see :mod:`hasten.bench.models`) one
:func:`~hasten.bench.harness.run_benchmark` interleaves the candidates in one process. Each
candidate's name says exactly what runs:

===============================  ===============================================================
candidate                        what runs
===============================  ===============================================================
eager                            the model as is, ``torch.optim.AdamW`` with its defaults (on CPU
                                 the for-loop implementation) — the baseline
torch.compile                    ``torch.compile(model)`` (Inductor, default mode), default AdamW
torch.compile+fused-AdamW        the same, with ``AdamW(fused=True)``
torch.compile-regional           PyTorch's regional recipe: ``block.compile()`` on every block of
                                 the model's repeated stack (the largest ``nn.ModuleList`` of
                                 one class); the rest eager; ``config.use_cache = False`` (else
                                 each decoder block recompiles); default AdamW
hasten.compile                   the two lines: ``hasten.compile(model)``, AdamW made with its
                                 defaults, which hasten switches to the fused kernel before its
                                 first step (``CompileConfig.fused_optimizer``; results recorded
                                 before that ran the for-loop AdamW)
hasten.compile+compile_step      ``hasten.compile(model)`` and ``hasten.compile_step`` around the
                                 step (the fused AdamW kernel)
hasten.compile-blocks            ``hasten.compile(model, regions="blocks")``: each repeated block
                                 compiled once and shared, the rest eager;
                                 ``config.use_cache = False`` as for the regional recipe; AdamW
                                 made with its defaults, fused by hasten as above
===============================  ===============================================================

The candidates share one process, and hasten's default malloc setting for large models
(``reuse_host_memory``) is process-wide, so here it is off for hasten too: eager and
``torch.compile`` run with malloc as the user has it, and hasten's figures leave out what the
setting adds (``benchmarks/host_memory.py`` measures that, one process per figure).

At ``bf16`` each name gets a ``-bf16`` suffix: eager and ``torch.compile`` run under
``torch.autocast(dtype=torch.bfloat16)``, hasten with ``precision="bf16"``. hasten runs with its
defaults (``regions="auto"``: the whole model, one region).

Every candidate trains with AdamW (lr 1e-4) on one fixed batch; a step is forward, backward and
the optimizer update. Model FLOPs are counted once, on the eager model.

With ``first_calls=True`` every candidate's first call (its first whole training step, compile
included) is also timed in processes of its own (:mod:`hasten.bench.first_call`): *cold* with a
fresh, empty Inductor cache, then *warm* in a second process reusing the cache the cold one
filled. The interleaved steady-state rounds then run with those caches merged, so the benchmark
process does not compile everything a third time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from hasten.bench import _hasten_api
from hasten.bench.harness import BenchConfig, BenchResult, Candidate, count_flops, run_benchmark
from hasten.bench.models import ModelSpec, get_model_spec

__all__ = [
    "CANDIDATES",
    "DEFAULT_CANDIDATES",
    "PRECISIONS",
    "candidates_for",
    "repeated_blocks",
    "run_compile_bench",
]

PRECISIONS = ("fp32", "bf16")
CANDIDATES = (
    "eager",
    "torch.compile",
    "torch.compile+fused-AdamW",
    "torch.compile-regional",
    "hasten.compile",
    "hasten.compile+compile_step",
    "hasten.compile-blocks",
)
DEFAULT_CANDIDATES = ("eager", "torch.compile", "hasten.compile", "hasten.compile+compile_step")
_OPTIMIZERS = {  # recorded with each result; the others use AdamW's defaults
    "torch.compile+fused-AdamW": "AdamW(lr=1e-4, fused=True)",
    "hasten.compile+compile_step": "AdamW(lr=1e-4), fused by compile_step",
    "hasten.compile": "AdamW(lr=1e-4), fused by hasten.compile (fused_optimizer=True)",
    "hasten.compile-blocks": "AdamW(lr=1e-4), fused by hasten.compile (fused_optimizer=True)",
}


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The blocks of ``model``'s repeated stack: the ``nn.ModuleList`` (or ``nn.Sequential``) of
    at least two children of one class with the most parameters; ``[]`` if there is none."""
    best: list[nn.Module] = []
    best_params = -1
    for module in model.modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        n = sum(p.numel() for p in module.parameters())
        if n > best_params:
            best, best_params = children, n
    return best


def _compile_regions(model: nn.Module) -> nn.Module:
    blocks = repeated_blocks(model)
    if not blocks:
        raise RuntimeError(
            f"torch.compile-regional: {type(model).__name__} has no repeated stack of blocks "
            "(an nn.ModuleList of one class) to compile"
        )
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False):
        # Transformers' decoder blocks otherwise update a KV cache keyed by their layer index, so
        # each block fails the previous one's guards: a recompile per block until Dynamo's limit
        # (8) runs the rest eagerly. A user following the recipe turns the cache off for
        # training; the whole-model candidates trace the cache update inside their one graph.
        config.use_cache = False
    for block in blocks:
        block.compile()  # PyTorch's recipe: in place, one compiled code shared by the stack
    return model


def _make_setup(
    spec: ModelSpec, kind: str, precision: str, device: torch.device, seed: int
) -> Callable[[], Callable[[], Any]]:
    def setup() -> Callable[[], Any]:
        hasten = kind.startswith("hasten")
        if hasten:
            reason = _hasten_api.compiler_unavailable()
            if reason:
                raise RuntimeError(reason)
        model = spec.build(seed).to(device)
        model.train()
        if kind in ("torch.compile", "torch.compile+fused-AdamW"):
            # The wrapper users write. (In torch 2.13 in-place `Module.compile()` compiles
            # nothing on modules whose code lives in torch.nn, such as nn.Sequential.)
            model = torch.compile(model)
        elif kind == "torch.compile-regional":
            model = _compile_regions(model)
        elif kind == "hasten.compile-blocks":
            config = getattr(model, "config", None)
            if getattr(config, "use_cache", False):
                config.use_cache = False  # as the regional recipe (and hasten's note) asks
            model = _hasten_api.hasten_compile(
                model, precision=precision, regions="blocks", reuse_host_memory=False
            )
        elif hasten:
            # steady-state figures: compiled at the first call (what the default plan compiles
            # once the run pays for it); the whole-run record times the default plan itself
            model = _hasten_api.hasten_compile(
                model, precision=precision, regions="whole", reuse_host_memory=False
            )
        fused = kind == "torch.compile+fused-AdamW"
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if fused else None)
        batch = spec.make_batch(torch.Generator().manual_seed(seed), device=device)
        autocast = precision == "bf16" and not hasten  # hasten applies its own precision

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss = spec.loss(model, batch)
            loss.backward()
            opt.step()

        if kind == "hasten.compile+compile_step":  # compile the optimizer update too
            return _hasten_api.hasten_compile_step(step, opt)
        return step

    return setup


def candidates_for(
    spec: ModelSpec,
    precisions: Sequence[str] = ("fp32",),
    kinds: Sequence[str] = DEFAULT_CANDIDATES,
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
    eager_info = {"kind": "eager", "optimizer": "AdamW(lr=1e-4)"}
    out = [Candidate("eager", _make_setup(spec, "eager", "fp32", device, seed), "fp32", eager_info)]
    for p in precisions:
        for k in kinds:
            name = k if p == "fp32" else f"{k}-{p}"
            if name == "eager":
                continue
            info = {"kind": k, "optimizer": _OPTIMIZERS.get(k, "AdamW(lr=1e-4)")}
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


def _child_first_call(
    spec: ModelSpec, cand: Candidate, cache: Path, device: torch.device, threads: int | None
) -> dict[str, Any]:
    """Run :mod:`hasten.bench.first_call` for ``cand`` in a new process using Inductor ``cache``."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), HF_HUB_OFFLINE="1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    cmd = [
        sys.executable,
        "-m",
        "hasten.bench.first_call",
        "--model",
        spec.name,
        "--size",
        spec.size,
        "--candidate",
        cand.name,
        "--precision",
        cand.precision,
        "--device",
        str(device),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"first-call process exited {proc.returncode}: {' | '.join(tail)}"}
    return json.loads(lines[-1])


@contextlib.contextmanager
def _first_calls(
    spec: ModelSpec,
    cands: Sequence[Candidate],
    device: torch.device,
    threads: int | None,
    progress: bool,
) -> Iterator[tuple[dict[str, dict[str, Any]], str]]:
    """Cold then warm first call of every candidate, each in its own process; yields the
    timings by candidate and an Inductor cache holding everything they compiled."""
    root = Path(tempfile.mkdtemp(prefix="hasten-first-calls-"))
    timings: dict[str, dict[str, Any]] = {}
    try:
        merged = root / "merged"
        for i, cand in enumerate(cands):
            cache = root / f"c{i}"  # fresh and empty: the cold call compiles from scratch
            cold = _child_first_call(spec, cand, cache, device, threads)
            warm = _child_first_call(spec, cand, cache, device, threads)
            timings[cand.name] = {"cold": cold, "warm": warm}
            if progress:
                print(
                    f"{spec.name}-{spec.size} {cand.name}: first call cold "
                    f"{cold.get('first_call_s')} s, warm {warm.get('first_call_s')} s",
                    file=sys.stderr,
                    flush=True,
                )
            if cache.exists():
                shutil.copytree(cache, merged, dirs_exist_ok=True)
        merged.mkdir(exist_ok=True)
        yield timings, str(merged)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_compile_bench(
    models: Sequence[str],
    size: str = "small",
    precisions: Sequence[str] = ("fp32",),
    kinds: Sequence[str] = DEFAULT_CANDIDATES,
    config: BenchConfig | None = None,
    progress: bool = False,
    on_result: Callable[[BenchResult], None] | None = None,
    first_calls: bool = False,
) -> list[BenchResult]:
    """Benchmark each model in ``models`` at ``size``; one :class:`BenchResult` per model.

    Dynamo's caches are reset between models (not between candidates: each candidate has its
    own model object, and the first-step time of each shows its compile cost). With
    ``first_calls``, each candidate's cold and warm first call is timed in processes of its own
    first (see the module docstring) and recorded in its ``info["first_call"]``.

    Raises:
        ValueError: for unknown models, sizes, precisions or candidates.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from configs; never the hub
    config = config or BenchConfig()
    device = torch.device(config.device)
    specs = [get_model_spec(m, size) for m in models]  # validate all names up front
    results = []
    for spec in specs:
        torch.compiler.reset()
        cands = candidates_for(spec, precisions, kinds, device)
        with contextlib.ExitStack() as stack:
            timings: dict[str, dict[str, Any]] = {}
            if first_calls:
                timings, merged = stack.enter_context(
                    _first_calls(spec, cands, device, config.threads, progress)
                )
                stack.enter_context(_hasten_api.temporary_cache_dir(merged))
            result = run_benchmark(
                cands,
                config,
                name=f"{spec.name}-{spec.size}",
                flops_per_step=_model_flops(spec, device, 0),
                samples_per_step=spec.batch_size,
                progress=progress,
            )
        for c in result.candidates:
            if c.name in timings:
                c.info["first_call"] = timings[c.name]
        result.machine["model"] = {"name": spec.name, "size": spec.size, **spec.hparams}
        results.append(result)
        if on_result:
            on_result(result)
    return results
