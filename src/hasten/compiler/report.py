"""What happened when a model was compiled: graphs, graph breaks, recompiles, passes, time.

:class:`CompileRecord` is filled in while hasten compiles (by the backend, the recompile guard and
the fallback); :class:`CompileReport` is the read-only summary users get from
``hasten.explain(model, *inputs)`` or ``hasten.compiler.compile_report(model)``.
"""

from __future__ import annotations

import linecache
import logging
import re
import sys
import threading
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hasten.compiler.passes.registry import PassStats

__all__ = [
    "CompileRecord",
    "CompileReport",
    "GraphBreak",
    "GraphInfo",
    "Recompile",
    "compile_line",
    "graph_break_from",
    "graph_shape",
    "log_line",
    "record_of",
    "remember",
    "suggest_fix",
]

logger = logging.getLogger("hasten")


def compile_line(
    label: str,
    graphs: int,
    seconds: float,
    *,
    variant: str = "",
    details: Sequence[str] = (),
    recompile: str | None = None,
) -> str:
    """The one log line hasten writes per compile (or recompile) of a model or region.

    ``"hasten: compiled GPT2LMHeadModel: 1 graph, 9.8 s"``; ``details`` go between the graph
    count and the seconds (e.g. ``"1 block shared by 12"``, ``"from the cache"``); a recompile
    names the guard that failed. The one place that formats it, so it is extended here.

    Args:
        label: The model or region class.
        graphs: Graphs captured by this compile.
        seconds: Wall time of the call that compiled (tracing + backend).
        variant: The call's variant (``"train_grad"``, ``"eval_no_grad"`` ...); shown unless it
            is training's.
        details: Extra facts, in order.
        recompile: The guard that failed, when this compile is a recompile.
    """
    what = label if variant in ("", "train_grad") else f"{label} ({variant})"
    parts = [f"{graphs} graph{'' if graphs == 1 else 's'}", *details, f"{seconds:.1f} s"]
    line = f"hasten: {'recompiled' if recompile else 'compiled'} {what}: " + ", ".join(parts)
    if recompile:
        line += f"; guard that failed: {recompile.splitlines()[0].strip()}"
    return line


def log_line(line: str) -> None:
    """Log ``line`` at INFO on the ``"hasten"`` logger, shown on stderr unless logging is set up.

    When neither the ``"hasten"`` logger nor the root logger has a handler (a plain script),
    hasten gives its own logger a stderr handler once, as Transformers does for its own, so the
    line is seen; silence it with ``logging.getLogger("hasten").setLevel(logging.WARNING)``.
    Where logging is configured, records propagate to the application's handlers as usual.
    """
    if not logger.hasHandlers():
        handler = _UntilConfigured(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    logger.info(line)


class _UntilConfigured(logging.StreamHandler):  # type: ignore[type-arg]
    """hasten's stderr handler of a script without logging set up: it stands aside once the
    application gives the root logger a handler (``logging.basicConfig`` after hasten's first
    line), which the records reach anyway, so no line is shown twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if not (logger.propagate and logging.getLogger().handlers):
            super().emit(record)


@dataclass(frozen=True)
class GraphBreak:
    """One place where TorchDynamo had to end a graph and run Python.

    Attributes:
        reason: Dynamo's reason, first line (the full text is in ``detail``).
        detail: Dynamo's full explanation.
        location: ``"file.py:123 in fn"`` of the user code that caused it (innermost frame).
        source: That line of code, stripped ("" when the file is not readable).
        suggestion: What to change so the graph does not break.
    """

    reason: str
    detail: str
    location: str
    source: str
    suggestion: str


@dataclass(frozen=True)
class Recompile:
    """A recompilation: a guard of a compiled graph failed on new inputs.

    Attributes:
        function: The compiled function (code name) that recompiled.
        guard: The guard that failed, as Dynamo reports it (e.g. a size that changed).
    """

    function: str
    guard: str


@dataclass(frozen=True)
class GraphInfo:
    """One captured graph.

    Attributes:
        index: Order of capture.
        nodes: Node count of the captured (torch-level) graph, before hasten's passes.
        ops: Count of call nodes by op name (top 10 kept for the report).
        seconds: Time the backend spent compiling it (passes + AOTAutograd + Inductor).
        variant: Which kind of call it serves: ``"train_grad"`` (training), ``"eval_no_grad"``,
            ``"eval_inference"``, ... (see :class:`~hasten.compiler.runtime.CompiledForward`);
            ``""`` for graphs compiled by the backend alone.
    """

    index: int
    nodes: int
    ops: tuple[tuple[str, int], ...]
    seconds: float
    variant: str = ""


@dataclass(frozen=True)
class CompileReport:
    """A summary of one compiled model. ``str(report)`` reads well in a terminal.

    Attributes:
        graphs: Every captured graph (more than one means graph breaks).
        graph_breaks: Every graph break, with its reason, user source line and a suggested fix.
        recompiles: Every recompilation with the guard that failed.
        compile_seconds: Wall time of the calls that compiled (tracing + backend).
        backend_seconds: Time inside the backend (passes, AOTAutograd, Inductor).
        pass_stats: What each hasten pass did to each graph.
        fixes: Known traps hasten found, and whether and how it fixed them.
        fallback: Why the model runs eagerly, when compiling failed (``None`` otherwise).
        checks: The first-call check of each compiled variant against eager, one line each
            (see :mod:`hasten.compiler.check`).
        hooks_skipped: hasten's uses of torch internals that this torch lacks, so hasten
            compiled without them (plain Inductor there), one line each (see
            :mod:`hasten.compiler.hooks`).
    """

    graphs: tuple[GraphInfo, ...]
    graph_breaks: tuple[GraphBreak, ...]
    recompiles: tuple[Recompile, ...]
    compile_seconds: float
    backend_seconds: float
    pass_stats: tuple[PassStats, ...]
    fixes: tuple[str, ...]
    fallback: str | None
    checks: tuple[str, ...] = ()
    hooks_skipped: tuple[str, ...] = ()

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    def __str__(self) -> str:
        lines = [
            f"hasten compile report: {len(self.graphs)} graph(s), "
            f"{len(self.graph_breaks)} graph break(s), {len(self.recompiles)} recompile(s), "
            f"compile {self.compile_seconds:.1f} s (backend {self.backend_seconds:.1f} s)"
        ]
        if self.fallback:
            lines.append(f"  FALLBACK: running eagerly because compiling failed: {self.fallback}")
        for fix in self.fixes:
            lines.append(f"  trap: {fix}")
        for check in self.checks:
            lines.append(f"  first-call check: {check}")
        for hook in self.hooks_skipped:
            lines.append(f"  torch hook skipped: {hook}")
        # TorchDynamo can break twice at one line (in the frame that inlined the call, then
        # in the called frame it traces next): listed once, with how often
        seen: Counter[tuple[str, str]] = Counter(
            (gb.reason, gb.location) for gb in self.graph_breaks
        )
        listed: set[tuple[str, str]] = set()
        for gb in self.graph_breaks:
            key = (gb.reason, gb.location)
            if key in listed:
                continue
            listed.add(key)
            times = f" ({seen[key]} times)" if seen[key] > 1 else ""
            lines.append(f"  graph break {len(listed)}{times}: {gb.reason}")
            lines.append(f"    at {gb.location}" + (f":  {gb.source}" if gb.source else ""))
            lines.append(f"    fix: {gb.suggestion}")
        for rc in self.recompiles:
            guard = rc.guard.splitlines()[0] if rc.guard else "?"  # full text: rc.guard
            lines.append(f"  recompile of {rc.function}: guard failed: {guard}")
        for g in self.graphs:
            top = ", ".join(f"{name} x{n}" for name, n in g.ops[:5])
            kind = f" ({g.variant})" if g.variant else ""
            lines.append(f"  graph {g.index}{kind}: {g.nodes} nodes, {g.seconds:.1f} s  [{top}]")
        changed = [s for s in self.pass_stats if s.changed]
        if changed:
            lines.append("  passes:")
            for s in changed:
                what = ", ".join(f"{k} {v}" for k, v in sorted(s.changes.items()))
                lines.append(
                    f"    {s.name} on {s.graph}: {what} (nodes {s.nodes_before} -> {s.nodes_after})"
                )
        elif self.pass_stats:
            lines.append(f"  passes: {len(self.pass_stats)} ran, none changed a graph")
        return "\n".join(lines)


@dataclass
class CompileRecord:
    """Mutable log of one compiled model, filled in by the backend and the runtime wrapper."""

    graphs: list[GraphInfo] = field(default_factory=list)
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    recompiles: list[Recompile] = field(default_factory=list)
    pass_stats: list[PassStats] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    hooks_skipped: list[str] = field(default_factory=list)
    compile_seconds: float = 0.0
    backend_seconds: float = 0.0
    backend_calls: int = 0
    fallback: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Dynamo's reason objects already recorded, by id (kept alive here, so ids stay unique)
    _break_reasons: dict[int, Any] = field(default_factory=dict, repr=False)

    def add_graph(self, shape: GraphShape, seconds: float, variant: str = "") -> None:
        """Log one captured graph (its :func:`graph_shape`) and the seconds it took to compile.

        The graph break that ended it, if any, is recorded with every other break TorchDynamo
        counts when the frame's compile ends (:mod:`hasten.compiler.breaks`), or here when the
        graph was compiled outside TorchDynamo's compile callbacks.
        """
        from hasten.compiler.breaks import note_graph

        nodes, ops, reason = shape
        with self.lock:
            self.graphs.append(
                GraphInfo(len(self.graphs), nodes, tuple(ops.most_common(10)), seconds, variant)
            )
        from hasten.compiler.hooks.dynamo import is_graph_break

        if reason is not None and is_graph_break(reason) and not note_graph(self):
            self.add_break(reason)

    def add_break(self, reason: Any) -> None:
        """Log one graph break from Dynamo's ``GraphCompileReason`` (each reason once; not the
        checkpoint graph of a break Dynamo could not resume from, which it does not count as a
        graph break either: :data:`hasten.compiler.breaks.UNRESUMABLE`)."""
        from hasten.compiler.breaks import UNRESUMABLE

        if getattr(reason, "reason", None) == UNRESUMABLE:
            return
        with self.lock:
            if id(reason) in self._break_reasons:
                return
            self._break_reasons[id(reason)] = reason
            self.graph_breaks.append(graph_break_from(reason))

    def report(self) -> CompileReport:
        with self.lock:
            return CompileReport(
                graphs=tuple(self.graphs),
                graph_breaks=tuple(self.graph_breaks),
                recompiles=tuple(self.recompiles),
                compile_seconds=self.compile_seconds,
                backend_seconds=self.backend_seconds,
                pass_stats=tuple(self.pass_stats),
                fixes=tuple(self.fixes),
                fallback=self.fallback,
                checks=tuple(self.checks),
                hooks_skipped=tuple(self.hooks_skipped),
            )


RECORDS: weakref.WeakKeyDictionary[Any, CompileRecord] = weakref.WeakKeyDictionary()
"""The record of every model ``hasten.compile`` compiled (and of its DDP wrapper), by model."""


def remember(model: Any, record: CompileRecord) -> None:
    """Keep ``record`` as ``model``'s (for :func:`record_of` and ``compile_report``)."""
    RECORDS[model] = record


def record_of(model: Any) -> CompileRecord | None:
    """The record of a model ``hasten.compile`` compiled (``None`` for any other object)."""
    return RECORDS.get(model)


GraphShape = tuple[int, "Counter[str]", Any]


def graph_shape(gm: Any) -> GraphShape:
    """Node count, op counts and Dynamo's compile reason of a captured graph."""
    ops: Counter[str] = Counter(
        _op_name(n.target) for n in gm.graph.nodes if n.op in ("call_function", "call_method")
    )
    return len(gm.graph.nodes), ops, getattr(gm, "compile_subgraph_reason", None)


def _op_name(target: Any) -> str:
    if isinstance(target, str):
        return f".{target}"
    return getattr(target, "__name__", None) or str(target)


def graph_break_from(reason: Any) -> GraphBreak:
    """A :class:`GraphBreak` from Dynamo's ``GraphCompileReason``."""
    detail = str(reason.reason).strip()
    first = _summary(detail)
    frames = list(getattr(reason, "user_stack", []) or [])
    location, source = "<unknown>", ""
    if frames:
        f = frames[-1]
        location = f"{f.filename}:{f.lineno} in {f.name}"
        source = (f.line or linecache.getline(f.filename, f.lineno or 0)).strip()
    return GraphBreak(first, detail, location, source, suggest_fix(detail, frames))


def _summary(detail: str) -> str:
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    if not lines:
        return "unknown reason"
    head = lines[0]
    for ln in lines[1:3]:
        if ln.startswith("Explanation:"):
            return f"{head}: {ln.removeprefix('Explanation:').strip()}"
    return head


# (pattern in Dynamo's reason or the user's frames, fix) -- first match wins
_FIXES: tuple[tuple[str, str], ...] = (
    (
        r"loss_function|loss_type",
        "Transformers logs a warning inside forward when model.loss_type is unset; set "
        "model.loss_type (e.g. 'ForCausalLM') -- hasten.compile does this when it is safe",
    ),
    (
        r"\bprint\b|logging|logger|warn",
        "move the print/log/warning out of forward, or skip it while compiling: "
        "`if not torch.compiler.is_compiling(): ...`",
    ),
    (
        r"\.item\(\)|Tensor\.item|data-dependent|data dependent|\.tolist|nonzero|unbacked",
        "a Python value is read from a tensor (.item()/.tolist()/bool(tensor)/data-dependent "
        "shape): keep it as a tensor (torch.where instead of if), or allow it with "
        "torch._dynamo.config.capture_scalar_outputs=True",
    ),
    (
        r"disable|skip|forbidden",
        "a function marked torch.compiler.disable (or a skipped file) is called: "
        "move it out of the compiled region or remove the marker",
    ),
    (
        r"numpy|np\.",
        "NumPy on tensors leaves the graph: use the torch equivalent",
    ),
    (
        r"generator|iter|yield",
        "iterating a generator/iterator built outside the graph: build a list, or iterate "
        "over modules/tensors directly",
    ),
)


def suggest_fix(detail: str, frames: list[Any] | None = None) -> str:
    """A suggested fix for a graph break, from its reason and the user's stack."""
    text = (
        detail
        + "\n"
        + "\n".join(
            f"{getattr(f, 'name', '')} {getattr(f, 'line', '') or ''}" for f in frames or []
        )
    )
    for pattern, fix in _FIXES:
        if re.search(pattern, text):
            return fix
    return (
        "move the unsupported call out of forward (or behind "
        "`if not torch.compiler.is_compiling()`); see the reason above"
    )
