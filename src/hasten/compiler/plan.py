"""The compile plan of ``regions="auto"``: compile a variant only when the run pays for it.

A compile costs seconds to minutes up front; it pays back only over enough steps. Most
fine-tunes are short, so compiling at the first call made short runs slower end to end than not
compiling at all. ``regions="auto"`` (the default) decides per region and per variant (training,
evaluation, scoring) from what it can know:

* **The run's length is known** (``steps=`` given to ``hasten.compile``, or passed by a trainer
  integration): the first calls run eagerly and are timed (each from its start to the next
  call of the same variant: forward, backward, optimizer step): at least two (four where the
  run is long enough), and more while each is still clearly faster than those before (a process's first steps carry one-off costs,
  several times a steady step's: docs/compiler.md#the-compile-plan-compiled-only-when-the-run-pays),
  up to ``steps // 20`` (at most
  10). The shortest counts. Then hasten compiles if the steps left, at the share of a step a
  compile saves, save more than the compile costs::

      steps_left * eager_step * gain  >  expected_compile

  and otherwise runs the whole run eagerly, saying so once.
* **The length is not known** (a plain loop): the ski-rental rule. The variant runs eagerly
  until the time spent in it eagerly reaches the compile's expected cost, then compiles. A run
  shorter than one compile never compiles (it stays as fast as eager); a long one loses at most
  one compile's worth of eager time, so it is within 2x of the best choice in hindsight. Rare
  variants (an evaluation every few hundred steps, the sifting scorer) count their own eager
  time, and rent at their gain: they compile once ``eager_time * gain`` reaches a compile's
  cost, the break-even point, so a run that ends there is within ``1 + gain`` of the best
  choice. Their gains measured far below training's (BERT-base's Trainer evaluation: 4 %
  faster compiled in one run, slower in the next), and compiling at the full eager time made
  that fine-tune's evaluation pay ~35 s of compiles to save ~2 s.
* **After compiling** the variant's compiled calls are timed against its eager ones; if compiled
  measures slower (a tiny model whose kernels' fixed costs exceed what fusion saves), the variant
  goes back to eager for the rest of the run, with one log line.

The expected compile cost is what the last compile of the same variant of the same region
(class, parameter shapes, settings; training and evaluation apart) took on this machine, kept in
``hasten-plan.json`` in the compile cache directory; the first time, a prior from the region's
size, ``PRIOR_S + PER_MODULE_S`` per submodule (14 s for the demo's small transformer, 44 s for
GPT-2 124M, 59 s for BERT-base, against cold compiles of 15, 54-62 and 48-55 s measured on 2
cores, the first call's check included), and ``FORWARD_ONLY_SHARE`` of that for an evaluation
variant (forward only). A region compiled
before in this cache directory finds its kernels in Inductor's cache, so only the backend's share
of that compile shrinks: the expectation is then the last compile less ``CACHED_BACKEND_SAVES``
of its backend seconds (measured on 2 cores, Intel Xeon: cold 28.2 s with 22.4 s in the backend
on BERT-base, 29.4 / 22.3 s on the Llama-style decoder, whose warm compile took 7.5 s with 1.0 s in the
backend), unless ``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` switches that cache off. The gain is the
variant's measured one from the same file, else ``PRIOR_GAIN``; a variant measured to save less
than ``MIN_GAIN`` stays eager under the ski-rental rule too. The prior is a guess: measured
against hasten's own eager step (fused AdamW), compiling saved 15 % of a GPT-2 124M step, 7 % of
BERT-base's, 17 % of the Llama-style decoder's at batch 1 x 128, and ~3 % of BERT-base's at
32 x 64 (the Trainer fine-tune, where a compile planned on 20 % did not pay back). Once compiled,
the variant's measured saving is said in one line, with whether it pays back this run.

Under ``torch.distributed`` with more than one rank, timing-based choices could differ between
ranks, so a region compiles at its first call there, as with ``regions="whole"``.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from torch import nn

__all__ = [
    "FORWARD_ONLY_SHARE",
    "MIN_GAIN",
    "PER_MODULE_S",
    "PRIOR_GAIN",
    "PRIOR_S",
    "Plan",
    "VariantPlan",
    "applies",
    "distributed_run",
    "history_key",
]

# a fit to cold compiles measured on 2 cores (AMD EPYC, 2026-12-02), the first call's check
# included: the demo's 2-layer transformer (27 modules) 15.5 s, GPT-2 124M (163) 54-62 s,
# BERT-base (233) 48-55 s; the prior is within about 25 % of each
PRIOR_S = 8.0
PER_MODULE_S = 0.22
PRIOR_GAIN = 0.2  # a compiled step 20 % shorter than eager's (1.25x): the low end measured
CACHED_BACKEND_SAVES = 0.9  # of the backend's seconds, when its kernels are cached (96-97 %
# measured: GPT-2 124M 44.6 -> 1.4 s, Llama-style 22.3 -> 1.0 s)
FORWARD_ONLY_SHARE = 0.35  # an evaluation variant's compile (forward only) against a training
# one's, before either was measured: BERT-base 17.3 of 50.3 s (0.34) on 2 Xeon cores
MIN_GAIN = 0.03  # a variant measured here to save less than this stays eager (ski-rental)
_CHECK_CALLS = 5  # compiled calls timed before comparing with eager
_TIMED_STEPS = 2  # eager steps timed, at least, before a known-length plan decides
_SETTLE_STEPS = 4  # and at least this many where the run allows (steps // 20): GPT-2 124M's
# first three steps in a new process took 2.6, 2.4, 2.4 s, the fourth 1.5 s, as later ones
_MAX_TIMED = 10  # and at most, while the step times still fall (Plan._timed_enough)
_HISTORY = "hasten-plan.json"
_LOCK = threading.Lock()


def applies(config: Any) -> bool:
    """Whether the compile plan decides when ``config``'s model compiles: ``regions="auto"`` in
    one process (under torch.distributed, ranks timing their own steps could decide differently,
    so a region compiles at its first call there, as with ``regions="whole"``)."""
    return config.regions == "auto" and not distributed_run()


def distributed_run() -> bool:
    """Whether this process is one of several ranks of an initialized process group."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@dataclass
class VariantPlan:
    """What the plan knows about one variant of one region."""

    state: str = "eager"  # "eager" (deciding), "compiled", "eager_for_good"
    calls: int = 0
    eager_s: float = 0.0  # time spent in eager calls (intervals or durations)
    eager_times: list[float] = field(default_factory=list)
    compiled_times: list[float] = field(default_factory=list)
    last_start: float | None = None
    last_was_compiled: bool = False
    last_compiled_now: bool = False
    expected_s: float = 0.0  # what compiling this variant is expected to cost
    source: str = "estimated"  # where that figure comes from
    gain: float = PRIOR_GAIN  # the share of a call compiling is expected to save
    measured_gain: bool = False  # ``gain`` was measured here before (not the prior)
    grad_steps_at_compile: int | None = None  # training calls made when it compiled


class Plan:
    """The plan of one compiled region (see the module docstring).

    Args:
        key: What identifies the region's compile across processes (class, shapes, settings).
        label: The region's name in log lines.
        prior_s: The expected compile seconds when the history knows nothing.
        steps: The run's expected number of training calls, or ``None``.
        history_dir: Where ``hasten-plan.json`` lives (the compile cache directory).
    """

    def __init__(
        self,
        key: str,
        label: str,
        prior_s: float,
        steps: int | None,
        history_dir: str | None,
    ) -> None:
        self.key = key
        self.label = label
        self.prior_s = prior_s
        self.steps = steps
        self.history_dir = history_dir
        self.history = _read_history(history_dir)
        self.variants: dict[str, VariantPlan] = {}
        self.notes: list[str] = []

    def variant(self, variant: str, grad: bool = True) -> VariantPlan:
        """The plan of one variant, made at its first call from the history of that variant
        (training and evaluation compile different graphs, at different costs and gains)."""
        v = self.variants.get(variant)
        if v is None:
            known = self.history.get(history_key(self.key, variant), {})
            prior = self.prior_s if grad else FORWARD_ONLY_SHARE * self.prior_s
            expected, source = _expected_compile(known, prior)
            v = self.variants[variant] = VariantPlan(
                expected_s=expected,
                source=source,
                gain=float(known.get("gain", PRIOR_GAIN)),
                measured_gain="gain" in known,
            )
        return v

    def compile_now(self, variant: str, grad: bool) -> bool:
        """Called at the start of each call of ``variant``: whether it runs compiled."""
        v = self.variant(variant, grad)
        now = time.perf_counter()
        if grad and v.last_start is not None:  # a training call's time: start to next start
            self._account(variant, now - v.last_start)
        v.calls += 1
        v.last_start = now if grad else None
        if v.state == "eager":
            v.state = self._decide(variant, v, grad)
            if v.state == "compiled":
                v.grad_steps_at_compile = v.calls - 1 if grad else None
        return v.state == "compiled"

    def finished(self, variant: str, grad: bool, started: float, compiled_now: bool) -> None:
        """Called after a call of ``variant``; ``compiled_now``: this call compiled."""
        v = self.variants[variant]
        v.last_was_compiled = v.state == "compiled"
        v.last_compiled_now = compiled_now
        if not grad:  # an evaluation or scoring call: its own duration is its cost
            self._account(variant, time.perf_counter() - started)

    def compiled_seconds(
        self, variant: str, seconds: float, backend_s: float | None = None
    ) -> None:
        """Learn what compiling ``variant`` took here, ``backend_s`` of it in the compiler
        backend (for the next process's plan, whose compile finds those kernels cached)."""
        v = self.variant(variant)
        v.expected_s, v.source = seconds, "measured in this run"
        values = {"compile_s": round(seconds, 3)}
        if backend_s is not None:
            values["backend_s"] = round(min(max(backend_s, 0.0), seconds), 3)
        _update_history(self.history_dir, history_key(self.key, variant), values)

    def odd_size_pays(self, variant: str, fraction: float, calls: int) -> bool:
        """Whether ``calls`` calls of another batch size (``fraction`` of a compiled call's
        work), run eagerly, have cost what compiling for that size is expected to: the
        variant's call time x ``fraction`` x its gain, summed, against its compile cost."""
        v = self.variants.get(variant)
        times = [] if v is None else v.eager_times or v.compiled_times
        if v is None or not times:
            return True
        return calls * statistics.median(times) * fraction * max(v.gain, 0.0) >= v.expected_s

    def _account(self, variant: str, seconds: float) -> None:
        v = self.variants[variant]
        if v.last_compiled_now:  # the call that compiled: its time is the compile's
            v.last_compiled_now = False
            return
        if v.last_was_compiled:
            v.compiled_times.append(seconds)
            if len(v.compiled_times) == _CHECK_CALLS and v.eager_times:
                self._compare(variant)
        else:
            v.eager_s += seconds
            v.eager_times = [*v.eager_times, seconds][-16:]

    def _decide(self, variant: str, v: VariantPlan, grad: bool) -> str:
        gain = f"~{v.gain:.0%} saved" + (" (measured here before)" if v.measured_gain else "")
        if self.steps is not None and grad:
            if not self._timed_enough(v.eager_times):
                if v.calls == 1:
                    self._note(
                        f"{self.label} ({variant}): the first steps run eagerly and are timed, to "
                        f"plan for the run's {self.steps} steps (a compile is expected to take "
                        f"~{v.expected_s:.0f} s, {v.source})"
                    )
                return "eager"
            left = max(self.steps - v.calls + 1, 0)
            step = min(v.eager_times)  # a first call's one-off costs are no step's
            saved = left * step * v.gain
            if saved > v.expected_s:
                self._note(
                    f"{self.label} ({variant}): compiling: {left} steps left x {step:.2f} s at "
                    f"{gain} is ~{saved:.0f} s, more than the ~{v.expected_s:.0f} s a compile "
                    "is expected to take"
                )
                return "compiled"
            self._note(
                f"{self.label} ({variant}): runs eagerly for this run: {left} steps left x "
                f"{step:.2f} s at {gain} would save ~{saved:.0f} s, less than the "
                f"~{v.expected_s:.0f} s a compile is expected to take (regions='whole' compiles "
                "anyway)"
            )
            return "eager_for_good"
        if v.measured_gain and v.gain < MIN_GAIN:
            self._note(
                f"{self.label} ({variant}): runs eagerly: compiled, it measured "
                f"{'no faster' if v.gain <= 0 else f'only {v.gain:.0%} faster'} than eager here "
                "before (regions='whole' compiles anyway)"
            )
            return "eager_for_good"
        # training rents at its full eager time, evaluation and scoring at their gain
        rent = v.eager_s if grad else v.eager_s * v.gain
        if rent >= v.expected_s:
            spent = f"{v.eager_s:.1f} s spent eagerly in {v.calls - 1} calls"
            self._note(
                f"{self.label} ({variant}): compiling now: "
                + (
                    f"{spent} reached"
                    if grad
                    else f"{spent} at {gain} would have saved ~{rent:.1f} s,"
                )
                + f" the ~{v.expected_s:.0f} s a compile is expected to take"
            )
            return "compiled"
        if v.calls == 1:
            until = (
                "spent that long eagerly"
                if grad
                else f"spent ~{v.expected_s / max(v.gain, 1e-9):.0f} s eagerly (at {gain}, "
                "what compiling would have saved by then pays for it)"
            )
            self._note(
                f"{self.label} ({variant}): starts eagerly: a compile is expected to take "
                f"~{v.expected_s:.0f} s ({v.source}), so it compiles once this variant has "
                f"{until} (hasten.compile(model, steps=N) plans for a known run "
                "length; regions='whole' compiles at once)"
            )
        return "eager"

    def _timed_enough(self, times: list[float]) -> bool:
        """Whether the eager steps timed so far tell what a step costs.

        A process's first steps carry one-off costs (lazy imports, the optimizer's state,
        allocator growth, under load more so), falling over several steps (a case in
        docs/compiler.md#the-compile-plan-compiled-only-when-the-run-pays). So timing goes on
        while each step is still clearly (10 %) faster than every one before it, from
        ``min(steps // 20, 4)`` to ``steps // 20`` timed steps (2 to 10): a few more eager steps cost nothing next to a
        compile chosen on a step time several times too long.
        """
        cap = max(_TIMED_STEPS, min(_MAX_TIMED, (self.steps or 0) // 20))
        if len(times) < min(cap, _SETTLE_STEPS):
            return False
        return len(times) >= cap or times[-1] >= 0.9 * min(times[:-1])

    def _compare(self, variant: str) -> None:
        v = self.variants[variant]
        # The eager reference is the median of the faster half of the eager calls: the first
        # ones carry one-off costs (a new process's lazy work, 2x a steady step measured on
        # GPT-2 124M), and a gain learned against them would make the next process's plan
        # compile runs the compile cannot pay back.
        fast = sorted(v.eager_times)[: max(1, (len(v.eager_times) + 1) // 2)]
        eager = statistics.median(fast)
        compiled = statistics.median(v.compiled_times)
        gain = 1.0 - compiled / eager if eager > 0 else 0.0
        _update_history(
            self.history_dir, history_key(self.key, variant), {"gain": round(max(gain, 0.0), 3)}
        )
        measured = (
            f"{compiled * 1e3:.1f} vs {eager * 1e3:.1f} ms eagerly, medians; the next run in "
            "this cache plans with that"
        )
        if compiled >= eager:
            v.state = "eager_for_good"
            self._note(
                f"{self.label} ({variant}): the compiled call measured slower than eager "
                f"({measured}), so it runs eagerly from now on"
            )
            return
        line = f"{self.label} ({variant}): compiled, a call takes {gain:.0%} less ({measured})"
        if self.steps is not None and v.grad_steps_at_compile is not None:
            left = max(self.steps - v.grad_steps_at_compile, 0)
            saved = left * (eager - compiled)
            line += f": ~{saved:.0f} s saved over the {left} steps compiled, " + (
                f"more than the {v.expected_s:.0f} s the compile took"
                if saved > v.expected_s
                else f"less than the {v.expected_s:.0f} s the compile took (the plan "
                f"expected ~{v.gain:.0%} saved; this compile did not pay back in this run)"
            )
        self._note(line)

    def _note(self, text: str) -> None:
        from hasten.compiler.report import log_line

        self.notes.append(text)
        log_line("hasten: " + text)


def plan_key(module: nn.Module, config: Any) -> str:
    """What identifies a region's compile: class, parameter shapes and dtypes, the settings."""
    params = [(n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters()]
    settings = (
        config.mode,
        config.precision,
        sorted(config.passes.items()),
        sorted((k, repr(v)) for k, v in config.inductor_options.items()),
        config.dynamic,
    )
    text = repr((type(module).__qualname__, params, settings))
    return f"{type(module).__name__}-{hashlib.sha1(text.encode()).hexdigest()[:16]}"


def history_key(key: str, variant: str) -> str:
    """A variant's entry in ``hasten-plan.json``: each variant compiles its own graph, at its
    own cost and gain (BERT-base: training 50.3 s at ~3 % saved, evaluation 17.3 s and slower
    compiled; one shared entry let the evaluation's figures replace the training's)."""
    return f"{key}/{variant}"


def prior_seconds(module: nn.Module) -> float:
    """The expected compile seconds of ``module`` when nothing was measured."""
    return PRIOR_S + PER_MODULE_S * sum(1 for _ in module.modules())


def _expected_compile(known: dict[str, float], prior_s: float) -> tuple[float, str]:
    """The expected compile seconds from the history's entry, and where that figure comes from."""
    if "compile_s" not in known:
        return prior_s, "estimated"
    seconds = float(known["compile_s"])
    backend = known.get("backend_s")
    if backend is None or os.environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE") == "0":
        return seconds, "measured here before"
    cached = seconds - CACHED_BACKEND_SAVES * float(backend)
    return cached, f"{seconds:.0f} s measured here before, less its kernels now cached"


def _read_history(folder: str | None) -> dict[str, dict[str, float]]:
    if folder is None:
        return {}
    try:
        with open(os.path.join(folder, _HISTORY)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _update_history(folder: str | None, key: str, values: dict[str, float]) -> None:
    if folder is None:
        return
    with _LOCK:
        data = _read_history(folder)
        entry = data.get(key) if isinstance(data.get(key), dict) else {}
        data[key] = {**entry, **values}
        path = os.path.join(folder, _HISTORY)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            os.makedirs(folder, exist_ok=True)
            with open(tmp, "w") as f:
                json.dump(data, f)
            os.replace(tmp, path)
        except OSError:  # a read-only cache: the plan falls back to its prior next time
            pass
