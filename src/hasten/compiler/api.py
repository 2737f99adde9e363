"""hasten's compiler API: ``compile``, ``compile_step``, ``explain``, ``verify``.

::

    import hasten

    model = hasten.compile(model)                        # in place: the same object comes back
    model = hasten.compile(model, precision="bf16")      # mixed precision, loop unchanged
    print(hasten.explain(model, example_batch))          # graphs, breaks, recompiles, passes
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hasten._modules import module_device
from hasten.compiler import cache as _cache
from hasten.compiler.config import (
    CompileConfig,
    Fallback,
    Glue,
    Mode,
    Precision,
    PrecisionAlias,
    Regions,
    Start,
    compile_at_once,
    resolve_config,
)
from hasten.compiler.hooks import dynamo as dynamo_hooks
from hasten.compiler.hooks import nn as nn_hooks
from hasten.compiler.hooks.inductor import VEC_ISA_OK
from hasten.compiler.hooks.vec_isa import start_vec_isa_probe
from hasten.compiler.host_memory import reason_to_reuse, reuse_freed_memory
from hasten.compiler.optimizer import watch as watch_optimizers
from hasten.compiler.plan import applies as plan_applies
from hasten.compiler.precision import attach_grad_scaler
from hasten.compiler.regions import install
from hasten.compiler.report import RECORDS, CompileRecord, CompileReport
from hasten.compiler.traps import apply_fixes, call_fixes, unwrap_data_parallel

if TYPE_CHECKING:
    from hasten.compiler.verify import VerifyResult

__all__ = ["compile", "compile_report", "compile_step", "explain", "verify"]

_RECORDS = RECORDS  # the records live in report.py, which traps.py reads too


class _Unset:
    """The default of ``hasten.compile``'s keywords: "not given, keep ``config``'s value"."""

    def __repr__(self) -> str:
        return "<CompileConfig default>"


UNSET: Any = _Unset()


def compile(
    model: nn.Module,
    config: CompileConfig | None = None,
    *,
    mode: Mode | _Unset = UNSET,
    precision: Precision | PrecisionAlias | torch.dtype | _Unset = UNSET,
    passes: Mapping[str, bool] | _Unset = UNSET,
    dynamic: bool | _Unset | None = UNSET,
    fullgraph: bool | _Unset = UNSET,
    fallback: Fallback | _Unset = UNSET,
    verify_first_call: bool | _Unset = UNSET,
    cache_dir: str | os.PathLike[str] | _Unset | None = UNSET,
    fix_known_traps: bool | _Unset = UNSET,
    fused_optimizer: bool | _Unset = UNSET,
    reuse_host_memory: bool | _Unset | None = UNSET,
    warn_recompiles: int | _Unset = UNSET,
    regions: Regions | _Unset = UNSET,
    glue: Glue | _Unset = UNSET,
    steps: int | _Unset | None = UNSET,
    start: Start | _Unset = UNSET,
    rank_wait_s: float | _Unset = UNSET,
    inductor_options: Mapping[str, Any] | _Unset = UNSET,
) -> nn.Module:
    """Compile ``model`` in place for training and return it (the same object).

    The module keeps its class, ``state_dict()`` keys (no ``_orig_mod.`` prefix), and pickles,
    saves and deep-copies like the uncompiled model (copies are eager). Compilation happens at the
    first call; if it fails, the model runs eagerly with a warning naming the cause (or raises,
    with ``fallback="raise"``).

    Args:
        model: The module to compile. A ``DistributedDataParallel`` wrapper is kept and the module
            it wraps is compiled (see :mod:`hasten.compiler.traps`).
        config: A :class:`CompileConfig`; ``None`` for the defaults.
        mode, precision, passes, dynamic, fullgraph, fallback, verify_first_call, cache_dir,
        fix_known_traps, fused_optimizer, reuse_host_memory,
        warn_recompiles, regions, glue, steps, start, rank_wait_s, inductor_options: The
            :class:`CompileConfig` fields of the same name
            (documented there; validated there, when the config is built). Each one given
            overrides ``config``'s; one not given keeps it (``config``'s, or the default).

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` (or is a ``torch.compile`` wrapper), or a
            setting has the wrong type.
        ValueError: a setting the model's device cannot run (e.g. fp16 on CPU).

    Example::

        model = hasten.compile(model, precision="bf16")
        for batch in loader:
            loss = loss_fn(model(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """
    given = {
        "mode": mode,
        "precision": precision,
        "passes": passes,
        "dynamic": dynamic,
        "fullgraph": fullgraph,
        "fallback": fallback,
        "verify_first_call": verify_first_call,
        "cache_dir": cache_dir,
        "fix_known_traps": fix_known_traps,
        "fused_optimizer": fused_optimizer,
        "reuse_host_memory": reuse_host_memory,
        "warn_recompiles": warn_recompiles,
        "regions": regions,
        "glue": glue,
        "steps": steps,
        "start": start,
        "rank_wait_s": rank_wait_s,
        "inductor_options": inductor_options,
    }
    cfg = _config(config, {k: v for k, v in given.items() if v is not UNSET})
    target, note = unwrap_data_parallel(_check_model(model))
    device = module_device(target)
    cfg.check_device(device)  # before anything changes the model
    if device.type == "cpu" and (why := reason_to_reuse(cfg.reuse_host_memory, target)):
        reuse_freed_memory(why)  # process-wide, once, logged with the reason
    record = CompileRecord()
    if note:
        record.fixes.append(note)
    record.fixes.extend(apply_fixes(target, fix=cfg.fix_known_traps))
    if cfg.precision == "fp16":
        attach_grad_scaler(model, device.type)
        if target is not model:
            attach_grad_scaler(target, device.type)
    install(target, cfg, record, device.type)
    # The SIMD probe and kernel header build run while TorchDynamo traces. Under the compile
    # plan they start when it decides to compile (runtime.py) instead: in a new cache they take
    # a core for seconds, which would slow the eager steps the plan times, and a run that stays
    # eager never needs them.
    if device.type == "cpu" and VEC_ISA_OK not in cfg.inductor_options and not plan_applies(cfg):
        start_vec_isa_probe(_cache.cache_dir(cfg.cache_dir))
    fixes, notes = call_fixes(target, fix=cfg.fix_known_traps)
    record.fixes.extend(notes)
    nn_hooks.compiled_call(target).call_fixes.extend(fixes)  # type: ignore[union-attr]
    _RECORDS[target] = record
    if target is not model:
        _RECORDS[model] = record
    watch_optimizers(target, cfg.fused_optimizer)  # its optimizer steps fused (optimizer.py)
    return model


def compile_report(model: nn.Module) -> CompileReport:
    """What compiling ``model`` has done so far (graphs, breaks, recompiles, passes, time).

    Raises:
        ValueError: ``model`` was not compiled with :func:`compile`.
    """
    record = _RECORDS.get(model)
    if record is None:
        raise ValueError("this model was not compiled with hasten.compile(model)")
    return record.report()


_config = resolve_config


_at_once = compile_at_once


def _check_model(model: Any) -> nn.Module:
    if dynamo_hooks.is_optimized_module(model):
        raise TypeError(
            "this model is already a torch.compile wrapper; pass the original module "
            "(model._orig_mod) to hasten.compile, which compiles it in place"
        )
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"hasten.compile expects a torch.nn.Module, not {type(model).__name__}; to compile a "
            "training-step function use hasten.compile_step"
        )
    return model


def explain(
    model: nn.Module, *example_args: Any, config: CompileConfig | None = None, **example_kwargs: Any
) -> CompileReport:
    """Compile a copy of ``model``, run it on the example inputs, and report what happened.

    Runs a deep copy (``model`` itself is untouched: no gradients, no BatchNorm statistics) in its
    current train/eval mode, forward and backward (when the output holds a loss or a tensor that
    requires grad), twice, so a recompile on identical inputs shows up too.

    Args:
        model: The module to explain.
        *example_args: Positional inputs of ``model``.
        config: A :class:`CompileConfig` (``fallback`` is forced to ``"eager"`` so failures are
            reported, not raised).
        **example_kwargs: Keyword inputs of ``model`` (e.g. ``input_ids=..., labels=...``).

    Returns:
        A :class:`CompileReport`: graphs, graph breaks with reason, user source line and a
        suggested fix, recompiles with the failing guard, compile seconds, per-pass statistics,
        and the known traps found (and fixed).

    Example::

        print(hasten.explain(model, **batch))
    """
    import copy
    import warnings

    cfg = _at_once(_config(config, {}).replace(fallback="eager"))
    inner, note = unwrap_data_parallel(_check_model(model))  # a DDP wrapper does not deep-copy
    probe = copy.deepcopy(inner)
    compile(probe, cfg)
    record = _RECORDS[probe]
    if note:
        record.fixes.insert(0, note)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # everything a warning would say goes into the report
        for _ in range(2):
            out = probe(*example_args, **example_kwargs)
            loss = _something_to_backprop(out)
            if loss is not None:
                loss.backward()
    return record.report()  # names it when nothing was compiled (runtime.CompiledForward)


def _something_to_backprop(out: Any) -> torch.Tensor | None:
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    for t in nn_hooks.tree_leaves(out):
        if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point():
            return t.float().sum()
    return None


def compile_step(
    step_fn: Callable[..., Any] | None = None,
    *,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    update: str = "auto",
    config: CompileConfig | None = None,
) -> Any:
    """Compile the optimizer update of a training step (with the model compiled by :func:`compile`).

    Usable as ``step = hasten.compile_step(train_step)`` or as a decorator, with or without
    arguments. The optimizers are found among the names ``step_fn`` uses (closure variables and
    globals) unless given. Each is prepared once, in place (see :mod:`hasten.compiler.step`):

    * ``update="auto"`` (default): its fused kernel where it has one for the parameters' device
      (Adam, AdamW, SGD, Adagrad), else ``"inductor"``;
    * ``"fused"``: the fused kernel (``ValueError`` if there is none);
    * ``"inductor"``: ``optimizer.step`` compiled by the hasten backend, with the learning rate held
      as a tensor so LR schedulers never trigger a recompile.

    ``step_fn`` itself runs as written.

    Args:
        step_fn: The training-step function (forward, backward, ``optimizer.step()``).
        optimizers: The optimizer(s) it steps, if they are not visible by name in ``step_fn``.
        update: ``"auto"``, ``"fused"`` or ``"inductor"``.
        config: The :class:`CompileConfig` used for ``"inductor"`` updates.

    Returns:
        A function that runs ``step_fn``; its ``optimizer_updates`` attribute says what was chosen
        per optimizer.

    Example::

        model = hasten.compile(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

        @hasten.compile_step
        def train_step(batch):
            loss = loss_fn(model(batch["x"]), batch["y"])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss
    """
    from hasten.compiler.step import compile_step as _compile_step

    return _compile_step(step_fn, optimizers=optimizers, update=update, config=config)  # type: ignore[arg-type]


def verify(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    optimizer_factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
    steps: int = 5,
    *,
    config: CompileConfig | None = None,
    disable_dropout: bool = True,
    seed: int = 0,
) -> VerifyResult:
    """Train a deep copy of ``model`` eagerly and another compiled, and compare them.

    ``model`` itself is untouched. Each step runs ``loss = loss_fn(copy, batch)``,
    ``loss.backward()``, ``optimizer.step()`` and ``zero_grad`` on each copy, with the same seed.

    Args:
        model: The model to check (its current state is the starting point of both copies).
        batch: One batch, used for every step.
        loss_fn: ``loss_fn(model, batch) -> scalar loss``.
        optimizer_factory: ``optimizer_factory(params) -> optimizer``, e.g.
            ``lambda p: torch.optim.AdamW(p, lr=1e-3)``.
        steps: Training steps to compare.
        config: The :class:`CompileConfig` of the compiled copy (its ``precision`` sets the
            tolerances, see :mod:`hasten.compiler.verify`).
        disable_dropout: Set dropout to 0 in both copies (compiled dropout draws other bits).
        seed: Seed of step ``i`` is ``seed + i``.

    Returns:
        A :class:`~hasten.compiler.verify.VerifyResult`, truthy when it passed; ``print`` it.

    Example::

        result = hasten.verify(model, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1]),
                               lambda p: torch.optim.AdamW(p, lr=1e-3))
        assert result, str(result)
    """
    from hasten.compiler.verify import verify_training

    return verify_training(
        model, batch, loss_fn, optimizer_factory, steps, config, disable_dropout, seed
    )
