"""Mixed precision applied by hasten, so the user's training loop stays as it is.

With ``precision="bf16"`` (or ``"fp16"``) the compiled forward runs under autocast, and its
floating outputs in the autocast dtype come back in the parameters' dtype: a loss computed
outside the model then runs in fp32, as it would inside an autocast region (where losses are on
autocast's fp32 list). Parameters, gradients and optimizer state keep their dtype.

fp16 needs gradient scaling (its range is small). hasten cannot scale a loss the user's own loop
backpropagates, so it keeps one ``torch.amp.GradScaler`` per fp16 model, for the loop to use::

    scaler = hasten.compiler.grad_scaler(model)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

(bf16 has fp32's range and needs no scaler.)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hasten.compiler.hooks.nn import tree_map

__all__ = ["autocast_dtype", "grad_scaler", "with_autocast"]

_SCALERS: weakref.WeakKeyDictionary[nn.Module, torch.amp.GradScaler] = weakref.WeakKeyDictionary()


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a ``CompileConfig.precision`` (``None`` for fp32)."""
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def with_autocast(
    fn: Callable[..., Any], device_type: str, dtype: torch.dtype, out_dtype: torch.dtype
) -> Callable[..., Any]:
    """``fn`` run under autocast, with ``dtype`` outputs cast to ``out_dtype``.

    The cast sits inside the compiled region, so Inductor fuses it into the kernel that produces
    the output.
    """

    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            out = fn(*args, **kwargs)
        return tree_map(
            lambda t: t.to(out_dtype) if isinstance(t, torch.Tensor) and t.dtype == dtype else t,
            out,
        )

    return autocast_forward


def grad_scaler(model: nn.Module) -> torch.amp.GradScaler:
    """The gradient scaler of a model compiled with ``precision="fp16"``.

    Raises:
        ValueError: if ``model`` was not compiled by hasten with fp16.
    """
    try:
        return _SCALERS[model]
    except KeyError:
        raise ValueError(
            "this model was not compiled with hasten.compile(model, precision='fp16'); only fp16 "
            "needs a gradient scaler (bf16 and fp32 train without one)"
        ) from None


def attach_grad_scaler(model: nn.Module, device_type: str) -> None:
    """Create the fp16 scaler of ``model`` (kept outside the module: state_dict is unchanged)."""
    _SCALERS.setdefault(model, torch.amp.GradScaler(device_type))
