"""Which parts of a model hasten compiles: the whole model, or regions of it (FSDP2).

By default the whole model's call is one region: one TorchDynamo frame, one graph when nothing
breaks it. Models sharded with FSDP2 (``torch.distributed.fsdp.fully_shard``) cannot be traced
whole: FSDP's forward hooks (all-gather before a unit's forward, reshard after, backward hooks)
are marked ``torch._dynamo.disable``, so tracing the model breaks the graph at every unit, and
for a model whose ``forward`` is torch's own code (``nn.Sequential``) nothing at all was compiled.
For such a model hasten compiles, as torchtitan does by hand:

* each FSDP unit without nested units (typically a transformer block): its ``forward`` only,
  with FSDP's hooks run eagerly around it (``kind="forward"``);
* each submodule with parameters and no FSDP unit inside, called from a unit that has nested
  units (embeddings, final norm, LM head): its whole call (``kind="call"``);
* the rest (the forward of units with nested units: loops, residual glue, the loss) runs eagerly.

With ``regions="blocks"`` the repeated blocks are the regions (:func:`repeated_blocks`) and the
code around them runs eagerly, unless ``CompileConfig.glue`` compiles its submodules
(``"modules"``) or a Transformers loss function (``"loss"``, :class:`EagerGlue`) too.
With ``regions="auto"`` the model's call is the region, and its compile plan
(:mod:`hasten.compiler.plan`) may choose the repeated blocks instead for a run whose length
makes them the cheapest choice: they are installed then (``_PlannedBlocks``), glue eager.

Modules of one class with the same parameter shapes share one :class:`CompiledCode`, so a stack
of identical blocks is traced and compiled once (TorchDynamo's parameters are graph inputs). The
plan is made at the model's first call, so ``hasten.compile`` may come before or after
``fully_shard``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from hasten.compiler.config import CompileConfig
from hasten.compiler.hooks import nn as nn_hooks
from hasten.compiler.plan import BlockPlan
from hasten.compiler.plan import applies as plan_applies
from hasten.compiler.report import CompileRecord
from hasten.compiler.runtime import CompiledCode, CompiledForward, Kind

__all__ = [
    "EagerGlue",
    "builds_kv_cache",
    "fsdp_units",
    "install",
    "plan_regions",
    "repeated_blocks",
    "swappable_loss_function",
]


def install(model: nn.Module, config: CompileConfig, record: CompileRecord, device: str) -> None:
    """Install hasten's compiled forward on ``model`` (regions are planned at its first call)."""
    code = CompiledCode(type(model).__name__, "call", config, record, device, _dtype_of(model))

    def plan(module: nn.Module) -> None:
        fsdp = bool(fsdp_units(module))
        regions = plan_regions(module, config.regions, config.glue)
        # A training KV cache (Transformers' use_cache=True) is indexed by layer inside each
        # block, so TorchDynamo would recompile a shared block once per layer, up to its limit
        # (8): then each block gets code of its own, and Inductor's caches share the kernels.
        own = not fsdp and builds_kv_cache(module)
        if regions == [(module, "call")]:
            if plan_applies(config) and not fsdp:
                _plan(code, module, config)
            return
        nn_hooks.set_compiled_call(module, None)  # its own call runs eagerly, unless a region
        # read model.loss_function only when it is used: Transformers' property logs a warning
        loss_fn = swappable_loss_function(module) if config.glue == "loss" and not fsdp else None
        if loss_fn is not None:
            loss_code = CompiledCode("loss_function", "call", config, record, device, torch.float32)
            nn_hooks.set_compiled_call(module, EagerGlue(module, loss_code, loss_fn))
        codes, served = _install_regions(regions, config, record, device, own, fsdp)
        note = (
            _fsdp_note(regions, len(codes))
            if fsdp
            else _blocks_note(
                module,
                codes,
                served,
                config.regions,
                own,
                isinstance(nn_hooks.compiled_call(module), EagerGlue),
            )
        )
        with record.lock:
            record.fixes.append(note)

    nn_hooks.set_compiled_call(model, CompiledForward(model, code, on_first_call=plan))


def _install_regions(
    regions: list[tuple[nn.Module, Kind]],
    config: CompileConfig,
    record: CompileRecord,
    device: str,
    own: bool,
    fsdp: bool,
) -> tuple[dict[tuple[object, ...], CompiledCode], dict[tuple[object, ...], int]]:
    """Install a compiled call on each region, modules of one signature sharing one
    :class:`CompiledCode` (unless ``own``); the codes, and how many modules each serves."""
    codes: dict[tuple[object, ...], CompiledCode] = {}
    served: dict[tuple[object, ...], int] = {}
    labels: dict[str, int] = {}
    for sub, kind in regions:
        key = _signature(sub, kind) + ((id(sub),) if own else ())
        served[key] = served.get(key, 0) + 1
        shared = codes.get(key)
        if shared is None:
            name = type(sub).__name__
            labels[name] = labels.get(name, 0) + 1
            label = name if labels[name] == 1 else f"{name}{labels[name]}"
            shared = codes[key] = CompiledCode(label, kind, config, record, device, _dtype_of(sub))
            # FSDP2's parameters are sharded outside the unit's forward: its gradients
            # cannot be taken by parameter there, so its regions are not checked
            shared.verify = shared.verify and not fsdp
        nn_hooks.set_compiled_call(sub, CompiledForward(sub, shared))
    for key, shared in codes.items():
        shared.shared_by = served[key]  # for its compile log line
    return codes, served


def _plan(code: CompiledCode, module: nn.Module, config: CompileConfig) -> None:
    """Give ``code`` the compile plan of ``regions="auto"`` (see :func:`plan.applies`), with
    the module's repeated blocks as a choice when it has some."""
    from hasten.compiler import cache
    from hasten.compiler.plan import Plan, plan_key, prior_seconds

    blocks = repeated_blocks(module)
    code.plan = Plan(
        plan_key(module, config),
        code.label,
        prior_seconds(module),
        config.steps,
        cache.cache_dir(config.cache_dir),
        blocks=_PlannedBlocks(module, blocks, code) if blocks else None,
        profile_gain=code.device_type == "cpu",
    )


class _PlannedBlocks:
    """The repeated blocks of a model under the compile plan (a ``plan.BlockSwitch``): installed
    when the plan chooses them, as ``regions="blocks"`` installs them at the first call, except
    that the model's own call keeps its compiled call, which runs eagerly under the plan (so the
    plan goes on timing the steps) and calls the compiled blocks."""

    def __init__(self, model: nn.Module, blocks: list[nn.Module], code: CompiledCode) -> None:
        self.model = model
        self.blocks = blocks
        self.code = code

    def available(self) -> bool:
        # a training KV cache indexed by layer would recompile a shared block once per layer
        return not builds_kv_cache(self.model)

    def install(self, plan: BlockPlan) -> None:
        code = self.code
        regions: list[tuple[nn.Module, Kind]] = [(b, "call") for b in self.blocks]
        codes, served = _install_regions(
            regions, code.config, code.record, code.device_type, own=False, fsdp=False
        )
        for shared in codes.values():
            shared.plan = plan
        note = _blocks_note(self.model, codes, served, "auto", own=False, loss=False)
        with code.record.lock:
            code.record.fixes.append(note)

    def uninstall(self) -> None:
        for block in self.blocks:
            nn_hooks.set_compiled_call(block, None)
        with self.code.record.lock:
            self.code.record.fixes.append(
                f"regions='auto': the compile plan swapped {type(self.model).__name__} from its "
                "blocks to the whole model, which measured to pay for the rest of the run (its "
                "blocks run as its own code again, inside the whole model's graph)"
            )


def swappable_loss_function(model: nn.Module) -> Callable[..., Any] | None:
    """The loss function a Transformers model computes its loss with (``model.loss_function``),
    when the model lets it be set (a property with a setter); ``None`` for other models."""
    prop = getattr(type(model), "loss_function", None)
    if not isinstance(prop, property) or prop.fset is None:
        return None
    try:
        fn = model.loss_function
    except Exception:  # a property that cannot answer: leave the model alone
        return None
    return fn if callable(fn) else None


class _LossFunction(nn.Module):
    """A loss function as a module, for a :class:`CompiledCode` (never registered in the model)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class EagerGlue:
    """``model._compiled_call_impl`` in block mode for a Transformers model: the model's own call
    (the glue around its blocks) runs eagerly, and its loss function is a compiled region.

    Eager, the loss over GPT-2's 512x50257 logits is a log-softmax and an NLL, each written out
    whole, forward and backward; compiled, Inductor fuses them. The compiled function stands in
    for ``model.loss_function`` during each call only (the instance attribute the property reads,
    put back afterwards), so the model's attributes, ``state_dict``, pickling and copies are
    untouched. It runs in the model's train/eval mode, short last batches eagerly, as a block does.
    """

    def __init__(self, model: nn.Module, code: CompiledCode, fn: Callable[..., Any]) -> None:
        self.model = model
        self.code = code
        self.holder = _LossFunction(fn)

    def loss(self, *args: Any, **kwargs: Any) -> Any:
        self.holder.training = self.model.training  # the variant follows the model
        return self.code.run(self.holder, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self.model
        if torch.compiler.is_compiling():  # inside a user's compiled function: plain call
            return nn_hooks.call_impl(model, *args, **kwargs)
        slots = model.__dict__
        missing = object()
        before = slots.get("_loss_function", missing)
        slots["_loss_function"] = self.loss
        try:
            return nn_hooks.call_impl(model, *args, **kwargs)
        finally:
            if before is missing:
                slots.pop("_loss_function", None)
            else:
                slots["_loss_function"] = before


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The FSDP2 units (``fully_shard``-ed modules) in ``model``, outermost first."""
    if "torch.distributed.fsdp" not in sys.modules:  # nothing can be sharded: stay cheap
        return []
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def plan_regions(
    model: nn.Module, regions: str = "whole", glue: str = "eager"
) -> list[tuple[nn.Module, Kind]]:
    """The regions hasten compiles in ``model`` (see the module docstring).

    Args:
        model: The model (FSDP2 units in it are always compiled by unit).
        regions: ``CompileConfig.regions``: ``"whole"``, ``"blocks"`` or ``"auto"``.
        glue: ``CompileConfig.glue``: with ``"modules"``, block mode also compiles the outermost
            submodules with parameters outside the blocks (``"loss"`` is not a module region:
            :func:`install` places it).
    """
    units = fsdp_units(model)
    if units:
        return _fsdp_regions(model, units)
    # "auto" starts as "whole": its compile plan may install the blocks later (_PlannedBlocks),
    # for a medium run (docs/compiler.md#the-compile-plan-compiled-only-when-the-run-pays)
    if regions != "blocks":
        return [(model, "call")]
    blocks = repeated_blocks(model)
    if not blocks:
        return [(model, "call")]
    out: list[tuple[nn.Module, Kind]] = [(b, "call") for b in blocks]
    if glue == "modules":
        out.extend((m, "call") for m in _glue_modules(model, blocks))
    return out


def _glue_modules(model: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """The outermost modules with parameters that hold no block and are in none."""
    block_ids = {id(b) for b in blocks}
    holders = {id(m) for b in blocks for m in _ancestors(model, b)}
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        for child in module.children():
            if id(child) in block_ids:
                continue
            if id(child) in holders:
                visit(child)
            elif next(child.parameters(), None) is not None:
                found.append(child)

    visit(model)
    return found


def _ancestors(model: nn.Module, target: nn.Module) -> list[nn.Module]:
    for name, m in model.named_modules():
        if m is target:
            parts = name.split(".") if name else []
            chain, cur = [model], model
            for part in parts[:-1]:
                cur = getattr(cur, part)
                chain.append(cur)
            return chain
    return []


def repeated_blocks(model: nn.Module, min_count: int = 2) -> list[nn.Module]:
    """The blocks of ``model`` that repeat, in model order.

    A block is a child of an ``nn.ModuleList`` or ``nn.Sequential`` with parameters, and it
    repeats when at least ``min_count`` children of that container have its signature (class and
    parameter names, shapes and dtypes). The outermost such containers count: what is inside a
    repeated block is compiled with it.
    """
    found: list[nn.Module] = []

    def visit(module: nn.Module) -> None:
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            groups: dict[tuple[object, ...], list[nn.Module]] = {}
            for child in module.children():
                if next(child.parameters(), None) is not None:
                    groups.setdefault(_signature(child, "call"), []).append(child)
            repeated = {id(b) for g in groups.values() if len(g) >= min_count for b in g}
            for child in module.children():
                if id(child) in repeated:
                    found.append(child)
                else:
                    visit(child)
            return
        for child in module.children():
            visit(child)

    visit(model)
    return found


def builds_kv_cache(model: nn.Module) -> bool:
    """Whether ``model`` (a Transformers model in training) builds a KV cache in its forward."""
    config = getattr(model, "config", None)
    return bool(
        model.training and getattr(config, "use_cache", False) and hasattr(config, "to_dict")
    )


def _fsdp_regions(model: nn.Module, units: list[nn.Module]) -> list[tuple[nn.Module, Kind]]:
    unit_ids = {id(m) for m in units}
    regions: list[tuple[nn.Module, Kind]] = []

    def visit(module: nn.Module) -> None:
        nested = any(id(m) in unit_ids for m in _descendants(module))
        if id(module) in unit_ids and not nested:
            regions.append((module, "forward"))
        elif id(module) not in unit_ids and not nested:
            if next(module.parameters(), None) is not None:
                regions.append((module, "call"))
        else:
            for child in module.children():
                visit(child)

    visit(model)
    return regions


def _descendants(module: nn.Module) -> Iterator[nn.Module]:
    it = module.modules()
    next(it)  # the module itself
    return it


def _signature(module: nn.Module, kind: Kind) -> tuple[object, ...]:
    params = tuple((n, tuple(p.shape), p.dtype) for n, p in module.named_parameters())
    return (type(module), kind, params)


def _dtype_of(module: nn.Module) -> torch.dtype:
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


def _fsdp_note(regions: list[tuple[nn.Module, Kind]], codes: int) -> str:
    units = sum(1 for _, k in regions if k == "forward")
    calls = len(regions) - units
    return (
        f"FSDP2 (fully_shard): compiled by region, since FSDP's hooks cannot be traced: the "
        f"forward of {units} unit(s) without nested units (hooks run eagerly around it) and "
        f"{calls} submodule(s) with parameters outside them, {codes} distinct region(s); the "
        "forward of units with nested units (their glue code and the loss) runs eagerly"
    )


def _blocks_note(
    model: nn.Module,
    codes: dict[tuple[object, ...], CompiledCode],
    served: dict[tuple[object, ...], int],
    regions: str,
    own: bool,
    loss: bool,
) -> str:
    if own:
        shared = (
            f"{len(codes)} blocks with code of their own, since the training KV cache "
            "(config.use_cache=True) differs per layer; set model.config.use_cache=False "
            "to share one"
        )
    else:
        shared = ", ".join(f"1 {codes[k].label} shared by {n}" for k, n in served.items())
    around = (
        "the code around the blocks (embeddings, final norm, head) runs eagerly, and its loss "
        "function is compiled on its own"
        if loss
        else "the code around the blocks (embeddings, final norm, head, loss) runs eagerly"
    )
    what = (
        f"the compile plan chose to compile {type(model).__name__} by block for this run's length"
        if regions == "auto"
        else f"compiled {type(model).__name__} by block"
    )
    return f"regions={regions!r}: {what} ({shared}); {around}"
