"""Small helpers for matching torch-level FX graphs (the graphs TorchDynamo captures)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.fx

from hasten.compiler.hooks.nn import tree_leaves

__all__ = [
    "example_value",
    "is_call",
    "only_user",
    "scalar_arg",
    "set_example_value",
]


def is_call(
    node: Any, functions: Iterable[Callable[..., Any]] = (), methods: Iterable[str] = ()
) -> bool:
    """Whether ``node`` calls one of ``functions`` or one of the Tensor ``methods`` by name."""
    if not isinstance(node, torch.fx.Node):
        return False
    if node.op == "call_function":
        return node.target in tuple(functions)
    if node.op == "call_method":
        return node.target in tuple(methods)
    return False


def arg(node: torch.fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` (positional) or ``name`` (keyword) of a call node."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def example_value(node: Any) -> Any:
    """The fake tensor (or value) TorchDynamo recorded for ``node``, or ``None``."""
    if isinstance(node, torch.fx.Node):
        return node.meta.get("example_value", node.meta.get("val"))
    return node


def only_user(node: torch.fx.Node, user: torch.fx.Node) -> bool:
    """Whether ``user`` is the one and only user of ``node`` (so rewriting it loses nothing)."""
    return len(node.users) == 1 and user in node.users


def scalar_arg(node: torch.fx.Node) -> tuple[Any, float] | None:
    """For ``x * c``, ``c * x`` or ``x / c`` with a Python number ``c``: ``(x, factor)``."""
    if is_call(node, (operator.mul, torch.mul), ("mul",)):
        a, b = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
        if isinstance(b, (int, float)) and not isinstance(b, bool):
            return a, float(b)
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return b, float(a)
    if is_call(node, (operator.truediv, torch.div), ("div",)):
        if node.kwargs.get("rounding_mode") is not None:
            return None
        a, b = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
        if isinstance(b, (int, float)) and not isinstance(b, bool) and b != 0:
            return a, 1.0 / float(b)
    return None


def set_example_value(
    node: torch.fx.Node, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> None:
    """Record ``node``'s example value by running ``fn`` on its inputs' fake tensors.

    Later passes (ours and Inductor's pre-grad passes) read shapes and dtypes from it. Leaves the
    meta empty when the inputs carry no fake tensors.
    """
    missing = False

    def value(n: torch.fx.Node) -> Any:
        nonlocal missing
        v = example_value(n)
        missing = missing or v is None
        return v

    vals = torch.fx.node.map_arg((args, kwargs), value)
    fakes = [v for v in tree_leaves(vals) if isinstance(v, torch.Tensor)]
    mode = getattr(fakes[0], "fake_mode", None) if fakes else None
    if missing or mode is None:
        return
    with mode:
        node.meta["example_value"] = fn(*vals[0], **vals[1])
