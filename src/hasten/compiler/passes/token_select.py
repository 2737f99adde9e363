"""``sink_token_select``: a model that reads one token's output computes only that token's row.

A sequence classifier built on an encoder (BERT, RoBERTa, DistilBERT, ELECTRA, DeBERTa, ViT)
reads one position of the last layer's output, ``hidden[:, 0]`` (the [CLS] token), and nothing
else. Eagerly, and under ``torch.compile``, the last layer still computes every token: its query
projection, attention, output projection, feed-forward block and norms, forward and backward
(the backward on gradients that are zero everywhere but that one row). Only the keys and values
need every token.

This pass moves the selection up the captured graph, before each op that computes each row
from the same row of its inputs, until it reaches an op that mixes rows:

* pointwise ops (``+ - * /`` on tensors or numbers, GELU, tanh, ...), ``contiguous``, casts;
* ``linear`` (rows stay rows) and ``layer_norm`` over trailing dimensions;
* ``view``/``reshape`` that leave the dimensions up to the selected one as they are, and
  ``transpose``/``permute`` (the selection follows its dimension);
* training dropout: the noise is drawn for the whole tensor, as before, and that row of it kept,
  so the kept row's mask is bit for bit the one it had (hashed noise from ``cheap_dropout_rng``,
  or ATen's draw for a tensor of ones);
* ``scaled_dot_product_attention``, with the selection on the query dimension: attention for one
  query against every key and value (not with ``is_causal``).

It moves only past a node all of whose users select the same position, so nothing is computed
twice. On BERT's last layer that leaves the key and value projections on every token and the
rest on one; each op computes the same numbers for the row it keeps (matrix products of fewer
rows may round differently in the last bit).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from hasten.compiler.hooks.nn import GELU_TARGETS, LINEAR_TARGETS
from hasten.compiler.passes._fx import arg, example_value, is_call, set_example_value
from hasten.compiler.passes.dropout import cheap_dropout, cheap_dropout_attention
from hasten.compiler.passes.registry import record, register_pass

__all__ = ["dropout_rows", "sink_token_select"]

_UNARY_FUNCS: tuple[Callable[..., Any], ...] = (
    *GELU_TARGETS,
    torch.tanh,
    torch.relu,
    F.relu,
    torch.sigmoid,
    F.silu,
    F.mish,
    torch.neg,
    torch.exp,
)
_UNARY_METHODS = ("contiguous", "tanh", "relu", "sigmoid", "neg", "exp", "float", "to", "type")
_BINARY_FUNCS: tuple[Callable[..., Any], ...] = (
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    torch.add,
    torch.sub,
    torch.mul,
    torch.div,
    operator.pow,
    torch.pow,
    torch.where,
)
_BINARY_METHODS = ("add", "sub", "mul", "div", "pow", "masked_fill")
_SOFTMAX_FUNCS: tuple[Callable[..., Any], ...] = (
    F.softmax,
    F.log_softmax,
    torch.softmax,
    torch.log_softmax,
)
_MATMUL_FUNCS: tuple[Callable[..., Any], ...] = (operator.matmul, torch.matmul, torch.bmm)
_RESHAPE_METHODS = ("view", "reshape")
# normalisation over the trailing dimensions (``rms_norm``: torch 2.4 on; ``nn.RMSNorm`` is
# captured as ``torch.rms_norm``)
_NORMS = tuple(
    f
    for f in (
        F.layer_norm,
        torch.layer_norm,
        getattr(F, "rms_norm", None),
        getattr(torch, "rms_norm", None),
    )
    if f is not None
)
_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


def dropout_rows(
    x: torch.Tensor, p: float, shape: Sequence[int], dim: int, index: int
) -> torch.Tensor:
    """``F.dropout(full, p).select(dim, index)`` for ``x = full.select(dim, index)``, ``full`` of
    ``shape``: ATen draws the mask for all of ``shape`` (as for ``full``) and ``x`` keeps its row."""
    mask = F.dropout(torch.ones(tuple(shape), dtype=x.dtype, device=x.device), p, True)
    return x * mask.select(dim, index)


@register_pass(
    "sink_token_select",
    stage="pre_grad",
    summary="a read of one token's output ([CLS]) computes only that row back to the last attention",
)
def sink_token_select(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> torch.fx.GraphModule:
    """Move a one-position selection above the row-wise ops that produce it (module docstring)."""
    graph = gm.graph
    moved = True
    while moved:  # each move leaves new selections one op further up: look again
        moved = False
        for node in list(graph.nodes):
            sel = _users_select(node)
            if sel is None:
                continue
            new = _move_above(graph, node, *sel)
            if new is None:
                continue
            for user in list(node.users):
                user.replace_all_uses_with(new)
                graph.erase_node(user)
            graph.erase_node(node)
            record("selection_moved")
            moved = True
            break
    return gm


def _static_shape(node: Any) -> tuple[int, ...] | None:
    value = example_value(node)
    if not isinstance(value, torch.Tensor):
        return None
    if not all(isinstance(s, int) for s in value.shape):
        return None  # dynamic shapes: left alone
    return tuple(value.shape)


def _selection(node: torch.fx.Node) -> tuple[torch.fx.Node, int, int] | None:
    """``(source, dim, index)`` when ``node`` selects one position along one dimension
    (``x[:, i]``, ``x[:, i, :]``, ``x.select(d, i)``), with ``dim`` and ``index`` >= 0."""
    if is_call(node, (torch.select,), ("select",)):
        src, dim, index = node.args[0], arg(node, 1, "dim"), arg(node, 2, "index")
    elif node.op == "call_function" and node.target is operator.getitem:
        src, key = node.args
        key = key if isinstance(key, tuple) else (key,)
        ints = [j for j, k in enumerate(key) if isinstance(k, int) and not isinstance(k, bool)]
        rest = [k for j, k in enumerate(key) if j not in ints]
        if len(ints) != 1 or any(k != slice(None) for k in rest):
            return None
        dim, index = ints[0], key[ints[0]]
    else:
        return None
    shape = _static_shape(src)
    if not isinstance(src, torch.fx.Node) or shape is None:
        return None
    if (
        not isinstance(dim, int)
        or not isinstance(index, int)
        or not -len(shape) <= dim < len(shape)
    ):
        return None
    dim %= len(shape)
    if not -shape[dim] <= index < shape[dim]:
        return None
    return src, dim, index % shape[dim]


def _users_select(node: torch.fx.Node) -> tuple[int, int] | None:
    """``(dim, index)`` when every user of ``node`` selects that same position of it."""
    if node.op not in ("call_function", "call_method") or not node.users:
        return None
    found = set()
    for user in node.users:
        sel = _selection(user)
        if sel is None or sel[0] is not node:
            return None
        found.add(sel[1:])
    return found.pop() if len(found) == 1 else None


def _new(
    graph: torch.fx.Graph,
    op: str,
    target: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
) -> torch.fx.Node:
    kwargs = kwargs or {}
    if op == "call_method":
        node = graph.call_method(target, args, kwargs)
        set_example_value(node, lambda t, *a, **k: getattr(t, target)(*a, **k), *args, **kwargs)
    else:
        node = graph.call_function(target, args, kwargs)
        set_example_value(node, target, *args, **kwargs)
    return node


def _select(graph: torch.fx.Graph, x: Any, dim: int, index: int) -> Any:
    return _new(graph, "call_function", torch.select, (x, dim, index))


def _move_above(
    graph: torch.fx.Graph, node: torch.fx.Node, dim: int, index: int
) -> torch.fx.Node | None:
    """A new node computing ``node.select(dim, index)`` from selections of ``node``'s inputs,
    inserted before ``node``; ``None`` where ``node``'s op is not one the selection moves past."""
    shape = _static_shape(node)
    if shape is None:
        return None
    before = set(graph.nodes)
    with graph.inserting_before(node):
        new = _move(graph, node, shape, dim, index)
    if new is None:  # take back the selections made on the way
        for n in reversed([n for n in graph.nodes if n not in before]):
            graph.erase_node(n)
    return new


def _others_are_constants(node: torch.fx.Node) -> bool:
    found: list[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args[1:], node.kwargs), found.append)
    return not found


def _move(
    graph: torch.fx.Graph, node: torch.fx.Node, shape: tuple[int, ...], dim: int, index: int
) -> torch.fx.Node | None:
    if is_call(node, _BINARY_FUNCS, _BINARY_METHODS):  # ``0.5 * x``: a number may come first
        return _binary(graph, node, shape, dim, index)
    x = node.args[0] if node.args else None
    if not isinstance(x, torch.fx.Node):
        return None
    # the input's row, where the input spans the output's dimensions up to ``dim`` (a linear
    # layer changes the last one)
    x_shape = _static_shape(x)
    same = (
        x_shape is not None
        and len(x_shape) == len(shape)
        and x_shape[: dim + 1] == shape[: dim + 1]
    )
    rows = _select(graph, x, dim, index) if same else None
    if is_call(node, _UNARY_FUNCS, _UNARY_METHODS) and _others_are_constants(node):
        if rows is None:
            return None
        return _new(graph, node.op, node.target, (rows, *node.args[1:]), dict(node.kwargs))
    if is_call(node, LINEAR_TARGETS):
        if dim >= len(shape) - 1 or rows is None:
            return None
        return _new(graph, node.op, node.target, (rows, *node.args[1:]), dict(node.kwargs))
    if is_call(node, _NORMS):
        normalized = arg(node, 1, "normalized_shape")
        over = 1 if isinstance(normalized, int) else len(tuple(normalized))
        if rows is None or dim >= len(shape) - over:
            return None
        return _new(graph, node.op, node.target, (rows, *node.args[1:]), dict(node.kwargs))
    if is_call(node, _SOFTMAX_FUNCS, ("softmax", "log_softmax")):
        over = arg(node, 1, "dim")
        if rows is None or not isinstance(over, int) or over % len(shape) == dim:
            return None
        if any(isinstance(a, torch.fx.Node) for a in (*node.args[2:], *node.kwargs.values())):
            return None
        over %= len(shape)
        args = (rows, over - (over > dim), *node.args[2:])
        kwargs = {k: v for k, v in node.kwargs.items() if k != "dim"}
        return _new(graph, node.op, node.target, args, kwargs)
    if is_call(node, _MATMUL_FUNCS, ("matmul", "bmm", "__matmul__")):
        return _matmul(graph, node, shape, dim, index)
    if is_call(node, (F.dropout, torch.dropout)):
        return _dropout(graph, node, rows, shape, dim, index)
    if node.op == "call_function" and node.target is cheap_dropout:
        if rows is None or node.kwargs or len(node.args) != 2:
            return None
        p = node.args[1]
        return _new(graph, node.op, cheap_dropout, (rows, p), {"rows_of": (shape, dim, index)})
    if is_call(node, (torch.reshape,), _RESHAPE_METHODS):
        return _reshape(graph, x, shape, dim, index)
    if is_call(node, (torch.transpose, torch.permute), ("transpose", "permute")):
        return _permute(graph, node, x, shape, dim, index)
    if is_call(node, (F.scaled_dot_product_attention, cheap_dropout_attention)):
        return _attention(graph, node, shape, dim, index)
    return None


def _matmul(
    graph: torch.fx.Graph, node: torch.fx.Node, shape: tuple[int, ...], dim: int, index: int
) -> torch.fx.Node | None:
    """``a @ b``: a row of the product is that row of ``a`` times ``b``; a batch of it, that batch
    of each operand spanning it (at 0 where one broadcasts)."""
    if len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    a_shape, b_shape = _static_shape(a), _static_shape(b)
    if a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
        return None
    if dim == len(shape) - 2:  # a row: keep it a matrix of one row, then drop that dimension
        a_rows = _select(graph, a, len(a_shape) - 2, index)
        a_row = _new(graph, "call_method", "unsqueeze", (a_rows, len(a_shape) - 2))
        out = _new(graph, node.op, node.target, (a_row, b))
        # squeeze, not select: a selection here would be moved again, into the same product
        return _new(graph, "call_method", "squeeze", (out, dim))
    if dim > len(shape) - 2:
        return None  # a column
    args = (
        _rows_of_operand(graph, a, a_shape, shape, dim, index),
        _rows_of_operand(graph, b, b_shape, shape, dim, index),
    )
    return _new(graph, node.op, node.target, args)


def _binary(
    graph: torch.fx.Graph, node: torch.fx.Node, shape: tuple[int, ...], dim: int, index: int
) -> torch.fx.Node | None:
    """An elementwise op of tensors (broadcast) and numbers."""
    if any(isinstance(a, torch.fx.Node) for a in node.kwargs.values()):
        return None
    args: list[Any] = []
    for a in node.args:
        if not isinstance(a, torch.fx.Node):
            args.append(a)  # a number
            continue
        a_shape = _static_shape(a)
        if a_shape is None:  # selections made before this are taken back by the caller
            return None
        args.append(_rows_of_operand(graph, a, a_shape, shape, dim, index))
    return _new(graph, node.op, node.target, tuple(args), dict(node.kwargs))


def _rows_of_operand(
    graph: torch.fx.Graph,
    a: torch.fx.Node,
    a_shape: tuple[int, ...],
    shape: tuple[int, ...],
    dim: int,
    index: int,
) -> torch.fx.Node:
    """What of operand ``a`` (of ``a_shape``, broadcast against the output's ``shape``, aligned
    from the right) the output's row ``index`` at ``dim`` reads: that row where ``a`` spans
    ``dim``, row 0 where it broadcasts along it, all of ``a`` where it lacks the dimension."""
    a_dim = dim - (len(shape) - len(a_shape))
    if a_dim < 0:
        return a
    return _select(graph, a, a_dim, 0 if a_shape[a_dim] == 1 else index)


def _dropout(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    rows: torch.fx.Node | None,
    shape: tuple[int, ...],
    dim: int,
    index: int,
) -> torch.fx.Node | None:
    p = arg(node, 1, "p", 0.5)
    training = arg(node, 2, "training" if node.target is F.dropout else "train", True)
    if rows is None or arg(node, 3, "inplace", False) or not isinstance(p, float):
        return None
    if training is not True or not 0.0 < p < 1.0:
        return _new(graph, node.op, node.target, (rows, *node.args[1:]), dict(node.kwargs))
    return _new(graph, "call_function", dropout_rows, (rows, p, shape, dim, index))


def _reshape(
    graph: torch.fx.Graph, x: torch.fx.Node, shape: tuple[int, ...], dim: int, index: int
) -> torch.fx.Node | None:
    """A reshape that leaves ``dim`` whole: some input dimension has its size and the same number
    of elements before it (in row-major order the two are then the same dimension)."""
    x_shape = _static_shape(x)
    if x_shape is None:
        return None
    before = math.prod(shape[:dim])
    for x_dim, size in enumerate(x_shape):
        if size == shape[dim] and math.prod(x_shape[:x_dim]) == before:
            rows = _select(graph, x, x_dim, index)
            return _new(graph, "call_method", "reshape", (rows, shape[:dim] + shape[dim + 1 :]))
    return None


def _permute(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    x: torch.fx.Node,
    shape: tuple[int, ...],
    dim: int,
    index: int,
) -> torch.fx.Node | None:
    ndim = len(shape)
    if node.target in ("transpose", torch.transpose):
        a, b = arg(node, 1, "dim0"), arg(node, 2, "dim1")
        if not isinstance(a, int) or not isinstance(b, int):
            return None
        perm = list(range(ndim))
        perm[a % ndim], perm[b % ndim] = perm[b % ndim], perm[a % ndim]
    else:
        dims = node.args[1:] if node.op == "call_method" else (arg(node, 1, "dims"),)
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        if len(dims) != ndim or not all(isinstance(d, int) for d in dims):
            return None
        perm = [d % ndim for d in dims]
    source = perm[dim]  # the input dimension the output's ``dim`` is
    rest = [p - (p > source) for j, p in enumerate(perm) if j != dim]
    rows = _select(graph, x, source, index)
    if rest == sorted(rest):
        return rows
    return _new(graph, "call_method", "permute", (rows, *rest))


def _attention(
    graph: torch.fx.Graph, node: torch.fx.Node, shape: tuple[int, ...], dim: int, index: int
) -> torch.fx.Node | None:
    """Attention for the one query at ``index``: the query's row (and the mask's, where it has
    one per query), every key and value."""
    if len(node.args) > len(_SDPA_ARGS) or any(k not in _SDPA_ARGS for k in node.kwargs):
        return None  # enable_gqa, or an argument this pass does not know
    given = dict(zip(_SDPA_ARGS, node.args)) | dict(node.kwargs)
    q, mask = given["query"], given.get("attn_mask")
    q_shape = _static_shape(q)
    if dim != len(shape) - 2 or given.get("is_causal", False) is not False:
        return None
    if q_shape is None or len(q_shape) != len(shape) or q_shape[dim] != shape[dim]:
        return None
    cheap = node.target is cheap_dropout_attention
    if not cheap and given.get("dropout_p", 0.0) != 0.0:
        return None  # ATen's dropout inside the kernel: its draws are not the full one's rows
    given["query"] = _new(graph, "call_method", "unsqueeze", (_select(graph, q, dim, index), dim))
    if isinstance(mask, torch.fx.Node):
        m_shape = _static_shape(mask)
        if m_shape is None:
            return None
        if len(m_shape) >= 2 and m_shape[-2] != 1:
            m_dim = len(m_shape) - 2
            m_rows = _select(graph, mask, m_dim, index)
            given["attn_mask"] = _new(graph, "call_method", "unsqueeze", (m_rows, m_dim))
    kwargs = {k: v for k, v in given.items() if k not in ("query", "key", "value")}
    if cheap:
        kwargs["query_of"] = (shape[dim], index)
    out = _new(
        graph,
        "call_function",
        node.target,
        (given["query"], given["key"], given["value"]),
        kwargs,
    )
    # squeeze, not select: a selection here would be moved again, into the same attention
    return _new(graph, "call_method", "squeeze", (out, dim))
