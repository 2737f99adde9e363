"""TorchDynamo's internals hasten uses: frame evaluation, counters, limits, compile callbacks.

Nothing here imports ``torch._dynamo`` at import time: importing it creates
``$TORCHINDUCTOR_CACHE_DIR``, which :func:`hasten.compiler.cache.check_env_cache_dir` must vet
first.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any

from hasten.compiler.hooks import register

__all__ = [
    "add_end_callback",
    "cache_counts",
    "compile_id",
    "disabled",
    "graph_break_reason_list",
    "graph_break_tally",
    "has_end_callback",
    "is_compile_error",
    "is_fake_tensor",
    "is_graph_break",
    "is_optimized_module",
    "optimize",
    "recompile_limit",
    "recompile_limit_patch",
]


# --- the frame evaluation hasten compiles through (required) ---------------------------------


@register("dynamo.optimize", "TorchDynamo frame evaluation with a backend", required=True)
def _probe_optimize() -> str | None:
    import torch._dynamo

    return (
        None if callable(getattr(torch._dynamo, "optimize", None)) else "no torch._dynamo.optimize"
    )


@register("dynamo.guard_fail_fn", "recompiles recorded with the guard that failed")
def _probe_guard_fail_fn() -> str | None:
    import torch._dynamo

    params = inspect.signature(torch._dynamo.optimize).parameters
    ok = "guard_fail_fn" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    return None if ok else "torch._dynamo.optimize takes no guard_fail_fn"


def optimize(
    backend: Callable[..., Any],
    *,
    fullgraph: bool,
    dynamic: bool | None,
    guard_fail_fn: Callable[[Any], None] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``torch._dynamo.optimize``: a decorator compiling a function with ``backend``.

    The private entry point, not ``torch.compile``, because only it hands each failed guard to
    ``guard_fail_fn`` (the recompile records of the report); without that hook recompiles are
    still compiled, only not recorded.
    """
    import torch._dynamo

    from hasten.compiler.hooks import require, usable

    require("dynamo.optimize")
    kwargs: dict[str, Any] = {"nopython": fullgraph, "dynamic": dynamic}
    if guard_fail_fn is not None and usable("dynamo.guard_fail_fn"):
        kwargs["guard_fail_fn"] = guard_fail_fn
    return torch._dynamo.optimize(backend, **kwargs)


def is_compile_error(err: BaseException) -> bool:
    """Whether ``err`` came from TorchDynamo/the backend rather than from the model's code."""
    import torch._dynamo.exc as exc

    kinds = tuple(
        k
        for k in (
            getattr(exc, "TorchDynamoException", None),
            getattr(exc, "FailOnRecompileLimitHit", None),
        )
        if isinstance(k, type)
    )
    return bool(kinds) and isinstance(err, kinds)


def is_graph_break(reason: Any) -> bool:
    """Whether Dynamo's ``GraphCompileReason`` ``reason`` ended its graph at a graph break."""
    return bool(getattr(reason, "graph_break", False))


def is_optimized_module(obj: object) -> bool:
    """Whether ``obj`` is the wrapper ``torch.compile(module)`` returns (``OptimizedModule``)."""
    import torch._dynamo.eval_frame as eval_frame

    cls = getattr(eval_frame, "OptimizedModule", None)
    return isinstance(cls, type) and isinstance(obj, cls)


def disabled() -> bool:
    """Whether TorchDynamo is switched off (``TORCH_COMPILE_DISABLE=1``, its config ``disable``)."""
    import torch._dynamo.config as config

    return bool(getattr(config, "disable", False))


# --- the recompile limit ---------------------------------------------------------------------


@register("dynamo.recompile_limit", "recompile-limit warnings name torch's limit")
def _probe_recompile_limit() -> str | None:
    return None if recompile_limit() is not None else "no recompile_limit or cache_size_limit"


def recompile_limit(config: Any = None) -> int | None:
    """TorchDynamo's recompile limit per code object (``None`` when this torch has none known).

    torch 2.7 renamed ``cache_size_limit`` to ``recompile_limit`` (and kept the old name as an
    alias for a while); ``config`` defaults to ``torch._dynamo.config`` (a parameter for tests).
    """
    if config is None:
        import torch._dynamo.config as config
    for key in ("recompile_limit", "cache_size_limit"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def recompile_limit_patch(limit: int) -> Any:
    """A context manager setting TorchDynamo's recompile limit to ``limit`` (whichever name this
    torch gives it), for tests and experiments; never called by hasten itself."""
    import torch._dynamo.config as config

    key = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    return config.patch(**{key: limit})


# --- counters --------------------------------------------------------------------------------

_BREAK_GROUPS = ("graph_break", "unimplemented")
_CACHE_KEYS = (
    ("inductor", "fxgraph_cache_hit", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_hit", "autograd_cache_miss"),
)


@register("dynamo.counters", "graph-break reasons and cache hits read off Dynamo's counters")
def _probe_counters() -> str | None:
    from torch._dynamo import utils

    counters = getattr(utils, "counters", None)
    return None if hasattr(counters, "__getitem__") else "no torch._dynamo.utils.counters"


def graph_break_tally() -> Counter[str]:
    """TorchDynamo's global tally of graph-break and skip reasons (to diff around a call);
    empty when this torch keeps no such counters."""
    from hasten.compiler.hooks import usable

    tally: Counter[str] = Counter()
    if not usable("dynamo.counters"):
        return tally
    from torch._dynamo.utils import counters

    for group in _BREAK_GROUPS:
        tally.update(counters[group])
    return tally


def cache_counts() -> tuple[int, int]:
    """Hits and misses of Inductor's FX-graph cache and AOTAutograd's cache so far (0, 0 when
    this torch keeps no such counters)."""
    from hasten.compiler.hooks import usable

    if not usable("dynamo.counters"):
        return 0, 0
    from torch._dynamo.utils import counters

    hits = sum(counters[group][hit] for group, hit, _ in _CACHE_KEYS)
    misses = sum(counters[group][miss] for group, _, miss in _CACHE_KEYS)
    return hits, misses


# --- end-of-compile callbacks (graph breaks in Dynamo's order, breaks.py) --------------------


@register("dynamo.compile_callbacks", "graph breaks of every frame, empty graphs' too")
def _probe_callbacks() -> str | None:
    try:
        from torch._dynamo.callback import callback_handler
        from torch._dynamo.utils import graph_break_reasons
        from torch._guards import CompileContext
    except ImportError as err:
        return str(err)
    if not hasattr(callback_handler, "register_end_callback"):
        return "no callback_handler.register_end_callback"
    if not isinstance(graph_break_reasons, list):
        return "torch._dynamo.utils.graph_break_reasons is not a list"
    if not callable(getattr(CompileContext, "current_compile_id", None)):
        return "no CompileContext.current_compile_id"
    return None


def add_end_callback(fn: Callable[..., None]) -> bool:
    """Register ``fn`` to run after each frame TorchDynamo compiles (once; re-registering after
    ``torch.compiler.reset()``, which clears the callbacks). ``False``: not on this torch."""
    from hasten.compiler.hooks import usable

    if not usable("dynamo.compile_callbacks"):
        return False
    from torch._dynamo.callback import callback_handler

    if fn not in callback_handler.end_callbacks:
        callback_handler.register_end_callback(fn)
    return True


def has_end_callback(fn: Callable[..., None]) -> bool:
    """Whether ``fn`` is registered as an end-of-compile callback now."""
    from hasten.compiler.hooks import usable

    if not usable("dynamo.compile_callbacks"):
        return False
    from torch._dynamo.callback import callback_handler

    return fn in callback_handler.end_callbacks


def graph_break_reason_list() -> list[Any]:
    """Dynamo's list of graph-break reasons, in order (cleared by ``torch.compiler.reset()``)."""
    from hasten.compiler.hooks import usable

    if not usable("dynamo.compile_callbacks"):
        return []
    from torch._dynamo.utils import graph_break_reasons

    return graph_break_reasons


def compile_id() -> Any:
    """The id of the TorchDynamo compile running on this thread (``None``: none is)."""
    from hasten.compiler.hooks import usable

    if not usable("dynamo.compile_callbacks"):
        return None
    from torch._guards import CompileContext

    return CompileContext.current_compile_id()


# --- fake tensors: what tracing (Dynamo, torch.export) runs code on --------------------------


@register("dynamo.fake_tensor", "fake tensors (tracing) told apart from real ones")
def _probe_fake_tensor() -> str | None:
    from torch._subclasses import fake_tensor

    ok = isinstance(getattr(fake_tensor, "FakeTensor", None), type)
    return None if ok else "no torch._subclasses.fake_tensor.FakeTensor"


def is_fake_tensor(t: Any) -> bool:
    """Whether ``t`` is a fake tensor (shapes and dtypes only, made while torch traces code).

    Without the hook, any tensor subclass counts as fake (``nn.Parameter`` excepted): callers use
    this to leave such a tensor to the plain, uncompiled code, which is always safe.
    """
    import torch
    from torch import nn

    from hasten.compiler.hooks import usable

    if not usable("dynamo.fake_tensor"):
        return isinstance(t, torch.Tensor) and type(t) not in (torch.Tensor, nn.Parameter)
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)
