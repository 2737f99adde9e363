"""The compiled forward hasten installs on a module: variants, fallback, recompile guard, precision.

``hasten.compile(model)`` sets ``model._compiled_call_impl`` to a :class:`CompiledForward`, the
slot ``nn.Module.compile()`` uses, so ``model(x)`` runs it while the module object, its class,
``state_dict()`` keys, pickling and ``deepcopy`` stay those of the plain module (``nn.Module``
drops the slot when pickled: a copy is an eager model).

One call of the compiled forward::

    model(*args)
      -> CompiledForward.__call__
           compile failed before?        -> eager
           pick the variant: train/eval x grad/no_grad/inference, each its own code object
           TorchDynamo frame (guards checked; a miss recompiles -> recompile guard counts it)
             -> hasten_forward: [autocast] module._call_impl(*args) [outputs back to fp32]
           compile error (lazily, at this first call or a recompile):
             fallback="eager" -> run eagerly, warn naming the cause, stay eager from now on
             fallback="raise" -> raise

A *region* is what one :class:`CompiledCode` compiles: the whole call of a module (hooks
included, ``kind="call"``), or only its ``forward`` with the module's hooks run eagerly around it
(``kind="forward"``, for FSDP2 units, whose hooks TorchDynamo must not trace; see
:mod:`hasten.compiler.regions`). Modules of one class with the same parameter shapes share one
``CompiledCode``, so a stack of identical blocks is traced once.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import types
import warnings
from collections import Counter
from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn

from hasten.compiler.backend import HastenBackend
from hasten.compiler.config import CompileConfig
from hasten.compiler.hooks import dynamo as dynamo_hooks
from hasten.compiler.hooks import nn as nn_hooks
from hasten.compiler.precision import autocast_dtype, with_autocast
from hasten.compiler.ranks import rank_gate
from hasten.compiler.report import CompileRecord, Recompile, compile_line, log_line
from hasten.compiler.traps import OddBatches, batch_size

__all__ = [
    "CompiledCode",
    "CompiledForward",
    "HastenCompileWarning",
    "HastenMiscompileWarning",
    "RecompileWarning",
    "grad_variant",
    "is_compile_error",
]

Kind = Literal["call", "forward"]

_LABELS: dict[str, int] = {}  # regions created per label in this process (rank gate keys)


class HastenCompileWarning(UserWarning):
    """Compiling failed, or compiled nothing, and the model runs eagerly."""


class HastenMiscompileWarning(UserWarning):
    """A compiled variant disagreed with eager on its first batch (see hasten.compiler.check)."""


class RecompileWarning(UserWarning):
    """A compiled forward keeps recompiling (and may fall back to eager at torch's limit)."""


def is_compile_error(err: BaseException) -> bool:
    """Whether ``err`` came from the compiler stack rather than from the model's own code."""
    return dynamo_hooks.is_compile_error(err)


def grad_variant(training: bool) -> str:
    """The variant of a call made now by a module in ``training`` mode.

    ``train`` or ``eval``, joined with ``grad``, ``no_grad`` or ``inference`` (inside
    ``torch.inference_mode()``), e.g. ``"eval_no_grad"``.
    """
    if torch.is_inference_mode_enabled():
        mode = "inference"
    elif torch.is_grad_enabled():
        mode = "grad"
    else:
        mode = "no_grad"
    return f"{'train' if training else 'eval'}_{mode}"


def hasten_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The function hasten compiles for a ``kind="call"`` region: the module's whole call.

    A function in hasten's own file (not ``module._call_impl`` itself) is what makes TorchDynamo
    trace modules whose ``forward`` is torch's own code, such as ``nn.Sequential``: Dynamo skips
    frames of torch's files but inlines them when called from a traced frame.
    """
    return nn_hooks.own_call(module)(*args, **kwargs)


def hasten_region(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The function hasten compiles for a ``kind="forward"`` region: ``forward`` without hooks."""
    return type(module).forward(module, *args, **kwargs)


class CompiledCode:
    """The compiled functions of one region, shared by the modules it serves.

    It keeps one compiled function per *variant* of a call (see :func:`grad_variant`), each with a
    code object of its own. TorchDynamo keeps graphs, guards and the recompile count per code
    object, so evaluating under ``no_grad`` or scoring under ``inference_mode`` compiles its own
    graph once instead of recompiling the training graph (a grad-mode or dispatch-key guard
    failure, which would eat into torch's recompile limit of 8), and a recompile counts against
    the variant it happened in.

    Args:
        label: Name used in code objects, reports and warnings (a model or block class).
        kind: ``"call"`` (the module's call, hooks included) or ``"forward"`` (``forward`` only).
        config: The model's :class:`CompileConfig`.
        record: The model's :class:`CompileRecord`.
        device_type: Device type of the parameters (for autocast).
        out_dtype: Dtype autocast outputs are cast back to (the parameters').
    """

    def __init__(
        self,
        label: str,
        kind: Kind,
        config: CompileConfig,
        record: CompileRecord,
        device_type: str,
        out_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.label = label if label.isidentifier() else "model"
        self.shared_by = 1  # modules that run this code (regions.py: a block shared by 12)
        self.kind = kind
        self.config = config
        self.record = record
        self.device_type = device_type
        self.out_dtype = out_dtype
        fn: Callable[..., Any] = hasten_forward if kind == "call" else hasten_region
        dtype = autocast_dtype(config.precision)
        self.eager = fn if dtype is None else with_autocast(fn, device_type, dtype, out_dtype)
        self.failed = False
        self._pending: list[tuple[str, str]] = []
        self._variants: dict[str, Callable[..., Any]] = {}
        self._ran: set[str] = set()  # variants that returned at least once
        # under torchrun: local rank 0 compiles each variant first (see hasten.compiler.ranks);
        # the key counts same-named regions so two models in one script do not share markers
        self.gate = rank_gate(config.rank_wait_s, config.cache_dir)
        _LABELS[self.label] = n = _LABELS.get(self.label, 0) + 1
        self._gate_key = f"{self.label}.{n}"
        self._helpers: dict[str, Any] = {}  # start="eager": variant -> its compiling helper
        self._odd: dict[str, OddBatches] = {}  # per variant: short last batches run eagerly
        # the first-call check (hasten.compiler.check): variants checked so far, those that run
        # eagerly because no setting agreed with eager, the backends (for a reproducer)
        self.verify = config.verify_first_call and kind == "call"
        self._checked: set[str] = set()
        self._eager_only: set[str] = set()
        self._backends: dict[str, list[HastenBackend]] = {}
        self._check_note = ""
        # regions="auto": a hasten.compiler.plan.Plan, set at first call (a BlockPlan on the
        # blocks that plan chose to compile)
        self.plan: Any = None

    def _make(self, variant: str, config: CompileConfig, retry: str = "") -> Callable[..., Any]:
        """A compiled function of ``variant`` with ``config`` and a code object of its own
        (``retry``: the safer setting it is, for the report's graph list)."""
        backend = HastenBackend(
            config,
            self.record,
            variant=f"{variant}, retry: {retry}" if retry else variant,
            keep_sources=self.verify and not retry,
        )
        self._backends.setdefault(variant, []).append(backend)
        return dynamo_hooks.optimize(
            backend,
            fullgraph=config.fullgraph,
            dynamic=config.dynamic,
            guard_fail_fn=self._on_guard_fail,
        )(_own_code(self.eager, self.label + ("_safe" if retry else ""), variant))

    def compiled(self, variant: str) -> Callable[..., Any]:
        """The compiled function of ``variant`` (created on first use; Dynamo compiles lazily)."""
        fn = self._variants.get(variant)
        if fn is None:
            fn = self._variants[variant] = self._make(variant, self.config)
        return fn

    def run(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the region on ``module``: compiled, or eagerly after a failure or when tracing."""
        if self.failed or torch.compiler.is_compiling():
            # Inside another compiled region (the user compiled a function calling this model),
            # the outer trace takes the plain forward in.
            return self.eager(module, *args, **kwargs)
        variant = grad_variant(module.training)
        if variant in self._eager_only:  # compiled code disagreed with eager (check.py)
            return self.eager(module, *args, **kwargs)
        if self.plan is not None:
            return self._planned(module, args, kwargs, variant)
        return self._run_compiled(module, args, kwargs, variant)

    def _planned(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], variant: str
    ) -> Any:
        """A call under the compile plan (plan.py): eager until compiling pays, then compiled."""
        grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        t0 = time.perf_counter()
        compiled = self.plan.compile_now(variant, grad)
        first = compiled and variant not in self._ran
        if first and self.device_type == "cpu":
            self._start_probe()
        calls, before = self.record.backend_calls, graph_break_reasons() if first else None
        backend_before = self.record.backend_seconds
        if compiled:
            out = self._run_compiled(module, args, kwargs, variant)
        else:
            out = self.eager(module, *args, **kwargs)
        # a compile during this call: the region's own, or, running eagerly, that of the blocks
        # the plan chose to compile instead (plan.BlockPlan), which compile inside this call
        compiled_now = self.record.backend_calls != calls
        if compiled_now:
            backend_s = self.record.backend_seconds - backend_before
            self.plan.compiled_seconds(variant, time.perf_counter() - t0, backend_s)
        self.plan.finished(variant, grad, t0, compiled_now)
        if first and before is not None and not self.record.graphs and not self.failed:
            self.warn_nothing_compiled(before)
        return out

    def _start_probe(self) -> None:
        """Start the SIMD probe and kernel header build (api.py defers them to here under the
        plan); at most once per cache directory, and it runs while TorchDynamo traces."""
        from hasten.compiler import cache
        from hasten.compiler.hooks.inductor import VEC_ISA_OK
        from hasten.compiler.hooks.vec_isa import start_vec_isa_probe

        if VEC_ISA_OK not in self.config.inductor_options:
            start_vec_isa_probe(cache.cache_dir(self.config.cache_dir))

    def warn_nothing_compiled(self, before: Counter[str]) -> None:
        """Record and warn that compiling captured no graph (``before``: Dynamo's tally then)."""
        reason = nothing_compiled_reason(before)
        with self.record.lock:
            self.record.fixes.append(f"nothing was compiled: {reason}")
        _warn(
            f"hasten: compiling {self.label} captured no graph, so it runs eagerly "
            f"(no speed-up). {reason}. hasten.explain(model, ...) shows more.",
            HastenCompileWarning,
        )

    def _run_compiled(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], variant: str
    ) -> Any:
        """A call through the compiled function of ``variant`` (compiling it when needed)."""
        if (
            self.config.start == "eager"
            and variant not in self._variants
            and self._helper_busy(module, args, kwargs, variant)
        ):
            return self.eager(module, *args, **kwargs)
        if self.config.dynamic is None and self._odd_batch(variant, args, kwargs):
            return self.eager(module, *args, **kwargs)  # a rare batch size: no recompile
        gated = self.gate is not None and variant not in self._variants
        turn = (
            self.gate.turn(f"{self._gate_key}.{variant}")  # type: ignore[union-attr]
            if gated
            else contextlib.nullcontext()
        )
        compiled = self.compiled(variant)
        calls, graphs = self.record.backend_calls, len(self.record.graphs)
        cache_before = _cache_counts()
        t0 = time.perf_counter()
        recompiled: str | None = None
        check = self.verify and variant not in self._checked
        self._check_note = ""
        try:
            with turn:
                if check:
                    out = self._checked_call(compiled, module, args, kwargs, variant)
                else:
                    out = compiled(module, *args, **kwargs)
        except Exception as err:
            if self.config.fallback == "raise" or not is_compile_error(err):
                if variant not in self._ran:
                    # The model's own error at the first call of this variant: TorchDynamo may
                    # have marked the frame "skip" (an exception escaped its trace), so it would
                    # run eagerly for good, or kept a graph specialized on the failed call's
                    # shapes. The next call starts afresh: a new code object, and the batch
                    # size is learned from a call that worked.
                    self._variants.pop(variant, None)
                    self._odd.pop(variant, None)
                    self._checked.discard(variant)
                raise
            return self._fall_back(err, module, args, kwargs)
        finally:
            recompiled = self._flush_recompiles()
            if gated and self.gate is not None and self.gate.outcomes:
                with self.record.lock:
                    self.record.fixes.append(
                        f"torchrun ({self.label}, {variant}): {self.gate.outcomes[-1]}; this "
                        f"rank waited {self.gate.waited_s:.1f} s for local rank 0 in all"
                    )
        self._ran.add(variant)
        if self.record.backend_calls != calls:  # this call compiled (or recompiled) a graph
            seconds = time.perf_counter() - t0
            self.record.compile_seconds += seconds
            hits, misses = (a - b for a, b in zip(_cache_counts(), cache_before))
            warm = ("from the cache",) if hits and not misses else ()
            log_line(
                compile_line(
                    self.label,
                    len(self.record.graphs) - graphs,
                    seconds,
                    variant=variant,
                    details=(
                        *((f"1 block shared by {self.shared_by}",) if self.shared_by > 1 else ()),
                        *warm,
                        *((self._check_note,) if self._check_note else ()),
                    ),
                    recompile=recompiled,
                )
            )
        return out

    def _checked_call(
        self,
        compiled: Callable[..., Any],
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        variant: str,
    ) -> Any:
        """The first call of ``variant``, checked against eager first (see check.py)."""
        from hasten.compiler.check import (
            check_call,
            draws_host_randomness,
            has_active_dropout,
            stateful_input,
        )

        state = stateful_input(args, kwargs)
        if state is not None:
            self._checked.add(variant)
            self._note_check(
                variant,
                f"not checked: the call passes a {state}, which the forward may change in "
                "place, so it cannot be run twice more (hasten.verify checks the whole model)",
            )
            return compiled(module, *args, **kwargs)
        if (
            module.training
            and has_active_dropout(module)
            and not _dropout_matches_eager(self.config, self.device_type)
        ):
            self._checked.add(variant)
            self._note_check(
                variant,
                "not checked: dropout is active and Inductor's RNG on "
                f"{self.device_type} draws other masks than eager (hasten.verify "
                "compares with dropout off)",
            )
            return compiled(module, *args, **kwargs)
        result = check_call(
            compiled,
            self.eager,
            module,
            args,
            kwargs,
            precision=self.config.precision,
            cheap_dropout=_cheap_dropout(self.config, self.device_type),
        )
        self._checked.add(variant)
        if result.passed:
            t0 = time.perf_counter()
            out = compiled(module, *args, **kwargs)
            cost = result.seconds + time.perf_counter() - t0  # the eager run and one more step
            self._note_check(variant, f"{result.describe()}; the check took {cost:.2f} s")
            self._check_note = f"checked against eager in {cost:.1f} s"
            return out
        if draws_host_randomness(self.eager, module, args, kwargs):
            self._note_check(
                variant,
                "not checked: the model draws from NumPy's or Python's random generator, which "
                "TorchDynamo traces as torch's, so compiled and eager draw differently by design "
                f"(difference seen: {result.describe()})",
            )
            return compiled(module, *args, **kwargs)
        fn = self._retry(module, args, kwargs, variant, result)
        return (fn or self.eager)(module, *args, **kwargs)

    def _retry(
        self,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        variant: str,
        first: Any,
    ) -> Callable[..., Any] | None:
        """After a failed check: the first safer setting that agrees with eager, or ``None``."""
        from hasten.compiler.check import check_call, known_cause, safer_settings

        tried: list[str] = []
        chosen: tuple[str, Any, Callable[..., Any]] | None = None
        for desc, cfg in safer_settings(self.config):
            fn = self._make(variant, cfg, desc)
            try:
                res = check_call(
                    fn,
                    self.eager,
                    module,
                    args,
                    kwargs,
                    precision=cfg.precision,
                    cheap_dropout=_cheap_dropout(cfg, self.device_type),
                )
            except Exception as err:
                if not is_compile_error(err):
                    raise
                tried.append(f"{desc}: did not compile ({_one_line(err)})")
                continue
            tried.append(f"{desc}: {res.describe()}")
            if res.passed:
                chosen = (desc, cfg, fn)
                break
        name, err = first.worst
        what = f"{self.label} ({variant})"
        if chosen is not None:
            desc, cfg, fn = chosen
            self._variants[variant] = fn
            outcome = f"it trains with {desc}, which agrees with eager"
            cause = known_cause(desc)
        else:
            fn = None
            self._eager_only.add(variant)
            outcome = "no setting agreed, so this variant runs eagerly (no speed-up)"
            cause = None
        repro = self._write_repro(
            variant, chosen, {"module": module, "args": args, "kwargs": kwargs}
        )
        line = (
            f"hasten: the compiled {what} computed wrong results on its first batch: worst "
            f"{name}, relative error {err:.1e} against eager (tolerance {first.tolerance:.0e}, "
            f"{self.config.precision}). Tried: "
            + "; ".join(tried)
            + f". {outcome[0].upper()}{outcome[1:]}."
            + (f" Cause: {cause}." if cause else "")
            + (f" Standalone reproducer: {repro}." if repro else "")
            + " Pass verify_first_call=False to skip this check."
        )
        self._note_check(variant, line.removeprefix("hasten: "))
        self._check_note = "checked against eager: differed, see the warning"
        _warn(line, HastenMiscompileWarning)
        return fn

    def _write_repro(self, variant: str, chosen: Any, scope: dict[str, Any]) -> str | None:
        import tempfile

        from hasten.compiler.backend import inductor_patches
        from hasten.compiler.check import TOLERANCES, write_reproducer

        first = self._backends.get(variant, [None])[0]
        if first is None:
            return None
        passes_at_fault = chosen is not None and "passes off" in chosen[0]
        backend = "hasten" if passes_at_fault else "inductor"
        options = {
            k: v
            for k, v in inductor_patches(self.config, self.device_type).items()
            if isinstance(v, (bool, int, float, str))
        }
        folder = os.path.join(
            tempfile.gettempdir(), "hasten-repro", f"{self.label}-{variant}-{os.getpid()}"
        )
        try:
            return write_reproducer(
                folder,
                f"{self.label} ({variant}) compiled differs from eager",
                first.sources,
                backend=backend,
                options=options,
                tolerance=TOLERANCES[self.config.precision],
                scope=scope,
            )
        except OSError:
            return None

    def _note_check(self, variant: str, text: str) -> None:
        with self.record.lock:
            self.record.checks.append(f"{self.label} ({variant}): {text}")

    def _helper_busy(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], variant: str
    ) -> bool:
        """``start="eager"``: whether a helper still compiles ``variant`` (start one if none)."""
        from hasten.compiler.nowait import start_helper

        helper = self._helpers.get(variant)
        if helper is None:
            helper = self._helpers[variant] = start_helper(self, module, args, kwargs, variant)
            if isinstance(helper, str):
                _warn(
                    f"hasten: start='eager' could not hand {self.label} to a helper process "
                    f"({helper}), so it compiles now, in this process",
                    HastenCompileWarning,
                )
        if isinstance(helper, str) or helper.running():
            return not isinstance(helper, str)
        with self.record.lock:
            self.record.fixes.append(
                f"start='eager': {self.label} ({variant}) ran eagerly for "
                f"{helper.ended - helper.started:.1f} s while a helper process compiled it"
                + ("" if helper.returncode == 0 else f" (the helper failed: {helper.error()})")
                + "; compiled from its cache from then on"
            )
        return False

    def _odd_batch(self, variant: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether this call's batch size is a rare other one, to run eagerly (traps.OddBatches)."""
        odd = self._odd.get(variant)
        if odd is None:
            # without the compile plan (regions="whole") the count rule alone decides
            odd = self._odd[variant] = OddBatches(
                lambda fraction, calls: (
                    self.plan is None or self.plan.odd_size_pays(variant, fraction, calls)
                )
            )
        if not odd.active:
            return False
        size = batch_size(args, kwargs)
        if not odd.run_eagerly(size):
            return False
        if odd.odd == 1:
            line = (
                f"hasten: {self.label} ({variant}): a batch of {size} (compiled for {odd.size}) "
                "runs eagerly instead of recompiling, while other batch sizes stay rare (the "
                "short last batch of an epoch); dynamic=True compiles for every size"
            )
            with self.record.lock:
                self.record.fixes.append(line.removeprefix("hasten: "))
            log_line(line)
        return True

    def _fall_back(
        self, err: BaseException, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        # If eager fails too, the error is the model's or the inputs', not the compiler's: raise
        # eager's error and keep compiling.
        out = self.eager(module, *args, **kwargs)
        cause = _one_line(err)
        self.failed = True
        self.record.fallback = cause
        _warn(
            f"hasten: compiling {self.label} failed, so it runs eagerly from now on (training "
            f"continues, without the speed-up). Cause: {cause}. Pass fallback='raise' to "
            "hasten.compile to get the full error.",
            HastenCompileWarning,
        )
        return out

    def _on_guard_fail(self, fail: Any) -> None:
        # Dynamo calls this once per cached graph whose guards failed, when it is about to
        # recompile (or has hit the recompile limit); _flush_recompiles groups them per call.
        code = getattr(getattr(fail, "orig_code", None), "co_name", "?")
        self._pending.append((code, str(getattr(fail, "reason", fail)).strip()))

    def _flush_recompiles(self) -> str | None:
        """Record the guard failures of this call; return the first one (``None``: none)."""
        if not self._pending:  # the common case: every step after the first
            return None
        pending, self._pending = self._pending, []
        by_code: dict[str, list[str]] = {}
        for code, guard in pending:
            by_code.setdefault(code, []).append(guard)
        # None on a torch whose limit hasten cannot read: recompiles are recorded, and the
        # warnings speak of "torch's recompile limit" without its number. Read here, in the
        # caller's ``finally``: it must never raise.
        limit = dynamo_hooks.recompile_limit()
        at = "torch's recompile limit" if limit is None else f"torch's recompile limit ({limit})"
        for code, guards in by_code.items():
            with self.record.lock:
                self.record.recompiles.append(Recompile(code, guards[0]))
                causes = [r.guard for r in self.record.recompiles if r.function == code]
            if limit is not None and len(guards) >= limit:  # every cached graph failed, no room
                _warn(
                    f"hasten: {self.label} ({code}) hit {at}; "
                    f"TorchDynamo now runs it eagerly. Guard that failed: {_short(guards[0])}. "
                    "Make the changing value a tensor, or pass dynamic=True for changing shapes.",
                    RecompileWarning,
                )
            elif self.config.warn_recompiles and len(causes) == self.config.warn_recompiles:
                _warn(
                    f"hasten: {self.label} ({code}) was recompiled {len(causes)} times; at "
                    f"{at} TorchDynamo stops compiling it and runs it eagerly. Guards that failed: "
                    + "; ".join(_short(c) for c in causes[:3])
                    + ". Changing shapes: pass dynamic=True or pad to a few lengths; a changing "
                    "Python number: make it a tensor. hasten.explain(model, ...) shows more.",
                    RecompileWarning,
                )
        return pending[0][1]


class CompiledForward:
    """Callable installed as ``module._compiled_call_impl`` (see the module docstring).

    Args:
        module: The module it serves.
        code: The region's :class:`CompiledCode` (possibly shared with same-shaped modules).
        on_first_call: Called with the module before its first call runs; it may re-plan what is
            compiled (FSDP2 units found, see :mod:`hasten.compiler.regions`) by installing other
            ``CompiledForward`` objects, on the module (replacing this one, or ``None``: its own
            call runs eagerly) and its submodules. After that first call, if no graph at all was
            captured, a
            :class:`HastenCompileWarning` says why: ``hasten.compile`` never compiles nothing
            silently.
    """

    def __init__(
        self,
        module: nn.Module,
        code: CompiledCode,
        on_first_call: Callable[[nn.Module], None] | None = None,
    ) -> None:
        self.module = module
        self.code = code
        self._first_call = on_first_call
        # Fixes that need the call's inputs (see hasten.compiler.traps.call_fixes), run before the
        # call while not tracing; each returns True once it has done its job and is dropped.
        self.call_fixes: list[Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], bool]] = []

    @property
    def failed(self) -> bool:
        """Whether compiling failed and the module runs eagerly."""
        return self.code.failed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.call_fixes and not torch.compiler.is_compiling():
            self.call_fixes = [f for f in self.call_fixes if not f(self.module, args, kwargs)]
        if self._first_call is not None and not torch.compiler.is_compiling():
            return self._run_first(args, kwargs)
        if self.code.kind == "call":
            return self.code.run(self.module, args, kwargs)
        return self._run_forward(args, kwargs)

    def _run_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # kind "forward": the module's hooks (FSDP's unshard/reshard) run eagerly around the
        # compiled forward, which _call_impl finds as an instance attribute for this one call.
        module, code = self.module, self.code
        if torch.compiler.is_compiling():
            return nn_hooks.call_impl(module, *args, **kwargs)
        module.__dict__["forward"] = lambda *a, **k: code.run(module, a, k)
        try:
            return nn_hooks.call_impl(module, *args, **kwargs)
        finally:
            del module.__dict__["forward"]

    def _run_first(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        plan, self._first_call = self._first_call, None
        before = graph_break_reasons()
        if plan is not None:
            plan(self.module)
        now = nn_hooks.installed_call(self.module)
        # ``now`` is this object, a region's (the module is an FSDP unit) or None (eager glue)
        try:
            if now is None:
                out = nn_hooks.call_impl(self.module, *args, **kwargs)
            else:
                out = now(*args, **kwargs)
        except BaseException:
            if now is self:  # the model's own error: the next call is a first call again
                self._first_call = _nothing_to_plan
            raise
        record = self.code.record
        # start="eager": the first call ran eagerly while a helper compiles, by design; under a
        # compile plan the first call may run eagerly too (the plan warns when it compiles)
        planned = now is self and self.code.plan is not None
        if (
            not record.graphs
            and record.fallback is None
            and self.code.config.start != "eager"
            and not planned
        ):
            self.code.warn_nothing_compiled(before)
        return out


def _nothing_to_plan(module: nn.Module) -> None:
    """The plan of a first call retried after the model raised (regions are planned already)."""


def graph_break_reasons() -> Counter[str]:
    """TorchDynamo's global tally of graph-break and skip reasons (to diff around a call)."""
    return dynamo_hooks.graph_break_tally()


def nothing_compiled_reason(before: Counter[str]) -> str:
    """Why a call captured no graph: new graph-break reasons since ``before``, or a likely cause."""
    if dynamo_hooks.disabled():
        return "TorchDynamo is disabled (TORCH_COMPILE_DISABLE=1 or torch._dynamo.config.disable)"
    new = graph_break_reasons() - before
    if new:
        reason = max(new, key=lambda r: len(r))  # the most specific (chained) explanation
        return "TorchDynamo skipped it: " + " ".join(reason.split())[:400]
    return (
        "TorchDynamo found no tensor operation to capture in a frame it traces (the forward is in "
        "a file TorchDynamo skips, or runs under torch.compiler.disable)"
    )


def _cheap_dropout(config: CompileConfig, device_type: str) -> bool:
    """Whether code compiled with ``config`` draws dropout as the cheap_dropout_rng pass does."""
    return device_type == "cpu" and "cheap_dropout_rng" in config.enabled_passes()


def _dropout_matches_eager(config: CompileConfig, device_type: str) -> bool:
    """Whether compiled dropout can draw eager's masks (ATen's RNG: Inductor fallback_random)."""
    from hasten.compiler.backend import inductor_patches
    from hasten.compiler.hooks.inductor import FALLBACK_RANDOM

    return bool(inductor_patches(config, device_type).get(FALLBACK_RANDOM, False))


def _cache_counts() -> tuple[int, int]:
    """Hits and misses of Inductor's FX-graph cache and AOTAutograd's cache, so far."""
    return dynamo_hooks.cache_counts()


def _own_code(fn: Callable[..., Any], label: str, variant: str) -> Callable[..., Any]:
    """``fn`` with a code object of its own, named after the model and the variant.

    TorchDynamo keeps compiled graphs, and counts recompiles against its limit (8), per code
    object. Every hasten-compiled model runs the same ``hasten_forward`` code, so without this the
    ninth model compiled in one process would hit the limit and silently run eagerly.
    """
    name = f"hasten_forward_{label}" + ("" if variant == "train_grad" else f"_{variant}")
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _warn(message: str, category: type[Warning]) -> None:
    """Warn at the user's line: the first frame outside hasten's compiler and torch's modules."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


_INTERNAL = (os.path.dirname(__file__), os.path.dirname(nn.Module.__call__.__code__.co_filename))


def _short(guard: str) -> str:
    return guard.splitlines()[0].strip() if guard else guard


def _one_line(err: BaseException) -> str:
    inner = getattr(err, "inner_exception", None)  # BackendCompilerFailed wraps the real error
    if isinstance(inner, BaseException):
        err = inner
    text = str(err).strip().splitlines()
    first = next((ln.strip() for ln in text if ln.strip()), "")
    return f"{type(err).__name__}: {first}"[:500]
