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

malloc has no per-call setting, so this is process-wide and lasts for the process. It is off
unless asked for (``hasten.compile(model, reuse_host_memory=True)``), applied when a model is
compiled for a CPU (never at import), said once, and left alone where the user chose already:
another allocator preloaded (jemalloc, tcmalloc, mimalloc), glibc's own ``MALLOC_*``
environment settings, or a C library other than glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

from hasten.compiler.report import log_line

__all__ = ["TRIM_THRESHOLD", "reuse_freed_memory", "state"]

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: 2 GiB, the most it can say
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


def reuse_freed_memory() -> str:
    """Apply the setting once per process; returns ``"on"`` or why it was not applied."""
    global _state
    with _lock:
        if _state is not None:
            return _state
        why = _why_not()
        if why is None:
            try:
                mallopt = ctypes.CDLL(None).mallopt
            except (OSError, AttributeError):
                why = "no mallopt in this process"
            else:
                mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
                if mallopt(_M_MMAP_MAX, 0) != 1 or mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
                    why = "mallopt refused the setting"
        _state = why or "on"
        if why is None:
            log_line(
                "hasten: large CPU buffers now reuse freed process memory instead of fresh "
                "pages from the OS each step (glibc malloc: no mmap, heap trimmed above 2 GiB), "
                "for the rest of this process (reuse_host_memory=True)"
            )
        return _state


def state() -> str | None:
    """``"on"``, why the setting was not applied, or ``None`` if no compile asked yet."""
    return _state
