"""``fused_linear_cross_entropy``: the LM head's matmul and the cross-entropy, in row chunks.

A language model's last linear layer makes ``rows x vocabulary`` logits (GPT-2 124M at batch
2 x 256: 512 x 50257, 103 MB in fp32) only to reduce them to one loss. Unfused, the training step
keeps the logits, their log-softmax (saved for the backward) and the logits' gradient alive, each
that size, and streams each through memory several times. Liger-Kernel fuses the two by hand on
GPUs; this pass does it in the graph, on any device:

``linear(h, W, b) -> [float] -> [view/reshape] -> F.cross_entropy(., target, ignore_index=i,
reduction="mean"|"sum")`` becomes one call of :func:`linear_cross_entropy`, which walks the rows
in chunks: logits of the chunk, log-sum-exp, the loss, and — while the chunk is hot — the
gradient of the summed loss with respect to ``h``, ``W`` and ``b`` (softmax minus one-hot, two
matmuls). The backward only scales those by the incoming gradient. The matmul FLOPs are those of
the unfused step (no recomputation); the full logits never exist.

It applies only where the logits are used for nothing else: the loss is the only thing computed
from them and the graph does not return them. A Transformers causal LM returns its logits next
to the loss (``CausalLMOutput.logits``), so compiled whole its graph keeps them and the pass
leaves it alone (``split_at_returned_logits`` handles that case); a model or wrapper whose
forward returns the loss only gets the fused head. Graphs under autocast, with label smoothing,
class weights or symbolic shapes are left alone too, and so are logits under :data:`MIN_LOGITS`
elements (a classifier's head: cheap to materialise, and Inductor fuses its loss anyway).

Numerics: the same sums in another order (fp32: as close to a float64 reference as eager is).

Off by default (``CompileConfig(passes={"fused_linear_cross_entropy": True})`` turns it on): on
GPT-2 124M returning only its loss it did not shorten the step and raised the peak step memory
(measured: docs/compiler.md#passes, ``benchmarks/gpt2_base_limit.py``). The chunks do save the logits, their log-softmax and gradient, but
the weight's gradient (vocabulary x width: 154 MB) is made in the forward and kept until the
backward, which scales it into a second tensor of that size. What would fix it: scale in place
(the incoming gradient of a loss is 1 in nearly every loop), or recompute the chunk logits in the
backward (one more LM-head matmul per chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from hasten.compiler.hooks import usable
from hasten.compiler.hooks.nn import AUTOCAST_TARGETS, LINEAR_TARGETS
from hasten.compiler.passes._fx import arg, example_value, is_call
from hasten.compiler.passes.registry import record, register_pass

__all__ = ["CHUNK_BYTES", "MIN_LOGITS", "fused_linear_cross_entropy", "linear_cross_entropy"]

CHUNK_BYTES = 32 << 20  # fp32 logits of one chunk: 167 rows at GPT-2's 50257-token vocabulary
# Smaller logits (a classifier's head) are cheap to materialise, and Inductor fuses their
# cross-entropy with its neighbours: the opaque chunked op would only get in its way.
MIN_LOGITS = 1 << 20


def _chunk_rows(vocab: int) -> int:
    return max(16, min(4096, CHUNK_BYTES // (4 * max(1, vocab)) // 16 * 16))


@torch.library.custom_op("hasten::linear_cross_entropy", mutates_args=())
def _lce(
    h: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    target: torch.Tensor,
    ignore_index: int,
    needs_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of ``h @ w.T + b`` against ``target`` and its gradients (or empty
    tensors without ``needs_grad``)."""
    rows, vocab = h.shape[0], w.shape[0]
    chunk = _chunk_rows(vocab)
    loss = torch.zeros((), dtype=torch.float32, device=h.device)
    gh = torch.empty_like(h) if needs_grad else h.new_empty(0)
    gw = torch.zeros_like(w) if needs_grad else w.new_empty(0)
    gb = torch.zeros_like(b) if (needs_grad and b is not None) else h.new_empty(0)
    for start in range(0, rows, chunk):
        hc = h[start : start + chunk]
        tc = target[start : start + chunk]
        logits = hc @ w.t() if b is None else torch.addmm(b, hc, w.t())
        logits = logits.float()
        valid = tc != ignore_index
        safe = torch.where(valid, tc, 0)
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, safe.unsqueeze(1)).squeeze(1)
        loss += ((lse - picked) * valid).sum()
        if needs_grad:
            probs = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in place of the logits
            probs.scatter_add_(1, safe.unsqueeze(1), -valid.to(probs.dtype).unsqueeze(1))
            probs.mul_(valid.unsqueeze(1))
            g = probs.to(h.dtype)
            torch.mm(g, w, out=gh[start : start + chunk])
            gw.addmm_(g.t(), hc)
            if b is not None:
                gb += g.sum(0).to(gb.dtype)
    return loss, gh, gw, gb


@_lce.register_fake
def _lce_fake(h, w, b, target, ignore_index, needs_grad):
    loss = h.new_empty((), dtype=torch.float32)
    if not needs_grad:
        return loss, h.new_empty(0), w.new_empty(0), h.new_empty(0)
    gb = torch.empty_like(b) if b is not None else h.new_empty(0)
    return loss, torch.empty_like(h), torch.empty_like(w), gb


def _lce_setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[Any, ...]) -> None:
    _, _, b, _, _, needs_grad = inputs
    ctx.needs_grad = needs_grad
    ctx.has_bias = b is not None
    ctx.save_for_backward(*output[1:])


def _lce_backward(ctx: Any, g_loss: torch.Tensor, *_: Any) -> tuple[Any, ...]:
    if not ctx.needs_grad:
        raise RuntimeError(
            "hasten's fused linear cross-entropy was traced without gradients but is being "
            "differentiated; compile with CompileConfig(passes={'fused_linear_cross_entropy': "
            "False})"
        )
    gh, gw, gb = ctx.saved_tensors
    g = g_loss.to(gh.dtype)
    return gh * g, gw * g, (gb * g if ctx.has_bias else None), None, None, None


_lce.register_autograd(_lce_backward, setup_context=_lce_setup)


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """``F.cross_entropy(F.linear(h, weight, bias).float(), target, ignore_index=...,
    reduction=...)`` for 2-D ``h`` (rows x features), without materialising the logits.

    Raises:
        ValueError: for a reduction other than ``"mean"`` or ``"sum"``.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(
            f"linear_cross_entropy supports reduction 'mean' or 'sum', not {reduction!r}"
        )
    needs_grad = torch.is_grad_enabled() and (
        h.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    )
    loss = _lce(h, weight, bias, target, ignore_index, needs_grad)[0]
    if reduction == "sum":
        return loss
    # F.cross_entropy's mean: over the rows that are not ignored (NaN when none is)
    return loss / (target != ignore_index).sum()


_SHAPE_METHODS = ("view", "reshape", "float", "contiguous")
_SHAPE_FUNCTIONS = (torch.reshape, torch.Tensor.view, torch.Tensor.reshape, torch.Tensor.float)


@register_pass("fused_linear_cross_entropy", stage="pre_grad", default=False)
def fused_linear_cross_entropy(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> torch.fx.GraphModule:
    """LM head + cross-entropy computed in row chunks when the logits feed only the loss."""
    graph = gm.graph
    # the chunks would run in the weights' dtype, not autocast's; a torch whose autocast entry
    # hasten cannot find in a graph: the pass is skipped, as under autocast
    if not usable("nn.autocast_target") or any(is_call(n, AUTOCAST_TARGETS) for n in graph.nodes):
        return gm
    for ce in list(graph.find_nodes(op="call_function", target=F.cross_entropy)):
        found = _match(ce)
        if found is None:
            continue
        linear, h, weight, bias = found
        target = arg(ce, 1, "target")
        ignore_index = arg(ce, 4, "ignore_index", -100)
        reduction = arg(ce, 6, "reduction", "mean")
        h_val = example_value(h)
        with graph.inserting_before(ce):
            rows = graph.call_method("reshape", (h, -1, h_val.shape[-1]))
            rows.meta["example_value"] = h_val.reshape(-1, h_val.shape[-1])
            flat_target = graph.call_method("reshape", (target, -1))
            flat_target.meta["example_value"] = example_value(target).reshape(-1)
            fused = graph.call_function(
                linear_cross_entropy,
                (rows, weight, bias, flat_target),
                {"ignore_index": ignore_index, "reduction": reduction},
            )
            fused.meta["example_value"] = example_value(ce)
        ce.replace_all_uses_with(fused)
        graph.erase_node(ce)
        _erase_dead_chain(graph, linear)
        record("lm_head_cross_entropy_fused")
    return gm


def _match(ce: torch.fx.Node) -> tuple[torch.fx.Node, Any, Any, Any] | None:
    """``(linear node, h, weight, bias)`` if ``ce`` is a fusable cross-entropy of a linear."""
    if arg(ce, 2, "weight") is not None or arg(ce, 7, "label_smoothing", 0.0) != 0.0:
        return None
    if arg(ce, 6, "reduction", "mean") not in ("mean", "sum"):
        return None
    if not isinstance(arg(ce, 4, "ignore_index", -100), int):
        return None
    for name, i in (("size_average", 3), ("reduce", 5)):
        if arg(ce, i, name) is not None:
            return None
    x = arg(ce, 0, "input")
    target = example_value(arg(ce, 1, "target"))
    xv = example_value(x)
    if not isinstance(xv, torch.Tensor) or xv.dim() != 2 or not xv.is_floating_point():
        return None  # class dimension first (N, C); (N, C, d...) layouts are left alone
    if not isinstance(target, torch.Tensor) or target.is_floating_point():
        return None  # probabilities as targets
    node = x
    while isinstance(node, torch.fx.Node) and len(node.users) == 1:
        if is_call(node, LINEAR_TARGETS):
            break
        if not (is_call(node, _SHAPE_FUNCTIONS, _SHAPE_METHODS) and _shape_only(node)):
            return None
        node = node.args[0]
    else:
        return None
    linear = node
    h = arg(linear, 0, "input")
    weight = arg(linear, 1, "weight")
    bias = arg(linear, 2, "bias")
    hv, wv = example_value(h), example_value(weight)
    if not (isinstance(hv, torch.Tensor) and isinstance(wv, torch.Tensor)):
        return None
    if _symbolic(hv) or _symbolic(wv) or _symbolic(target):
        return None
    if wv.dim() != 2 or hv.shape[-1] != wv.shape[1] or xv.shape[-1] != wv.shape[0]:
        return None
    if hv.dtype != wv.dtype or xv.shape[0] * wv.shape[0] != example_value(linear).numel():
        return None
    if xv.numel() < MIN_LOGITS:
        return None
    return linear, h, weight, bias


def _shape_only(node: torch.fx.Node) -> bool:
    """``.float()`` / ``.contiguous()`` / ``view`` / ``reshape``: same values, other shape."""
    if node.op == "call_method" and node.target in ("float", "contiguous"):
        return len(node.args) == 1 and not node.kwargs
    return True


def _erase_dead_chain(graph: torch.fx.Graph, linear: torch.fx.Node) -> None:
    """Erase the now unused views of the logits and the linear itself."""
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            dead = node.op in ("call_function", "call_method") and not node.users
            if dead and (node is linear or _reaches(node, linear)):
                graph.erase_node(node)
                changed = True


def _reaches(node: torch.fx.Node, linear: torch.fx.Node) -> bool:
    n: Any = node
    while isinstance(n, torch.fx.Node) and n.op in ("call_function", "call_method"):
        if n is linear:
            return True
        if not (is_call(n, _SHAPE_FUNCTIONS, _SHAPE_METHODS)):
            return False
        n = n.args[0]
    return False


def _symbolic(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape)
