"""The first-call check: each compiled variant is compared against eager on its first batch.

A compiler that computes a wrong gradient does not crash: the model trains, a little worse, and
nothing says why. So the first time a compiled variant of a region runs (training, evaluation,
...), hasten runs it twice more on that same batch, compiled and eagerly, from the same state,
and compares what came out::

    snapshot: RNG state (torch's CPU and CUDA, Python's, NumPy's), the region's buffers
    compiled(module, batch copy)  -> outputs, gradients of a random projection of them
    restore; eager(module, batch copy) -> the same
    restore; compare, per output and per gradient (parameters and inputs that require grad)
    then the user's own call runs, from the snapshot, as if nothing had happened

The gradients are those of ``sum_i <w_i, out_i>`` over the floating outputs with fixed random
``w_i``, taken with ``torch.autograd.grad`` (no ``.grad`` is touched); the batch is copied so a
forward that writes into its inputs runs on a copy. On CPU dropout draws the same masks in both
runs: compiled dropout uses ATen's RNG (Inductor's ``fallback_random``), and while the eager
reference runs, ``F.dropout`` and ``F.scaled_dot_product_attention`` draw their masks the way
hasten's ``cheap_dropout_rng`` pass does when that pass is on. Where the bits cannot match
(Inductor's own RNG on a GPU), a variant with active dropout is not checked, and the report says
so.

Tolerances (relative: ``||compiled - eager|| / max(||eager||, 1e-3 * largest norm)``, per tensor):

=========  =========
precision  tolerance
=========  =========
fp32       1e-2
bf16       1e-1
fp16       1e-1
=========  =========

fp32 kernels that only reorder sums agree to about 1e-6 on the transformer test models, but a
BatchNorm weight's gradient (a sum over the batch that nearly cancels) came out 5.4e-3 apart on a
small ResNet-style CNN under every Inductor setting tried, which is rounding, not a miscompile; a
miscompile shows as an error of order 1 (an all-zero gradient is exactly 1.0). The floor keeps a
near-zero gradient, whose rounding noise is large relative to itself, from failing the check.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hasten.compiler.hooks import nn as pytree  # torch's pytree (tree_leaves, tree_flatten, ...)
from hasten.compiler.hooks import usable
from hasten.compiler.hooks.inductor import LAYOUT_OPTIMIZATION, PATTERN_MATCHER

__all__ = [
    "TOLERANCES",
    "CheckResult",
    "GraphSource",
    "check_call",
    "draws_host_randomness",
    "graph_source",
    "has_active_dropout",
    "known_cause",
    "safer_settings",
    "stateful_input",
    "write_reproducer",
]

TOLERANCES: dict[str, float] = {"fp32": 1e-2, "bf16": 1e-1, "fp16": 1e-1}
_FLOOR = 1e-3


@dataclass(frozen=True)
class CheckResult:
    """One compiled-vs-eager comparison.

    Attributes:
        passed: Every output and gradient agreed within ``tolerance``.
        worst: The tensor with the largest relative error (``"output 0"``, ``"input 1"`` or a
            parameter name) and that error.
        tolerance: The tolerance used.
        compared: How many tensors were compared.
        seconds: What the check added: the eager run and the comparison (the compiled run,
            which compiles the variant, stands for the call the user made and is not counted).
        note: Why the comparison means less than usual, or was not made ("" when it was).
    """

    passed: bool
    worst: tuple[str, float]
    tolerance: float
    compared: int
    seconds: float
    note: str = ""

    def describe(self) -> str:
        name, err = self.worst
        if self.note and not self.compared:
            return f"not checked: {self.note}"
        verdict = "matches eager" if self.passed else "DIFFERS from eager"
        return f"{verdict} (worst {name} {err:.1e}, tolerance {self.tolerance:.0e})"


class _Snapshot:
    """RNG state and buffer values of ``module``, to run it again from the same start."""

    def __init__(self, module: nn.Module) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = (
            [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
            if torch.cuda.is_available() and torch.cuda.is_initialized()
            else []
        )
        self.buffers = [(b, b.detach().clone()) for b in module.buffers() if b is not None]
        # models draw from Python's and NumPy's generators too (Wav2Vec2's SpecAugment masks)
        self.py = random.getstate()
        numpy = sys.modules.get("numpy")
        self.np = numpy.random.get_state() if numpy is not None else None

    def restore(self) -> None:
        random.setstate(self.py)
        if self.np is not None:
            sys.modules["numpy"].random.set_state(self.np)
        torch.set_rng_state(self.cpu)
        for i, state in enumerate(self.cuda):
            torch.cuda.set_rng_state(state, i)
        with torch.no_grad():
            for buf, saved in self.buffers:
                buf.copy_(saved)


_PLAIN = (torch.Tensor, int, float, bool, str, bytes, type(None), torch.dtype, torch.device, slice)


def stateful_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """The type name of an input the forward may change in place (a KV cache), else ``None``.

    The check runs the forward twice more; an object such as Transformers' ``DynamicCache``
    would keep what those runs appended to it, so a call with one is not checked.
    """
    for leaf in pytree.tree_leaves((args, kwargs)):
        if not isinstance(leaf, _PLAIN) and not callable(leaf):
            return type(leaf).__name__
    return None


def draws_host_randomness(
    eager: Callable[..., Any], module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    """Whether ``module``'s eager call draws from Python's or NumPy's generator.

    TorchDynamo traces NumPy's random functions as torch's (``use_numpy_random_stream`` off), so
    such a model's compiled draws differ from eager's by design and the two cannot be compared:
    the eager call is run twice from one state, once with those generators reseeded.
    """
    snap = _Snapshot(module)
    try:
        with torch.no_grad():
            first = _copy_batch(args, kwargs)
            out1 = eager(module, *first[0], **first[1])
            snap.restore()
            random.seed(12345)
            numpy = sys.modules.get("numpy")
            if numpy is not None:
                numpy.random.seed(12345)
            second = _copy_batch(args, kwargs)
            out2 = eager(module, *second[0], **second[1])
    finally:
        snap.restore()
    a, b = pytree.tree_leaves(out1), pytree.tree_leaves(out2)
    pairs = [
        (f"output {i}", x, y)
        for i, (x, y) in enumerate(zip(a, b))
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.is_floating_point()
    ]
    _, same, _ = _compare(pairs, TOLERANCES["fp32"])
    return not same


def has_active_dropout(module: nn.Module) -> bool:
    """Whether ``module`` holds a dropout module that would drop something now."""
    return any(
        isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
        for m in module.modules()
    )


def check_call(
    compiled: Callable[..., Any],
    eager: Callable[..., Any],
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    precision: str,
    cheap_dropout: bool,
) -> CheckResult:
    """Run ``compiled`` and ``eager`` on ``module`` and the batch, from one state, and compare.

    ``module``'s buffers and the RNG are left as they were before the call. Exceptions of either
    run propagate (the compiled one is where a first compile happens).

    Args:
        compiled: ``compiled(module, *args, **kwargs)``.
        eager: The same function, not compiled.
        module: The module both run.
        args, kwargs: The call's inputs.
        precision: ``"fp32"``, ``"bf16"`` or ``"fp16"``: picks the tolerance.
        cheap_dropout: The compiled code draws dropout masks as hasten's ``cheap_dropout_rng``
            pass does (so the eager run must too).
    """
    t0 = time.perf_counter()
    tol = TOLERANCES[precision]
    snap = _Snapshot(module)
    grad = torch.is_grad_enabled()
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad] if grad else []
    try:
        out_c, grads_c, names = _run(compiled, module, args, kwargs, params)
        t0 = time.perf_counter()  # the compiled run (and its compile) is not the check's cost
        snap.restore()
        with _eager_dropout_like_compiled(cheap_dropout):
            out_e, grads_e, _ = _run(eager, module, args, kwargs, params)
    finally:
        snap.restore()
    leaves_c, spec_c = pytree.tree_flatten(out_c)
    leaves_e, spec_e = pytree.tree_flatten(out_e)
    pairs: list[tuple[str, torch.Tensor | None, torch.Tensor | None]] = []
    if spec_c != spec_e or len(leaves_c) != len(leaves_e):
        return CheckResult(False, ("output structure", math.inf), tol, 0, _since(t0))
    k = 0
    for c, e in zip(leaves_c, leaves_e):
        if isinstance(e, torch.Tensor) and e.is_floating_point():
            pairs.append((f"output {k}", c.detach() if isinstance(c, torch.Tensor) else None, e))
            k += 1
    pairs.extend((n, gc, ge) for n, gc, ge in zip(names, grads_c, grads_e))
    worst, passed, note = _compare(pairs, tol)
    return CheckResult(passed, worst, tol, len(pairs), _since(t0), note)


def _since(t0: float) -> float:
    return time.perf_counter() - t0


def _run(
    fn: Callable[..., Any],
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    params: list[tuple[str, nn.Parameter]],
) -> tuple[Any, list[torch.Tensor | None], list[str]]:
    """One run on a copy of the batch: outputs, gradients of the probe, their names."""
    a, kw, inputs = _copy_batch(args, kwargs)
    out = fn(module, *a, **kw)
    targets = [p for _, p in params] + [t for _, t in inputs]
    names = [n for n, _ in params] + [n for n, _ in inputs]
    if not targets:
        return out, [], []
    probe = _probe(out)
    if probe is None or not probe.requires_grad:
        return out, [None] * len(targets), names
    grads = torch.autograd.grad(probe, targets, allow_unused=True)
    return out, list(grads), names


def _copy_batch(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], list[tuple[str, torch.Tensor]]]:
    """The batch with every tensor copied; floating ones that require grad become leaves."""
    inputs: list[tuple[str, torch.Tensor]] = []

    def copy(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if t.requires_grad and t.is_floating_point():
            leaf = _same_strides(t.detach()).requires_grad_(True)
            inputs.append((f"input {len(inputs)}", leaf))
            return leaf
        if t.is_inference():
            return _same_strides(t)
        # under inference_mode a plain clone would be an inference tensor, whose dispatch keys
        # differ from the input's: the user's own call would then recompile
        with torch.inference_mode(False):
            return _same_strides(t)

    a, kw = pytree.tree_map(copy, (args, kwargs))
    return a, kw, inputs


def _same_strides(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` laid out as ``t`` is: its sizes and strides, and a view where ``t`` is one.

    The compiled code is first traced on the check's copies, and TorchDynamo guards on strides
    and on whether an input is a view: a plain clone of a slice (a language model's
    ``ids[:, :-1]``, strides ``(8, 1)``) is contiguous (``(7, 1)``), so the user's own tensor
    then failed the guard and the model compiled a second time at its first step; an expanded
    tensor (zero strides) likewise. A view's copy is the memory it spans, not its whole base (a
    batch sliced from a dataset held in one tensor would copy the dataset), viewed the same way.
    """
    if t.layout != torch.strided or type(t) is not torch.Tensor:
        return t.clone()
    if t._base is not None:
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
        flat = t.as_strided((span,), (1,), t.storage_offset()).clone()
        return flat.as_strided(t.shape, t.stride())
    out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    try:
        return out.copy_(t)
    except RuntimeError:  # overlapping strides, which cannot be written to
        return t.clone()


def _probe(out: Any) -> torch.Tensor | None:
    """``sum_i <w_i, out_i>`` over the floating outputs, ``w_i`` fixed random weights."""
    total: torch.Tensor | None = None
    gen: dict[torch.device, torch.Generator] = {}
    for leaf in pytree.tree_leaves(out):
        if not (isinstance(leaf, torch.Tensor) and leaf.is_floating_point()):
            continue
        if not leaf.requires_grad:
            continue
        g = gen.get(leaf.device)
        if g is None:
            g = gen[leaf.device] = torch.Generator(device=leaf.device).manual_seed(0)
        w = torch.randn(leaf.shape, generator=g, device=leaf.device, dtype=torch.float32)
        term = (leaf.float() * w).sum()
        total = term if total is None else total + term
    return total


def _compare(
    pairs: list[tuple[str, torch.Tensor | None, torch.Tensor | None]], tol: float
) -> tuple[tuple[str, float], bool, str]:
    """The worst relative error over ``pairs`` (one host sync for all of them).

    Each pair is reduced to float64 sums of squares chunk by chunk (:func:`_sums64`), so the
    float64 temporaries stay a few MiB: converting every gradient to float64 first doubled a
    base-size model's peak memory at its first step (Llama-style, 2 x 256: 4.6 GiB against
    2.4 without the check).
    """
    names: list[str] = []
    sums: list[torch.Tensor] = []  # per pair: sum((c - e)^2), sum(e^2), e all finite
    for name, c, e in pairs:
        if c is None and e is None:
            continue
        if c is not None and e is not None and c.shape != e.shape:
            return (name, math.inf), False, f"{name}: shape {tuple(c.shape)} vs {tuple(e.shape)}"
        sums.append(_sums64(c, e))
        names.append(name)
    if not names:
        return ("", 0.0), True, "nothing to compare"
    if len({t.device for t in sums}) > 1:  # a model split across devices: gather on the CPU
        sums = [t.cpu() for t in sums]
    table = torch.stack(sums).cpu()  # one host sync for all of them
    diff_t, norm_t = table[:, 0].sqrt(), table[:, 1].sqrt()
    if not bool((table[:, 2] > 0).all()):  # eager itself overflowed: nothing to compare against
        return ("", 0.0), True, "eager produced inf/NaN on this batch"
    floor = _FLOOR * float(norm_t.max())
    errs = (diff_t / norm_t.clamp_min(max(floor, 1e-30))).nan_to_num(nan=math.inf).tolist()
    i = max(range(len(errs)), key=errs.__getitem__)
    worst = (names[i], float(errs[i]))
    return worst, worst[1] <= tol, ""


_CHUNK = 1 << 20  # elements per float64 chunk in _sums64 (8 MiB a temporary)


def _sums64(c: torch.Tensor | None, e: torch.Tensor | None) -> torch.Tensor:
    """``[sum((c - e)^2), sum(e^2), all(isfinite(e))]`` in float64, a missing side counting as
    zeros, converted a chunk at a time; on the pair's device (no host sync)."""
    ref = e if e is not None else c
    assert ref is not None  # callers skip pairs with neither
    cf = c.detach().reshape(-1) if c is not None else None
    ef = e.detach().reshape(-1) if e is not None else None
    diff2 = torch.zeros((), dtype=torch.float64, device=ref.device)
    norm2 = torch.zeros((), dtype=torch.float64, device=ref.device)
    ok = torch.ones((), dtype=torch.bool, device=ref.device)
    for i in range(0, max(ref.numel(), 1), _CHUNK):
        cc = cf[i : i + _CHUNK].double() if cf is not None else None
        ee = ef[i : i + _CHUNK].double() if ef is not None else None
        if ee is not None:
            norm2 += ee.square().sum()
            ok &= torch.isfinite(ee).all()
        gap = ee if cc is None else cc if ee is None else cc - ee
        assert gap is not None
        diff2 += gap.square().sum()
    return torch.stack([diff2, norm2, ok.double()])


@contextlib.contextmanager
def _eager_dropout_like_compiled(on: bool) -> Iterator[None]:
    """While the eager reference runs: dropout drawn the way the compiled code draws it."""
    if not on:
        yield
        return
    from hasten.compiler.passes.dropout import cheap_dropout, cheap_dropout_attention

    dropout, sdpa = F.dropout, F.scaled_dot_product_attention

    def like_dropout(x: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False):  # type: ignore[no-untyped-def]
        if (
            training
            and not inplace
            and isinstance(p, float)
            and 0.0 < p < 1.0
            and x.device.type == "cpu"
            and x.is_floating_point()
        ):
            return cheap_dropout(x, p)
        return dropout(x, p, training, inplace)

    def like_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):  # type: ignore[no-untyped-def]
        if (
            not kw
            and isinstance(dropout_p, float)
            and 0.0 < dropout_p < 1.0
            and q.device.type == "cpu"
        ):
            return cheap_dropout_attention(q, k, v, attn_mask, dropout_p, is_causal, scale)
        return sdpa(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            **kw,
        )

    F.dropout, F.scaled_dot_product_attention = like_dropout, like_sdpa  # type: ignore[assignment]
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = dropout, sdpa  # type: ignore[assignment]


# Safer settings tried, in order, when a compiled variant differs from eager: each rung is a
# name the warning can show and the CompileConfig changes that make it.
def safer_settings(config: Any) -> list[tuple[str, Any]]:
    """The settings a failed check retries with, in order, as ``(description, config)``."""
    rungs: list[tuple[str, Any]] = []
    enabled = config.enabled_passes()
    if enabled:
        rungs.append(
            ("hasten's graph passes off", config.replace(passes=dict.fromkeys(enabled, False)))
        )
    opts = dict(config.inductor_options)
    # only the Inductor switches this torch has (a retry must not fail on a key it dropped)
    offs = [
        key
        for key, hook in (
            (LAYOUT_OPTIMIZATION, "inductor.layout_optimization"),
            (PATTERN_MATCHER, "inductor.pattern_matcher"),
        )
        if usable(hook)
    ]
    if LAYOUT_OPTIMIZATION in offs and opts.get(LAYOUT_OPTIMIZATION, True):
        rungs.append(
            (
                f"Inductor {LAYOUT_OPTIMIZATION}=False",
                config.replace(inductor_options={**opts, LAYOUT_OPTIMIZATION: False}),
            )
        )
    # a rung that fixes a bug known on this torch goes first: each rung costs a compile
    rungs.sort(key=lambda rung: known_cause(rung[0]) is None)
    safest = {**opts, **dict.fromkeys(offs, False)}
    if enabled or opts != safest:
        what = ["hasten's passes off"]
        if offs:
            what.append("Inductor " + ", ".join(f"{k}=False" for k in offs))
        rungs.append(
            (
                ", ".join(what),
                config.replace(passes=dict.fromkeys(enabled, False), inductor_options=safest),
            )
        )
    return rungs


# What a rung that fixed the gradients says about the cause, by torch release.
_KNOWN_CAUSES: dict[str, tuple[tuple[str, ...], str]] = {
    "Inductor layout_optimization=False": (
        ("2.13.",),
        "a known bug of Inductor's CPU layout optimization in torch 2.13: with convolution "
        "weights held as parameters, the compiled backward returns all-zero convolution "
        "gradients for some CNNs (torch 2.14.1 and 2.15 compute them right; see 'Known "
        "miscompiles' in hasten's compiler docs)",
    ),
}


def known_cause(rung: str) -> str | None:
    """The upstream cause a fixing rung points to on this torch, if hasten knows it."""
    found = _KNOWN_CAUSES.get(rung)
    if found is None:
        return None
    versions, text = found
    return text if torch.__version__.startswith(versions) else None


@dataclass(frozen=True)
class GraphSource:
    """A graph TorchDynamo captured, as code that runs without hasten or the model.

    Attributes:
        src: The graph's Python (``def forward(self, ...)``), as FX writes it.
        imports: Lines that bind the names ``src`` uses besides ``torch``.
        inputs: Per placeholder ``(shape, stride, dtype, device, requires_grad, is_parameter)``, or
            ``None`` for a non-tensor input (its value is in ``constants``).
        constants: Per placeholder, the value of a non-tensor input (``repr``-able), else None.
        names: Per placeholder, where TorchDynamo read it from (``"L['args'][0]"``), to save
            the real values of a failing call beside the reproducer; ``None`` where unknown.
    """

    src: str
    imports: tuple[str, ...]
    inputs: tuple[tuple[tuple[int, ...], tuple[int, ...], str, str, bool, bool] | None, ...]
    constants: tuple[str | None, ...]
    names: tuple[str | None, ...] = ()


def graph_source(gm: torch.fx.GraphModule, example_inputs: Any) -> GraphSource | None:
    """The :class:`GraphSource` of ``gm`` (``None`` when it cannot be written out)."""
    try:
        code = gm.graph.python_code(root_module="self")
        imports: list[str] = []
        for name, obj in code.globals.items():
            if name in ("torch", "inf", "nan", "NoneType", "device"):
                continue
            mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
            if isinstance(obj, type(math)):
                imports.append(f"import {obj.__name__} as {name}")
            elif mod and qual and "<" not in qual:
                imports.append(f"{name} = _resolve({mod!r}, {qual!r})")
            else:
                return None
        inputs: list[Any] = []
        consts: list[str | None] = []
        for x in example_inputs:
            if isinstance(x, torch.Tensor):
                inputs.append(
                    (
                        tuple(int(s) for s in x.shape),
                        tuple(int(s) for s in x.stride()),
                        str(x.dtype).removeprefix("torch."),
                        str(x.device),
                        bool(x.requires_grad),
                        isinstance(x, nn.Parameter),
                    )
                )
                consts.append(None)
            else:
                inputs.append(None)
                consts.append(repr(int(x)) if isinstance(x, torch.SymInt) else repr(x))
        names: list[str | None] = []
        for node in gm.graph.find_nodes(op="placeholder"):
            source = getattr(node.meta.get("grapharg"), "source", None)
            name = getattr(source, "name", None)
            name = name() if callable(name) else name
            names.append(name if isinstance(name, str) else None)
        return GraphSource(code.src, tuple(imports), tuple(inputs), tuple(consts), tuple(names))
    except Exception:  # a graph FX cannot write out: the reproducer says so
        return None


_REPRO_HEAD = '''\
"""Reproducer written by hasten: {what} on torch {torch_version}.

The graph(s) below are what TorchDynamo captured from the model's forward; this script runs
each with random inputs eagerly and compiled with torch.compile(backend={backend!r},
options={options!r}), and compares outputs and the gradients of a random projection of them.
It needs only torch{needs}. Exit code 1: a mismatch was reproduced.
"""

import importlib
import math
import sys

import torch
from torch import device

inf, nan, NoneType = math.inf, math.nan, type(None)


def _resolve(module, qualname):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


'''

_REPRO_TAIL = '''

def make_inputs(spec, constants, saved):
    torch.manual_seed(0)
    out = []
    for j, (s, c) in enumerate(zip(spec, constants)):
        if saved is not None and saved[j] is not None:
            t = saved[j]
            out.append(t.detach().requires_grad_(True) if s and s[4] else t)
            continue
        if s is None:
            out.append(eval(c))
            continue
        shape, stride, dtype, dev, requires_grad, _ = s
        dtype = getattr(torch, dtype)
        size = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
        if dtype.is_floating_point:
            base = torch.randn(size, dtype=dtype, device=dev)
        elif dtype == torch.bool:
            base = torch.ones(size, dtype=dtype, device=dev)
        else:
            base = torch.zeros(size, dtype=dtype, device=dev)  # index 0 is valid anywhere
        t = base.as_strided(shape, stride)
        out.append(t.detach().requires_grad_(True) if requires_grad else t)
    return out


class Model(torch.nn.Module):
    """The graph with its parameters held as nn.Parameters, as in the model it came from."""

    def __init__(self, graph, spec, inputs):
        super().__init__()
        self.graph = graph
        self.slots = [bool(s and s[5]) for s in spec]
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(x.detach().clone()) for x, p in zip(inputs, self.slots) if p])

    def forward(self, *rest):
        params, rest, args = iter(self.params), iter(rest), []
        for is_param in self.slots:
            args.append(next(params) if is_param else next(rest))
        return self.graph(*args)


def tree_leaves(x):
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in tree_leaves(v)]
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in tree_leaves(v)]
    return [x]


def run(graph, spec, inputs, compile_it):
    holder = Model(graph, spec, inputs)
    model = torch.compile(holder, backend=BACKEND, options=OPTIONS or None) if compile_it else holder
    fresh = [x.detach().clone().requires_grad_(x.requires_grad)
             if isinstance(x, torch.Tensor) else x
             for x, p in zip(inputs, holder.slots)
             if not p]
    torch.manual_seed(1)
    out = model(*fresh)
    fresh = list(holder.params) + fresh
    leaves = [o for o in tree_leaves(out)
              if isinstance(o, torch.Tensor) and o.is_floating_point()]
    g = torch.Generator().manual_seed(0)
    probe = sum((o.float() * torch.randn(o.shape, generator=g).to(o.device)).sum()
                for o in leaves if o.requires_grad)
    wrt = [x for x in fresh if isinstance(x, torch.Tensor) and x.requires_grad]
    grads = (torch.autograd.grad(probe, wrt, allow_unused=True)
             if wrt and isinstance(probe, torch.Tensor) and probe.requires_grad else [])
    return [o.detach() for o in leaves], list(grads)


def rel(a, b):
    if a is None and b is None:
        return 0.0
    a = torch.zeros_like(b) if a is None else a
    b = torch.zeros_like(a) if b is None else b
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))


import os  # noqa: E402

_here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "inputs.pt")
SAVED = torch.load(_here) if os.path.exists(_here) else None  # the failing batch's real values
bad = False
for i, (graph, spec, constants) in enumerate(GRAPHS):
    inputs = make_inputs(spec, constants, SAVED[i] if SAVED is not None else None)
    out_e, grads_e = run(graph(), spec, inputs, False)
    torch.compiler.reset()
    out_c, grads_c = run(graph(), spec, inputs, True)
    errs = [rel(c, e) for c, e in zip(out_c + grads_c, out_e + grads_e)]
    worst = max(errs, default=0.0)
    print(f"graph {i}: {len(errs)} tensors compared, worst relative error {worst:.2e}")
    bad |= worst > TOLERANCE
print("MISMATCH reproduced" if bad else "no mismatch")
sys.exit(1 if bad else 0)
'''


def write_reproducer(
    path: str,
    what: str,
    sources: list[GraphSource | None],
    *,
    backend: str,
    options: dict[str, Any],
    tolerance: float,
    scope: dict[str, Any] | None = None,
    max_saved_bytes: int = 256 * 2**20,
) -> str | None:
    """Write a standalone script reproducing a mismatch into the folder ``path``.

    With ``scope`` (the failing call's ``{"module": ..., "args": ..., "kwargs": ...}``), the real
    inputs of each graph (parameters included) are saved beside it as ``inputs.pt`` when they
    take at most ``max_saved_bytes``; the script draws random inputs for the rest.

    Returns the script's path, or ``None`` when no graph could be written out.
    """
    import os

    usable = [s for s in sources if s is not None]
    if not usable:
        return None
    os.makedirs(path, exist_ok=True)
    needs = "" if backend == "inductor" else " and hasten (for its backend)"
    parts = [
        _REPRO_HEAD.format(
            what=what,
            torch_version=torch.__version__,
            backend=backend,
            options=options,
            needs=needs,
        )
    ]
    if backend == "hasten":
        parts.append("import hasten  # noqa: F401  (registers the backend)\n\n")
    names = []
    for i, s in enumerate(usable):
        parts.extend(line + "\n" for line in s.imports)
        body = "\n".join("    " + ln if ln.strip() else "" for ln in s.src.strip("\n").splitlines())
        parts.append(f"\nclass Graph{i}(torch.nn.Module):\n{body}\n\n")
        names.append(f"(Graph{i}, {list(s.inputs)!r}, {list(s.constants)!r})")
    parts.append(f"\nGRAPHS = [{', '.join(names)}]\n")
    parts.append(f"BACKEND = {backend!r}\nOPTIONS = {options!r}\nTOLERANCE = {tolerance!r}\n")
    parts.append(_REPRO_TAIL)
    if scope is not None:
        saved = [_saved_inputs(src, scope) for src in usable]
        size = sum(t.numel() * t.element_size() for g in saved for t in g if t is not None)
        if size <= max_saved_bytes:
            torch.save(saved, os.path.join(path, "inputs.pt"))
    script = os.path.join(path, "repro.py")
    with open(script, "w") as f:
        f.write("".join(parts))
    return script


def _saved_inputs(src: GraphSource, scope: dict[str, Any]) -> list[torch.Tensor | None]:
    """The values of ``src``'s tensor inputs in the failing call (``None`` where unknown)."""
    out: list[torch.Tensor | None] = []
    for spec, name in zip(src.inputs, src.names or (None,) * len(src.inputs)):
        value = None
        if spec is not None and name is not None:
            try:  # Dynamo's source expressions, e.g. L['module']._modules['0']._parameters['w']
                value = eval(name, {"__builtins__": {}}, {"L": scope})
            except Exception:
                value = None
        ok = isinstance(value, torch.Tensor) and tuple(value.shape) == spec[0]  # type: ignore[index]
        out.append(value.detach().clone() if ok else None)  # type: ignore[union-attr]
    return out
