"""Graph breaks as TorchDynamo counts them, each recorded on the hasten model it happened in.

TorchDynamo counts a graph break (``torch._dynamo.utils.counters["graph_break"]``) every time it
ends a graph at an unsupported instruction, and keeps the reason, with the user's stack, in
``torch._dynamo.utils.graph_break_reasons``. hasten used to read breaks only off the graphs its
backend compiles (``gm.compile_subgraph_reason``), and Dynamo calls no backend for an *empty*
graph: a break at the start of a frame, or right after another break, or in a frame that then
runs eagerly, ends a graph with nothing in it. Those breaks were missing from the report: a toy
``forward`` starting with a break, TorchDynamo 3, the report 1; tiny Transformers configs, two
training steps, breaks on the compiled graphs against Dynamo's count: Longformer 11 of 16,
Wav2Vec2 3 of 16.

So hasten reads every break where Dynamo records it. After each frame TorchDynamo compiles (its
end-of-compile callback, ``torch._dynamo.callback_handler``), the reasons added to
``graph_break_reasons`` since the last one go, in order, to the record of the
hasten model whose call is being compiled: the ``CompiledCode._run_compiled`` frame on the stack
(hasten's own runtime, whatever TorchDynamo frames sit between), else the record of a hasten
backend that ran during the compile (``torch.compile(fn, backend="hasten")``). Compiles of
anything else are left alone. A break Dynamo cannot resume from (it compiles up to its last
checkpoint, reason ``"step_unsupported"``, and runs the rest of the frame eagerly) is counted by
Dynamo as ``"unimplemented"``, not as a graph break, and so not listed either: the report's
count is ``counters["graph_break"]``'s (tiny Wav2Vec2 through ``hasten.compile``, whose
first-call check retried the compile three times: 56 both).
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

from hasten.compiler import hooks
from hasten.compiler.hooks import dynamo as dynamo_hooks

if TYPE_CHECKING:
    from hasten.compiler.report import CompileRecord

__all__ = ["UNRESUMABLE", "note_graph", "track"]

_LOCK = threading.Lock()
_seen = 0  # reasons of graph_break_reasons already handed out
_registered_once = False
_backend_records: list[CompileRecord] = []  # hasten backends that ran in the current compile
# The reason of the graph Dynamo compiles up to its last checkpoint after a break it cannot
# resume from (in a try block, a failed backend compile), when it then runs the rest of the
# frame eagerly. Dynamo counts that break as "unimplemented", not in counters["graph_break"],
# so it is not a graph break of the report either (the frame runs eagerly from there).
UNRESUMABLE = "step_unsupported"


def track() -> bool:
    """Make sure the end-of-compile callback is registered; whether breaks are tracked this way.

    Called whenever a hasten backend is made or compiles a graph: ``torch._dynamo.reset()``
    clears TorchDynamo's callbacks (and its list of reasons), so it is registered again then.
    """
    global _seen, _registered_once
    if not hooks.usable("dynamo.compile_callbacks"):  # breaks are read off the compiled graphs
        return False
    with _LOCK:
        if not dynamo_hooks.has_end_callback(_on_end):
            if not _registered_once:  # reasons from before hasten's first compile are not ours
                _seen, _registered_once = len(dynamo_hooks.graph_break_reason_list()), True
            # after a reset, the list starts empty (_on_end starts over), and reasons of the
            # compile running now, if any, are still handed out at its end
            dynamo_hooks.add_end_callback(_on_end)
    return True


def note_graph(record: CompileRecord) -> bool:
    """A hasten backend compiled a graph for ``record``. ``True``: its break, if any, is recorded
    by the end-of-compile callback (in Dynamo's order); ``False``: record it now (no TorchDynamo
    compile is running, or the callback cannot be registered)."""
    if not track() or dynamo_hooks.compile_id() is None:
        return False
    with _LOCK:
        if all(r is not record for r in _backend_records):
            _backend_records.append(record)
    return True


def _on_end(*_: Any) -> None:
    """After each frame TorchDynamo compiles: its new graph-break reasons to their record."""
    global _seen
    graph_break_reasons = dynamo_hooks.graph_break_reason_list()
    with _LOCK:
        if len(graph_break_reasons) < _seen:  # torch._dynamo.reset() cleared the list
            _seen = 0
        new = list(graph_break_reasons[_seen:])
        _seen = len(graph_break_reasons)
        backends, _backend_records[:] = list(_backend_records), []
    if not new:
        return
    record = _record_on_stack() or (backends[-1] if backends else None)
    if record is None:
        return  # a compile of something hasten did not compile
    for reason in new:
        record.add_break(reason)


def _record_on_stack() -> CompileRecord | None:
    """The record of the innermost hasten-compiled call this thread is in, if any."""
    from hasten.compiler import runtime

    code = runtime.CompiledCode._run_compiled.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            owner = frame.f_locals.get("self")
            if isinstance(owner, runtime.CompiledCode):
                return owner.record
        frame = frame.f_back
    return None
