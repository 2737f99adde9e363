"""``nn.Module``'s private call slots, the mechanism of ``nn.Module.compile()`` that hasten uses
to compile a model in place (same object, same class, same ``state_dict`` keys), and the op
targets Dynamo's graphs call for public functions.

``module(x)`` runs ``module._compiled_call_impl`` when it is set, else ``module._call_impl``
(the hooks, then ``forward``); hasten installs its compiled forward in the first slot and calls
the second to run a module's call eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# torch's pytree (the one Dynamo traces through); private in the oldest supported torch
from torch.utils._pytree import (
    TreeSpec,
    tree_flatten,
    tree_leaves,
    tree_map,
    tree_map_only,
    tree_unflatten,
)

from hasten.compiler.hooks import register

__all__ = [
    "AUTOCAST_TARGETS",
    "GELU_TARGETS",
    "LINEAR_TARGETS",
    "TreeSpec",
    "call_impl",
    "compiled_call",
    "installed_call",
    "own_call",
    "set_compiled_call",
    "tree_flatten",
    "tree_leaves",
    "tree_map",
    "tree_map_only",
    "tree_unflatten",
    "unwrap_compiled",
]


@register(
    "nn.compiled_call_impl", "nn.Module's compiled-call slot (in-place compile)", required=True
)
def _probe() -> str | None:
    if not callable(getattr(nn.Module, "_call_impl", None)):
        return "no nn.Module._call_impl"
    if "_compiled_call_impl" not in vars(nn.Module) and not hasattr(
        nn.Module, "_compiled_call_impl"
    ):
        return "no nn.Module._compiled_call_impl (torch.nn.Module.compile)"
    return None


def call_impl(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``module``'s own call, hooks and ``forward``, bypassing a compiled call installed on it."""
    return module._call_impl(*args, **kwargs)


def own_call(module: nn.Module) -> Callable[..., Any]:
    """``module``'s own call as a bound method, for code TorchDynamo traces: calling it from the
    traced function keeps this module's frame off the stack (a frame in between would be one
    more frame a graph break breaks, and resumes, in)."""
    return module._call_impl


def set_compiled_call(module: nn.Module, fn: Callable[..., Any] | None) -> None:
    """Make ``module(...)`` run ``fn`` (``None``: its own call, eagerly)."""
    module._compiled_call_impl = fn  # type: ignore[assignment]


def compiled_call(module: nn.Module) -> Callable[..., Any] | None:
    """What ``module(...)`` runs instead of its own call (``None``: nothing)."""
    return getattr(module, "_compiled_call_impl", None)


def installed_call(module: nn.Module) -> Callable[..., Any] | None:
    """The compiled call set on the module object itself (not the class default)."""
    return vars(module).get("_compiled_call_impl")


def unwrap_compiled(obj: object) -> nn.Module | None:
    """The module a ``torch.compile(module)`` wrapper wraps (``None`` for anything else)."""
    from hasten.compiler.hooks.dynamo import is_optimized_module

    if not is_optimized_module(obj):
        return None
    inner = getattr(obj, "_orig_mod", None)
    return inner if isinstance(inner, nn.Module) else None


# The targets a traced ``F.linear`` call may have in a Dynamo graph: the Python function or the
# C binding it resolves to.
LINEAR_TARGETS: tuple[Any, ...] = tuple(
    t for t in (F.linear, getattr(getattr(torch._C, "_nn", None), "linear", None)) if t is not None
)

# The same for ``F.gelu`` (Transformers' GELU activation calls it; Dynamo records the binding).
GELU_TARGETS: tuple[Any, ...] = tuple(
    t for t in (F.gelu, getattr(getattr(torch._C, "_nn", None), "gelu", None)) if t is not None
)


# What a Dynamo graph calls where the traced code entered ``torch.autocast`` (a private function
# of torch.amp); empty when this torch has moved it, and then the probe says no.
AUTOCAST_TARGETS: tuple[Any, ...] = tuple(
    t
    for t in (getattr(getattr(torch.amp, "autocast_mode", None), "_enter_autocast", None),)
    if t is not None
)


@register("nn.autocast_target", "autocast regions found in captured graphs (a pass skips them)")
def _probe_autocast() -> str | None:
    return None if AUTOCAST_TARGETS else "no torch.amp.autocast_mode._enter_autocast"
