"""The compiled forward hasten installs on a module: fallback, recompile guard, precision.

``hasten.compile(model)`` sets ``model._compiled_call_impl`` to a :class:`CompiledForward`, the
slot ``nn.Module.compile()`` uses, so ``model(x)`` runs it while the module object, its class,
``state_dict()`` keys, pickling and ``deepcopy`` stay those of the plain module (``nn.Module``
drops the slot when pickled: a copy is an eager model).

One call of the compiled forward::

    model(*args)
      -> CompiledForward.__call__
           compile failed before?        -> eager forward
           TorchDynamo frame (guards checked; a miss recompiles -> recompile guard counts it)
             -> hasten_forward: [autocast] module._call_impl(*args) [outputs back to fp32]
           compile error (lazily, at this first call or a recompile):
             fallback="eager" -> run eagerly, warn naming the cause, stay eager from now on
             fallback="raise" -> raise
"""

from __future__ import annotations

import time
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hasten.compiler.backend import HastenBackend
from hasten.compiler.config import CompileConfig
from hasten.compiler.precision import autocast_dtype, with_autocast
from hasten.compiler.report import CompileRecord, Recompile

__all__ = ["CompiledForward", "HastenCompileWarning", "RecompileWarning", "is_compile_error"]


class HastenCompileWarning(UserWarning):
    """Compiling failed and the model runs eagerly (``fallback="eager"``)."""


class RecompileWarning(UserWarning):
    """A compiled forward keeps recompiling (and may fall back to eager at torch's limit)."""


def is_compile_error(err: BaseException) -> bool:
    """Whether ``err`` came from the compiler stack rather than from the model's own code."""
    import torch._dynamo.exc as dynamo_exc

    return isinstance(err, (dynamo_exc.TorchDynamoException, dynamo_exc.FailOnRecompileLimitHit))


def eager_forward(module: nn.Module, config: CompileConfig, device_type: str) -> Callable[..., Any]:
    """The function hasten compiles for ``module``: its call, with the precision policy.

    A function defined here (not ``module._call_impl`` itself) is what makes TorchDynamo trace
    modules whose ``forward`` is torch's own code, such as ``nn.Sequential``.
    """
    call = module._call_impl

    def hasten_forward(*args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    dtype = autocast_dtype(config.precision)
    if dtype is None:
        return hasten_forward
    out_dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    return with_autocast(hasten_forward, device_type, dtype, out_dtype)


class CompiledForward:
    """Callable installed as ``module._compiled_call_impl`` (see the module docstring)."""

    def __init__(
        self, module: nn.Module, config: CompileConfig, record: CompileRecord, device_type: str
    ) -> None:
        self.name = type(module).__name__
        self.config = config
        self.record = record
        self.eager = _own_code(eager_forward(module, config, device_type), self.name)
        self.backend = HastenBackend(config, record)
        self.failed = False
        self._pending: list[tuple[str, str]] = []
        self.compiled = torch._dynamo.optimize(
            self.backend,
            nopython=config.fullgraph,
            dynamic=config.dynamic,
            guard_fail_fn=self._on_guard_fail,
        )(self.eager)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.failed or torch.compiler.is_compiling():
            # Inside another compiled region (the user compiled a function calling this model),
            # the outer trace takes the plain forward in.
            return self.eager(*args, **kwargs)
        calls = self.record.backend_calls
        t0 = time.perf_counter()
        try:
            out = self.compiled(*args, **kwargs)
        except Exception as err:
            if self.config.fallback == "raise" or not is_compile_error(err):
                raise
            return self._fall_back(err, args, kwargs)
        finally:
            self._flush_recompiles()
        if self.record.backend_calls != calls:  # this call compiled (or recompiled) a graph
            self.record.compile_seconds += time.perf_counter() - t0
        return out

    def _fall_back(self, err: BaseException, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # If eager fails too, the error is the model's or the inputs', not the compiler's: raise
        # eager's error and keep compiling.
        out = self.eager(*args, **kwargs)
        cause = _one_line(err)
        self.failed = True
        self.record.fallback = cause
        warnings.warn(
            f"hasten: compiling {self.name} failed, so it runs eagerly from now on (training "
            f"continues, without the speed-up). Cause: {cause}. Pass fallback='raise' to "
            "hasten.compile to get the full error.",
            HastenCompileWarning,
            stacklevel=3,
        )
        return out

    def _on_guard_fail(self, fail: Any) -> None:
        # Dynamo calls this once per cached graph whose guards failed, when it is about to
        # recompile (or has hit the recompile limit); _flush_recompiles groups them per call.
        code = getattr(getattr(fail, "orig_code", None), "co_name", "?")
        self._pending.append((code, str(getattr(fail, "reason", fail)).strip()))

    def _flush_recompiles(self) -> None:
        if not self._pending:  # the common case: every step after the first
            return
        import torch._dynamo.config as dynamo_config

        pending, self._pending = self._pending, []
        by_code: dict[str, list[str]] = {}
        for code, guard in pending:
            by_code.setdefault(code, []).append(guard)
        limit = dynamo_config.recompile_limit
        for code, guards in by_code.items():
            with self.record.lock:
                self.record.recompiles.append(Recompile(code, guards[0]))
                causes = [r.guard for r in self.record.recompiles if r.function == code]
            if len(guards) >= limit:  # every cached graph failed and there is no room for more
                warnings.warn(
                    f"hasten: {self.name} ({code}) hit torch's recompile limit ({limit}); "
                    f"TorchDynamo now runs it eagerly. Guard that failed: {_short(guards[0])}. "
                    "Make the changing value a tensor, or pass dynamic=True for changing shapes.",
                    RecompileWarning,
                    stacklevel=4,
                )
            elif self.config.warn_recompiles and len(causes) == self.config.warn_recompiles:
                warnings.warn(
                    f"hasten: {self.name} ({code}) was recompiled {len(causes)} times; at {limit} "
                    "torch stops compiling it and runs it eagerly. Guards that failed: "
                    + "; ".join(_short(c) for c in causes[:3])
                    + ". Changing shapes: pass dynamic=True or pad to a few lengths; a changing "
                    "Python number: make it a tensor. hasten.explain(model, ...) shows more.",
                    RecompileWarning,
                    stacklevel=4,
                )


def _own_code(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    """``fn`` with a code object of its own, named after the model.

    TorchDynamo keeps compiled graphs, and counts recompiles against its limit (8), per code
    object. Every hasten-compiled model runs the same ``hasten_forward`` code, so without this the
    ninth model compiled in one process would hit the limit and silently run eagerly.
    """
    name = f"hasten_forward_{label}" if label.isidentifier() else "hasten_forward"
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _short(guard: str) -> str:
    return guard.splitlines()[0].strip() if guard else guard


def _one_line(err: BaseException) -> str:
    inner = getattr(err, "inner_exception", None)  # BackendCompilerFailed wraps the real error
    if isinstance(inner, BaseException):
        err = inner
    text = str(err).strip().splitlines()
    first = next((ln.strip() for ln in text if ln.strip()), "")
    return f"{type(err).__name__}: {first}"[:500]
