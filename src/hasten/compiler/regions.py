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

Modules of one class with the same parameter shapes share one :class:`CompiledCode`, so a stack
of identical blocks is traced and compiled once (TorchDynamo's parameters are graph inputs). The
plan is made at the model's first call, so ``hasten.compile`` may come before or after
``fully_shard``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import torch
from torch import nn

from hasten.compiler.config import CompileConfig
from hasten.compiler.report import CompileRecord
from hasten.compiler.runtime import CompiledCode, CompiledForward, Kind

__all__ = ["fsdp_units", "install", "plan_regions"]


def install(model: nn.Module, config: CompileConfig, record: CompileRecord, device: str) -> None:
    """Install hasten's compiled forward on ``model`` (regions are planned at its first call)."""
    code = CompiledCode(type(model).__name__, "call", config, record, device, _dtype_of(model))

    def plan(module: nn.Module) -> None:
        regions = plan_regions(module)
        if regions == [(module, "call")]:
            return
        module._compiled_call_impl = None  # its own call runs eagerly, unless it is a region
        codes: dict[tuple[object, ...], CompiledCode] = {}
        labels: dict[str, int] = {}
        for sub, kind in regions:
            key = _signature(sub, kind)
            shared = codes.get(key)
            if shared is None:
                name = type(sub).__name__
                labels[name] = labels.get(name, 0) + 1
                label = name if labels[name] == 1 else f"{name}{labels[name]}"
                shared = codes[key] = CompiledCode(
                    label, kind, config, record, device, _dtype_of(sub)
                )
            sub._compiled_call_impl = CompiledForward(sub, shared)
        with record.lock:
            record.fixes.append(_fsdp_note(regions, len(codes)))

    model._compiled_call_impl = CompiledForward(model, code, on_first_call=plan)


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The FSDP2 units (``fully_shard``-ed modules) in ``model``, outermost first."""
    if "torch.distributed.fsdp" not in sys.modules:  # nothing can be sharded: stay cheap
        return []
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def plan_regions(model: nn.Module) -> list[tuple[nn.Module, Kind]]:
    """The regions hasten compiles in ``model`` (see the module docstring)."""
    units = fsdp_units(model)
    if not units:
        return [(model, "call")]
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
