"""The fused-optimizer kernels' private API: which devices have them, whether a kernel exists
for a device, and the flag that makes an optimizer re-check its parameters for them."""

from __future__ import annotations

from typing import Any

from hasten.compiler.hooks import register, usable

__all__ = ["fused_devices", "has_kernel", "recheck_fused"]


@register("optim.fused_devices", "the devices torch's fused optimizer kernels run on")
def _probe_devices() -> str | None:
    from torch.optim import optimizer

    ok = callable(getattr(optimizer, "_get_fused_kernels_supported_devices", None))
    return None if ok else "no torch.optim.optimizer._get_fused_kernels_supported_devices"


@register("optim.dispatch_has_kernel", "whether a fused optimizer kernel exists for a device")
def _probe_dispatch() -> str | None:
    import torch

    ok = callable(getattr(torch._C, "_dispatch_has_kernel_for_dispatch_key", None))
    return None if ok else "no torch._C._dispatch_has_kernel_for_dispatch_key"


def fused_devices() -> tuple[str, ...]:
    """Device types torch has fused optimizer kernels for (CUDA and CPU on a torch that cannot
    list them: the dispatcher check, :func:`has_kernel`, then decides)."""
    if not usable("optim.fused_devices"):
        return ("cpu", "cuda")
    from torch.optim.optimizer import _get_fused_kernels_supported_devices

    return tuple(_get_fused_kernels_supported_devices())


def has_kernel(op: str, dispatch_key: str) -> bool | None:
    """Whether ATen op ``op`` (``"_fused_adam_"``) has a kernel for ``dispatch_key``
    (``"CPU"``); ``None`` when this torch cannot say."""
    if not usable("optim.dispatch_has_kernel"):
        return None
    import torch

    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", dispatch_key))
    except RuntimeError:  # the op does not exist in this torch
        return False


def recheck_fused(opt: Any) -> None:
    """Make ``opt`` check its parameters' devices and dtypes for its fused kernel at its next
    step (the flag ``Optimizer.__init__`` sets when ``fused=True`` is passed)."""
    opt._need_device_dtype_check_for_fused = True
