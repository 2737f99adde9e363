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
* **Eager, blocks or whole**: where the region has repeated blocks (``regions.repeated_blocks``:
  a transformer's layers; not under FSDP2, and not while a Transformers model builds a training
  KV cache, which would recompile a shared block per layer), the training variant's
  known-length decision is three-way, by the expected total time of the steps left::

      eager   steps_left * step
      blocks  BLOCKS_COMPILE_SHARE * compile + steps_left * step * (1 - BLOCKS_GAIN_SHARE * gain)
      whole   compile + steps_left * step * (1 - gain)

  the cheapest wins (a tie goes to the cheaper start), in one log line with the three totals.
  Block mode's cold compile measured 0.35-0.36 of the whole model's and its saving 0.3-1.4x of
  the whole model's, ~0.57 in the middle (the constants say where), so with ``N*`` whole's
  break-even it wins medium runs: about 0.72 ``N*`` to 1.28 ``N*`` steps with these priors (the
  lower bound is ``BLOCKS_COMPILE_SHARE / BLOCKS_GAIN_SHARE``, the upper one
  ``(1 - BLOCKS_COMPILE_SHARE) / (1 - BLOCKS_GAIN_SHARE)``). Choosing blocks installs
  the block regions (as ``regions="blocks"`` does, glue eager) and the region then runs eagerly
  for good, calling them; its plan goes on timing the steps (a few eager ones after the
  compiled ones, as the settled reference), so blocks measured slower go back to eager, and
  blocks measured far below their prior swap to the whole region when its compile plus the
  steps left at its gain now costs less than those steps as measured (``Plan._swap_to_whole``:
  the blocks' compile is spent either way; the block regions are taken off and the whole
  region compiles at the next call). By the priors that happens in the upper part of the
  blocks' window, ``C < steps_left * step * gain < 1.28 C``, where blocks saved next to
  nothing. The other variants (evaluation, scoring) then compile by block too, but only by
  the plan's rule (ski-rental at their gain, scaled the same way), never because of the switch.
  The blocks' compile and gain measured here are kept apart from the whole region's; blocks
  are no choice when the whole region's kernels are cached here (a warm whole compile, 6.5 s
  on GPT-2 124M, costs less than a cold block compile, 10.5 s, and saves at least as much).
* **The length is not known** (a plain loop): the ski-rental rule. The variant runs eagerly
  until the time spent in it eagerly reaches the compile's expected cost, then compiles. A run
  shorter than one compile never compiles (it stays as fast as eager); a long one loses at most
  one compile's worth of eager time, so it is within 2x of the best choice in hindsight. This
  path chooses between eager and whole only: a run whose length is unknown cannot tell a medium
  run, where blocks pay, from a long one, where block mode's slower step (GPT-2 124M: 2032 against
  1841 ms) costs more than its cheaper compile saved, and rent-then-blocks-then-whole would pay
  two compiles on every long run. Rare
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
size: ``PRIOR_S + PER_MODULE_S`` per submodule, and on a CPU, once an eager training step was
profiled (as for the gain, below), ``PROFILED_PRIOR_S + PER_BACKWARD_NODE_S`` per node of its
backward graph instead, which follows the traced graph more closely (within 25 % against 37 %
of cold compiles measured on 2 cores, 8-33 s, the first call's check included: GPT-2, BERT,
RoBERTa and the Llama-style decoder at three sizes each; BERT's many wrapper modules add no
graph), and ``FORWARD_ONLY_SHARE`` of that for an evaluation variant (forward only). A region
compiled before in this cache directory finds its kernels in Inductor's cache, so only the
backend's share of that compile shrinks: the expectation is then the last compile less ``CACHED_BACKEND_SAVES``
of its backend seconds (measured on 2 cores, Intel Xeon: cold 28.2 s with 22.4 s in the backend
on BERT-base, 29.4 / 22.3 s on the Llama-style decoder, whose warm compile took 7.5 s with 1.0 s in the
backend), unless ``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` switches that cache off. The gain is the
variant's measured one from the same file, else ``PRIOR_GAIN`` (an evaluation variant: the
training variant's, once that is estimated or measured); a variant measured to save less
than ``MIN_GAIN`` stays eager under the ski-rental rule too. The prior is a guess: measured
against hasten's own eager step (fused AdamW), compiling saved 15 % of a GPT-2 124M step, 7 % of
BERT-base's, 17 % of the Llama-style decoder's at batch 1 x 128, and ~3 % of BERT-base's at
32 x 64 (the Trainer fine-tune, where a compile planned on 20 % did not pay back). Once compiled,
the variant's measured saving is said in one line, with whether it pays back this run.

Under ``torch.distributed`` with more than one rank, timing-based choices could differ between
ranks, so a region compiles at its first call there, as with ``regions="whole"``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch
from torch import nn

__all__ = [
    "BLOCKS_COMPILE_SHARE",
    "BLOCKS_GAIN_SHARE",
    "BLOCKS_MIN_S",
    "FORWARD_ONLY_SHARE",
    "GAIN_PER_FUSABLE_SHARE",
    "MAX_ESTIMATED_GAIN",
    "MIN_ESTIMATED_GAIN",
    "MIN_GAIN",
    "PER_BACKWARD_NODE_S",
    "PER_MODULE_S",
    "PRIOR_GAIN",
    "PRIOR_S",
    "PRIOR_SPREAD",
    "PROFILED_PRIOR_S",
    "BlockPlan",
    "BlockSwitch",
    "Plan",
    "VariantPlan",
    "applies",
    "distributed_run",
    "estimated_gain",
    "fusable_share",
    "history_key",
]

# The expected compile seconds before anything was compiled here. A fit to cold compiles of
# the benchmark models (GPT-2, BERT, RoBERTa, Llama-style, each tiny / small / base: 8-33 s),
# fp32, the first call's check included, 2-core AMD EPYC, 2026-12-05
# (benchmarks/results/plan-compile-prior.json). From the module count alone: within 37 % of
# each, 15 % on average (the fit before, 8 s + 0.22 s a module from 2026-12-02, read 33-143 %
# high there: BERT's wrapper modules count without adding graph, and today's compiles are
# faster)...
PRIOR_S = 4.5
PER_MODULE_S = 0.10
# ...and, once an eager training step was profiled (on a CPU, as for the gain), from its
# backward graph's nodes, which track the graph a compile traces and lowers: within 25 %
# of each (GPT-2 124M's the furthest, 25 % low: its first call's check runs a 50257-word
# vocabulary eagerly), 9 % on average
PROFILED_PRIOR_S = 4.2
PER_BACKWARD_NODE_S = 0.024
PRIOR_GAIN = 0.2  # a compiled step 20 % shorter than eager's (1.25x): the low end measured
# Before any measurement on a CPU, the plan profiles one eager training step instead: what a
# compile can fuse is the step outside matmuls, attention and convolution kernels and the
# optimizer. Measured on 2 AMD EPYC cores (benchmarks/results/plan-gain-share.json), the
# compiled step's saving against that share: the demo's model 0.35 of 0.65, GPT-2 124M 1x128
# 0.11 of 0.18, BERT-base 32x64 0.08 of 0.15 and 1x128 0.06 of 0.14, about half; the
# Llama-style decoder 0.13 of 0.10 (Inductor also speeds its matmuls' operand handling); out of
# that sample, GPT-2 2x256 0.13 of 0.19, Llama 2x256 0.06 of 0.09, RoBERTa 4x128 0.06 of 0.12. So
# the estimate is half the share, floored at 0.1, where the matmul-bound steps sit: mean absolute
# error 0.03 over the eight, against 0.11 for the 0.2 prior.
GAIN_PER_FUSABLE_SHARE = 0.5
MIN_ESTIMATED_GAIN = 0.1
MAX_ESTIMATED_GAIN = 0.5
# The module-count prior's error (within 37 % of each compile in its fit, above), as a margin:
# a known run whose steps left could not save even 0.6 x that prior at MAX_ESTIMATED_GAIN is
# not profiled (Plan._profile_now), since no estimate could make a compile pay for it
PRIOR_SPREAD = 0.4
_GEMM_OPS = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::addbmm",
        "aten::_mkldnn_linear",
        "aten::mkldnn_convolution",
        "aten::convolution_backward",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    }
)
CACHED_BACKEND_SAVES = 0.9  # of the backend's seconds, when its kernels are cached (96-97 %
# measured: GPT-2 124M 44.6 -> 1.4 s, Llama-style 22.3 -> 1.0 s)
FORWARD_ONLY_SHARE = 0.35  # an evaluation variant's compile (forward only) against a training
# one's, before either was measured: BERT-base 17.3 of 50.3 s (0.34) on 2 Xeon cores
MIN_GAIN = 0.03  # a variant measured here to save less than this stays eager (ski-rental)
# Block mode (each repeated block compiled once, shared; the glue eager) against the whole
# model, measured on 2 Intel Xeon cores, fp32, batch 2 x 256 (benchmarks/results/
# compile-cpu-base.json): a cold first call took 10.5 of 29.0 s on GPT-2 124M, 9.5 of 26.8 on
# BERT-base, 9.1 of 25.3 on the Llama-style decoder (0.36, 0.35, 0.36)
BLOCKS_COMPILE_SHARE = 0.36
# but not below a compile's fixed cost: the demo's 2-block transformer compiled by block in 7.3 s
# cold against 8.8 s whole (0.83, 2-core AMD EPYC, first call with the check), where 0.36 x its
# whole-model prior (14 s) expects 5 s
BLOCKS_MIN_S = 7.0
# and its steady saving over eager, as a share of the whole model's: GPT-2 124M 0.45 (2191 /
# 2032 / 1841 ms eager / blocks / whole, compile-regions-base.json), GPT-2 4x256 0.52 (236 /
# 212 / 190 ms, compile-regions-small.json); in compile-cpu-base.json's five rounds, per-round
# speed-up medians 0.63 (GPT-2), 1.4 (BERT), 1.0 (Llama), step medians 0.33 / 0.90 / 0.28
# (within the rounds' spread). The middle is ~0.57; rounded down, as PRIOR_GAIN is a low end.
# Below it: BERT-base at batch 1 x 128 on 2 AMD EPYC cores, ~0.1-0.2 (block-compiled step 0.62 s,
# eager 0.63, whole 0.51-0.54; compile-whole-run-bert-blocks.json): small batches, where the
# 24 block graph calls a step weigh more. A run learns the blocks' own gain for the next one.
BLOCKS_GAIN_SHARE = 0.5
_CHECK_CALLS = 5  # compiled calls timed before comparing with eager
_PROBE_CALLS = 4  # then a training variant's eager calls, timed as its settled eager reference
# (the first left out: the demo's model's first eager step after compiled ones took 73 and 77 ms,
# the next 63-58 and 72-63 ms, as the eager path's caches refilled; 2-core AMD EPYC)
_TIMED_STEPS = 2  # eager steps timed, at least, before a known-length plan decides
_SETTLE_STEPS = 4  # and at least this many where the run allows (steps // 20): GPT-2 124M's
# first three steps in a new process took 2.6, 2.4, 2.4 s, the fourth 1.5 s, as later ones
_MAX_TIMED = 10  # and at most, while the step times still fall (Plan._timed_enough)
_BACKWARD_NODE = "autograd::engine::evaluate_function: "  # the profiler's name of a node run
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
    cached: bool = False  # ``expected_s`` counts on the kernels cached by an earlier compile
    grad_steps_at_compile: int | None = None  # training calls made when it compiled
    probing: bool = False  # compiled, running a few calls eagerly to time a settled eager step
    last_was_probe: bool = False
    probe_times: list[float] = field(default_factory=list)
    profiled: bool = False  # a step was profiled to estimate the gain (or could not be)
    gain_note: str = ""  # where an estimated ``gain`` comes from, for the log line
    regions: str = "whole"  # what compiles: the whole region, or its repeated "blocks"
    whole: _Figures | None = None  # by block: the whole region's figures, for a swap to them
    grad: bool = True  # a training variant (forward and backward compile), not evaluation


_COMPILED = ("compiled", "blocks")  # the states that run compiled code: the region's or blocks'


def _probing_now(v: VariantPlan) -> bool:
    """Whether ``v``'s current call is one of the eager calls timed after compiling, whole or
    by block (set between a call's :meth:`Plan.compile_now` and its :meth:`Plan.finished`)."""
    return v.probing and v.state in _COMPILED


class BlockSwitch(Protocol):
    """The repeated blocks of a region, which its plan may choose to compile instead of the
    whole region (given by :func:`hasten.compiler.regions.install`)."""

    def available(self) -> bool:
        """Whether compiling by block is a choice now (not when a training KV cache, indexed by
        layer, would recompile a shared block per layer)."""
        ...

    def install(self, plan: BlockPlan) -> None:
        """Install the block regions, each deciding by ``plan`` which variants run compiled."""
        ...

    def uninstall(self) -> None:
        """Take the block regions off again: the blocks run as the model's own code, which the
        whole region's compile then traces."""
        ...


class Plan:
    """The plan of one compiled region (see the module docstring).

    Args:
        key: What identifies the region's compile across processes (class, shapes, settings).
        label: The region's name in log lines.
        prior_s: The expected compile seconds when the history knows nothing.
        steps: The run's expected number of training calls, or ``None``.
        history_dir: Where ``hasten-plan.json`` lives (the compile cache directory).
        blocks: The region's repeated blocks, when compiling them instead is a choice.
        profile_gain: Estimate a training variant's gain, before it was ever measured here,
            from one profiled eager step (:func:`estimated_gain`; CPU only: on a GPU the CPU
            profile is the launch overhead, not the step).
    """

    def __init__(
        self,
        key: str,
        label: str,
        prior_s: float,
        steps: int | None,
        history_dir: str | None,
        blocks: BlockSwitch | None = None,
        profile_gain: bool = False,
    ) -> None:
        self.key = key
        self.profile_gain = profile_gain
        # the variant whose eager step is being profiled to estimate its gain, and the profiler
        self._profiling: tuple[VariantPlan, Any] | None = None
        self.label = label
        self.prior_s = prior_s
        self.steps = steps
        self.history_dir = history_dir
        self.history = _read_history(history_dir)
        self.variants: dict[str, VariantPlan] = {}
        self.notes: list[str] = []
        self.blocks = blocks
        self.by_block = False  # the plan chose the blocks: every variant compiles by block

    def variant(self, variant: str, grad: bool = True) -> VariantPlan:
        """The plan of one variant, made at its first call from the history of that variant
        (training and evaluation compile different graphs, at different costs and gains)."""
        v = self.variants.get(variant)
        if v is None:
            known = self.history.get(history_key(self.key, variant), {})
            prior = self.prior_s if grad else FORWARD_ONLY_SHARE * self.prior_s
            expected, source, cached = _expected_compile(known, prior)
            v = self.variants[variant] = VariantPlan(
                grad=grad,
                expected_s=expected,
                source=source,
                gain=float(known.get("gain", PRIOR_GAIN)),
                measured_gain="gain" in known,
                cached=cached,
            )
            if not grad:
                self._lend_training_gain()
            if self.by_block:
                self._by_block(variant, v)
        return v

    def compile_now(self, variant: str, grad: bool) -> bool:
        """Called at the start of each call of ``variant``: whether it runs compiled."""
        if self._profiling is not None:  # the profiled step ended (its time is not a step's)
            profiled, prof = self._profiling
            self._profiling = None
            self._estimate(profiled, prof)
        v = self.variant(variant, grad)
        now = time.perf_counter()
        if grad and v.last_start is not None:  # a training call's time: start to next start
            self._account(variant, now - v.last_start)
        v.calls += 1
        v.last_start = now if grad else None
        if v.state == "eager" and self._profile_now(variant, v, grad):
            v.last_start = None  # this step runs under the profiler: not timed
            return False
        if v.state == "eager":
            v.state = self._decide(variant, v, grad)
            if v.state in _COMPILED:
                v.grad_steps_at_compile = v.calls - 1 if grad else None
        # "blocks": the region runs eagerly, its blocks compiled; a probe: eagerly, timed
        return v.state == "compiled" and not _probing_now(v)

    def finished(self, variant: str, grad: bool, started: float, compiled_now: bool) -> None:
        """Called after a call of ``variant``; ``compiled_now``: this call compiled."""
        v = self.variants[variant]
        v.last_was_probe = _probing_now(v)
        v.last_was_compiled = v.state in _COMPILED and not v.last_was_probe
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
        _update_history(self.history_dir, history_key(self.key, variant, v.regions), values)

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
        if v.last_was_probe:
            v.probe_times.append(seconds)
            if len(v.probe_times) == _PROBE_CALLS:
                v.probing = False
                self._compare(variant)
        elif v.last_was_compiled:
            v.compiled_times.append(seconds)
            if len(v.compiled_times) > 16:  # the recent calls, as for eager: bounded over a run
                del v.compiled_times[:-16]
            if len(v.compiled_times) == _CHECK_CALLS and v.eager_times:
                # A training variant, compiled whole or by block, times a few eager calls now,
                # its settled reference (the calls before compiling were a new process's first
                # ones: against them, BERT-base's blocks read 24 % saved where they saved ~2 %).
                # Evaluation and scoring calls vary in size (a last short batch) and are timed
                # by their own duration: those compare with their faster eager half.
                if v.state in _COMPILED and v.last_start is not None:
                    v.probing = True
                else:
                    self._compare(variant)
        else:
            v.eager_s += seconds
            v.eager_times = [*v.eager_times, seconds][-16:]

    def _profile_now(self, variant: str, v: VariantPlan, grad: bool) -> bool:
        """Start profiling this call's step when the gain is still the prior: the training
        variant's, once one eager step was timed (the first carries one-off costs), on a CPU,
        with no other profiler running."""
        if not (self.profile_gain and grad) or v.profiled or v.measured_gain or not v.eager_times:
            return False
        v.profiled = True
        if self._too_short_to_compile(variant, v):  # no profile could make a compile pay
            return False
        from hasten.compiler.hooks.aten import profiler_running

        if profiler_running():  # the user's own profiler is recording
            return False
        try:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            with _quiet_stderr():
                prof.start()
        except Exception:  # an estimate is optional: keep the prior
            return False
        self._profiling = (v, prof)
        return True

    def _too_short_to_compile(self, variant: str, v: VariantPlan) -> bool:
        """Whether the run's known length leaves too few steps for any compile of ``v`` to pay,
        whatever its profiled gain: the steps left at ``MAX_ESTIMATED_GAIN`` save less than the
        cheapest compile (whole or by block) at its prior's low end. Profiling a step costs
        about 0.1 s on a CPU (the profiler's start and stop, and the step it slows): in a
        24-step Trainer run of 2 s, about 5 % of the run, for a plan that stays eager anyway."""
        if self.steps is None:
            return False
        most = _steps_left(self.steps, v) * min(v.eager_times) * MAX_ESTIMATED_GAIN
        costs = [(v.expected_s, v.source)]
        blocks = self._blocks_choice(variant, v)
        if blocks is not None:
            costs.append((blocks.expected_s, blocks.source))
        cheapest = min(s if _measured(source) else s * (1.0 - PRIOR_SPREAD) for s, source in costs)
        return most < cheapest

    def _estimate(self, v: VariantPlan, prof: Any) -> None:
        try:
            with _quiet_stderr():
                prof.stop()
            ops = [(e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()]
        except Exception:  # an estimate is optional: keep the prior
            return
        nodes = sum(n for key, _, n in ops if key.startswith(_BACKWARD_NODE))
        if nodes and v.source == "estimated":  # nothing measured here: a better prior
            self.prior_s = profiled_prior_seconds(nodes)
            v.expected_s = self.prior_s
            v.source = f"estimated from the {nodes} backward nodes of a profiled eager step"
            for other in self.variants.values():  # evaluation variants made before this
                if other is not v and other.source == "estimated" and not other.grad:
                    other.expected_s = FORWARD_ONLY_SHARE * self.prior_s
        share = fusable_share((key, t) for key, t, _ in ops)
        if share is None:
            return
        v.gain = estimated_gain(share)
        v.gain_note = (
            f", estimated from a profiled eager step ({share:.0%} of it outside matmuls, "
            "attention and the optimizer)"
        )
        self._lend_training_gain()

    def _lend_training_gain(self) -> None:
        """Evaluation variants with no gain of their own measured here plan with the training
        variant's, estimated from its profiled step or measured compiled, rather than the fixed
        prior: the same model's kernels (BERT-base at 32 x 64: training 11 % saved, evaluation
        6 %, where the prior's 20 % compiled an evaluation that did not pay back)."""
        train = next(
            (t for t in self.variants.values() if t.grad and (t.measured_gain or t.gain_note)),
            None,
        )
        if train is None:
            return
        how = "measured" if train.measured_gain else "estimated"
        for v in self.variants.values():
            if not v.grad and not v.measured_gain:
                v.gain, v.gain_note = train.gain, f", as {how} for the training step"

    def _decide(self, variant: str, v: VariantPlan, grad: bool) -> str:
        gain = _gain_text(v.gain, v.measured_gain) + v.gain_note
        # what compiling means for this variant: the region's code, or its blocks' once the
        # plan chose them (the region then runs eagerly, calling its compiled blocks)
        compiled, what = ("blocks", " by block") if v.regions == "blocks" else ("compiled", "")
        if self.steps is not None and grad:
            if not self._timed_enough(v.eager_times):
                if v.calls == 1:
                    self._note(
                        f"{self.label} ({variant}): the first steps run eagerly and are timed, to "
                        f"plan for the run's {self.steps} steps (a compile is expected to take "
                        f"~{v.expected_s:.0f} s, {v.source})"
                    )
                return "eager"
            left = _steps_left(self.steps, v)
            step = min(v.eager_times)  # a first call's one-off costs are no step's
            blocks = self._blocks_choice(variant, v)
            if blocks is not None and self.blocks is not None:
                return self._three_way(variant, v, left, step, blocks, self.blocks)
            saved = left * step * v.gain
            if saved > v.expected_s:
                self._note(
                    f"{self.label} ({variant}): compiling{what}: {left} steps left x {step:.2f} s "
                    f"at {gain} is ~{saved:.0f} s, more than the ~{v.expected_s:.0f} s a compile "
                    "is expected to take"
                )
                return compiled
            self._note(
                f"{self.label} ({variant}): runs eagerly for this run: {left} steps left x "
                f"{step:.2f} s at {gain} would save ~{saved:.0f} s, less than the "
                f"~{v.expected_s:.0f} s a compile is expected to take (regions='whole' compiles "
                "anyway)"
            )
            return "eager_for_good"
        if v.measured_gain and v.gain < MIN_GAIN:
            self._note(
                f"{self.label} ({variant}): runs eagerly: compiled{what}, it measured "
                f"{'no faster' if v.gain <= 0 else f'only {v.gain:.0%} faster'} than eager here "
                "before (regions='whole' compiles anyway)"
            )
            return "eager_for_good"
        # training rents at its full eager time, evaluation and scoring at their gain
        rent = v.eager_s if grad else v.eager_s * v.gain
        if rent >= v.expected_s:
            spent = f"{v.eager_s:.1f} s spent eagerly in {v.calls - 1} calls"
            self._note(
                f"{self.label} ({variant}): compiling{what} now: "
                + (
                    f"{spent} reached"
                    if grad
                    else f"{spent} at {gain} would have saved ~{rent:.1f} s,"
                )
                + f" the ~{v.expected_s:.0f} s a compile is expected to take"
            )
            return compiled
        if v.calls == 1:
            until = (
                "spent that long eagerly"
                if grad
                else f"spent ~{v.expected_s / max(v.gain, 1e-9):.0f} s eagerly (at {gain}, "
                "what compiling would have saved by then pays for it)"
            )
            self._note(
                f"{self.label} ({variant}): starts eagerly: a compile{what} is expected to take "
                f"~{v.expected_s:.0f} s ({v.source}), so it compiles once this variant has "
                f"{until} (hasten.compile(model, steps=N) plans for a known run "
                "length; regions='whole' compiles at once)"
            )
        return "eager"

    def _blocks_choice(self, variant: str, v: VariantPlan) -> _Figures | None:
        """What compiling ``variant`` by block is expected to cost and save, when it is a choice
        beside eager and the whole region: the region has repeated blocks that can be compiled
        (:class:`BlockSwitch`), and the whole region's kernels are not cached here already (a
        cached whole compile, GPT-2 124M 6.5 s warm, costs less than a cold block compile,
        10.5 s, and saves at least as much)."""
        if self.blocks is None or self.by_block or v.regions != "whole":
            return None
        if v.cached and "compile_s" not in self._blocks_entry(variant):
            return None
        return self._blocks_figures(variant, v) if self.blocks.available() else None

    def _blocks_entry(self, variant: str) -> dict[str, float]:
        return self.history.get(history_key(self.key, variant, "blocks"), {})

    def _blocks_figures(self, variant: str, v: VariantPlan) -> _Figures:
        """Compiling ``variant`` by block: its compile and gain measured here before, else the
        whole region's scaled by ``BLOCKS_COMPILE_SHARE`` and ``BLOCKS_GAIN_SHARE``."""
        known = self._blocks_entry(variant)
        if "compile_s" in known:
            expected, source, _ = _expected_compile(known, 0.0)
        else:
            expected = BLOCKS_COMPILE_SHARE * v.expected_s
            source = f"{BLOCKS_COMPILE_SHARE:.2f} x the whole model's"
            # a small model: the compile's fixed cost dominates (a forward's, for evaluation)
            floor = BLOCKS_MIN_S * (1.0 if v.grad else FORWARD_ONLY_SHARE)
            if expected < floor:
                expected, source = floor, "a block compile's fixed cost"
        if "gain" in known:
            return _Figures(expected, source, float(known["gain"]), True)
        return _Figures(expected, source, BLOCKS_GAIN_SHARE * v.gain, False)

    def _three_way(
        self,
        variant: str,
        v: VariantPlan,
        left: int,
        step: float,
        blocks: _Figures,
        switch: BlockSwitch,
    ) -> str:
        """Choose the cheapest of eager, blocks and whole for the ``left`` steps of ``step``
        seconds eagerly: a compile's expected seconds plus the steps at the share it saves."""
        totals = {  # in this order: a tie goes to the cheaper start
            "eager": left * step,
            "blocks": blocks.expected_s + left * step * (1.0 - blocks.gain),
            "whole": v.expected_s + left * step * (1.0 - v.gain),
        }
        choice = min(totals, key=lambda k: totals[k])
        said = {
            "eager": "runs eagerly for this run",
            "blocks": "compiling by block (each repeated block compiled once and shared, the "
            "code around them eager; other variants compile by block too, once their share of "
            "the run pays)",
            "whole": "compiling the whole model",
        }[choice]
        share = "" if blocks.measured_gain else f", {BLOCKS_GAIN_SHARE} x the whole model's"
        self._note(
            f"{self.label} ({variant}): {said}: expected totals over the {left} steps left: "
            f"eager ~{totals['eager']:.0f} s ({step:.2f} s a step), blocks "
            f"~{totals['blocks']:.0f} s (a ~{blocks.expected_s:.0f} s compile, "
            f"{blocks.source}, at {_gain_text(blocks.gain, blocks.measured_gain)}{share}), "
            f"whole ~{totals['whole']:.0f} s (a ~{v.expected_s:.0f} s compile, {v.source}, at "
            f"{_gain_text(v.gain, v.measured_gain)}{v.gain_note})"
            + (" (regions='blocks' or 'whole' compiles anyway)" if choice == "eager" else "")
        )
        if choice == "eager":
            return "eager_for_good"
        if choice == "whole":
            return "compiled"
        self.by_block = True
        for name, other in self.variants.items():
            if other.state == "eager":  # this one, and those still deciding
                self._by_block(name, other)
        switch.install(BlockPlan(self))
        return "blocks"

    def _by_block(self, variant: str, v: VariantPlan) -> None:
        """From now on compiling ``variant`` means compiling the region's blocks."""
        v.whole = _Figures.of(v)
        # the blocks' gain is a share of the whole region's: its note still says where from
        replace(self._blocks_figures(variant, v), gain_note=v.gain_note).apply(v)
        v.regions = "blocks"

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
        # The eager reference: a training variant's eager calls timed after its compiled ones
        # (the process has settled by then), else the median of the faster half of the eager
        # calls before compiling. The first calls carry one-off costs (a new process's lazy
        # work, 2x a steady step measured on GPT-2 124M; the faster half still read 24 % saved
        # where ~3 % was), and a gain learned against them would make the next process's plan
        # compile runs the compile cannot pay back.
        if v.probe_times:
            eager = statistics.median(v.probe_times[1:])  # the first: the switch's own cost
            reference = f"{len(v.probe_times) - 1} eager calls after compiling, and one more"
        else:
            fast = sorted(v.eager_times)[: max(1, (len(v.eager_times) + 1) // 2)]
            eager = statistics.median(fast)
            reference = "the faster half of the eager calls"
        compiled = statistics.median(v.compiled_times)
        gain = 1.0 - compiled / eager if eager > 0 else 0.0
        expected_gain = v.gain
        if v.grad:  # what evaluation variants not yet measured plan with
            v.gain, v.measured_gain, v.gain_note = max(gain, 0.0), True, ""
            self._lend_training_gain()
        _update_history(
            self.history_dir,
            history_key(self.key, variant, v.regions),
            {"gain": round(max(gain, 0.0), 3)},
        )
        measured = (
            f"{compiled * 1e3:.1f} vs {eager * 1e3:.1f} ms eagerly, medians, eager from "
            f"{reference}; the next run in this cache plans with that"
        )
        what = " by block" if v.regions == "blocks" else ""
        if v.regions == "blocks" and self._swap_to_whole(variant, v, eager, compiled, measured):
            return
        if compiled >= eager:
            v.state = "eager_for_good"
            self._note(
                f"{self.label} ({variant}): the call compiled{what} measured slower than eager "
                f"({measured}), so it runs eagerly from now on"
            )
            return
        line = (
            f"{self.label} ({variant}): compiled{what}, a call takes {gain:.0%} less ({measured})"
        )
        if self.steps is not None and v.grad_steps_at_compile is not None:
            left = max(self.steps - v.grad_steps_at_compile, 0)
            saved = left * (eager - compiled)
            line += f": ~{saved:.0f} s saved over the {left} steps compiled, " + (
                f"more than the {v.expected_s:.0f} s the compile took"
                if saved > v.expected_s
                else f"less than the {v.expected_s:.0f} s the compile took (the plan "
                f"expected ~{expected_gain:.0%} saved; this compile did not pay back in this run)"
            )
        self._note(line)

    def _swap_to_whole(
        self, variant: str, v: VariantPlan, eager: float, compiled: float, measured: str
    ) -> bool:
        """Once a training variant's blocks are measured, on a run of known length: swap to the
        whole region when its expected compile plus the steps left at its gain now costs less
        than the steps left as they measured (by block, or eagerly where blocks are slower).
        Whether it swapped.

        The three-way choice took blocks on their priors (half the whole model's saving for a
        third of its compile); where they measure far below that (BERT-base at 1 x 128 kept
        ~0.1-0.2 of whole's saving: 24 block graph calls a step), the whole model may still pay
        for the rest of the run. What the blocks' compile cost is spent either way. Swapping
        takes the block regions off (:meth:`BlockSwitch.uninstall`); every variant then plans
        with the whole region's figures again, and the whole region compiles at the next call.
        """
        if not v.grad or self.steps is None or v.whole is None or self.blocks is None:
            return False
        left = max(self.steps - v.calls, 0)  # the calls after this one's start
        whole = v.whole
        keep = left * min(eager, compiled)
        swap = whole.expected_s + left * eager * (1.0 - whole.gain)
        if swap >= keep:
            return False
        kept = "by block" if compiled < eager else "eagerly"
        how = (
            f"a call takes {1 - compiled / eager:.0%} less"
            if compiled < eager
            else "a call measured slower than eager"
        )
        self._note(
            f"{self.label} ({variant}): compiled by block, {how} ({measured}); compiling the "
            f"whole model instead: over the {left} steps "
            f"left, ~{swap:.0f} s expected (a ~{whole.expected_s:.0f} s compile, {whole.source},"
            f" at {_gain_text(whole.gain, whole.measured_gain)}{whole.gain_note}) against "
            f"~{keep:.0f} s {kept}"
        )
        self.blocks.uninstall()
        self.blocks = None  # no second swap: block mode is not offered again in this run
        self.by_block = False
        for other in self.variants.values():
            if other.whole is not None:  # back to the whole region's figures
                other.whole.apply(other)
                other.regions, other.whole = "whole", None
            if other is not v and other.state == "blocks":  # plans again, as a whole region
                other.state = "eager"
        v.state = "compiled"
        v.compiled_times, v.probe_times, v.probing = [], [], False
        v.grad_steps_at_compile = v.calls
        return True

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


def history_key(key: str, variant: str, regions: str = "whole") -> str:
    """A variant's entry in ``hasten-plan.json``: each variant compiles its own graph, at its
    own cost and gain (BERT-base: training 50.3 s at ~3 % saved, evaluation 17.3 s and slower
    compiled; one shared entry let the evaluation's figures replace the training's); compiled by
    block (``regions="blocks"``), an entry of its own too."""
    return f"{key}/{variant}" + ("" if regions == "whole" else f"/{regions}")


def prior_seconds(module: nn.Module) -> float:
    """The expected compile seconds of ``module`` when nothing was measured."""
    return PRIOR_S + PER_MODULE_S * sum(1 for _ in module.modules())


def profiled_prior_seconds(backward_nodes: int) -> float:
    """The expected compile seconds of a region whose profiled eager training step ran
    ``backward_nodes`` autograd nodes, when nothing was measured."""
    return PROFILED_PRIOR_S + PER_BACKWARD_NODE_S * backward_nodes


def _steps_left(steps: int, v: VariantPlan) -> int:
    """The training calls of a run of ``steps`` left from ``v``'s current call on, this one
    included (what a compile decided now would serve)."""
    return max(steps - v.calls + 1, 0)


def _measured(source: str) -> bool:
    """Whether an expected compile time (its ``source`` text, from :func:`_expected_compile` or
    a compile timed in this run) was measured here, not a prior."""
    return "measured" in source


def _expected_compile(known: dict[str, float], prior_s: float) -> tuple[float, str, bool]:
    """The expected compile seconds from the history's entry, where that figure comes from, and
    whether it counts on kernels cached here by that compile."""
    if "compile_s" not in known:
        return prior_s, "estimated", False
    seconds = float(known["compile_s"])
    backend = known.get("backend_s")
    if backend is None or os.environ.get("TORCHINDUCTOR_FX_GRAPH_CACHE") == "0":
        return seconds, "measured here before", False
    cached = seconds - CACHED_BACKEND_SAVES * float(backend)
    return cached, f"{seconds:.0f} s measured here before, less its kernels now cached", True


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for a moment: the profiler's C++ side (Kineto) writes
    "USDT: ... profiler_start" / "profiler_stop" lines to stderr at every start and stop, at
    every log level, which would land in the user's training log."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            sys.stderr.flush()
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def fusable_share(ops: Any) -> float | None:
    """The share of a profiled step's self CPU time outside matmuls, attention, convolution and
    the optimizer (``ops``: ``(name, self time)`` pairs), what a compile can fuse; ``None`` for an
    empty profile."""
    total = fixed = 0.0
    for name, self_time in ops:
        total += self_time
        if name in _GEMM_OPS or "adam" in name.lower() or name.startswith("Optimizer."):
            fixed += self_time
    return None if total <= 0 else max(0.0, 1.0 - fixed / total)


def estimated_gain(share: float) -> float:
    """The share of a step a compile is expected to save, from the step's fusable share."""
    return min(max(GAIN_PER_FUSABLE_SHARE * share, MIN_ESTIMATED_GAIN), MAX_ESTIMATED_GAIN)


def _gain_text(gain: float, measured: bool) -> str:
    return f"~{gain:.0%} saved" + (" (measured here before)" if measured else "")


@dataclass(frozen=True)
class _Figures:
    """What compiling a variant one way is expected to cost (seconds) and save (a share)."""

    expected_s: float
    source: str
    gain: float
    measured_gain: bool
    gain_note: str = ""  # where an estimated ``gain`` comes from (VariantPlan.gain_note)

    @classmethod
    def of(cls, v: VariantPlan) -> _Figures:
        """The figures ``v`` plans with now."""
        return cls(v.expected_s, v.source, v.gain, v.measured_gain, v.gain_note)

    def apply(self, v: VariantPlan) -> None:
        """Make ``v`` plan with these figures."""
        v.expected_s, v.source = self.expected_s, self.source
        v.gain, v.measured_gain, v.gain_note = self.gain, self.measured_gain, self.gain_note


class BlockPlan:
    """The plan of the block regions a :class:`Plan` chose (:meth:`Plan._three_way`): a block
    runs a variant compiled while the region's plan has that variant compiling by block. The
    region's plan does the timing (its calls run eagerly and call the blocks), so a variant
    measured slower by block goes back to eager in the blocks too, and evaluation or scoring
    variants compile by block only once their share of the run pays, by the plan's rule."""

    def __init__(self, root: Plan) -> None:
        self.root = root

    def compile_now(self, variant: str, grad: bool) -> bool:
        v = self.root.variants.get(variant)
        return v is not None and v.state == "blocks" and not _probing_now(v)

    def finished(self, variant: str, grad: bool, started: float, compiled_now: bool) -> None:
        """Nothing to do: the region's plan times the calls around the blocks'."""

    def compiled_seconds(
        self, variant: str, seconds: float, backend_s: float | None = None
    ) -> None:
        """Nothing to do: the region's plan learns the blocks' compile from its own call."""

    def odd_size_pays(self, variant: str, fraction: float, calls: int) -> bool:
        return self.root.odd_size_pays(variant, fraction, calls)


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
