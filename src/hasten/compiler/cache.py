"""The on-disk compile cache: where it is, whether it is intact, and moving it between machines.

Inductor keeps what it compiles under one directory (``$TORCHINDUCTOR_CACHE_DIR``, else
``<tmp>/torchinductor_<user>``; ``CompileConfig(cache_dir=...)`` points one model elsewhere):
``fxgraph/`` and ``aotautograd/`` hold compiled graphs (written atomically), the two-letter
folders hold kernels as C++ sources and the shared libraries built from them (``.so``, written by
the C++ compiler in place, so a compile killed midway can leave a truncated one), ``triton/``
GPU kernels. A second process with the same graphs finds them there and starts warm.

What hasten adds:

* **Integrity** (:func:`scan`, :func:`repair`, :func:`ensure_intact`): a shared library shorter
  than its own ELF headers say (a killed compile), or an empty entry, is corrupt. Loading such a
  ``.so`` fails ("file too short") or crashes the process (SIGBUS), and Inductor never rebuilds
  it, so every later run fell back to eager. hasten checks the cache once per process before its
  first compile, removes corrupt entries with a warning naming them, and Inductor rebuilds them.
  ``hasten doctor`` and ``hasten cache show`` report them.
* **Moving it** (:func:`export_cache`, :func:`import_cache`): a ``.tar.gz`` of the directory with a
  manifest (torch and hasten versions, CPU), so a cluster job compiles once and ships the archive
  to every node. The archive is of the directory, not of
  ``torch.compiler.save_cache_artifacts()``, because that serializes only what was compiled in the
  calling process, so a separate command cannot produce it; the directory holds every run's.
  Entries only hit with the same torch version (and, for GPU kernels, GPU; for CPU kernels, an
  instruction set the kernels were built for).
* **A cache directory that cannot be used** (:func:`check_env_cache_dir`): torch creates
  ``$TORCHINDUCTOR_CACHE_DIR`` while ``torch._dynamo`` is imported and crashed there when it could
  not; hasten checks it before that import and falls back to torch's default, with a warning.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import struct
import sys
import tarfile
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CacheScan",
    "CacheWarning",
    "Corrupt",
    "cache_dir",
    "check_env_cache_dir",
    "clear_cache",
    "ensure_intact",
    "export_cache",
    "import_cache",
    "repair",
    "scan",
]

MANIFEST = "hasten-cache.json"
_SKIP_DIRS = ("locks",)  # lock files of a running compile: never exported, never corrupt


class CacheWarning(UserWarning):
    """The compile cache was unusable or held corrupt entries, and hasten worked around it."""


@dataclass(frozen=True)
class Corrupt:
    """One corrupt cache entry: its path and why it is corrupt."""

    path: str
    reason: str


@dataclass(frozen=True)
class CacheScan:
    """What :func:`scan` found in a cache directory."""

    path: str
    exists: bool
    files: int = 0
    bytes: int = 0
    kernels: int = 0  # shared libraries (.so)
    graphs: int = 0  # entries of fxgraph/ and aotautograd/
    corrupt: tuple[Corrupt, ...] = field(default=())


def default_cache_dir() -> str:
    """torch's default cache directory, ``<tmp>/torchinductor_<user>`` (computed as torch does,
    without importing ``torch._inductor``)."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        getuid = getattr(os, "getuid", None)
        user = f"uid_{getuid()}" if callable(getuid) else "unknown_user"
    return os.path.join(
        tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user)
    )


def cache_dir(config_dir: str | os.PathLike[str] | None = None) -> str:
    """The cache directory a compile uses: ``config_dir``, else ``$TORCHINDUCTOR_CACHE_DIR``, else
    torch's default; absolute, not created."""
    path = config_dir if config_dir is not None else os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return os.path.abspath(os.fspath(path) if path is not None else default_cache_dir())


def _usable(path: str) -> str | None:
    """Why ``path`` cannot serve as a cache directory (``None``: it can; it is created)."""
    if any(ch.isspace() for ch in path):
        return "it contains whitespace, which Inductor's C++ builds cannot handle"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        return f"it cannot be created ({type(err).__name__}: {err})"
    if not os.access(path, os.W_OK | os.X_OK):
        return "it is not writable"
    return None


def check_env_cache_dir() -> str | None:
    """Fall back, with a :class:`CacheWarning`, when ``$TORCHINDUCTOR_CACHE_DIR`` is unusable.

    Must run before ``torch._dynamo`` is imported, which creates the directory and raised when it
    could not (hasten imports it lazily, after this check). The fallback is torch's default
    directory, else a fresh temporary one; ``TORCHINDUCTOR_CACHE_DIR`` is set to it, as torch
    itself sets that variable when it resolves the directory. Returns the fallback, or ``None``
    when nothing was changed.
    """
    raw = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if raw is None or "torch._dynamo" in sys.modules:
        return None
    why = _usable(os.path.abspath(raw))
    if why is None:
        return None
    fallback = default_cache_dir()
    if _usable(fallback) is not None:
        fallback = tempfile.mkdtemp(prefix="torchinductor_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = fallback
    warnings.warn(
        f"hasten: TORCHINDUCTOR_CACHE_DIR={raw!r} cannot be used as the compile cache: {why}. "
        f"Compiled kernels are cached in {fallback} instead. Set TORCHINDUCTOR_CACHE_DIR to a "
        "writable directory without spaces (or unset it).",
        CacheWarning,
        stacklevel=2,
    )
    return fallback


def _elf_problem(path: str, size: int) -> str | None:
    """Why the shared library at ``path`` cannot be loaded whole (``None``: it looks intact).

    The ELF header says where the program headers (the segments the loader maps) and the section
    headers (usually last in the file) are; a file that ends before them was truncated.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF":
                return f"not a complete shared library ({size} bytes, no ELF header): truncated"
            is64, endian = head[4] == 2, "<" if head[5] == 1 else ">"
            if is64:
                if len(head) < 64:
                    return f"truncated ELF header ({size} bytes)"
                phoff, shoff = struct.unpack_from(endian + "QQ", head, 0x20)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(endian + "HHHH", head, 0x36)
            else:
                phoff, shoff = struct.unpack_from(endian + "II", head, 0x1C)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(endian + "HHHH", head, 0x2A)
            need = max(shoff + shnum * shentsize, phoff + phnum * phentsize)
            if size < need:
                return f"truncated: {size} bytes, its ELF headers need {need}"
            f.seek(phoff)
            table = f.read(phnum * phentsize)
    except OSError as err:
        return f"unreadable ({type(err).__name__}: {err})"
    for i in range(phnum):
        at = i * phentsize
        if is64:
            offset, filesz = (
                struct.unpack_from(endian + "Q", table, at + 8)[0],
                struct.unpack_from(endian + "Q", table, at + 32)[0],
            )
        else:
            offset, filesz = (
                struct.unpack_from(endian + "I", table, at + 4)[0],
                struct.unpack_from(endian + "I", table, at + 16)[0],
            )
        if offset + filesz > size:
            return f"truncated: a segment ends at byte {offset + filesz}, the file at {size}"
    return None


def _being_written(root: str, name: str) -> bool:
    """Whether another compile holds this entry's lock (``locks/<key>.lock``) right now.

    Inductor builds a kernel under that lock, so a ``.so`` that looks truncated while the lock is
    held is being written (another rank, another process), not broken.
    """
    from filelock import FileLock, Timeout

    lock_path = os.path.join(root, "locks", name.split(".")[0] + ".lock")
    if not os.path.exists(lock_path):
        return False
    lock = FileLock(lock_path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return True
    except OSError:  # a read-only cache: nobody writes there either
        return False
    lock.release()
    return False


# files Inductor leaves empty on purpose: newer torch (2.15) marks a vectorisation probe library
# that loaded with an empty ``<library>.so.load_ok`` next to it
_EMPTY_BY_DESIGN = (".load_ok",)


def scan(path: str | os.PathLike[str] | None = None) -> CacheScan:
    """Count a cache directory's entries and find the corrupt ones (``None``: :func:`cache_dir`).

    Corrupt: a shared library shorter than its ELF headers require, or an empty file (other
    than the markers Inductor leaves empty), unless a compile holds its lock (it is being
    written).
    """
    root = cache_dir(path)
    if not os.path.isdir(root):
        return CacheScan(root, exists=False)
    files = total = kernels = graphs = 0
    corrupt: list[Corrupt] = []
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == root:
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
        top = os.path.relpath(dirpath, root).split(os.sep)[0]
        for name in filenames:
            full = os.path.join(dirpath, name)
            try:
                size = os.stat(full).st_size
            except OSError:  # removed meanwhile (another process's compile)
                continue
            if name == MANIFEST or name.endswith((".lock", ".tmp")):
                continue
            files += 1
            total += size
            if top in ("fxgraph", "aotautograd"):
                graphs += 1
            if name.endswith(".so"):
                kernels += 1
                problem = _elf_problem(full, size)
            elif name.endswith(_EMPTY_BY_DESIGN):
                problem = None
            else:
                problem = "empty file" if size == 0 else None
            if problem is not None and not _being_written(root, name):
                corrupt.append(Corrupt(full, problem))
    return CacheScan(root, True, files, total, kernels, graphs, tuple(corrupt))


def repair(path: str | os.PathLike[str] | None = None) -> list[Corrupt]:
    """Remove the corrupt entries of a cache directory (Inductor rebuilds them); returns them."""
    removed = []
    for entry in scan(path).corrupt:
        with contextlib.suppress(FileNotFoundError):
            os.remove(entry.path)
        removed.append(entry)
    return removed


_CHECKED: set[str] = set()
_CHECK_LOCK = threading.Lock()


def ensure_intact(path: str | os.PathLike[str] | None = None) -> list[Corrupt]:
    """:func:`repair` a cache directory once per process, warning when it removed anything.

    Called by hasten's backend before its first compile into a directory.
    """
    root = cache_dir(path)
    with _CHECK_LOCK:
        if root in _CHECKED:
            return []
        _CHECKED.add(root)
    removed = repair(root)
    if removed:
        names = ", ".join(os.path.relpath(c.path, root) for c in removed[:3])
        more = f" and {len(removed) - 3} more" if len(removed) > 3 else ""
        warnings.warn(
            f"hasten: the compile cache at {root} held {len(removed)} corrupt entr"
            f"{'y' if len(removed) == 1 else 'ies'} ({names}{more}: {removed[0].reason}), most "
            "likely left by a compile that was killed; removed, so they are rebuilt now instead "
            "of making every run fall back to eager.",
            CacheWarning,
            stacklevel=2,
        )
    return removed


def clear_cache(path: str | os.PathLike[str] | None = None, *, corrupt_only: bool = False) -> int:
    """Delete a cache directory's contents (or only its corrupt entries); returns files removed."""
    if corrupt_only:
        return len(repair(path))
    root = cache_dir(path)
    found = scan(root)
    if not found.exists:
        return 0
    for name in os.listdir(root):
        full = os.path.join(root, name)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            os.remove(full)
    return found.files


def _manifest(scanned: CacheScan) -> dict[str, object]:
    import torch

    from hasten import __version__

    try:
        from hasten.machine import cpu_model

        cpu = cpu_model()
    except Exception:  # the bench extras are optional; the CPU is informative only
        cpu = "unknown"
    return {
        "kind": "hasten.compile-cache",
        "torch": torch.__version__,
        "hasten": __version__,
        "python": sys.version.split()[0],
        "cpu": cpu,
        "cuda": torch.version.cuda,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": scanned.files,
        "bytes": scanned.bytes,
    }


def export_cache(
    archive: str | os.PathLike[str], path: str | os.PathLike[str] | None = None
) -> dict[str, object]:
    """Write the cache directory's intact entries to ``archive`` (``.tar.gz``); returns the manifest.

    Raises:
        ValueError: there is no cache directory, or it is empty.
    """
    found = scan(path)
    if not found.exists or found.files == 0:
        raise ValueError(
            f"there is no compile cache to export at {found.path}; run a compiled model first, or "
            "pass --dir (the cache_dir it compiled into)"
        )
    bad = {c.path for c in found.corrupt}
    manifest = _manifest(found)
    out = Path(archive)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        data = json.dumps(manifest, indent=2).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
        for dirpath, dirnames, filenames in os.walk(found.path):
            if dirpath == found.path:
                dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                if full in bad or name.endswith((".lock", ".tmp")) or os.path.islink(full):
                    continue
                tar.add(full, arcname=os.path.relpath(full, found.path), recursive=False)
    manifest["skipped_corrupt"] = len(bad)
    return manifest


def import_cache(
    archive: str | os.PathLike[str], path: str | os.PathLike[str] | None = None
) -> dict[str, object]:
    """Unpack an :func:`export_cache` archive into the cache directory; returns its manifest.

    Existing entries are kept (same name, same content: the names are content hashes). Members
    that are not plain files or folders, or that would land outside the directory, are refused.
    Warns when the archive was made with another torch version (its entries would never hit).

    Raises:
        ValueError: ``archive`` is not a hasten cache archive, or holds an unsafe member.
    """
    import torch

    root = cache_dir(path)
    why = _usable(root)
    if why is not None:
        raise ValueError(f"cannot import into the compile cache at {root}: {why}")
    try:
        opened = tarfile.open(archive, "r:*")  # noqa: SIM115 (closed by the with below)
    except (OSError, tarfile.TarError) as err:
        raise ValueError(f"{archive} is not a readable .tar.gz archive: {err}") from err
    with opened as tar:
        try:
            member = tar.extractfile(MANIFEST)
            manifest = json.loads(member.read()) if member is not None else None
        except (KeyError, json.JSONDecodeError):
            manifest = None
        if not isinstance(manifest, dict) or manifest.get("kind") != "hasten.compile-cache":
            raise ValueError(f"{archive} is not a hasten compile-cache archive (no {MANIFEST})")
        members = []
        for m in tar.getmembers():
            if m.name == MANIFEST:
                continue
            target = os.path.abspath(os.path.join(root, m.name))
            inside = target == root or target.startswith(root + os.sep)
            if not (m.isfile() or m.isdir()) or not inside or (target == root and m.isfile()):
                raise ValueError(f"{archive} holds an unsafe member {m.name!r}; refusing it")
            if m.isfile() and os.path.exists(target):
                continue
            members.append(m)
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(root, members=members, **kwargs)
    if manifest.get("torch") != torch.__version__:
        warnings.warn(
            f"hasten: {archive} was made with torch {manifest.get('torch')}, this is torch "
            f"{torch.__version__}: its entries will not be used (they are keyed by version)",
            CacheWarning,
            stacklevel=2,
        )
    manifest["imported"] = sum(1 for m in members if m.isfile())
    manifest["removed_corrupt"] = len(repair(root))
    return manifest
