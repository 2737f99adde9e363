"""CompileReport pieces: graph-break summaries, suggested fixes, the printed report."""

from __future__ import annotations

import traceback
from collections import Counter
from types import SimpleNamespace

from hasten.compiler.passes.registry import PassStats
from hasten.compiler.report import CompileRecord, graph_break_from, suggest_fix


def _reason(text: str, line: str = "print('x')") -> SimpleNamespace:
    frame = traceback.FrameSummary("model.py", 12, "forward", line=line)
    return SimpleNamespace(reason=text, user_stack=[frame], graph_break=True)


def test_graph_break_keeps_reason_location_source_and_fix():
    gb = graph_break_from(
        _reason("Failed to trace builtin operator\n  Explanation: Dynamo does not know `print`")
    )
    assert gb.reason == "Failed to trace builtin operator: Dynamo does not know `print`"
    assert gb.location == "model.py:12 in forward"
    assert gb.source == "print('x')"
    assert "torch.compiler.is_compiling" in gb.suggestion


def test_suggestions_cover_the_common_causes():
    assert "loss_type" in suggest_fix(
        "step_unsupported", [SimpleNamespace(name="forward", line="loss = self.loss_function(")]
    )
    assert "capture_scalar_outputs" in suggest_fix("Tensor.item() call")
    assert "torch equivalent" in suggest_fix("call to numpy function np.sum")
    assert "move the unsupported call" in suggest_fix("something else entirely")


def test_report_text_lists_everything():
    rec = CompileRecord()
    gm = SimpleNamespace(graph=SimpleNamespace(nodes=[]), compile_subgraph_reason=_reason("print"))
    rec.add_graph((5, Counter({"linear": 2}), gm.compile_subgraph_reason), 1.5)
    rec.fixes.append("model: something fixed")
    st = PassStats(
        "attention_to_sdpa", "pre_grad", "pre_grad", 30, 26, Counter({"attention_rewritten": 1})
    )
    rec.pass_stats.append(st)
    rec.compile_seconds, rec.backend_seconds = 2.0, 1.5
    text = str(rec.report())
    assert "1 graph(s), 1 graph break(s)" in text
    assert "model.py:12 in forward" in text
    assert "trap: model: something fixed" in text
    assert "attention_to_sdpa on pre_grad: attention_rewritten 1 (nodes 30 -> 26)" in text
    assert "linear x2" in text


def test_one_compile_line_format():
    from hasten.compiler.report import compile_line

    assert (
        compile_line("GPT2LMHeadModel", 1, 9.84)
        == "hasten: compiled GPT2LMHeadModel: 1 graph, 9.8 s"
    )
    assert (
        compile_line("M", 3, 2.0, variant="eval_no_grad", details=("from the cache",))
        == "hasten: compiled M (eval_no_grad): 3 graphs, from the cache, 2.0 s"
    )
    line = compile_line("M", 1, 1.0, recompile="tensor 'x' size mismatch at index 0\nmore")
    assert line == (
        "hasten: recompiled M: 1 graph, 1.0 s; guard that failed: tensor 'x' size mismatch at index 0"
    )
