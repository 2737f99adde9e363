"""Algebraic simplification of the captured graph: drop operations that return their input.

Rules (each exact: the result is the input tensor, bit for bit, with the same dtype, device, shape
and strides, checked on the fake tensors TorchDynamo recorded):

* casts to the dtype/device a tensor already has: ``.to(...)``, ``.type(...)``, ``.float()``, ...;
* ``.contiguous()`` of a contiguous tensor; ``view``/``reshape``/``expand`` to the same shape;
* inverse pairs: ``transpose(a, b)`` of ``transpose(a, b)``, ``permute`` pairs that compose to the
  identity, ``t()`` of ``t()``;
* arithmetic identities with Python numbers: ``x * 1``, ``x / 1``, ``x + 0``, ``x - 0``;
* dropout that does nothing: ``p == 0`` or ``training=False``.

Ops that already return their input as is (casts, views, dropout) are replaced by it unchanged;
arithmetic identities create a new tensor in eager, so they are only removed when neither value
is mutated in place afterwards or returned from the graph (aliasing would then be visible).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from hasten.compiler.passes._fx import arg, example_value, is_call
from hasten.compiler.passes.registry import record, register_pass

__all__ = ["simplify"]

_CAST_METHODS = ("to", "type", "float", "double", "half", "bfloat16", "type_as", "cpu", "cuda")
_VIEW_METHODS = ("view", "reshape", "expand", "expand_as", "view_as", "reshape_as")
_VIEW_FUNCS = (torch.reshape,)


@register_pass(
    "simplify",
    stage="pre_grad",
    summary="drop no-op casts/views/contiguous, inverse transpose pairs, x*1, x+0, inactive dropout",
)
def simplify(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> torch.fx.GraphModule:
    """Remove operations that return their input unchanged (see the module docstring)."""
    changed = True
    while changed:  # removing one op can expose another (a cast of a no-op view, ...)
        changed = False
        for node in list(gm.graph.nodes):
            if node.op not in ("call_function", "call_method") or not node.users:
                continue
            rule = _rule(node)
            if rule is None:
                continue
            kind, source = rule
            node.replace_all_uses_with(source)
            gm.graph.erase_node(node)
            record(kind)
            changed = True
        for node in list(gm.graph.nodes):  # inverse pairs leave their first half unused
            if node.op in ("call_function", "call_method") and not node.users and _pure_view(node):
                gm.graph.erase_node(node)
    return gm


def _rule(node: torch.fx.Node) -> tuple[str, torch.fx.Node] | None:
    """``(kind, replacement)`` when ``node`` returns its input unchanged, else ``None``."""
    src = node.args[0] if node.args else None
    if not isinstance(src, torch.fx.Node):
        return None
    out = example_value(node)
    pair = _inverse_pair(node, src)
    if pair is not None and _same_tensor_meta(out, example_value(pair)):
        return "inverse_pair", pair
    if not _same_tensor_meta(out, example_value(src)):
        return None
    if is_call(node, (), _CAST_METHODS):
        if node.kwargs.get("copy", False):
            return None
        return "noop_cast", src
    if is_call(node, (), ("contiguous",)):
        return "noop_contiguous", src
    if is_call(node, _VIEW_FUNCS, _VIEW_METHODS):
        return "noop_view", src
    if is_call(node, (F.dropout, torch.dropout)):
        p = arg(node, 1, "p", 0.5)
        training = arg(node, 2, "training" if node.target is F.dropout else "train", True)
        if arg(node, 3, "inplace", False):
            return None
        if training is False or (isinstance(p, (int, float)) and p == 0):
            return "noop_dropout", src
        return None
    if _arith_identity(node) and _alias_safe(node, src):
        return "arith_identity", src
    return None


def _same_tensor_meta(a: Any, b: Any) -> bool:
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dtype == b.dtype
        and a.device == b.device
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.requires_grad == b.requires_grad
    )


def _pure_view(node: torch.fx.Node) -> bool:
    return is_call(node, (torch.transpose, torch.permute, torch.t), ("transpose", "permute", "t"))


def _inverse_pair(node: torch.fx.Node, src: torch.fx.Node) -> torch.fx.Node | None:
    """For ``op(op(x))`` that is the identity: ``x``."""
    if not (_pure_view(node) and _pure_view(src)) or not isinstance(src.args[0], torch.fx.Node):
        return None
    x = src.args[0]
    val = example_value(x)
    if not isinstance(val, torch.Tensor):
        return None
    perm_a, perm_b = _perm(src, val.dim()), _perm(node, val.dim())
    if perm_a is None or perm_b is None:
        return None
    composed = [perm_a[i] for i in perm_b]
    return x if composed == list(range(val.dim())) else None


def _perm(node: torch.fx.Node, rank: int) -> list[int] | None:
    """The dimension permutation a transpose/permute/t node applies, if static."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    args = list(node.args[1:])
    if name == "t":
        return [1, 0] if rank == 2 else list(range(rank))
    if name == "transpose":
        a, b = arg(node, 1, "dim0"), arg(node, 2, "dim1")
        if not isinstance(a, int) or not isinstance(b, int):
            return None
        perm = list(range(rank))
        a, b = a % rank, b % rank
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    if name == "permute":
        dims = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
        if not dims:
            dims = node.kwargs.get("dims", [])
        if len(dims) != rank or not all(isinstance(d, int) for d in dims):
            return None
        return [d % rank for d in dims]
    return None


_MUL = (operator.mul, torch.mul)
_DIV = (operator.truediv, torch.div)
_ADD = (operator.add, torch.add)
_SUB = (operator.sub, torch.sub)


def _arith_identity(node: torch.fx.Node) -> bool:
    if len(node.args) != 2 or node.kwargs:
        return False
    a, b = node.args
    if not isinstance(a, torch.fx.Node):
        return False
    if isinstance(b, bool) or not isinstance(b, (int, float)):
        return False
    if is_call(node, _MUL, ("mul",)) or is_call(node, _DIV, ("div",)):
        return b == 1
    if is_call(node, _ADD, ("add",)) or is_call(node, _SUB, ("sub",)):
        return b == 0
    return False


def _mutated_or_output(node: torch.fx.Node) -> bool:
    for user in node.users:
        if user.op == "output":
            return True
        if user.op == "call_method" and str(user.target).endswith("_"):
            return True
        if user.op == "call_function" and getattr(user.target, "__name__", "").endswith("_"):
            return True
        if user.op == "call_function" and user.target in (
            operator.iadd,
            operator.isub,
            operator.imul,
            operator.itruediv,
            operator.setitem,
        ):
            return True
    return False


def _alias_safe(node: torch.fx.Node, src: torch.fx.Node) -> bool:
    """Replacing a fresh result by its input is invisible only if neither is mutated/returned."""
    return src.op != "placeholder" and not _mutated_or_output(node) and not _mutated_or_output(src)
