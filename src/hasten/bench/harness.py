"""The one timing harness behind every hasten benchmark.

How a comparison runs (:func:`run_benchmark`)::

    for each candidate:                       # set-up, apart from the timed steps
        step = candidate.setup()              #   build model + optimizer (+ compile lazily)
        time step() once                      #   first step: includes any compilation
        run warmup - 1 more steps             #   caches, allocator and autotuning settle
    for round in range(rounds):               # interleaved: drift hits every candidate alike
        for candidate in rotated(order, round):
            time steps_per_round steps, one at a time, device synchronised around each
    for each candidate:
        one more step under the memory meter  # peak memory the step allocates
    summarise: median and p20/p80 step time, speedup as the median of per-round ratios,
               model FLOPs per step / matmul peak measured in this run

A step is a whole training step — forward, backward and the optimizer update — so what is timed is
what a user waits for. Compile time is reported apart (``first_step_s`` and ``compile_s``), never
mixed into the steady-state step time.

Example::

    from hasten.bench.harness import BenchConfig, Candidate, run_benchmark

    def eager():
        model = ...; opt = ...
        def step():
            opt.zero_grad(set_to_none=True)
            loss_fn(model, batch).backward()
            opt.step()
        return step

    result = run_benchmark([Candidate("eager", eager)], BenchConfig(rounds=5))
    print(result.candidates[0].step_s.median)
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from hasten.bench.machine import machine_stamp, torch_threads
from hasten.bench.stats import Summary, summarize

__all__ = [
    "BenchConfig",
    "BenchResult",
    "Candidate",
    "CandidateResult",
    "count_flops",
    "measure_matmul_peak",
    "peak_step_memory",
    "rotated",
    "run_benchmark",
    "synchronize",
]

Step = Callable[[], Any]


def synchronize(device: torch.device | str) -> None:
    """Wait for queued device work to finish (a no-op on CPU, where work runs eagerly)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # intended host sync: timing boundary


def count_flops(fn: Callable[[], Any]) -> int:
    """Floating-point operations of one call of ``fn``, counted by ``torch.utils.flop_counter``.

    The counter sees matmuls, convolutions and attention (forward and backward) — the "model
    FLOPs" convention: elementwise ops and the optimizer update are not counted. Run it on an
    eager model; the count is the same for every compiled variant of it.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return int(counter.get_total_flops())


def measure_matmul_peak(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    n: int | None = None,
    repeats: int = 5,
) -> float:
    """Achieved FLOP/s of the fastest of ``repeats`` square ``n×n`` matmuls on ``device``.

    A practical ceiling for dense compute on this machine, measured in the same process as the
    benchmark so that the fraction ``achieved / peak`` is comparable across machines.

    Args:
        device: Where to run.
        dtype: Element type (``torch.bfloat16`` measures the bf16 ceiling).
        n: Matrix size; defaults to 2048 on CPU and 8192 on GPU.
        repeats: Timed repetitions after one warm-up; the best is kept.

    Raises:
        ValueError: for ``n < 1`` or ``repeats < 1``.
    """
    device = torch.device(device)
    n = n if n is not None else (8192 if device.type == "cuda" else 2048)
    if n < 1 or repeats < 1:
        raise ValueError(f"need n >= 1 and repeats >= 1, got n={n}, repeats={repeats}")
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    torch.mm(a, b)
    synchronize(device)
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def peak_step_memory(step: Step, device: torch.device | str = "cpu") -> tuple[int, str]:
    """Peak bytes that one call of ``step`` allocates above what was allocated when it started.

    GPU: ``torch.cuda.max_memory_allocated`` minus the allocation at the start. CPU: torch's CPU
    allocator reports every allocation and free to the profiler; the running sum of those made
    during the step gives its peak (tensors alive before the step — parameters, optimizer state —
    are not counted, as on GPU). Neither counts memory outside torch's allocators.

    Returns:
        ``(bytes, method)`` where ``method`` names how it was measured.
    """
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        step()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start, "cuda.max_memory_allocated"
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    cpu = torch.autograd.DeviceType.CPU
    events = sorted(
        (e.start_ns(), e.nbytes())
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]" and e.device_type() == cpu
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak, "profiler CPU allocator events"


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence the profiler's C++ start/stop chatter on file descriptor 2 (not Python's)."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (for example under capture)
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def rotated(items: Sequence[Any], k: int) -> list[Any]:
    """``items`` rotated left by ``k`` (so each item leads the order equally often over rounds)."""
    if not items:
        return []
    k %= len(items)
    return list(items[k:]) + list(items[:k])


@dataclass(frozen=True)
class Candidate:
    """One variant in a side-by-side comparison.

    Attributes:
        name: Label in tables and result files.
        setup: Builds everything the variant needs (model, optimizer, batch; compile lazily) and
            returns the step function: one full training step, forward + backward + optimizer.
        precision: Compute precision of the variant ("fp32", "bf16"): picks the matmul peak its
            achieved FLOP/s is compared with.
        info: Anything worth recording with the result (config, options).
    """

    name: str
    setup: Callable[[], Step]
    precision: str = "fp32"
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BenchConfig:
    """How long and how carefully to measure.

    Attributes:
        warmup: Untimed steps per candidate before the rounds, the first included (≥ 1).
        rounds: Interleaved rounds (≥ 1); every candidate runs once per round.
        steps_per_round: Timed steps per candidate per round (≥ 1).
        device: Where the steps run; the harness synchronises it around every timed step.
        measure_memory: Measure peak step memory (one extra step per candidate).
        matmul_n: Matrix size for the matmul peak (``None``: 2048 CPU, 8192 GPU; 0 skips it).
        threads: torch CPU threads while measuring (``None``: torch's setting), restored after.
    """

    warmup: int = 3
    rounds: int = 5
    steps_per_round: int = 5
    device: str = "cpu"
    measure_memory: bool = True
    matmul_n: int | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"BenchConfig.threads must be >= 1 or None, got {self.threads}")
        for name in ("warmup", "rounds", "steps_per_round"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"BenchConfig.{name} must be an integer >= 1, got {value!r}")
        if self.matmul_n is not None and self.matmul_n < 0:
            raise ValueError(f"BenchConfig.matmul_n must be >= 0 or None, got {self.matmul_n}")
        if torch.device(self.device).type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"BenchConfig.device={self.device!r} but CUDA is not available; use device='cpu'"
            )


@dataclass
class CandidateResult:
    """Measurements of one candidate. Times are seconds; ``None`` where not measured."""

    name: str
    precision: str
    info: dict[str, Any]
    setup_s: float | None = None
    first_step_s: float | None = None
    step_times: list[float] = field(default_factory=list)
    round_means: list[float] = field(default_factory=list)
    peak_mem_bytes: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.step_times)

    @property
    def step_s(self) -> Summary | None:
        return summarize(self.step_times) if self.step_times else None

    @property
    def compile_s(self) -> float | None:
        """First step minus a steady step: the one-off cost of compiling (≈ 0 for eager)."""
        if self.first_step_s is None or not self.step_times:
            return None
        return max(0.0, self.first_step_s - summarize(self.step_times).median)


@dataclass
class BenchResult:
    """A finished comparison, with the machine it ran on.

    Attributes:
        name: What was compared (for example ``"gpt2-small fp32"``).
        config: The :class:`BenchConfig` used.
        candidates: One result per candidate, in the order given.
        flops_per_step: Model FLOPs of one training step (``None`` if not counted).
        samples_per_step: Samples (or sequences) per step, for throughput.
        matmul_peak: Measured matmul FLOP/s by precision.
        machine: :func:`~hasten.bench.machine.machine_stamp` of this run.
    """

    name: str
    config: BenchConfig
    candidates: list[CandidateResult]
    flops_per_step: int | None
    samples_per_step: int | None
    matmul_peak: dict[str, float]
    machine: dict[str, Any]

    def get(self, name: str) -> CandidateResult:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(f"no candidate named {name!r}; have {[c.name for c in self.candidates]}")

    def speedup(self, name: str, baseline: str) -> Summary | None:
        """Per-round ratios ``baseline time / candidate time`` (paired, so drift cancels)."""
        a, b = self.get(baseline), self.get(name)
        if not (a.ok and b.ok):
            return None
        return summarize([x / y for x, y in zip(a.round_means, b.round_means)])

    def achieved_flops(self, name: str) -> float | None:
        c = self.get(name)
        if not c.ok or not self.flops_per_step:
            return None
        return self.flops_per_step / c.step_s.median  # type: ignore[union-attr]

    def peak_fraction(self, name: str) -> float | None:
        """Achieved model FLOP/s as a fraction of the matmul peak of the candidate's precision."""
        achieved = self.achieved_flops(name)
        peak = self.matmul_peak.get(self.get(name).precision)
        if achieved is None or not peak:
            return None
        return achieved / peak

    def to_dict(self, baseline: str | None = None) -> dict[str, Any]:
        """JSON-ready dict: every raw sample plus the summaries quoted in tables."""
        out = []
        for c in self.candidates:
            step = c.step_s
            speed = self.speedup(c.name, baseline) if baseline else None
            out.append(
                {
                    "name": c.name,
                    "precision": c.precision,
                    "info": c.info,
                    "error": c.error,
                    "setup_s": c.setup_s,
                    "first_step_s": c.first_step_s,
                    "compile_s": c.compile_s,
                    "step_s": step.to_dict() if step else None,
                    "samples_per_s": (
                        self.samples_per_step / step.median
                        if step and self.samples_per_step
                        else None
                    ),
                    "speedup_vs_" + (baseline or "baseline"): speed.to_dict() if speed else None,
                    "achieved_flops_per_s": self.achieved_flops(c.name),
                    "fraction_of_matmul_peak": self.peak_fraction(c.name),
                    "peak_mem_bytes": c.peak_mem_bytes,
                    "step_times": c.step_times,
                    "round_means": c.round_means,
                }
            )
        return {
            "name": self.name,
            "config": self.config.__dict__,
            "baseline": baseline,
            "flops_per_step": self.flops_per_step,
            "samples_per_step": self.samples_per_step,
            "matmul_peak_flops_per_s": self.matmul_peak,
            "memory_method": (
                "cuda.max_memory_allocated"
                if torch.device(self.config.device).type == "cuda"
                else "profiler CPU allocator events"
            ),
            "candidates": out,
            "machine": self.machine,
        }


_PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) < 2000 else text[:2000] + " …"


def run_benchmark(
    candidates: Sequence[Candidate],
    config: BenchConfig | None = None,
    *,
    name: str = "benchmark",
    flops_per_step: int | None = None,
    samples_per_step: int | None = None,
    progress: bool = False,
) -> BenchResult:
    """Measure ``candidates`` side by side (see the module docstring for the protocol).

    A candidate whose set-up or step raises is recorded with its error and left out of the later
    rounds; the others carry on.

    Args:
        candidates: The variants, with unique names.
        config: Measurement settings (defaults: 3 warm-up steps, 5 rounds of 5 steps, CPU).
        name: Label of the comparison.
        flops_per_step: Model FLOPs of one step (see :func:`count_flops`), for achieved FLOP/s.
        samples_per_step: Samples per step, for throughput.
        progress: Show a progress bar on stderr.

    Raises:
        ValueError: for no candidates or duplicate names.
    """
    config = config or BenchConfig()
    if not candidates:
        raise ValueError("run_benchmark needs at least one Candidate")
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"candidate names must be unique, got {names}")
    with torch_threads(config.threads):
        return _run(candidates, config, name, flops_per_step, samples_per_step, progress)


def _run(
    candidates: Sequence[Candidate],
    config: BenchConfig,
    name: str,
    flops_per_step: int | None,
    samples_per_step: int | None,
    progress: bool,
) -> BenchResult:
    device = torch.device(config.device)
    stamp = machine_stamp()
    results = [CandidateResult(c.name, c.precision, dict(c.info)) for c in candidates]
    steps: dict[str, Step] = {}

    from tqdm.auto import tqdm

    total = len(candidates) * (config.rounds + 1 + int(config.measure_memory))
    bar = tqdm(total=total, desc=name, disable=not progress, leave=False)

    def guarded(res: CandidateResult, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as err:  # a failing variant is a result, not the end of the run
            res.error = _describe(err)
            steps.pop(res.name, None)
            return None

    for cand, res in zip(candidates, results):
        bar.set_postfix_str(f"{cand.name}: set-up and first step")
        t0 = time.perf_counter()
        step = guarded(res, cand.setup)
        res.setup_s = time.perf_counter() - t0
        if step is not None:
            steps[cand.name] = step
            synchronize(device)
            t0 = time.perf_counter()
            guarded(res, step)
            synchronize(device)
            res.first_step_s = time.perf_counter() - t0
            for _ in range(config.warmup - 1):
                if guarded(res, step) is None and res.error:
                    break
            synchronize(device)
        bar.update(1)

    for r in range(config.rounds):
        for cand, res in rotated(list(zip(candidates, results)), r):
            step = steps.get(cand.name)
            if step is None:
                bar.update(1)
                continue
            bar.set_postfix_str(f"round {r + 1}/{config.rounds}: {cand.name}")
            times = []
            for _ in range(config.steps_per_round):
                synchronize(device)
                t0 = time.perf_counter()
                if guarded(res, step) is None and res.error:
                    break
                synchronize(device)
                times.append(time.perf_counter() - t0)
            if res.error is None:
                res.step_times.extend(times)
                res.round_means.append(sum(times) / len(times))
            bar.update(1)

    if config.measure_memory:
        for cand, res in zip(candidates, results):
            step = steps.get(cand.name)
            if step is not None:
                bar.set_postfix_str(f"memory: {cand.name}")
                measured = guarded(res, lambda s=step: peak_step_memory(s, device))
                if measured is not None:
                    res.peak_mem_bytes = measured[0]
            bar.update(1)
    bar.close()

    peaks: dict[str, float] = {}
    if config.matmul_n != 0:
        for precision in sorted({c.precision for c in candidates}):
            dtype = _PEAK_DTYPES.get(precision)
            if dtype is not None:
                peaks[precision] = measure_matmul_peak(device, dtype, config.matmul_n)
    return BenchResult(name, config, results, flops_per_step, samples_per_step, peaks, stamp)
