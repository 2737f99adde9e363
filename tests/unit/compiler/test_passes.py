"""Registry-driven contract tests: every hasten pass preserves outputs and gradients on its cases
and reports what it changed. Graphs are captured by TorchDynamo and run eagerly (no Inductor), so
these are quick; cases that build Transformers models are marked slow.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hasten.compiler.passes import get_pass, pass_names, run_passes
from hasten.compiler.passes.registry import PassStats, record, register_pass

from ._pass_cases import PASS_CASES, NanoGPTAttention, PassCase

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# fp32 tolerances: a pass may reorder floating-point work (SDPA fuses the softmax), not change it
RTOL, ATOL = 1e-5, 1e-6


def _run_with_pass(module, inputs, name: str) -> tuple[Any, list[PassStats]]:
    """Run ``module`` through TorchDynamo with only pass ``name``; graphs execute eagerly."""
    stats: list[PassStats] = []
    stage = get_pass(name).stage

    def rewrite(gm, example_inputs):
        gm, st = run_passes(gm, example_inputs, [name], graph=stage)
        stats.extend(st)
        return gm

    if stage == "pre_grad":

        def backend(gm, example_inputs):
            return rewrite(gm, example_inputs).forward

    else:
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd
        from torch._inductor.decomposition import select_decomp_table

        # post-grad passes see the graphs Inductor gives them: decomposed by Inductor's table
        backend = aot_autograd(
            fw_compiler=lambda gm, ex: make_boxed_func(rewrite(gm, ex).forward),
            bw_compiler=lambda gm, ex: make_boxed_func(rewrite(gm, ex).forward),
            decompositions=select_decomp_table(),
        )
    torch._dynamo.reset()
    try:
        out = torch.compile(module, backend=backend, fullgraph=False)(*inputs)
    finally:
        torch._dynamo.reset()
    return out, stats


def _grads(module, inputs) -> list[torch.Tensor]:
    tensors = [p for p in module.parameters()] + [
        x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad
    ]
    return [t.grad.clone() if t.grad is not None else torch.zeros_like(t) for t in tensors]


def _fwd_bwd(module, inputs, run) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    for p in module.parameters():
        p.grad = None
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x.grad = None
    out = run(module, inputs)
    outs = [o for o in torch.utils._pytree.tree_leaves(out) if isinstance(o, torch.Tensor)]
    sum(o.float().pow(2).mean() for o in outs if o.is_floating_point()).backward()
    return [o.detach() for o in outs], _grads(module, inputs)


def _cases() -> list[Any]:
    params = []
    for name, cases in PASS_CASES.items():
        for case in cases:
            marks = [pytest.mark.slow] if case.slow else []
            params.append(pytest.param(name, case, id=f"{name}-{case.name}", marks=marks))
    return params


def test_every_registered_pass_has_contract_cases():
    missing = set(pass_names()) - set(PASS_CASES)
    assert not missing, f"passes without contract cases in _pass_cases.py: {missing}"
    for name, cases in PASS_CASES.items():
        assert any(c.min_changes > 0 for c in cases), f"{name}: no case it must change"


@pytest.mark.parametrize(("name", "case"), _cases())
def test_pass_preserves_outputs_and_gradients(name: str, case: PassCase):
    torch.manual_seed(0)
    module = case.build()
    inputs = case.inputs(torch.Generator().manual_seed(1))
    ref_out, ref_grads = _fwd_bwd(module, inputs, lambda m, x: m(*x))
    runs: list[list[PassStats]] = []

    def compiled(m, x):
        out, st = _run_with_pass(m, x, name)
        runs.append(st)  # the list itself: the backward graph compiles (and adds) at backward
        return out

    out, grads = _fwd_bwd(module, inputs, compiled)
    stats = [s for st in runs for s in st]
    assert stats, "the pass never ran (no graph captured?)"
    changes = sum(sum(s.changes.values()) for s in stats)
    assert changes >= case.min_changes, f"expected >= {case.min_changes} changes, got {stats}"
    if case.min_changes == 0:
        assert changes == 0
    if case.check is not None:  # a pass that draws other random numbers than eager
        case.check(inputs, out, grads[len(list(module.parameters())) :])
        return
    for a, b in zip(ref_out, out):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL)
    for a, b in zip(ref_grads, grads):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL)
    for s in stats:  # reports are consistent
        assert s.name == name and s.seconds >= 0
        assert (s.nodes_after != s.nodes_before) <= s.changed


def _captured_graph(module, inputs):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, example_inputs))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(module, backend=backend)(*inputs)
    torch._dynamo.reset()
    assert len(graphs) == 1
    return graphs[0]


def test_attention_rewrite_keeps_dropout_probability_in_training():
    module = NanoGPTAttention(dropout=0.1).train()
    gm, ex = _captured_graph(module, (torch.randn(2, 16, 32),))
    gm, stats = run_passes(gm, ex, ["attention_to_sdpa"], graph="pre_grad")
    (sdpa,) = [n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention]
    assert sdpa.kwargs["dropout_p"] == pytest.approx(0.1)
    assert sdpa.kwargs["scale"] == pytest.approx(1 / (32 // 4) ** 0.5)  # head dim 8
    assert not [n for n in gm.graph.nodes if n.target is F.softmax]
    assert stats[0].changes["attention_rewritten"] == 1


def test_attention_rewrite_in_eval_drops_dropout():
    module = NanoGPTAttention(dropout=0.1).eval()
    gm, ex = _captured_graph(module, (torch.randn(2, 16, 32),))
    gm, _ = run_passes(gm, ex, ["attention_to_sdpa"], graph="pre_grad")
    (sdpa,) = [n for n in gm.graph.nodes if n.target is F.scaled_dot_product_attention]
    assert sdpa.kwargs["dropout_p"] == 0.0


def test_registry_rejects_duplicates_and_reports_unknown_names():
    with pytest.raises(ValueError, match="already registered"):
        register_pass("attention_to_sdpa", stage="pre_grad")(lambda gm, ex: gm)
    with pytest.raises(ValueError, match="known passes"):
        get_pass("nope")
    with pytest.raises(ValueError, match="unknown stage"):
        register_pass("x", stage="later")  # type: ignore[arg-type]


def test_run_passes_rejects_a_pass_that_returns_something_else(monkeypatch):
    from hasten.compiler.passes import registry

    def bad(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        record("did_something")
        return None

    monkeypatch.setitem(
        registry._REGISTRY, "bad_pass", registry.GraphPass("bad_pass", "pre_grad", bad, False, "")
    )
    gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="bad_pass"):
        run_passes(gm, [], ["bad_pass"], graph="pre_grad")


def test_record_outside_a_pass_is_a_no_op():
    record("nothing")  # must not raise


def test_builtin_passes_run_in_pipeline_order_whatever_the_import_order():
    # the split cuts the graph into parts that later pre-grad passes would not see into
    assert pass_names("pre_grad") == (
        "attention_to_sdpa",
        "cheap_dropout_rng",
        "simplify",
        "sink_token_select",
        "fused_linear_cross_entropy",
        "split_at_returned_logits",
    )
    assert pass_names("post_grad") == ("unfuse_bias_add", "tied_embedding_grad")
