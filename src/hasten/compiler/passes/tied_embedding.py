"""``tied_embedding_grad``: a tied embedding's gradient scattered into the output layer's.

A language model whose output projection shares its weight with the input embedding (GPT-2,
BERT's masked-LM head, Transformers' ``tie_word_embeddings``) gets that weight's gradient as a
sum of two: the output layer's, a dense ``vocabulary x hidden`` matmul, and the embedding's,
the gradient rows of the batch's tokens scattered into a zero matrix of the same size. After
AOTAutograd's decompositions the backward graph reads::

    zeros = full([V, H], 0)
    emb   = _unsafe_masked_index_put_accumulate(zeros, mask, [tokens], rows)
    grad  = add(dense, emb)

which writes a zero matrix, scatters into it, and reads both matrices to add them: for GPT-2
124M three passes over 154 MB (fp32) per step besides the matmul's own, and the zero matrix is
allocated anew each step (page faults). This pass rewrites it to scatter the rows into the dense
gradient itself::

    grad  = _unsafe_index_put(dense, [clamp(tokens)], where(mask, rows, 0), accumulate=True)

the lowering Inductor gives ``_unsafe_masked_index_put_accumulate`` (clamped indices, masked
rows), on the dense gradient instead of the zeros. Inductor's reinplacing pass then scatters in
place into the matmul's output (or into the fp32 cast of a bf16 matmul's, fused with the cast).

The sum is the same sum, in another order: each token's row is added to the dense gradient in
turn, where eagerly the rows are summed first and the dense gradient added after; the result
differs by rounding (one fp32 rounding per token that repeats a row). Measured:
docs/compiler.md#passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from hasten.compiler.passes._fx import example_value
from hasten.compiler.passes.registry import record, register_pass

__all__ = ["tied_embedding_grad"]

aten = torch.ops.aten


def _zeros(node: Any) -> bool:
    """Whether ``node`` is a ``full(..., 0)`` (the scatter's fresh zero matrix)."""
    return (
        isinstance(node, torch.fx.Node)
        and node.target is aten.full.default
        and len(node.args) >= 2
        and node.args[1] == 0
    )


@register_pass("tied_embedding_grad", stage="post_grad", default=True)
def tied_embedding_grad(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> torch.fx.GraphModule:
    """``add(dense, masked_index_put_accumulate(zeros, ...))`` -> the scatter into ``dense``."""
    graph = gm.graph
    # (the op AOTAutograd writes the embedding's backward with, since torch 2.5; absent before)
    packet = getattr(aten, "_unsafe_masked_index_put_accumulate", None)
    if packet is None:
        return gm
    target = packet.default
    for put in list(graph.find_nodes(op="call_function", target=target)):
        zeros, mask, indices, rows = put.args[:4]
        if not _zeros(zeros) or len(zeros.users) != 1 or len(put.users) != 1:
            continue
        (add,) = put.users
        if add.target is not aten.add.Tensor or len(add.args) != 2 or add.kwargs:
            continue
        dense = add.args[0] if add.args[1] is put else add.args[1]
        if dense is put or not isinstance(dense, torch.fx.Node):
            continue
        vals = [example_value(n) for n in (dense, put, add, mask, rows)]
        if not all(isinstance(v, torch.Tensor) for v in vals):
            continue
        dense_v, put_v, add_v, mask_v, rows_v = vals
        # the same matrix, no broadcasting or type promotion in the add
        if not (dense_v.shape == put_v.shape == add_v.shape):
            continue
        if not (dense_v.dtype == put_v.dtype == add_v.dtype):
            continue
        if not isinstance(indices, (list, tuple)) or not indices:
            continue
        fake_mode = getattr(rows_v, "fake_mode", None)
        if fake_mode is None:
            continue
        shape = list(put_v.shape)
        with graph.inserting_before(add), fake_mode:
            zero = graph.call_function(
                aten.full.default,
                ([], 0.0),
                {"dtype": rows_v.dtype, "layout": torch.strided, "device": rows_v.device},
            )
            zero.meta["val"] = torch.full([], 0.0, dtype=rows_v.dtype, device=rows_v.device)
            masked = graph.call_function(aten.where.self, (mask, rows, zero))
            masked.meta["val"] = torch.where(mask_v, rows_v, zero.meta["val"])
            clamped: list[Any] = []
            for dim, index in enumerate(indices):
                if index is None:
                    clamped.append(None)
                    continue
                low = graph.call_function(aten.clamp_min.default, (index, -shape[dim]))
                low.meta["val"] = torch.clamp_min(example_value(index), -shape[dim])
                node = graph.call_function(aten.clamp_max.default, (low, shape[dim] - 1))
                node.meta["val"] = torch.clamp_max(low.meta["val"], shape[dim] - 1)
                clamped.append(node)
            scatter = graph.call_function(
                aten._unsafe_index_put.default, (dense, clamped, masked, True)
            )
            scatter.meta["val"] = torch.empty_like(dense_v)
        add.replace_all_uses_with(scatter)
        graph.erase_node(add)
        graph.erase_node(put)
        graph.erase_node(zeros)
        record("tied_embedding_grad_scattered")
    return gm
