"""hasten's training compiler: TorchDynamo capture, hasten's passes, AOTAutograd + Inductor.

The public entry points are re-exported at the top level (``hasten.compile``,
``hasten.compile_step``, ``hasten.explain``, ``hasten.verify``, ``hasten.CompileConfig``); this
package adds :func:`compile_report` (what compiling a model has done so far) and :func:`grad_scaler` (the
gradient scaler of an fp16 model). Submodules are imported lazily, so ``import hasten.compiler``
stays cheap.

Pipeline::

    hasten.compile(model)             traps fixed (traps.py), CompiledForward installed (regions.py,
                                      runtime.py)
    model(x), first call              regions planned (whole model, or FSDP2 units); TorchDynamo
                                      captures graphs of hasten_forward [+ autocast], one code
                                      object per variant (train/eval x grad/no_grad/inference)
      -> backend.HastenBackend        pre-grad passes (passes/), then Inductor's compile_fx with
                                      post-grad passes hooked in; backward lowered eagerly
      -> compiled kernels             later calls: guards checked, a miss recompiles (counted)
    hasten.compile_step(train_step)   the optimizer update fused / compiled (step.py)
"""

from __future__ import annotations

import importlib
from typing import Any

from hasten.compiler.cache import check_env_cache_dir

# Before anything imports torch._dynamo, which creates $TORCHINDUCTOR_CACHE_DIR and raised
# (inside torch's import) when it could not: fall back with a warning instead (cache.py).
check_env_cache_dir()

__all__ = [
    "CompileConfig",
    "compile",
    "compile_report",
    "compile_step",
    "explain",
    "grad_scaler",
    "verify",
]

_LAZY = {
    "CompileConfig": "hasten.compiler.config",
    "compile": "hasten.compiler.api",
    "compile_step": "hasten.compiler.api",
    "explain": "hasten.compiler.api",
    "compile_report": "hasten.compiler.api",
    "verify": "hasten.compiler.api",
    "grad_scaler": "hasten.compiler.precision",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hasten.compiler' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
