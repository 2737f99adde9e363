"""CPU kernels of one compiled graph built as a few shared libraries, not one each.

Inductor's CPU code defines each fused kernel with ``async_compile.cpp_pybinding(argtypes,
source)``: one C++ file, one compiler process and one shared library per kernel. Most of that
process is fixed cost (loading the precompiled header, linking), paid once per kernel; the
measurements are in docs/compiler.md ("Kernel libraries").

While hasten's backend compiles (:func:`batched_kernels`), the kernels a graph module defines are
collected instead and, at the module's ``async_compile.wait``, built as one library per compile
worker (each kernel in a namespace of its own, its entry point and Python module renamed, in one
file). The kernel code and the compiler flags are Inductor's, unchanged: only the packaging
differs, so the numerics are the same. A kernel whose source includes more than Inductor's
prefix header is built Inductor's way, as is every kernel when only one compile thread is
allowed (Inductor then loads kernels at once, not at ``wait``); and if a library fails to build,
its kernels are built one by one, Inductor's way, so a packaging problem costs time, never a run.

It patches Inductor's internals (``AsyncCompile.cpp_pybinding``, the code templates and loader of
``CppPythonBindingsCodeCache``): on a torch where any of them is missing, the probe
``inductor.batched_kernels`` fails and :func:`batched_kernels` does nothing (Inductor's own way,
one library per kernel; see :mod:`hasten.compiler.hooks`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from hasten.compiler.hooks import register, usable

__all__ = ["batched_kernels"]

_PREFIX = "#include <torch/csrc/inductor/cpp_prefix.h>"
_HEAD = (
    f"{_PREFIX}\n#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n"
    "#include <sstream>\n#include <cstdlib>\n#include <cerrno>\n"
)
_PATCH_LOCK = threading.Lock()
_DEPTH = [0]


# The oldest torch the batching's tests passed on: on torch 2.6 the attributes below all exist but
# Inductor's build layout differs (its kernels were not found built), so older releases get
# Inductor's own way.
_TESTED_FROM = (2, 13)


@register("inductor.batched_kernels", "CPU kernels of a graph built a few to a library")
def _probe() -> str | None:
    import torch
    from torch._inductor import async_compile, codecache

    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < _TESTED_FROM:  # below the declared floor too: a user may still run one
        return f"tested on torch>={_TESTED_FROM[0]}.{_TESTED_FROM[1]} only"

    cache = getattr(codecache, "CppPythonBindingsCodeCache", None)
    for owner, attr in (
        (getattr(async_compile, "AsyncCompile", None), "cpp_pybinding"),
        (getattr(async_compile, "AsyncCompile", None), "submit"),
        (async_compile, "get_compile_threads"),
        (codecache, "LambdaFuture"),
        (codecache, "CodeCacheFuture"),
        (cache, "suffix_template"),
        (cache, "call_entry_function"),
        (cache, "extra_parse_arg"),
        (cache, "load_async"),
        (cache, "_load_library_inner"),
        (getattr(torch._C, "_dynamo", None), "guards"),
    ):
        if owner is None or not hasattr(owner, attr):
            return f"no {getattr(owner, '__name__', owner)}.{attr}"
    if not hasattr(torch._C._dynamo.guards, "_torchinductor_pyobject_tensor_data_ptr"):
        return "no torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr"
    return None


@contextlib.contextmanager
def batched_kernels() -> Iterator[None]:
    """Batch the CPU kernels graph modules define while this is active (re-entrant); nothing
    when this torch lacks what the batching patches (tests switch it off the same way)."""
    if not usable("inductor.batched_kernels"):
        yield
        return
    from torch._inductor.async_compile import AsyncCompile

    with _PATCH_LOCK:
        if _DEPTH[0] == 0:
            if AsyncCompile.cpp_pybinding is not _batching_cpp_pybinding:
                _ORIGINAL[:] = [AsyncCompile.cpp_pybinding]
            AsyncCompile.cpp_pybinding = _batching_cpp_pybinding  # type: ignore[method-assign]
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _PATCH_LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                AsyncCompile.cpp_pybinding = _ORIGINAL[0]  # type: ignore[method-assign]


_ORIGINAL: list[Callable[..., Any]] = []  # Inductor's cpp_pybinding while patched


def _batching_cpp_pybinding(self: Any, argtypes: list[str], source_code: str) -> Any:
    from torch._inductor.async_compile import get_compile_threads

    original = _ORIGINAL[0]
    lines = [ln.strip() for ln in source_code.splitlines() if ln.strip().startswith("#include")]
    if get_compile_threads() <= 1 or lines != [_PREFIX]:
        return original(self, argtypes, source_code)
    batch = self.__dict__.get("_hasten_batch")
    if batch is None or batch.started:
        batch = self.__dict__["_hasten_batch"] = _Batch(self, get_compile_threads())
    return batch.add(argtypes, source_code)


class _Batch:
    """The kernels one graph module defined so far; built together at the first result asked."""

    def __init__(self, compiler: Any, workers: int) -> None:
        self.compiler = compiler
        self.workers = max(1, workers)
        self.kernels: list[tuple[list[str], str]] = []
        self.index: dict[tuple[tuple[str, ...], str], int] = {}
        self.started = False
        self.lock = threading.Lock()
        self.functions: list[Callable[..., Any]] | None = None

    def add(self, argtypes: list[str], source: str) -> Any:
        from torch._inductor.codecache import LambdaFuture

        key = (tuple(argtypes), source)
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.kernels)
            self.kernels.append((argtypes, source))
        return _future_class()(LambdaFuture(functools.partial(self.function, i)))

    def function(self, i: int) -> Callable[..., Any]:
        with self.lock:
            if self.functions is None:
                self.started = True
                self.functions = self._build()
        return self.functions[i]

    def _build(self) -> list[Callable[..., Any]]:
        n = len(self.kernels)
        chunks = [list(range(k, n, self.workers)) for k in range(min(self.workers, n))]
        pending: list[tuple[list[int], Callable[[], str] | None]] = []
        for chunk in chunks:  # every library is submitted before any is waited for
            try:
                pending.append((chunk, self._submit(chunk)))
            except Exception:
                pending.append((chunk, None))
        out: list[Callable[..., Any] | None] = [None] * n
        for chunk, load in pending:
            try:
                if load is None:
                    raise RuntimeError("not submitted")
                path = load()
                for i in chunk:
                    out[i] = _import_kernel(path, i)
            except Exception:  # build them Inductor's way, kernel by kernel
                for i in chunk:
                    argtypes, source = self.kernels[i]
                    out[i] = _resolve(_ORIGINAL[0](self.compiler, argtypes, source))
        return out  # type: ignore[return-value]

    def _submit(self, chunk: list[int]) -> Callable[[], str]:
        code = _combined([(i, *self.kernels[i]) for i in chunk])
        get = _kernel_library().load_async(code, "cpu", submit_fn=self.compiler.submit)
        return lambda: get().path


@functools.cache
def _future_class() -> type:
    from torch._inductor.codecache import CodeCacheFuture

    class KernelFuture(CodeCacheFuture):
        """A kernel's future, resolved by Inductor's ``wait`` (and callable meanwhile)."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def result(self, timeout: float | None = None) -> Callable[..., Any]:
            return self.inner.result()

        def __call__(self, *args: Any) -> Any:
            return self.inner.result()(*args)

    return KernelFuture


def _resolve(x: Any) -> Callable[..., Any]:
    result = getattr(x, "result", None)
    return result() if callable(result) else x


def _combined(kernels: list[tuple[int, list[str], str]]) -> str:
    """One C++ file for ``kernels`` (index, argtypes, source): each in a namespace of its own,
    its entry point ``kernel`` renamed by a macro and its Python module named ``kernel_<i>``."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache as cls

    parts = [_HEAD]
    for i, argtypes, source in kernels:
        body = source.replace(_PREFIX, "", 1)
        parseargs = ", ".join(
            f"parse_arg<{t.replace('const ', '')}>(args, {n})" for n, t in enumerate(argtypes)
        )
        suffix = cls.suffix_template.format(
            arg_len=len(argtypes),
            call_entry_func=cls.call_entry_function.format(parseargs),
            entry_func=f"kernel_{i}",
            extra_parse_arg=cls.extra_parse_arg.format(array_len=-1),
        )
        parts.append(
            f"namespace hasten_k{i} {{\n#define kernel hasten_kernel_{i}\n{body}\n{suffix}\n"
            f"#undef kernel\n}}  // namespace hasten_k{i}\n"
        )
    return "".join(parts)


@functools.cache
def _kernel_library() -> type:
    """Inductor's kernel builder (same flags, precompiled header), loading nothing itself."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    class KernelLibrary(CppPythonBindingsCodeCache):
        cache: ClassVar[dict[str, Callable[[], Any]]] = {}

        @classmethod
        def _load_library_inner(cls, path: str, key: str) -> Any:
            return types.SimpleNamespace(path=path)

    return KernelLibrary


def _import_kernel(path: str, i: int) -> Callable[..., Any]:
    """Kernel ``i``'s Python function from the library at ``path`` (its module ``kernel_<i>``)."""
    import torch

    os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(  # what Inductor's loader sets
        torch._C._dynamo.guards._torchinductor_pyobject_tensor_data_ptr  # type: ignore[attr-defined]
    )
    name = f"hasten_kernels.{abs(hash(path))}.kernel_{i}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return getattr(module, f"kernel_{i}")
