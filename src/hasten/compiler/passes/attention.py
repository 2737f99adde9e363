"""Rewrite hand-written attention into ``torch.nn.functional.scaled_dot_product_attention``.

Matches, on the graph TorchDynamo captured, the chain a hand-written attention computes::

    scores = q @ k.transpose(-2, -1)          # also torch.matmul / bmm, k given untransposed
    scores = scores * scale                   # or / d, before or after the mask; optional
    scores = scores.masked_fill(m, fill)      # or torch.where(keep, scores, fill), or + float_mask
    p = softmax(scores, dim=-1)               # no-op casts (.type/.to/.float) around it are skipped
    p = dropout(p, p_drop, training)          # optional
    out = p @ v

and replaces it with one ``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, scale)``
call, which needs no ``[.., L, S]`` score tensor saved for the backward and runs a fused (flash)
kernel on CPU and GPU. The mask is passed as the additive float mask the chain is equivalent to
(``where(keep, 0, fill)``), so a fully masked row behaves as it did. Every intermediate must have
no other user (a model returning its attention weights is left alone).

With dropout active the random numbers differ from eager (SDPA draws its own mask), as Inductor's
own dropout does: same distribution, not the same bits.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from hasten.compiler.passes._fx import (
    arg,
    example_value,
    is_call,
    only_user,
    scalar_arg,
    set_example_value,
)
from hasten.compiler.passes.registry import record, register_pass

__all__ = ["attention_to_sdpa"]

_MATMUL = (torch.matmul, operator.matmul, torch.bmm)
_SOFTMAX = (F.softmax, torch.softmax)
_DROPOUT = (F.dropout, torch.dropout)
_ADD = (operator.add, torch.add)
_CASTS = ("type", "to", "float", "type_as")


@dataclass
class _Match:
    q: Any
    k: Any  # untransposed key, or None when only k^T exists in the graph
    kt: Any
    v: Any
    scale: float | None
    mask: tuple[str, Any, Any] | None  # ("add", mask) | ("keep", cond, fill) | ("drop", cond, fill)
    mask_scale: float  # the mask was applied before a scale: multiply it by this
    dropout_p: float
    chain: list[torch.fx.Node]  # nodes that die with the rewrite, last first


@register_pass(
    "attention_to_sdpa",
    stage="pre_grad",
    summary="hand-written attention (matmul, scale, mask, softmax, dropout, matmul) -> SDPA",
)
def attention_to_sdpa(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> torch.fx.GraphModule:
    """Rewrite hand-written attention into ``scaled_dot_product_attention`` (see module doc)."""
    # A rewrite only erases nodes before the matched one, which the loop has already passed.
    for node in list(gm.graph.nodes):
        if is_call(node, _MATMUL, ("matmul",)):
            match = _match(node)
            if match is not None:
                _rewrite(gm.graph, node, match)
                record("attention_rewritten")
    return gm


def _skip_casts(node: Any, user: torch.fx.Node, chain: list[torch.fx.Node]) -> Any:
    """Step over value-preserving casts (same dtype in and out) with one user."""
    while is_call(node, (), _CASTS) and only_user(node, user) and _same_dtype(node, node.args[0]):
        chain.append(node)
        user, node = node, node.args[0]
    return node


def _same_dtype(a: Any, b: Any) -> bool:
    va, vb = example_value(a), example_value(b)
    return (
        isinstance(va, torch.Tensor)
        and isinstance(vb, torch.Tensor)
        and va.dtype == vb.dtype
        and va.device == vb.device
    )


def _match(out: torch.fx.Node) -> _Match | None:
    probs, v = out.args[0], out.args[1] if len(out.args) > 1 else None
    if not isinstance(probs, torch.fx.Node) or not isinstance(v, torch.fx.Node):
        return None
    chain: list[torch.fx.Node] = []
    node = _skip_casts(probs, out, chain)
    user = chain[-1] if chain else out

    dropout_p = 0.0
    if is_call(node, _DROPOUT) and only_user(node, user):
        p = arg(node, 1, "p", 0.5)
        training = arg(node, 2, "training" if node.target is F.dropout else "train", True)
        if arg(node, 3, "inplace", False) or not isinstance(p, (int, float)):
            return None
        if not isinstance(training, bool):
            return None
        dropout_p = float(p) if training else 0.0
        chain.append(node)
        user, node = node, node.args[0]
        node = _skip_casts(node, user, chain)
        user = chain[-1]

    if not (is_call(node, _SOFTMAX, ("softmax",)) and only_user(node, user)):
        return None
    dim = arg(node, 1, "dim")
    dtype = arg(node, 3 if node.target is F.softmax else 2, "dtype")
    val = example_value(node)
    if not isinstance(val, torch.Tensor) or dim not in (-1, val.dim() - 1) or dtype is not None:
        return None
    chain.append(node)
    user, node = node, node.args[0]
    node = _skip_casts(node, user, chain)
    user = chain[-1]

    scale: float | None = None
    mask: tuple[str, Any, Any] | None = None
    mask_scale = 1.0
    for _ in range(2):  # scale and mask, in either order, each at most once
        if not only_user(node, user):
            return None
        sc = scalar_arg(node) if scale is None else None
        if sc is not None:
            node_in, scale = sc
            if scale <= 0:
                return None
            chain.append(node)
            user, node = node, node_in
            continue
        m = _mask(node) if mask is None else None
        if m is not None:
            node_in, mask = m
            if scale is not None:  # the scale comes after the mask in program order
                mask_scale = scale
            chain.append(node)
            user, node = node, node_in
            continue
        break

    if not (is_call(node, _MATMUL, ("matmul",)) and only_user(node, user)):
        return None
    q, kt = node.args[0], node.args[1] if len(node.args) > 1 else None
    if not isinstance(q, torch.fx.Node) or not isinstance(kt, torch.fx.Node):
        return None
    chain.append(node)
    if scale is None:
        sc = scalar_arg(q)
        if sc is not None and sc[1] > 0 and only_user(q, node):  # (q * c) @ k^T
            q, scale = sc
            chain.append(node.args[0])
    k = _untransposed(kt)
    if not _shapes_ok(q, kt, v, mask):
        return None
    return _Match(q, k, kt, v, scale, mask, mask_scale, dropout_p, chain)


def _mask(node: torch.fx.Node) -> tuple[Any, tuple[str, Any, Any]] | None:
    """Recognise a masking step; returns (scores input, mask description)."""
    if is_call(node, (torch.masked_fill,), ("masked_fill",)):
        x, cond, fill = node.args[0], arg(node, 1, "mask"), arg(node, 2, "value")
        if _fill_ok(fill):
            return x, ("drop", cond, fill)
    if is_call(node, (torch.where,)) and len(node.args) == 3:
        cond, x, fill = node.args
        if _fill_ok(fill) and isinstance(x, torch.fx.Node):
            return x, ("keep", cond, fill)
    if is_call(node, _ADD, ("add",)) and len(node.args) == 2 and "alpha" not in node.kwargs:
        a, b = node.args
        for x, m in ((a, b), (b, a)):
            mv = example_value(m)
            if (
                isinstance(mv, torch.Tensor)
                and mv.is_floating_point()
                and isinstance(x, torch.fx.Node)
            ):
                return x, ("add", m, None)
    return None


def _fill_ok(fill: Any) -> bool:
    """A fill value that removes a position from the softmax (-inf or a huge negative number)."""
    if isinstance(fill, (int, float)) and not isinstance(fill, bool):
        return fill <= -1e4
    fv = example_value(fill)
    return isinstance(fv, torch.Tensor) and fv.dim() == 0 and fv.is_floating_point()


def _untransposed(kt: torch.fx.Node) -> Any:
    """``k`` when ``kt`` is ``k.transpose(-2, -1)`` (in any spelling), else ``None``."""
    if not is_call(kt, (torch.transpose,), ("transpose",)) or len(kt.args) < 3:
        return None
    val = example_value(kt)
    if not isinstance(val, torch.Tensor):
        return None
    dims = {d % val.dim() for d in kt.args[1:3] if isinstance(d, int)}
    return kt.args[0] if dims == {val.dim() - 2, val.dim() - 1} else None


def _shapes_ok(q: Any, kt: Any, v: Any, mask: tuple[str, Any, Any] | None) -> bool:
    qv, ktv, vv = example_value(q), example_value(kt), example_value(v)
    if not all(isinstance(t, torch.Tensor) for t in (qv, ktv, vv)):
        return False
    if qv.dim() < 3 or not (qv.dim() == ktv.dim() == vv.dim()):
        return False
    if not qv.is_floating_point() or not (qv.dtype == ktv.dtype == vv.dtype):
        return False
    if not (qv.device == ktv.device == vv.device):
        return False
    # no broadcasting between q, k, v: SDPA's batch semantics then match matmul's exactly
    if qv.shape[:-2] != ktv.shape[:-2] or qv.shape[:-2] != vv.shape[:-2]:
        return False
    if qv.shape[-1] != ktv.shape[-2] or ktv.shape[-1] != vv.shape[-2]:
        return False
    if mask is not None:
        scores_shape = (*qv.shape[:-1], ktv.shape[-1])
        mv = example_value(mask[1])
        if not isinstance(mv, torch.Tensor):
            return False
        if mask[0] != "add" and mv.dtype != torch.bool:
            return False
        try:
            if torch.broadcast_shapes(mv.shape, scores_shape) != scores_shape:
                return False
        except RuntimeError:
            return False
    return True


def _rewrite(graph: torch.fx.Graph, out: torch.fx.Node, m: _Match) -> None:
    dtype = example_value(m.q).dtype
    with graph.inserting_before(out):
        k = m.k
        if k is None:
            k = graph.call_method("transpose", (m.kt, -2, -1))
            set_example_value(k, torch.transpose, m.kt, -2, -1)
        attn_mask = None
        if m.mask is not None:
            kind, a, b = m.mask
            if kind == "add":
                attn_mask = a
            else:
                # where(cond, x, fill) keeps where cond is True; masked_fill drops there
                args = (a, 0.0, b) if kind == "keep" else (a, b, 0.0)
                attn_mask = graph.call_function(torch.where, args)
                set_example_value(attn_mask, torch.where, *args)
            if m.mask_scale != 1.0:
                scaled = graph.call_function(operator.mul, (attn_mask, m.mask_scale))
                set_example_value(scaled, operator.mul, attn_mask, m.mask_scale)
                attn_mask = scaled
            mval = example_value(attn_mask)
            if isinstance(mval, torch.Tensor) and mval.dtype != dtype:
                cast = graph.call_method("to", (attn_mask, dtype))
                set_example_value(cast, torch.Tensor.to, attn_mask, dtype)
                attn_mask = cast
        kwargs = {
            "attn_mask": attn_mask,
            "dropout_p": m.dropout_p,
            "is_causal": False,
            "scale": 1.0 if m.scale is None else m.scale,
        }
        sdpa = graph.call_function(F.scaled_dot_product_attention, (m.q, k, m.v), kwargs)
        set_example_value(sdpa, F.scaled_dot_product_attention, m.q, k, m.v, **kwargs)
        sdpa.meta.setdefault("stack_trace", out.meta.get("stack_trace"))
        sdpa.meta.setdefault("nn_module_stack", out.meta.get("nn_module_stack"))
    out.replace_all_uses_with(sdpa)
    graph.erase_node(out)
    for node in m.chain:  # the chain runs from the softmax side back to q @ k^T
        if not node.users:
            graph.erase_node(node)
