"""ATen's and oneDNN's private entry points hasten calls: an op by its private name, a CPU query.

* ``aten._safe_softmax``: softmax whose fully masked rows come out 0, not NaN (what
  ``scaled_dot_product_attention``'s math path computes); the cheap-dropout pass writes that path
  out. Without it, a softmax whose NaN rows are zeroed, the same values.
* ``mkldnn._is_mkldnn_bf16_supported``: whether oneDNN runs bfloat16 on this CPU, asked where the
  CPU's flags cannot tell (see :func:`native_bf16_cpu`). Without it the answer is unknown
  (``None``) and hasten does not refuse bf16.
* ``autograd.profiler._is_profiler_enabled``: whether a profiler is recording, so the compile
  plan does not start one of its own inside the user's (torch refuses nested profilers). Without
  it the answer is "yes", and the plan keeps its prior gain.
"""

from __future__ import annotations

from typing import Any

import torch

from hasten.compiler.hooks import register

__all__ = ["native_bf16_cpu", "profiler_running", "safe_softmax"]


@register("aten.safe_softmax", "softmax with fully masked rows 0 (cheap dropout's attention)")
def _probe_safe_softmax() -> str | None:
    return None if hasattr(torch.ops.aten, "_safe_softmax") else "no aten._safe_softmax"


def safe_softmax(scores: torch.Tensor, dim: int) -> torch.Tensor:
    """Softmax of ``scores`` over ``dim`` whose rows of all ``-inf`` are 0 (not NaN)."""
    from hasten.compiler.hooks import usable

    if usable("aten.safe_softmax"):
        return torch.ops.aten._safe_softmax.default(scores, dim)
    return torch.softmax(scores, dim).nan_to_num(0.0)


@register("aten.mkldnn_bf16", "whether this CPU has native bfloat16 (for precision='bf16')")
def _probe_bf16() -> str | None:
    ok = callable(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None))
    return None if ok else "no mkldnn._is_mkldnn_bf16_supported"


def native_bf16_cpu() -> bool | None:
    """Whether this CPU computes bfloat16 natively (``None``: unknown).

    On x86 its flags decide: AVX512-BF16 or AMX-BF16 (:func:`hasten.machine.cpu_bf16_units`).
    oneDNN's own answer is not enough there, since it says yes on any AVX-512 CPU and emulates
    bf16 on one without those units: on such a 2-core Xeon a bf16 matmul ran at 57 GFLOP/s
    against 284 in fp32, and a compiled GPT-2 step in bf16 took 3.2x its fp32 time. Without x86
    flags (another OS or architecture), oneDNN's answer, where this torch has it.
    """
    from hasten.compiler.hooks import usable
    from hasten.machine import cpu_bf16_units

    units = cpu_bf16_units()
    if units is not None:
        return bool(units)
    if not usable("aten.mkldnn_bf16"):
        return None
    answer: Any = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return bool(answer)


@register("autograd.profiler_enabled", "whether a profiler is recording (the compile plan's)")
def _probe_profiler() -> str | None:
    ok = isinstance(getattr(torch.autograd.profiler, "_is_profiler_enabled", None), bool)
    return None if ok else "no torch.autograd.profiler._is_profiler_enabled"


def profiler_running() -> bool:
    """Whether a torch profiler is recording now (``True`` when this torch cannot say)."""
    from hasten.compiler.hooks import usable

    if not usable("autograd.profiler_enabled"):
        return True
    return bool(torch.autograd.profiler._is_profiler_enabled)
