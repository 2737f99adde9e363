"""What a benchmark ran on: the stamp every result file carries.

A figure without its machine is not a result. :func:`machine_stamp` records the CPU model and the
instruction-set features that decide kernel choice (AVX-512, bf16, AMX), the cores this process may
use and torch's thread count, the GPU, the library versions and the date, and the load average at
the time (a loaded machine gives noisy timings)::

    from hasten.machine import machine_stamp

    stamp = machine_stamp()
    print(stamp["cpu"]["model"], stamp["versions"]["torch"])

Nothing here imports optional packages; versions are read from installed metadata.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "cpu_bf16_units",
    "cpu_flags",
    "cpu_model",
    "git_commit",
    "machine_stamp",
    "package_version",
    "torch_threads",
    "usable_cores",
]

_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile")


def _cpuinfo_field(field: str) -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == field:
                    return value.strip()
    except OSError:
        return None
    return None


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux, ``platform`` elsewhere)."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> dict[str, bool]:
    """Which of the kernel-relevant instruction-set features the CPU reports (Linux only)."""
    flags = set((_cpuinfo_field("flags") or "").split())
    return {name: name in flags for name in _FLAGS_OF_INTEREST}


def cpu_bf16_units() -> list[str] | None:
    """The x86 CPU's bfloat16 arithmetic units its flags list: ``avx512_bf16``, ``amx_bf16``.

    ``[]`` when the flags list neither (bfloat16 then runs emulated, slower than fp32); ``None``
    when there are no x86 flags to read (another OS or architecture: unknown). A virtual machine
    lists what it lets its guest use, which is what counts: a Xeon with AMX whose hypervisor hides
    AMX and AVX512-BF16 has neither.
    """
    flags = _cpuinfo_field("flags")
    if flags is None:
        return None
    have = set(flags.split())
    return [name for name in ("avx512_bf16", "amx_bf16") if name in have]


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), not the machine's total."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def package_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None``; never imports the package."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        return None
    return None


def _gpu() -> dict[str, Any] | None:
    if not torch.cuda.is_available():
        return None
    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    return {
        "name": props.name,
        "count": torch.cuda.device_count(),
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "bf16": torch.cuda.is_bf16_supported(),
        "cuda": torch.version.cuda,
    }


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(n)``, then restore (``None``: leave as is).

    Small models on a busy machine often train faster on one thread than on several that wait
    for each other; benchmarks record the thread count they ran with.

    Raises:
        ValueError: for ``n < 1``.
    """
    if n is None:
        yield
        return
    if n < 1:
        raise ValueError(f"threads must be >= 1 or None, got {n}")
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def git_commit() -> dict[str, Any] | None:
    """The commit of the hasten checkout this code runs from, and whether it has uncommitted
    changes to tracked files (``None`` for an installed copy outside a git checkout)."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=here, capture_output=True, text=True, timeout=10, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def machine_stamp() -> dict[str, Any]:
    """A JSON-ready description of this machine, its software and the moment.

    Returns:
        A dict with ``cpu`` (model, flags, logical and usable cores, torch threads), ``memory_gib``,
        ``gpu`` (``None`` without CUDA), ``versions`` (python, torch, hasten, transformers, numpy,
        torch's CUDA build), ``platform``, ``date_utc``, ``load_average`` (1/5/15 minutes) and
        ``git`` (the checkout's commit and whether it had uncommitted changes; see
        :func:`git_commit`).
    """
    from hasten import __version__

    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": {
            "model": cpu_model(),
            "flags": cpu_flags(),
            "logical_cores": os.cpu_count(),
            "usable_cores": usable_cores(),
            "torch_threads": torch.get_num_threads(),
        },
        "memory_gib": _memory_gib(),
        "gpu": _gpu(),
        "versions": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "hasten": __version__,
            "transformers": package_version("transformers"),
            "numpy": package_version("numpy"),
        },
        "platform": platform.platform(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "load_average": load,
        "git": git_commit(),
    }
