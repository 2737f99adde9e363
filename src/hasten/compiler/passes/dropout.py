"""``cheap_dropout_rng``: on CPU, training dropout from raw random integers instead of Bernoulli.

With ``fallback_random`` (hasten's CPU default, see ``backend.py``) Inductor runs dropout as
ATen's ``native_dropout``: a float ``bernoulli_`` draw per element, a multiply, and a copy of the
noise into a bool mask, none of it fused.

This pass rewrites each training ``F.dropout`` of the captured graph (``nn.Dropout`` modules) to
one draw of uniform 31-bit integers (ATen ``random_`` on int32, from the same default
generator, so ``torch.manual_seed`` still makes runs repeatable) and a comparison against
``p * 2**31`` that Inductor fuses, with the scaling, into the kernels around it. The mask it
keeps for the backward is ``keep`` in the input's dtype (or the int32 noise, as the partitioner
picks): Inductor's CPU kernels store a bool mask slowly and a float one at full vector speed, at
the price of 3 more bytes an element (fp32) among the tensors saved for backward. (Timings:
docs/compiler.md#passes.)

The meaning is exactly ``F.dropout``'s: each element is kept with probability ``1 - p`` (to
within 2**-32) and scaled by ``1 / (1 - p)``. The bits differ from eager's for the same seed (as
Inductor's own RNG's would), not the distribution.

``scaled_dot_product_attention`` with ``dropout_p > 0`` (Transformers' default attention while
training) runs PyTorch's math path on CPU anyway (the fused CPU kernel has no dropout), with a
``native_dropout`` inside; the pass writes that math out (``q @ kᵀ · scale``, mask, ``_safe_softmax``,
dropout, ``@ v``) with the cheap dropout. Calls with ``enable_gqa`` are left alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from hasten.compiler.hooks.aten import safe_softmax
from hasten.compiler.passes._fx import arg, example_value, is_call
from hasten.compiler.passes.registry import record, register_pass

__all__ = ["cheap_dropout", "cheap_dropout_attention", "cheap_dropout_rng"]

_RANGE = 2**31  # random_ on int32 draws uniformly from [0, 2**31)


def cheap_dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """``F.dropout(x, p, training=True)`` from 31-bit integer noise (see the module docstring)."""
    noise = torch.empty(x.shape, dtype=torch.int32, device=x.device).random_()
    # 1 where noise >= threshold, else 0, in int32 arithmetic: no bool tensor anywhere, which
    # Inductor would otherwise pick to save for the backward (1 byte, but a slow scalar store)
    keep = ((noise - round(p * _RANGE)) >> 31) + 1
    # the scale is a Python number: applied in float and rounded once, also for bf16 inputs
    return x * keep.to(x.dtype) * (1.0 / (1.0 - p))


def cheap_dropout_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (training, ``dropout_p > 0``) as math with
    :func:`cheap_dropout`, as PyTorch's CPU math path computes it."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1))
    scores = (q * scale) @ k.transpose(-2, -1)
    if is_causal:
        causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    probs = safe_softmax(scores, -1)  # fully masked rows: 0, not NaN
    return cheap_dropout(probs, dropout_p) @ v


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


@register_pass("cheap_dropout_rng", stage="pre_grad", default=True)
def cheap_dropout_rng(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> torch.fx.GraphModule:
    """CPU training ``F.dropout`` -> int32 ``random_`` + a compare Inductor fuses."""
    for node in list(gm.graph.nodes):
        if is_call(node, (F.scaled_dot_product_attention,)):
            _attention(gm, node)
            continue
        if not is_call(node, (F.dropout, torch.dropout)):
            continue
        x = node.args[0]
        p = arg(node, 1, "p", 0.5)
        training = arg(node, 2, "training" if node.target is F.dropout else "train", True)
        value = example_value(x)
        if training is not True or arg(node, 3, "inplace", False):
            continue
        if not isinstance(p, float) or not 0.0 < p < 1.0:
            continue
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            continue
        if not value.is_floating_point():
            continue
        _replace_with_call(gm, node, cheap_dropout, (x, p), {})
        record("dropout_rewritten")
    return gm


def _attention(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    if node.kwargs.get("enable_gqa", False) or len(node.args) > len(_SDPA_ARGS):
        return
    given = dict(zip(_SDPA_ARGS, node.args))
    given.update((k, v) for k, v in node.kwargs.items() if k in _SDPA_ARGS)
    if len(given) != len(node.args) + len(node.kwargs):  # an argument this pass does not know
        return
    p = given.get("dropout_p", 0.0)
    value = example_value(given.get("query"))
    if not isinstance(p, float) or not 0.0 < p < 1.0:
        return
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
        return
    qkv = tuple(given.get(name) for name in _SDPA_ARGS[:3])
    rest = {name: given[name] for name in _SDPA_ARGS[3:] if name in given}
    _replace_with_call(gm, node, cheap_dropout_attention, qkv, rest)
    record("attention_dropout_rewritten")


def _replace_with_call(
    gm: torch.fx.GraphModule,
    node: torch.fx.Node,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Put a call of ``fn`` (with ``node``'s metadata) in ``node``'s place and remove ``node``."""
    with gm.graph.inserting_before(node):
        new = gm.graph.call_function(fn, args, kwargs)
    new.meta = dict(node.meta)
    node.replace_all_uses_with(new)
    gm.graph.erase_node(node)
