"""``unfuse_bias_add``: on CPU, ``addmm(bias, x, w)`` feeding only pointwise ops -> ``mm`` + add.

ATen's CPU ``addmm`` first copies the broadcast bias into the whole output, then runs the GEMM
accumulating onto it (beta = 1): one extra write and one extra read of the output, which for a
freshly allocated output also pays the page faults (``aten::copy_`` under ``aten::addmm`` in a
profile; measured: docs/compiler.md#passes). When every use of the result is pointwise (GELU, a residual add, dropout, through views), the
bias add can instead run inside the kernel Inductor generates for those uses, for free. Inductor
does exactly this on GPUs (``unfuse_bias_add_to_pointwise``) but not on CPU; this pass does it
for CPU fp32 graphs. (bf16/fp16 are left alone: the mm output would be rounded before the bias
is added.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from hasten.compiler.passes.registry import record, register_pass

__all__ = ["unfuse_bias_add"]

aten = torch.ops.aten


@register_pass("unfuse_bias_add", stage="post_grad", default=True)
def unfuse_bias_add(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
) -> torch.fx.GraphModule:
    """CPU fp32 ``addmm`` whose uses are all pointwise -> ``mm`` + bias add fused into them."""
    from hasten.compiler.hooks.inductor import is_pointwise_use

    graph = gm.graph
    for node in list(graph.find_nodes(op="call_function", target=aten.addmm.default)):
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            continue
        bias, x1, x2 = node.args[:3]
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            continue
        if value.dtype != torch.float32 or not node.users:
            continue
        if not all(is_pointwise_use(u) for u in node.users):
            continue
        with graph.inserting_before(node):
            mm = graph.call_function(aten.mm.default, (x1, x2))
            mm.meta["val"] = value
            add = graph.call_function(aten.add.Tensor, (mm, bias))
            add.meta["val"] = value
        node.replace_all_uses_with(add)
        graph.erase_node(node)
        record("addmm_unfused")
    return gm
