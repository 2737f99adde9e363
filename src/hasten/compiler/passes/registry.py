"""The pass registry: every hasten graph pass is registered here by name.

A pass is a function ``(graph_module, example_inputs) -> graph_module`` that rewrites the graph in
place and reports what it changed through :func:`record`. It runs at one *stage* of the pipeline:

``"pre_grad"``
    on the graph TorchDynamo captured (torch-level ops, before AOTAutograd derives the backward),
    so a rewrite there gets its backward derived for free;
``"post_grad"``
    on each forward and backward graph AOTAutograd produced (ATen ops), through Inductor's
    ``post_grad_custom_pre_pass`` hook, just before Inductor generates kernels.

A pre-grad pass may also cut the graph into parts (``torch.fx.passes.split_module``: a graph
calling submodules ``submod_0``, ``submod_1``, ...) and set the attribute :data:`SPLIT_MARK` on
it; the backend then compiles each part on its own (see ``passes/split.py``).

Registering a pass::

    @register_pass("my_pass", stage="pre_grad", default=True)
    def my_pass(gm, example_inputs):
        for node in list(gm.graph.nodes):
            ...
            record("rewritten")
        return gm
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch.fx

__all__ = [
    "SPLIT_MARK",
    "STAGES",
    "GraphPass",
    "PassFn",
    "PassStats",
    "get_pass",
    "pass_names",
    "record",
    "register_pass",
    "run_passes",
]

Stage = Literal["pre_grad", "post_grad"]
STAGES: tuple[Stage, ...] = ("pre_grad", "post_grad")
PassFn = Callable[[torch.fx.GraphModule, Sequence[Any]], torch.fx.GraphModule]
SPLIT_MARK = "_hasten_split"  # set on a graph a pass split into parts to compile one by one


@dataclass(frozen=True)
class GraphPass:
    """A registered pass.

    Attributes:
        name: The name users enable or disable it by (``CompileConfig(passes={name: False})``).
        stage: Where in the pipeline it runs (see the module docstring).
        fn: The pass itself.
        default: Whether it runs unless the config disables it.
        summary: One line for reports and docs.
    """

    name: str
    stage: Stage
    fn: PassFn
    default: bool
    summary: str


@dataclass
class PassStats:
    """What one pass did to one graph.

    Attributes:
        name: The pass.
        stage: The stage it ran at.
        graph: Which graph (``"pre_grad"``, ``"forward"``, ``"backward"`` or ``"inference"``).
        nodes_before: Node count before the pass.
        nodes_after: Node count after it.
        changes: Counts of what the pass did, by kind (e.g. ``{"attention_rewritten": 4}``).
        seconds: Time the pass took.
    """

    name: str
    stage: str
    graph: str
    nodes_before: int
    nodes_after: int
    changes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.changes) or self.nodes_before != self.nodes_after


_REGISTRY: dict[str, GraphPass] = {}
_CURRENT: contextvars.ContextVar[PassStats | None] = contextvars.ContextVar(
    "hasten_pass_stats", default=None
)


def register_pass(
    name: str, *, stage: Stage, default: bool = True, summary: str = ""
) -> Callable[[PassFn], PassFn]:
    """Register ``fn`` as the pass ``name`` (a decorator). Names are unique."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; choose one of {STAGES}")

    def deco(fn: PassFn) -> PassFn:
        if name in _REGISTRY:
            raise ValueError(f"a pass named {name!r} is already registered")
        doc = summary or (fn.__doc__ or "").strip().splitlines()[0]
        _REGISTRY[name] = GraphPass(name, stage, fn, default, doc)
        return fn

    return deco


def get_pass(name: str) -> GraphPass:
    """The registered pass ``name``; ValueError naming the known passes otherwise."""
    _load_builtin_passes()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"unknown pass {name!r}; known passes: {', '.join(sorted(_REGISTRY))}"
        ) from None


def pass_names(stage: Stage | None = None) -> tuple[str, ...]:
    """Names of the registered passes (of one stage), in pipeline order.

    hasten's own passes run in the order of :data:`_BUILTIN_ORDER` (whatever order their modules
    were imported in), then other registered passes in registration order.
    """
    _load_builtin_passes()
    rank = {n: i for i, n in enumerate(_BUILTIN_ORDER)}
    names = sorted(_REGISTRY, key=lambda n: rank.get(n, len(rank)))  # stable: keeps the rest
    return tuple(n for n in names if stage is None or _REGISTRY[n].stage == stage)


def record(kind: str, count: int = 1) -> None:
    """Report a change from inside a running pass (a no-op outside :func:`run_passes`)."""
    stats = _CURRENT.get()
    if stats is not None:
        stats.changes[kind] += count


def run_passes(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    names: Sequence[str],
    *,
    graph: str,
) -> tuple[torch.fx.GraphModule, list[PassStats]]:
    """Run the passes ``names`` in order on ``gm``; returns the graph and one stats row per pass.

    A pass that changed the graph gets it linted and recompiled, so a broken rewrite fails here,
    naming the pass, instead of deep inside Inductor.
    """
    out: list[PassStats] = []
    for name in names:
        p = get_pass(name)
        stats = PassStats(name, p.stage, graph, len(gm.graph.nodes), 0)
        t0 = time.perf_counter()
        with _recording(stats):
            result = p.fn(gm, example_inputs)
        if not isinstance(result, torch.fx.GraphModule):
            raise TypeError(f"pass {name!r} returned {type(result).__name__}, not a GraphModule")
        gm = result
        if stats.changes:
            gm.graph.lint()
            gm.recompile()
        stats.nodes_after = len(gm.graph.nodes)
        stats.seconds = time.perf_counter() - t0
        out.append(stats)
    return gm, out


@contextlib.contextmanager
def _recording(stats: PassStats) -> Iterator[None]:
    token = _CURRENT.set(stats)
    try:
        yield
    finally:
        _CURRENT.reset(token)


_LOADED = False
# Pipeline order of the built-in passes: rewrites first, the split last (it cuts the rewritten
# graph into parts, which later pre-grad passes would not see into).
_BUILTIN_ORDER = (
    "attention_to_sdpa",
    "cheap_dropout_rng",
    "simplify",
    "sink_token_select",
    "fused_linear_cross_entropy",
    "split_at_returned_logits",
    "unfuse_bias_add",
    "tied_embedding_grad",
)


def _load_builtin_passes() -> None:
    # The built-in passes register themselves on import; importing them here (not at module top)
    # keeps the registry free of import cycles.
    global _LOADED
    if not _LOADED:
        _LOADED = True
        from hasten.compiler.passes import (  # noqa: F401
            attention,
            bias,
            dropout,
            linear_ce,
            simplify,
            split,
            tied_embedding,
            token_select,
        )
