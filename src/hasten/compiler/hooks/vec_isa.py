"""Inductor's SIMD ISA probe on CPU: once per cache directory, one ISA, off the critical path.

Before its first CPU kernel, Inductor checks every SIMD ISA the CPU's flags claim (on this
project's Xeon: AMX, AVX-512 VNNI, AVX-512, AVX2) by compiling a test library against ATen's
vector headers and loading it in a child Python, plus smaller checks (VNNI, AMX tiles, AVX-512
bf16): seconds in a process whose cache is cold, and still a second in every new process, before
any kernel compiles (measured in docs/compiler.md, "Compile time").

hasten does three things about it:

* **Once per cache directory.** The outcome depends on the CPU, the compiler, Python and torch
  only, so it is stored (``hasten/vec_isa.json`` in the cache directory, keyed by those) and later
  processes tell Inductor (``cpp.vec_isa_ok``, which Inductor reads instead of its header builds).
  The setting is part of Inductor's cache key, so the probing process sets it too, and a cold and a
  warm process compile alike.
* **One ISA.** Inductor picks the first valid ISA of its list, best first, and each later one
  needs a subset of its instructions and compiler flags (AVX-512 VNNI < AMX, AVX2 < AVX-512). So
  hasten runs Inductor's own checks for the first claimed ISA alone (header build, load, AMX
  permission); when it passes, the others are taken as valid. Inductor still runs its small
  per-ISA checks (VNNI, AMX tiles, bf16), which set the compiler flags each ISA compiles with;
  in a cold cache hasten builds them beforehand in the same background thread.
* **Off the critical path.** ``hasten.compile`` starts the probe in a background thread, so it
  runs while TorchDynamo traces the model; the backend waits for it before Inductor starts. The
  same thread then precompiles the header every CPU kernel includes (:func:`_build_kernel_header`),
  which Inductor would otherwise do at its first kernel.

Off x86 Linux, when the top ISA fails, or when anything in the probe raises, nothing changes:
Inductor probes as usual. On a torch whose internals differ from what this module calls, its
probes (``inductor.vec_isa``, ``inductor.kernel_header``, ``inductor.vec_isa_small_checks``,
see :mod:`hasten.compiler.hooks`) fail and the part they guard is skipped: Inductor probes and
precompiles as usual.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sys
import threading
from concurrent.futures import Future
from typing import Any

import torch

from hasten.compiler.hooks import register, usable

__all__ = ["start_vec_isa_probe", "vec_isa_patch"]

_PATCH = (("cpp.vec_isa_ok", True),)
_FUTURES: dict[str, Future[tuple[tuple[str, Any], ...]]] = {}
_LOCK = threading.Lock()


_THREAD_IMPORTS = (
    "torch._inductor.codecache",
    "torch._inductor.cpp_builder",
    "torch._inductor.cpu_vec_isa",
    "torch._inductor.runtime.cache_dir_utils",
    "torch.utils._filelock",
    "torch.utils.cpp_extension",
)
"""Every module the probe thread needs, imported by the caller before the thread starts.

Two threads importing overlapping parts of torch at once are not safe: with these imports left
to the thread, a fresh-clone test run once failed in the main thread's first compile with
``ModuleNotFoundError: No module named 'torch.utils._runtime_estimation'`` (a module that exists)
while the thread imported ``torch._inductor``. ``test_vec_isa.py`` checks that the thread imports
nothing on its own."""


@register("inductor.vec_isa", "Inductor's CPU ISA probe once per cache directory (cpp.vec_isa_ok)")
def _probe_vec_isa() -> str | None:
    import importlib

    for name in _THREAD_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError as err:
            return str(err)
    from torch._inductor import config, cpp_builder, cpu_vec_isa

    if not hasattr(getattr(config, "cpp", None), "vec_isa_ok"):
        return "no Inductor config cpp.vec_isa_ok"
    for owner, attr in (
        (cpu_vec_isa, "x86_isa_checker"),
        (cpu_vec_isa, "supported_vec_isa_list"),
        (cpu_vec_isa.VecISA, "check_build"),
        (cpu_vec_isa.VecISA, "_avx_code"),
        (cpp_builder, "get_cpp_compiler"),
    ):
        if not hasattr(owner, attr):
            return f"no {getattr(owner, '__name__', owner)}.{attr}"
    return None


@register("inductor.vec_isa_small_checks", "Inductor's small per-ISA checks built in advance")
def _probe_small_checks() -> str | None:
    from torch._inductor.cpu_vec_isa import VecISA

    return None if hasattr(VecISA, "_VecISA__bool__impl") else "no VecISA.__bool__impl"


@register("inductor.kernel_header", "Inductor's kernel header precompiled off the critical path")
def _probe_kernel_header() -> str | None:
    from torch._inductor import codecache, config, cpp_builder

    loader = getattr(codecache, "CppPythonBindingsCodeCache", None)
    for owner, attr in (
        (loader, "_get_uncompiled_header"),
        (loader, "cpp_compile_command_flags"),
        (codecache, "_precompile_header"),
        (config, "cpp_cache_precompile_headers"),
        (config, "is_fbcode"),
        (cpp_builder, "CppBuilder"),
        (cpp_builder, "CppTorchDeviceOptions"),
    ):
        if owner is None or not hasattr(owner, attr):
            return f"no {getattr(owner, '__name__', owner)}.{attr}"
    return None


def start_vec_isa_probe(directory: str) -> None:
    """Work out :func:`vec_isa_patch` for cache ``directory`` in a daemon thread (at most once).

    The thread's imports happen here, in the caller's thread (see :data:`_THREAD_IMPORTS`); they
    are ones Inductor's first compile makes anyway, so their time moves off the first call.
    """
    if not usable("inductor.vec_isa"):  # the probe imported _THREAD_IMPORTS, or failed to
        return
    _future(directory, background=True)


def vec_isa_patch(directory: str | None = None) -> dict[str, Any]:
    """``{"cpp.vec_isa_ok": True}`` when the CPU's best SIMD ISA builds and loads here, else ``{}``.

    ``directory`` defaults to Inductor's cache directory. Waits for a probe already started for it
    by :func:`start_vec_isa_probe`; worked out once per process and directory.
    """
    if not usable("inductor.vec_isa"):
        return {}
    if directory is None:
        from hasten.compiler.hooks.inductor import cache_dir

        directory = cache_dir()
    return dict(_future(directory, background=False).result())


def _future(directory: str, *, background: bool) -> Future[tuple[tuple[str, Any], ...]]:
    with _LOCK:
        future = _FUTURES.get(directory)
        if future is not None:
            return future
        future = _FUTURES[directory] = Future()
    if background:
        threading.Thread(
            target=_resolve, args=(future, directory, True), name="hasten-vec-isa", daemon=True
        ).start()
    else:
        _resolve(future, directory, False)
    return future


def _resolve(future: Future[tuple[tuple[str, Any], ...]], directory: str, background: bool) -> None:
    try:
        claimed = _claimed()
        patch, probed = _stored_or_probed(directory, claimed)
        if patch and background:
            bool(claimed[0])  # its flags (bf16, AMX fp16) are settled before Inductor reads
    except Exception:  # any surprise: no shortcut, Inductor probes as it always does
        future.set_result(())
        return
    future.set_result(patch)
    if not (patch and background):
        return
    with contextlib.suppress(Exception):  # Inductor builds whatever is missing itself
        if probed:  # a cold cache: the small checks are still to build
            _build_small_checks(claimed[1:])
        _build_kernel_header(claimed[0])


def _build_small_checks(isas: list[Any]) -> None:
    """Build the small per-ISA checks Inductor runs even with ``cpp.vec_isa_ok`` (VNNI, AMX
    tiles, AVX-512 bf16; each a C++ build when cold) for ``isas``, so that Inductor's own checks
    find them built and only load them (docs/compiler.md, "Compile time").

    Each check runs on a twin of the ISA that takes the header build as passed (what
    ``cpp.vec_isa_ok`` does, without setting it: the setting is process-wide and this runs in a
    thread). A twin compiles with the same flags in the same order as the ISA itself, so the
    builds land under the keys Inductor looks up; its outcome is not used.
    """
    if not usable("inductor.vec_isa_small_checks"):
        return
    for isa in isas:
        cls = type(isa)
        twin_cls = type(
            f"_Trusting{cls.__name__}",
            (cls,),
            {"_VecISA__bool__impl": lambda self, vec_isa_ok: True},  # VecISA.__bool__impl
        )
        twin = object.__new__(twin_cls)
        twin.__dict__.update(isa.__dict__)
        bool(twin)


def _build_kernel_header(isa: Any) -> None:
    """Precompile the header every CPU kernel includes, as Inductor will for ``isa``.

    Inductor precompiles ``cpp_prefix.h`` (a large ``.gch``, seconds to build) at its first kernel,
    once per machine (the file lives in ``<tmp>/torchinductor_<user>/precompiled_headers``, not in
    the cache directory, so a fresh node pays it even after ``hasten cache import``), and
    preprocesses it once per process to check the file is current. This makes the same
    call, with the arguments Inductor's kernel loader passes, in order, so Inductor's in-process
    memo of it hits and the file is found built. Only for the ISA Inductor picks by default.
    """
    if not usable("inductor.kernel_header"):
        return
    from torch._inductor import codecache, config
    from torch._inductor.cpp_builder import CppBuilder, CppTorchDeviceOptions

    if os.environ.get("ATEN_CPU_CAPABILITY") or config.cpp.simdlen is not None:
        return  # Inductor picks another ISA than the best one
    loader = codecache.CppPythonBindingsCodeCache
    header = loader._get_uncompiled_header("cpu")
    if header is None or not config.cpp_cache_precompile_headers:
        return
    command = {
        **loader.cpp_compile_command_flags,
        "device_type": "cpu",
        "extra_flags": (),
        "use_relative_path": config.is_fbcode(),
        "vec_isa": isa,
    }
    option = CppTorchDeviceOptions(compile_only=False, min_optimize=False, **command)
    line = CppBuilder(name="o", sources="i", BuildOption=option).get_command_line()
    codecache._precompile_header(header, line, min_optimize=False, **command)


def _forget() -> None:
    """Drop the in-process outcomes (what a new process starts without); for tests."""
    with _LOCK:
        _FUTURES.clear()


def _claimed() -> list[Any]:
    """Inductor's x86 ISAs whose flags the CPU claims, best first."""
    from torch._inductor import cpu_vec_isa

    flags = set(cpu_vec_isa.x86_isa_checker())
    return [
        isa
        for isa in cpu_vec_isa.supported_vec_isa_list
        if all(f in flags for f in str(isa).split())
    ]


def _probe(isa: Any) -> bool:
    """Inductor's checks for ``isa``: its header build and load first (what ``cpp.vec_isa_ok``
    skips; called directly so a setting made meanwhile cannot stand in for it), then its own
    ``__bool__`` (VNNI, AMX tiles and permission, bf16)."""
    from torch._inductor.cpu_vec_isa import VecISA

    return bool(isa.check_build(VecISA._avx_code)) and bool(isa)


def _stored_or_probed(
    directory: str, claimed: list[Any]
) -> tuple[tuple[tuple[str, Any], ...], bool]:
    """The patch for ``directory`` given the ``claimed`` ISAs (:func:`_claimed`), and whether
    this call probed (no stored outcome fitted)."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    if platform.machine() not in ("x86_64", "AMD64") or not sys.platform.startswith("linux"):
        return (), False
    if not claimed:
        return (), False
    try:
        compiler = get_cpp_compiler()
    except Exception:  # no compiler: Inductor reports it on its own
        return (), False
    key = {
        "torch": torch.__version__,
        "python": sys.executable,
        "compiler": compiler,
        "compiler_mtime": os.stat(found).st_mtime if (found := shutil.which(compiler)) else None,
        "claimed": [str(isa) for isa in claimed],
        "probed": "best",  # files from the all-ISA probe (no such field) are probed again
    }
    path = os.path.join(directory, "hasten", "vec_isa.json")
    try:
        with open(path) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        stored = None
    probed = not (isinstance(stored, dict) and stored.get("key") == key)
    if probed:
        stored = {"key": key, "best_valid": _probe(claimed[0])}
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w") as f:
                json.dump(stored, f)
            os.replace(tmp, path)  # atomic: ranks probing at once never read half a file
        except OSError:
            pass  # a read-only cache: probe again next time
    return (_PATCH if stored.get("best_valid") is True else ()), probed
