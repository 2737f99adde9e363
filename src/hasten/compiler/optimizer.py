"""The optimizer of a hasten-compiled model steps with its fused kernel: the two lines at full speed.

``hasten.compile(model)`` compiles forward and backward; the optimizer update runs after them.
PyTorch's default Adam/AdamW/SGD/Adagrad loop over the parameters in Python on CPU (a dozen
small kernels per tensor; for-each on CUDA), while each has a fused multi-tensor kernel that
``fused=True`` selects. Measured here, that kernel was most of hasten's lead over
``torch.compile`` at base sizes (docs/compiler.md#compile_step), but it took a second switch
(``hasten.compile_step``) few users find.

So while a hasten-compiled model exists, hasten keeps one global optimizer step pre-hook
(``torch_optimizer.register_optimizer_step_pre_hook``, PyTorch's public hook). Before an
optimizer's first step it looks once at the optimizer (and again only when param groups are
added, a model is compiled or a state dict is loaded): when its parameters belong to a
hasten-compiled model, it is an ``Adam``, ``AdamW``, ``SGD`` or ``Adagrad``, and a param group
leaves the implementation to PyTorch, that group steps with the fused kernel from then on. It
says so once per optimizer on the ``"hasten"`` logger. The update is the same arithmetic (the
fused kernel reorders it: parameters agree to fp32 rounding; tested after several AdamW steps).

What is left as it is:

* a group where the user chose: ``fused`` or ``foreach`` given (``True`` or ``False``),
  ``capturable=True`` or ``differentiable=True``;
* a group with a parameter the fused kernel cannot update: not floating point, sparse, a sparse
  gradient, or on a device without that optimizer's fused kernel (each parameter is checked on
  its own device, so a group split across devices is fused only when every device has it);
* an optimizer prepared by ``hasten.compile_step``, other optimizer classes (subclasses
  included: their ``step`` may not be the one that reads ``fused``), an optimizer whose
  parameters belong to a model compiled with ``fused_optimizer=False``, and steps traced by
  TorchDynamo (a ``torch.compile``-d ``optimizer.step``).

State already there (an optimizer that stepped before, or one loaded from a checkpoint) is kept;
its step counters move where the fused kernel reads them (float32, on the parameter's device).
``optimizer.state_dict()`` records ``fused`` as the user left it (``None``), so a checkpoint
reads as an eager run's and loads anywhere; ``load_state_dict`` (which replaces the groups'
settings with the saved ones) is followed by a fresh look at the next step. LR schedulers are
unaffected (the fused kernel reads the group's ``lr`` at every step). The hook holds no
reference to a model or optimizer and is removed when the last hasten-compiled model is
garbage-collected (or, when that happens during an optimizer step, the next time it is safe).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

import torch
import torch.optim.optimizer as torch_optimizer
from torch import nn

from hasten.compiler.report import log_line
from hasten.compiler.step import fused_kernel, steps_for_fused

__all__ = ["FUSABLE", "watch"]

FUSABLE: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.SGD,
    torch.optim.Adagrad,
)

# per optimizer, in its __dict__ (not pickled by Optimizer.__getstate__, not in its state_dict)
_SEEN = "_hasten_fuse_seen"  # (generation, param groups looked at)
_FUSED = "_hasten_fused_groups"  # the param groups hasten switched to fused
_HOOKED = "_hasten_fuse_hooks"  # its state_dict hooks are registered
_LOGGED = "_hasten_fuse_logged"

_LOCK = threading.RLock()  # re-entrant: a finalizer may run in this thread while it is held
_MODELS: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
_generation = 0  # bumped when a model is compiled: optimizers are looked at again
_handle: Any = None  # the global pre-hook's RemovableHandle while one is registered


def watch(model: nn.Module, fuse: bool) -> None:
    """Note a hasten-compiled ``model``: optimizers of its parameters are fused when ``fuse``.

    ``fuse=False`` (``CompileConfig.fused_optimizer``) keeps an optimizer of its parameters as
    the user made it, whatever other models it also trains.
    """
    global _generation, _handle
    with _LOCK:
        if model not in _MODELS:
            weakref.finalize(model, _forget)
        _MODELS[model] = fuse
        _generation += 1
        if _handle is None:
            _handle = torch_optimizer.register_optimizer_step_pre_hook(_pre_step)


def hook_registered() -> bool:
    """Whether the global optimizer pre-hook is registered (for tests)."""
    return _handle is not None and _handle.id in torch_optimizer._global_optimizer_pre_hooks


def _forget() -> None:
    """A watched model was garbage-collected: remove the hook once none is left."""
    global _handle
    with _LOCK:
        if _handle is None or any(True for _ in _MODELS):  # a live model is left
            return
        if _inside_optimizer_step():
            # Optimizer.step is iterating the global hooks: removing one now would change the
            # dict's size under it (RuntimeError in the user's step). The hook stays, inert
            # (no model is watched), until the next model is compiled or collected.
            return
        _handle.remove()
        _handle = None


def _inside_optimizer_step() -> bool:
    path = torch_optimizer.__file__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "wrapper" and frame.f_code.co_filename == path:
            return True
        frame = frame.f_back
    return False


def _pre_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """The global step pre-hook: cheap unless ``opt`` is new, grew a group or a model came."""
    seen = opt.__dict__.get(_SEEN)
    if seen is not None and seen == (_generation, len(opt.param_groups)):
        return None
    if torch.compiler.is_compiling():
        return None
    _consider(opt)
    return None


def _consider(opt: torch.optim.Optimizer) -> None:
    with _LOCK:
        models = list(_MODELS.items())
        generation = _generation
    opt.__dict__[_SEEN] = (generation, len(opt.param_groups))
    if not models or type(opt) not in FUSABLE or "_hasten_update" in opt.__dict__:
        return
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    owners = [fuse for model, fuse in models if any(id(p) in ids for p in model.parameters())]
    if not owners or not all(owners):
        return  # not a hasten model's optimizer, or one whose model opted out
    fused: list[dict[str, Any]] = opt.__dict__.setdefault(_FUSED, [])
    switched = 0
    for group in opt.param_groups:
        if any(group is g for g in fused) or not _defaults_left(group):
            continue
        if not all(_fusable(opt, p) for p in group["params"]):
            continue
        group["fused"] = True
        steps_for_fused(opt, group["params"])
        fused.append(group)
        switched += 1
    if not fused:
        return
    if not opt.__dict__.get(_HOOKED):
        opt.register_state_dict_post_hook(_saved_as_made)
        opt.register_load_state_dict_post_hook(_loaded)
        opt.__dict__[_HOOKED] = True
    if switched and not opt.__dict__.get(_LOGGED):
        opt.__dict__[_LOGGED] = True
        devices = sorted({p.device.type for g in fused for p in g["params"]})
        total = len(opt.param_groups)
        left = total - len(fused)
        log_line(
            f"hasten: {type(opt).__name__} steps with its fused kernel on "
            f"{', '.join(devices)} ({len(fused)} of {total} param group"
            f"{'' if total == 1 else 's'}"
            + (f"; {left} left as set" if left else "")
            + "): one multi-tensor update instead of a loop over the parameters; "
            "hasten.compile(model, fused_optimizer=False) keeps the optimizer as made"
        )


def _defaults_left(group: dict[str, Any]) -> bool:
    """Whether the group leaves the implementation to PyTorch (no explicit user choice)."""
    return (
        group.get("fused") is None
        and group.get("foreach") is None
        and not group.get("capturable", False)
        and not group.get("differentiable", False)
        and bool(group["params"])
    )


def _fusable(opt: torch.optim.Optimizer, p: torch.Tensor) -> bool:
    grad = p.grad
    return fused_kernel(opt, p) and not (grad is not None and grad.is_sparse)


def _saved_as_made(opt: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` post-hook: the groups hasten fused are saved with ``fused`` as made."""
    fused = opt.__dict__.get(_FUSED, [])
    for saved, group in zip(state_dict["param_groups"], opt.param_groups):
        if any(group is g for g in fused):
            saved["fused"] = None
    return state_dict


def _loaded(opt: torch.optim.Optimizer) -> None:
    """``load_state_dict`` post-hook: the groups are new dicts with the saved settings; the next
    step looks at them again (and moves the loaded step counters for the fused kernel)."""
    opt.__dict__[_FUSED] = []
    opt.__dict__.pop(_SEEN, None)
