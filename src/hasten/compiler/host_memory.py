"""Opt-in: large CPU buffers from freed process memory, not fresh pages, each training step.

PyTorch's CPU allocator is the C library's ``malloc``. glibc serves a request above its mmap
threshold (at most 32 MiB) with a fresh ``mmap`` and gives the pages back with ``munmap`` when it
is freed, so a buffer that big is page-faulted in again at every step, one fault per 4 KiB page.
A language model's step makes several: GPT-2 124M's fp32 logits at batch 2 x 256 are 103 MB,
their gradient as much again. In a bf16 profile on 2 AMD EPYC cores, the zero fill of the
Llama-style decoder's 65 MB logits gradient took 43 ms, most of it page faults.

:func:`reuse_freed_memory` sets glibc's ``M_MMAP_MAX`` to 0 (every block comes from the heap,
where freed memory is reused) and ``M_TRIM_THRESHOLD`` to 2 GiB (free memory at the heap's top
is kept until it exceeds that). Measured (``benchmarks/host_memory.py``,
``results/host-memory.json``): GPT-2 124M's bf16 step 1.35x as fast at 10-13 % more peak
RSS, the Llama-style decoder's 1.10x at the same. The cost: PyTorch allocates with
``posix_memalign``, and glibc's aligned allocations ask for more than the freed block of the
same size, so the heap can fragment: a 64 MiB buffer allocated and freed in a loop settled at
0.67 GiB of resident memory (tested). jemalloc or
tcmalloc, preloaded (as PyTorch's CPU launcher ``torch.backends.xeon.run_cpu`` does), avoid
both the faults and that fragmentation; this is for where neither is installed.

malloc has no per-call setting, so this is process-wide and lasts for the process. By default
(``reuse_host_memory=None``) it is applied when a model with a parameter of at least 32 MiB
(:data:`MMAP_CEILING`) is compiled for a CPU: that parameter's gradient, which ``zero_grad``
drops by default, is then a fresh mapping at every step, and so are the activations of a model
that size. ``True`` applies it for any CPU model, ``False`` never. Never at import; said once;
left alone where the user chose already: another allocator preloaded (jemalloc, tcmalloc,
mimalloc), glibc's own ``MALLOC_*`` environment settings, or a C library other than glibc. A
process forked afterwards (a ``DataLoader`` worker) starts with glibc's usual thresholds again
(:func:`_in_forked_child`), so a worker does not keep 2 GiB of freed heap.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Callable

import torch

from hasten.compiler.report import log_line

__all__ = [
    "MMAP_CEILING",
    "TRIM_THRESHOLD",
    "reason_to_reuse",
    "reuse_freed_memory",
    "state",
]

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: 2 GiB, the most it can say
MMAP_CEILING = 32 << 20
"""glibc's largest mmap threshold on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``): a block at least
this big is always mapped afresh and unmapped when freed, whatever the threshold has grown to."""
_MMAP_MAX_DEFAULT = 65536  # glibc's DEFAULT_MMAP_MAX
_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_ENV = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")

_lock = threading.Lock()
_state: str | None = None  # "on", or why not; None: not asked yet


def _why_not() -> str | None:
    preload = os.environ.get("LD_PRELOAD", "")
    chosen = next((a for a in _ALLOCATORS if a in preload), None)
    if chosen:
        return f"{chosen} is preloaded"
    set_env = [name for name in _ENV if name in os.environ]
    if set_env:
        return f"malloc is set by {', '.join(set_env)}"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    return None


def reason_to_reuse(setting: bool | None, module: torch.nn.Module) -> str | None:
    """Why ``reuse_host_memory=setting`` asks for the malloc setting for this CPU model (the end
    of the log line that says it is on), or ``None`` where it does not."""
    if setting is not None:
        return "reuse_host_memory=True" if setting else None
    largest = max((p.numel() * p.element_size() for p in module.parameters()), default=0)
    if largest < MMAP_CEILING:
        return None
    return (
        f"the model's largest parameter ({largest / 2**20:.0f} MiB) reaches glibc's "
        f"{MMAP_CEILING >> 20} MiB mmap ceiling, so its gradient would be mapped afresh every step"
    )


def _in_forked_child() -> None:
    """A forked child (a ``DataLoader`` worker) gets glibc's thresholds as they settle by default.

    glibc's rule is dynamic (the mmap threshold grows to the largest block freed, up to 32 MiB,
    and the trim threshold is twice it); any ``mallopt`` fixes it, so the child gets where it
    settles: mapped from 32 MiB, trimmed above 64 MiB."""
    mallopt = _mallopt()
    if mallopt is not None:
        mallopt(_M_MMAP_MAX, _MMAP_MAX_DEFAULT)
        mallopt(_M_MMAP_THRESHOLD, MMAP_CEILING)
        mallopt(_M_TRIM_THRESHOLD, 2 * MMAP_CEILING)


def _mallopt() -> Callable[[int, int], int] | None:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


def reuse_freed_memory(why_on: str = "reuse_host_memory=True") -> str:
    """Apply the setting once per process; returns ``"on"`` or why it was not applied.

    ``why_on`` ends the log line that says it is on."""
    global _state
    with _lock:
        if _state is not None:
            return _state
        why = _why_not()
        if why is None:
            mallopt = _mallopt()
            if mallopt is None:
                why = "no mallopt in this process"
            elif mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
                why = "mallopt refused the setting"
            else:
                os.register_at_fork(after_in_child=_in_forked_child)
        _state = why or "on"
        if why is None:
            log_line(
                "hasten: large CPU buffers now reuse freed process memory instead of fresh "
                "pages from the OS each step (glibc malloc: no mmap, heap trimmed above 2 GiB), "
                f"for the rest of this process ({why_on}; reuse_host_memory=False turns it off)"
            )
        return _state


def state() -> str | None:
    """``"on"``, why the setting was not applied, or ``None`` if no compile asked yet."""
    return _state
