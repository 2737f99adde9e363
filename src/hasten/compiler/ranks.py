"""One compile per node under torchrun: local rank 0 compiles, the other ranks reuse its artifacts.

Every rank of a ``torchrun`` job compiles the same model on the same shapes. Compiled alone, each
one pays the whole cold compile (on a 2-core machine two ranks compiling at once also take each
other's cores). hasten lets local rank 0 (the *leader*) compile each region first; the other ranks
of the node wait for it, then compile from Inductor's on-disk caches (FX graph cache and
AOTAutograd cache, on by default), which the leader has just filled: what is left for them is
TorchDynamo's tracing and loading the compiled kernels.

Coordination goes through small marker files next to the cache, one per region and variant::

    <cache dir>/hasten-ranks/<TORCHELASTIC_RUN_ID>-<restart>/<region>.<variant>.start   leader pid
    <cache dir>/hasten-ranks/<TORCHELASTIC_RUN_ID>-<restart>/<region>.<variant>.done    ok | failed

A rank other than the leader waits for ``.done`` at most ``CompileConfig.rank_wait_s`` seconds;
it stops waiting at once when the leader's process is gone (it died while compiling: a pid that
no longer exists on this node), and when the leader's compile failed. It then compiles locally,
so a dead or stuck leader never hangs the job. Only the first compile of each variant is
coordinated; recompiles are compiled by each rank, as they are not guaranteed to happen on
every rank.

Ranks of one node share the cache when they share ``TORCHINDUCTOR_CACHE_DIR`` (or
``CompileConfig.cache_dir``): torch's default, ``/tmp/torchinductor_<user>``, is per node and
user, so they do under a plain ``torchrun``. On other nodes each local rank 0 compiles for its
node.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["RankGate", "rank_gate"]

_POLL_S = 0.2


class RankGate:
    """The leader/follower protocol of one torchrun job on one node (see the module docstring).

    Args:
        directory: Where the job's marker files go.
        leader: Whether this process compiles first (local rank 0).
        wait_s: How long a follower waits for the leader's compile of one region.
    """

    def __init__(self, directory: Path, leader: bool, wait_s: float) -> None:
        self.directory = directory
        self.leader = leader
        self.wait_s = wait_s
        self.waited_s = 0.0
        """Seconds this rank spent waiting for the leader, all regions together."""
        self.outcomes: list[str] = []
        """Per coordinated compile: ``"led"``, ``"followed"``, ``"leader failed"``,
        ``"leader died"`` or ``"timed out"``."""

    @contextlib.contextmanager
    def turn(self, key: str) -> Iterator[None]:
        """Hold this rank's turn to compile ``key`` (a region and variant) around the compile."""
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", key)
        start, done = self.directory / f"{name}.start", self.directory / f"{name}.done"
        if not self.leader:
            self.outcomes.append(self._wait(start, done))
            yield
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        _write(start, str(os.getpid()))
        ok = False
        try:
            yield
            ok = True
        finally:
            _write(done, "ok" if ok else "failed")
            self.outcomes.append("led")

    def _wait(self, start: Path, done: Path) -> str:
        t0 = time.monotonic()
        try:
            while True:
                if done.exists():
                    status = _read(done)
                    return "followed" if status == "ok" else "leader failed"
                pid = _read(start)
                if pid.isdigit() and not _alive(int(pid)):
                    return "leader died"
                if time.monotonic() - t0 >= self.wait_s:
                    return "timed out"
                time.sleep(_POLL_S)
        finally:
            self.waited_s += time.monotonic() - t0


def rank_gate(wait_s: float, cache_dir: str | None) -> RankGate | None:
    """The gate of this process when it runs under torchrun with other local ranks, else ``None``.

    Args:
        wait_s: ``CompileConfig.rank_wait_s`` (``0`` turns the coordination off).
        cache_dir: ``CompileConfig.cache_dir`` (``None``: Inductor's cache directory).
    """
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    local_rank = os.environ.get("LOCAL_RANK")
    if wait_s <= 0 or not run_id or local_rank is None:
        return None
    if int(os.environ.get("LOCAL_WORLD_SIZE", "1")) < 2:
        return None
    if cache_dir is None:
        from hasten.compiler.hooks.inductor import cache_dir as inductor_cache_dir

        try:
            cache_dir = inductor_cache_dir()
        except OSError:  # an unusable cache directory: the compile falls back on its own
            return None
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{run_id}-{restart}")
    return RankGate(Path(cache_dir) / "hasten-ranks" / tag, local_rank == "0", wait_s)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process took the pid: ours is gone
        return False
    return True


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # atomic: a reader sees all of it or nothing


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""
