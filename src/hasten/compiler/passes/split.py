"""``split_at_returned_logits``: cut the graph after a large tensor it returns *and* uses further.

A Transformers language model computes ``logits`` and, given ``labels``, the loss from them, in
one graph, and returns both. The user backpropagates the loss; nobody backpropagates the logits.
In one compiled graph (one autograd node) the backward still needs a gradient for every output
that requires grad, so autograd hands it a materialized zero tensor the size of the logits
(batch x sequence x vocabulary: 32 MiB for GPT-2 small at batch 8), fills it, and the compiled
backward reads it and adds it in: a fill and a read of that size every step, and that much more
alive at the peak than ``torch.compile``'s graph-broken run (measured: docs/compiler.md#passes).

This pass cuts the graph into two at such a tensor ``X``: the part that does not depend on ``X``
(the model up to the logits, label shifting) and the part that does (the loss). Each part is
compiled by AOTAutograd and Inductor on its own (the backend does this, the way TorchDynamo's
DDPOptimizer compiles its buckets), so each is its own autograd node: ``X``'s gradient comes from
the loss part's backward, and from the user's own use of ``X`` too, if any, summed by autograd
as in eager mode. Nothing is approximated; the values are those of the unsplit graph.

A cut is made at one output tensor only: floating, requiring grad, at least
:data:`MIN_ELEMENTS` elements (smaller zero fills cost less than a graph boundary), used by nodes
other than the output, and whose dependents produce another output that requires grad (the loss;
otherwise no gradient would flow through the second part). Graphs with symbolic shapes are left
alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from hasten.compiler.passes._fx import example_value
from hasten.compiler.passes.registry import SPLIT_MARK, record, register_pass

__all__ = ["MIN_ELEMENTS", "split_at_returned_logits"]

MIN_ELEMENTS = 1 << 20  # 4 MiB in fp32


@register_pass("split_at_returned_logits", stage="pre_grad", default=True)
def split_at_returned_logits(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> torch.fx.GraphModule:
    """Split the graph after a large returned tensor the loss is computed from (no zero grad)."""
    found = _cut_node(gm)
    if found is None:
        return gm
    from torch.fx.passes.split_module import split_module

    _, later = found
    split = split_module(gm, gm, lambda n: 1 if n in later else 0, keep_original_order=True)
    _carry_dynamo_metadata(gm, split)
    setattr(split, SPLIT_MARK, True)
    record("graphs_split")
    return split


def _cut_node(gm: torch.fx.GraphModule) -> tuple[torch.fx.Node, set[torch.fx.Node]] | None:
    """The output node to cut after, with every node computed from it; ``None``: no cut."""
    if any(_symbolic(example_value(n)) for n in gm.graph.find_nodes(op="placeholder")):
        return None
    output = next(iter(gm.graph.find_nodes(op="output")))
    flat: list[torch.fx.Node] = []
    torch.fx.node.map_arg(output.args, flat.append)
    best: tuple[torch.fx.Node, set[torch.fx.Node]] | None = None
    for node in dict.fromkeys(flat):  # unique, in order
        value = example_value(node)
        if not _large_grad_tensor(value) or len(node.users) < 2:
            continue
        later = _dependents(node)
        if not any(n in later and _grad_tensor(example_value(n)) for n in flat if n is not node):
            continue
        if best is None or example_value(best[0]).numel() < value.numel():
            best = (node, later)
    return best


def _dependents(node: torch.fx.Node) -> set[torch.fx.Node]:
    """Every node computed from ``node`` (not the output node, not ``node`` itself)."""
    seen: set[torch.fx.Node] = set()
    stack = [u for u in node.users if u.op != "output"]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(u for u in n.users if u.op != "output")
    return seen


def _grad_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.requires_grad and value.is_floating_point()


def _large_grad_tensor(value: Any) -> bool:
    return _grad_tensor(value) and not _symbolic(value) and value.numel() >= MIN_ELEMENTS


def _symbolic(value: Any) -> bool:
    if isinstance(value, torch.SymInt):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in value.shape)
    return False


def _carry_dynamo_metadata(gm: torch.fx.GraphModule, split: torch.fx.GraphModule) -> None:
    """What AOTAutograd reads off a Dynamo graph (sources of inputs, graph meta), per part."""
    sources = {
        n.name: getattr(n, "_dynamo_source", None) for n in gm.graph.find_nodes(op="placeholder")
    }
    for name, part in split.named_children():
        if not isinstance(part, torch.fx.GraphModule) or not name.startswith("submod_"):
            continue
        part.meta = gm.meta
        if hasattr(gm, "_param_name_to_source"):
            part._param_name_to_source = gm._param_name_to_source
        for n in part.graph.find_nodes(op="placeholder"):
            n._dynamo_source = sources.get(n.name)
