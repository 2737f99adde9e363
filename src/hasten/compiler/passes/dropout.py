"""``cheap_dropout_rng``: on CPU, training dropout from a counter-based hash instead of Bernoulli.

With ``fallback_random`` (hasten's CPU default, see ``backend.py``) Inductor runs dropout as
ATen's ``native_dropout``: a float ``bernoulli_`` draw per element, a multiply, and a copy of the
noise into a bool mask, none of it fused.

This pass rewrites each training ``F.dropout`` of the captured graph (``nn.Dropout`` modules) to
noise computed from the element's index: one 62-bit key is drawn per call from the default
generator (``torch.manual_seed`` still makes runs repeatable), and each element's 32-bit noise
is a hash of its flat index under that key (three rounds of the ``lowbias32`` integer mixer,
the key XORed in between rounds, see :func:`dropout_noise`). All of it is integer arithmetic
Inductor fuses and vectorizes with the comparison against ``p * 2**32`` and the scaling into
the kernels around it; ATen's ``random_`` it replaces is a serial Mersenne Twister at about 2 ns
an element (5-10 % of a GPT-2 or BERT step on 2 cores), the hash a fraction of that. The
partitioner may keep the 8-byte key and recompute the mask in the backward instead of saving
it. The mask is ``keep`` in the input's dtype, built without a bool tensor (Inductor's CPU
kernels store a bool slowly). Tensors of 2**32 elements or more (beyond the index the hash takes)
draw ``random_`` integers as before. (Timings: docs/compiler.md#passes.)

The meaning is exactly ``F.dropout``'s: each element is kept with probability ``1 - p`` (to
within 2**-32) and scaled by ``1 / (1 - p)``. The bits differ from eager's for the same seed (as
Inductor's own RNG's would), not the distribution; the integer hash computes the same bits
eagerly and compiled, which the first-call check relies on (``check.py``).

``scaled_dot_product_attention`` with ``dropout_p > 0`` (Transformers' default attention while
training) runs PyTorch's math path on CPU anyway (the fused CPU kernel has no dropout), with a
``native_dropout`` inside; the pass writes that math out (``q @ kᵀ · scale``, mask, ``_safe_softmax``,
dropout, ``@ v``) with the cheap dropout. Calls with ``enable_gqa`` are left alone.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from hasten.compiler.hooks import inductor as hooks_inductor
from hasten.compiler.hooks.aten import safe_softmax
from hasten.compiler.passes._fx import arg, example_value, is_call
from hasten.compiler.passes.registry import record, register_pass

__all__ = ["cheap_dropout", "cheap_dropout_attention", "cheap_dropout_rng", "dropout_noise"]

_M32 = 0xFFFFFFFF
# lowbias32's multipliers (C. Wellons, hash-prospector); the second as its negative twin mod 2**32,
# so that in int64 every product of a 32-bit value stays below 2**63 (no overflow, eager or
# compiled: the bits agree)
_MUL1 = 0x7FEB352D
_MUL2 = 0x846CA68B - 2**32
_HASHED_MAX = 2**32  # the hash takes a 32-bit index


class _TensorOps:
    """The hash's operations on tensors, named as Inductor's op handler names them, so that one
    definition (:func:`_hash`) runs eagerly and is lowered into a compiled kernel."""

    @staticmethod
    def constant(value: int, dtype: torch.dtype) -> int:
        return value

    bitwise_xor = staticmethod(torch.bitwise_xor)
    bitwise_and = staticmethod(torch.bitwise_and)
    bitwise_right_shift = staticmethod(torch.bitwise_right_shift)
    mul = staticmethod(torch.mul)


def _hash(o: Any, index: Any, key: Any) -> Any:
    """32-bit noise at ``index`` under the 62-bit ``key``: ``lowbias32`` three times, the key's
    two halves XORed in after the first and second rounds. ``o`` is :class:`_TensorOps` or
    Inductor's op handler. The index is mixed before the key goes in, so two keys give unrelated
    masks rather than permutations of one another (an index XORed with a key is reordered)."""

    def c(value: int) -> Any:
        return o.constant(value, torch.int64)

    def mix(x: Any) -> Any:  # a bijection on 32-bit values (held in int64) mixing every bit
        x = o.bitwise_xor(x, o.bitwise_right_shift(x, c(16)))
        x = o.bitwise_and(o.mul(x, c(_MUL1)), c(_M32))
        x = o.bitwise_xor(x, o.bitwise_right_shift(x, c(15)))
        x = o.bitwise_and(o.mul(x, c(_MUL2)), c(_M32))
        return o.bitwise_xor(x, o.bitwise_right_shift(x, c(16)))

    low, high = o.bitwise_and(key, c(_M32)), o.bitwise_right_shift(key, c(32))
    return mix(o.bitwise_xor(mix(o.bitwise_xor(mix(index), low)), high))


def _lowered_hash(o: Any, index: Any, key: Any) -> Any:
    return _hash(o, index, key)  # looked up at each lowering: a test counts the calls


# pointwise: the partitioner may recompute the noise in the backward from the 8-byte key rather
# than save a mask (torch releases before custom_op took tags go without)
_POINTWISE = (
    {"tags": (torch.Tag.pointwise,)}
    if "tags" in inspect.signature(torch.library.custom_op).parameters
    else {}
)


@torch.library.custom_op("hasten::dropout_noise", mutates_args=(), **_POINTWISE)
def _noise_op(key: torch.Tensor, numel: int) -> torch.Tensor:
    """``numel`` hashed noise values (int64 in ``[0, 2**32)``) under the 0-dim int64 ``key``."""
    return _hash(_TensorOps, torch.arange(numel, dtype=torch.int64, device=key.device), key)


@_noise_op.register_fake
def _noise_fake(key: torch.Tensor, numel: int) -> torch.Tensor:
    return key.new_empty((numel,), dtype=torch.int64)


def dropout_noise(shape: Sequence[int], device: torch.device) -> torch.Tensor:
    """Uniform integers in ``[0, 2**32)`` (int64), one per element, from one 62-bit key drawn
    from the default generator; bit for bit the same eagerly and compiled."""
    key = torch.randint(0, 2**62, (), dtype=torch.int64, device=device)
    return _noise_op(key, math.prod(shape)).view(shape)


def cheap_dropout(
    x: torch.Tensor, p: float, *, rows_of: tuple[Sequence[int], int, int] | None = None
) -> torch.Tensor:
    """``F.dropout(x, p, training=True)`` from hashed integer noise (see the module docstring).

    ``rows_of=(shape, dim, index)``: ``x`` is ``full.select(dim, index)`` of a tensor ``full`` of
    ``shape`` that was never computed (pass ``sink_token_select``); the noise is drawn for
    ``shape`` and the same index kept, so ``x`` gets the bits ``full`` would have had there."""
    shape = tuple(x.shape) if rows_of is None else tuple(rows_of[0])
    if math.prod(shape) < _HASHED_MAX and hooks_inductor.lower_pointwise_op(
        _noise_op._opoverload, torch.int64, _lowered_hash
    ):
        noise, bits = dropout_noise(shape, x.device), 32
    else:
        noise, bits = torch.empty(shape, dtype=torch.int32, device=x.device).random_(), 31
    if rows_of is not None:
        noise = noise.select(rows_of[1], rows_of[2]).reshape(x.shape)
    # 1 where noise >= threshold, else 0, in integer arithmetic: no bool tensor anywhere, which
    # Inductor would otherwise pick to save for the backward (1 byte, but a slow scalar store)
    keep = ((noise - round(p * 2**bits)) >> (noise.element_size() * 8 - 1)) + 1
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
    *,
    query_of: tuple[int, int] | None = None,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (training, ``dropout_p > 0``) as math with
    :func:`cheap_dropout`, as PyTorch's CPU math path computes it.

    ``query_of=(queries, index)``: ``q`` holds one query (size 1 at dim -2), the one at ``index``
    of ``queries`` (pass ``sink_token_select``); the dropout noise is that row of the noise all
    ``queries`` would have drawn."""
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
    rows_of = None
    if query_of is not None:
        queries, index = query_of
        shape = (*probs.shape[:-2], queries, probs.shape[-1])
        rows_of = (shape, probs.dim() - 2, index)
    return cheap_dropout(probs, dropout_p, rows_of=rows_of) @ v


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
