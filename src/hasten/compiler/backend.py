"""The ``hasten`` TorchDynamo backend: hasten's passes, then AOTAutograd + Inductor.

The pipeline, for every graph TorchDynamo captures::

    Dynamo graph (torch ops)
      -> hasten "pre_grad" passes            e.g. attention_to_sdpa
      -> Inductor compile_fx, with config patches for this compile:
           AOTAutograd: joint forward/backward graph, partitioned
           -> hasten "post_grad" passes       through Inductor's post_grad_custom_pre_pass hook,
                                              a custom graph pass whose uuid() hashes the pass
                                              sources, so the FX graph cache still hits
           -> Inductor codegen (C++/OpenMP on CPU, Triton on GPU)

The backward is lowered eagerly (with the forward), so a compile failure in it surfaces on the
first forward call, where hasten's fallback can catch it, not in ``loss.backward()``.

After ``pip install hasten`` the backend is found by name through the ``torch_dynamo_backends``
entry point: ``torch.compile(model, backend="hasten")`` needs no import. ``mode`` and ``options``
of ``torch.compile`` are honoured: ``options`` are Inductor options, plus ``"passes"`` (a mapping
like ``CompileConfig.passes``).

Inductor and Dynamo are reached only through :mod:`hasten.compiler.hooks`: a hook this torch
lacks (the post-grad hook, a config key, the split compile) is skipped and named in the report.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from hasten.compiler import hooks
from hasten.compiler.breaks import track as track_graph_breaks
from hasten.compiler.cache import ensure_intact
from hasten.compiler.config import CompileConfig
from hasten.compiler.hooks import inductor
from hasten.compiler.hooks.kernels import batched_kernels
from hasten.compiler.hooks.split import compile_parts
from hasten.compiler.hooks.vec_isa import vec_isa_patch
from hasten.compiler.passes.registry import SPLIT_MARK, get_pass, run_passes
from hasten.compiler.report import CompileRecord, graph_shape

__all__ = ["HastenBackend", "hasten_backend", "inductor_patches"]


class HastenBackend:
    """A TorchDynamo backend callable bound to one :class:`CompileConfig` and one record.

    Args:
        config: What to do (passes, mode, Inductor options, cache dir). Defaults to
            ``CompileConfig()``.
        record: Where to log graphs, pass statistics and compile time (a fresh one by default).
        variant: A label the record keeps with every graph this backend compiles (e.g.
            ``"eval_no_grad"``, see :class:`~hasten.compiler.runtime.CompiledForward`).
        keep_sources: Keep each captured graph as standalone code (``sources``), for the
            reproducer a failed first-call check writes (:mod:`hasten.compiler.check`).
    """

    def __init__(
        self,
        config: CompileConfig | None = None,
        record: CompileRecord | None = None,
        *,
        variant: str = "",
        keep_sources: bool = False,
    ):
        self.__name__ = "hasten"
        self.keep_sources = keep_sources
        track_graph_breaks()  # every break TorchDynamo counts, empty graphs' too (breaks.py)
        self.sources: list[
            Any
        ] = []  # graphs as standalone code, for a reproducer (check.py)  # how TorchDynamo names the backend in errors and logs
        self.variant = variant
        self.config = config or CompileConfig()
        self.record = record if record is not None else CompileRecord()
        enabled = self.config.enabled_passes()
        self.pre_grad = tuple(n for n in enabled if get_pass(n).stage == "pre_grad")
        self.post_grad = tuple(n for n in enabled if get_pass(n).stage == "post_grad")

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **_: Any
    ) -> Callable[..., Any]:
        t0 = time.perf_counter()
        shape = graph_shape(gm)  # before the passes rewrite gm in place
        if self.keep_sources and len(self.sources) < 8:
            from hasten.compiler.check import graph_source

            self.sources.append(graph_source(gm, example_inputs))
        device = _device_type(example_inputs)
        gm, stats = run_passes(gm, example_inputs, self.pre_grad, graph="pre_grad")
        with self.record.lock:
            self.record.pass_stats.extend(stats)
            self.record.backend_calls += 1
        patches = inductor_patches(self.config, device, self._post_grad_hook())
        marked = _hasten_functions(gm)
        if marked:
            key = inductor.CACHEABLE_FUNCTIONS
            patches[key] = {**patches.get(key, {}), **marked}
        self._note_skipped_hooks()
        with inductor.scoped(self.config.cache_dir):
            ensure_intact(self.config.cache_dir)  # once per process and directory (cache.py)
            if device == "cpu" and inductor.VEC_ISA_OK not in patches:
                patches.update(vec_isa_patch())
            patches = inductor.supported_patches(patches)  # hasten's keys this torch has
            batch = batched_kernels() if device == "cpu" else contextlib.nullcontext()
            with batch:  # a graph's CPU kernels built as a few libraries (hooks/kernels.py)
                if getattr(gm, SPLIT_MARK, False):
                    compiled = compile_parts(gm, example_inputs, patches)
                else:
                    compiled = inductor.compile_fx(gm, example_inputs, patches)
        seconds = time.perf_counter() - t0
        self.record.add_graph(shape, seconds, self.variant)
        with self.record.lock:
            self.record.backend_seconds += seconds
        return compiled

    def _post_grad_hook(self) -> Any:
        if not self.post_grad:
            return None
        passes = _PostGradPasses(self.post_grad, self.record)
        return inductor.post_grad_pass(passes.run, passes.uuid)

    def _note_skipped_hooks(self) -> None:
        """Name each torch hook this torch lacks in the report, once per record."""
        skipped = hooks.skipped()
        if not skipped:
            return
        with self.record.lock:
            for line in skipped:
                if line not in self.record.hooks_skipped:
                    self.record.hooks_skipped.append(line)


class _PostGradPasses:
    """hasten's post-grad passes as one Inductor custom pass (run on forward and backward)."""

    def __init__(self, names: tuple[str, ...], record: CompileRecord):
        self.names = names
        self.record = record

    def run(self, graph: torch.fx.Graph) -> None:
        gm = graph.owning_module
        if gm is None:  # Inductor always hands over an owned graph; be safe anyway
            return
        inputs = [n.meta.get("val") for n in graph.find_nodes(op="placeholder")]
        out, stats = run_passes(gm, inputs, self.names, graph="post_grad")
        if out is not gm:
            raise RuntimeError("a post_grad pass must rewrite its graph in place")
        with self.record.lock:
            self.record.pass_stats.extend(stats)

    def uuid(self) -> Any:
        # Stable across processes: the pass sources and which passes run. Inductor folds this
        # into its FX-graph cache key, so a warm cache still hits (and a changed pass misses).
        files = tuple(sorted({get_pass(n).fn.__code__.co_filename for n in self.names}))
        return (inductor.file_hash(files), self.names)


# Inductor settings hasten changes per device, each measured on the benchmark models (see
# docs/compiler.md): on CPU, Inductor's in-kernel dropout RNG (scalar Philox per element) cost
# ~20 ns an element, a quarter of BERT-small's fp32 step. With ATen's RNG (fallback_random) the
# cheap_dropout_rng pass draws one key per dropout from the default generator, as its eager
# reference does, and hashes the elements in the fused kernels.
_DEVICE_DEFAULTS: dict[str, dict[str, Any]] = {"cpu": {inductor.FALLBACK_RANDOM: True}}


def inductor_patches(
    config: CompileConfig, device_type: str, post_grad: Any = None
) -> dict[str, Any]:
    """The Inductor config hasten compiles with: mode options, hasten's choices, the hook
    (``post_grad``: an Inductor custom graph pass, see :func:`hooks.inductor.post_grad_pass`).
    hasten's own keys this torch lacks are left out."""
    mode = config.mode
    if device_type != "cuda" and mode == "max-autotune":
        mode = "max-autotune-no-cudagraphs"  # CUDA graphs mean nothing off CUDA
    patches: dict[str, Any] = inductor.mode_options(mode)
    patches.update(_DEVICE_DEFAULTS.get(device_type, {}))
    if post_grad is not None:
        patches[inductor.POST_GRAD_PASS] = post_grad
    patches.update(config.inductor_options)
    return inductor.supported_patches(patches)


def _hasten_functions(gm: torch.fx.GraphModule) -> dict[str, str]:
    """hasten's own Python functions the pre-grad passes put in ``gm``, keyed by source hash.

    AOTAutograd's cache refuses a graph that calls a Python function it does not know (e.g.
    ``cheap_dropout``), so without this every warm start re-traced the joint graph. Inductor's
    ``unsafe_marked_cacheable_functions`` lets named functions in, and its values are part of the
    cache key: each is the hash of the file that defines the function, so editing it misses.
    """
    marked: dict[str, str] = {}
    for g in (m for m in gm.modules() if isinstance(m, torch.fx.GraphModule)):  # gm included
        for node in g.graph.nodes:
            fn = node.target
            if node.op != "call_function" or not callable(fn):
                continue
            module = getattr(fn, "__module__", None) or ""
            code = getattr(fn, "__code__", None)
            if module.startswith("hasten.") and code is not None:
                name = f"{module}.{fn.__name__}"
                marked[name] = inductor.file_hash((code.co_filename,))
    return marked


def _device_type(example_inputs: Sequence[Any]) -> str:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return x.device.type
    return "cpu"


def _options_config(mode: str | None, options: Mapping[str, Any] | None) -> CompileConfig:
    opts = dict(options or {})
    passes = opts.pop("passes", {})
    return CompileConfig(mode=mode or "default", passes=passes, inductor_options=opts)  # type: ignore[arg-type]


def hasten_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    *,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Callable[..., Any]:
    """The ``"hasten"`` backend for ``torch.compile(model, backend="hasten")``.

    ``mode`` is Inductor's mode; ``options`` are Inductor options plus ``"passes"``. Precision and
    fallback are features of :func:`hasten.compile`, which wraps the model, not of a backend.
    """
    return HastenBackend(_options_config(mode, options))(gm, example_inputs, **kwargs)
