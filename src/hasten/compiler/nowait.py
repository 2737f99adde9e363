"""No-wait start (``CompileConfig(start="eager")``): train eagerly while a helper process compiles.

At the first call of a region (and variant) that is not compiled yet, hasten saves the module and
that call's inputs to a temporary file and starts a helper process, ``python -m
hasten.compiler.nowait FILE``, which compiles the same region on the same inputs with the same
config into the same on-disk cache (Inductor's FX graph and AOTAutograd caches), then exits. Until
it has exited the training process runs the region eagerly; at the first call after that it
compiles the region itself, now from a warm cache (TorchDynamo's tracing and loading the kernels),
and runs compiled from then on. The model's numerics do not change at the switch: eager and
compiled steps compute the same function (fp32: up to kernel rounding), on the same parameters and
optimizer state.

Why a process and not a thread: TorchDynamo and Inductor compile in Python, holding the GIL
for most of a compile, which would stall the training thread's own Python; running the model in
another thread would also draw dropout masks from the process's one CPU generator, changing the
training run's random numbers. A helper process has its own generator and its own GIL, and its
output is files.

When it pays: the helper takes CPU cores the eager steps would use. On a GPU, eager steps barely
use the CPU and the compile runs beside them; on a CPU-only machine with few cores the two compete
(measured in docs/compiler.md#starting-fast). The module and its inputs must pickle, and the
module's class must be importable in a fresh process (not defined in ``__main__``); when they do
not, or the helper fails, hasten compiles in the training process as with ``start="wait"``.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hasten.compiler.hooks.nn import tree_map_only

if TYPE_CHECKING:
    from hasten.compiler.runtime import CompiledCode

__all__ = ["Helper", "start_helper"]

_LIVE: list[Helper] = []


class Helper:
    """A helper process compiling one region's variant (see the module docstring).

    Attributes:
        started: ``time.perf_counter()`` when it was started.
        ended: When it was seen to have exited (``None`` while it runs).
        returncode: Its exit status (``None`` while it runs).
    """

    def __init__(self, proc: subprocess.Popen[bytes], payload: Path, log: Path) -> None:
        self.proc = proc
        self.payload = payload
        self.log = log
        self.started = time.perf_counter()
        self.ended: float | None = None
        self.returncode: int | None = None

    def running(self) -> bool:
        """Whether it still compiles (checked without blocking)."""
        if self.returncode is None and self.proc.poll() is not None:
            self.returncode = self.proc.returncode
            self.ended = time.perf_counter()
            self.payload.unlink(missing_ok=True)
        return self.returncode is None

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until it has exited (or ``timeout``); its exit status."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.running()
        return self.returncode

    def error(self) -> str:
        """The last lines of its log (after a failure)."""
        try:
            return " ".join(self.log.read_text().strip().splitlines()[-3:])[-500:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.payload.unlink(missing_ok=True)


def start_helper(
    code: CompiledCode,
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    variant: str,
) -> Helper | str:
    """Start a helper compiling ``code``'s ``variant`` on this call's inputs.

    Returns:
        The :class:`Helper`, or why none could be started (the caller then compiles itself).
    """
    folder = Path(tempfile.mkdtemp(prefix="hasten_nowait_"))
    payload, log = folder / "payload.pt", folder / "helper.log"
    detach = lambda t: t.detach().clone().requires_grad_(t.requires_grad)  # noqa: E731
    try:
        inputs = tree_map_only(torch.Tensor, detach, (args, kwargs))
        torch.save(
            {
                "module": module,
                "inputs": inputs,
                "config": _fields(code.config.replace(start="wait", rank_wait_s=0)),
                "label": code.label,
                "kind": code.kind,
                "variant": variant,
                "device": code.device_type,
                "out_dtype": code.out_dtype,
                # Inductor's CPU kernels are generated for this thread count and it is part of
                # their cache key: a helper with another count (an inherited OMP_NUM_THREADS)
                # would fill the cache with kernels this process never finds
                "threads": torch.get_num_threads(),
            },
            payload,
        )
    except Exception as err:  # an unpicklable module or input: compile in this process
        return f"{type(err).__name__}: {err}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the caller's imports
    env["OMP_NUM_THREADS"] = str(torch.get_num_threads())  # see "threads" in the payload
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hasten.compiler.nowait", str(payload)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    helper = Helper(proc, payload, log)
    if not _LIVE:
        atexit.register(_stop_all)
    _LIVE.append(helper)
    return helper


def _fields(config: Any) -> dict[str, Any]:
    """``config``'s fields, picklable (its mappings are read-only proxies, which do not pickle)."""
    import dataclasses
    from collections.abc import Mapping

    return {
        f.name: dict(v) if isinstance(v := getattr(config, f.name), Mapping) else v
        for f in dataclasses.fields(config)
    }


def _stop_all() -> None:
    for h in _LIVE:
        h.stop()


def _grad_mode(variant: str) -> Any:
    mode = variant.split("_", 1)[1]
    if mode == "inference":
        return torch.inference_mode()
    return torch.set_grad_enabled(mode == "grad")


def main(path: str) -> None:
    """The helper: compile the saved region on the saved inputs, then exit."""
    from hasten.compiler.config import CompileConfig
    from hasten.compiler.report import CompileRecord
    from hasten.compiler.runtime import CompiledCode

    p = torch.load(path, weights_only=False)
    torch.set_num_threads(p["threads"])  # the training process's, whatever the environment says
    module: nn.Module = p["module"]
    module.train(p["variant"].startswith("train"))
    code = CompiledCode(
        p["label"],
        p["kind"],
        CompileConfig(**p["config"]),
        CompileRecord(),
        p["device"],
        p["out_dtype"],
    )
    args, kwargs = p["inputs"]
    with _grad_mode(p["variant"]):
        code.run(module, args, kwargs)
    if code.failed:
        raise SystemExit(f"hasten helper: compiling {p['label']} failed: {code.record.fallback}")


if __name__ == "__main__":
    main(sys.argv[1])
