"""``compile_step``: the optimizer update compiled along with the model.

``hasten.compile(model)`` compiles forward and backward; the optimizer update runs after them,
once per step, over every parameter. Eagerly, PyTorch's default Adam/AdamW on CPU loops over the
parameters in Python, a dozen elementwise kernels each, a share of the step that grows as the
model's compute shrinks (measured: docs/compiler.md#compile_step). ``compile_step`` makes that
update one pass over memory:

* ``update="fused"``: switch the optimizer to its fused kernel (Adam, AdamW, SGD, Adagrad; CPU and
  GPU), one multi-tensor kernel already compiled into PyTorch;
* ``update="inductor"``: compile ``optimizer.step`` with the hasten backend (any optimizer), with
  the learning rate held as a 0-dim tensor, so an LR scheduler changing it never
  recompiles;
* ``update="auto"`` (the default): ``"fused"`` where the optimizer has a fused kernel for the
  parameters' device, ``"inductor"`` otherwise. Measured on the benchmark models (see
  docs/compiler.md), the fused kernel beat Inductor's generated update on CPU and needs no compile.

The step function itself runs as written: its forward/backward are compiled by ``hasten.compile``.
Tracing the whole step (forward, loss, backward break, update) into one function was no faster
than this split and compiles longer (docs/compiler.md#compile_step), so hasten does not do it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

import torch

__all__ = ["UPDATES", "fused_kernel", "fused_supported", "prepare_optimizer", "steps_for_fused"]

Update = Literal["auto", "fused", "inductor"]
UPDATES: tuple[str, ...] = ("auto", "fused", "inductor")
F = TypeVar("F", bound=Callable[..., Any])


def find_optimizers(step_fn: Callable[..., Any]) -> list[torch.optim.Optimizer]:
    """Optimizers ``step_fn`` refers to by name (closure variables and globals)."""
    try:
        cv = inspect.getclosurevars(step_fn)
    except (TypeError, ValueError):  # builtins, partials of C functions, ...
        return []
    seen: list[torch.optim.Optimizer] = []
    for value in (*cv.nonlocals.values(), *cv.globals.values()):
        if isinstance(value, torch.optim.Optimizer) and all(value is not o for o in seen):
            seen.append(value)
    return seen


def _params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for g in opt.param_groups for p in g["params"]]


# The fused kernel each optimizer's fused implementation calls (AdamW's is Adam's with decoupled
# weight decay, which calls _fused_adamw_).
_FUSED_OPS: dict[str, str] = {
    "Adam": "_fused_adam_",
    "AdamW": "_fused_adamw_",
    "SGD": "_fused_sgd_",
    "Adagrad": "_fused_adagrad_",
}


def fused_kernel(opt: torch.optim.Optimizer, p: torch.Tensor) -> bool:
    """Whether ``opt``'s fused implementation can update ``p``: a floating, dense tensor on a
    device torch has this optimizer's fused kernel for. torch's list of fused devices is shared
    by all optimizers, but not every kernel exists on every device (Adagrad's was CPU-only in
    some releases; a CPU build has no CUDA kernels), so the dispatcher is asked where it can be."""
    from hasten.compiler.hooks import optim as optim_hooks

    if not (p.is_floating_point() and not p.is_sparse):
        return False
    if p.device.type not in optim_hooks.fused_devices():
        return False
    op = next((_FUSED_OPS[c.__name__] for c in type(opt).__mro__ if c.__name__ in _FUSED_OPS), None)
    if op is None:
        return True  # another optimizer with a ``fused`` flag: trust torch's device list
    key = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS", "xpu": "XPU", "hpu": "HPU"}.get(
        p.device.type
    )
    if key is None:
        return True
    has = optim_hooks.has_kernel(op, key)
    return True if has is None else has  # None: this torch cannot say; trust its device list


def fused_supported(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` has a fused kernel for all its parameters (type, device and dtype)."""
    if "fused" not in opt.defaults or opt.defaults.get("differentiable"):
        return False
    return all(fused_kernel(opt, p) for p in _params(opt))


def steps_for_fused(opt: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> None:
    """Put the step counters of ``params`` where the fused kernels read them.

    The for-loop update keeps Adam's and Adagrad's ``step`` as a CPU tensor (of the default
    dtype); the fused kernels take a float32 tensor on the parameter's device, which is where
    ``Optimizer.load_state_dict`` puts it for a fused optimizer. A plain number (an old
    checkpoint) becomes such a tensor.
    """
    for p in params:
        state = opt.state.get(p)
        if not state or "step" not in state:
            continue
        step = state["step"]
        if not isinstance(step, torch.Tensor):
            state["step"] = torch.tensor(float(step), dtype=torch.float32, device=p.device)
        elif step.device != p.device or step.dtype != torch.float32:
            state["step"] = step.to(device=p.device, dtype=torch.float32)


def prepare_optimizer(
    opt: torch.optim.Optimizer, update: Update = "auto", config: Any = None
) -> str:
    """Make ``opt``'s update fast, in place; returns what was done (``"fused"``/``"inductor"``).

    Idempotent: a prepared optimizer is left as it is.
    """
    if update not in UPDATES:
        raise ValueError(f"update={update!r} is not valid; choose one of {', '.join(UPDATES)}")
    if not isinstance(opt, torch.optim.Optimizer):
        raise TypeError(f"expected a torch.optim.Optimizer, got {type(opt).__name__}")
    done = getattr(opt, "_hasten_update", None)
    if done is not None:
        return done
    if update == "auto":
        update = "fused" if fused_supported(opt) else "inductor"
    if update == "fused":
        if not fused_supported(opt):
            raise ValueError(
                f"{type(opt).__name__} has no fused kernel for these parameters; "
                "use update='inductor' (or 'auto')"
            )
        _to_fused(opt)
    else:
        _to_inductor(opt, config)
    opt._hasten_update = update  # type: ignore[attr-defined]
    return update


def _to_fused(opt: torch.optim.Optimizer) -> None:
    opt.defaults["fused"] = True
    opt.defaults["foreach"] = None
    for group in opt.param_groups:
        group["fused"] = True
        group["foreach"] = None
    steps_for_fused(opt, _params(opt))
    from hasten.compiler.hooks.optim import recheck_fused

    recheck_fused(opt)


def _to_inductor(opt: torch.optim.Optimizer, config: Any) -> None:
    from hasten.compiler.backend import HastenBackend
    from hasten.compiler.config import CompileConfig

    for group in opt.param_groups:
        _tensorize(group, "lr")
    cfg = config if isinstance(config, CompileConfig) else CompileConfig()
    # The instance attribute shadows the method; schedulers and hooks wrapped before keep working
    # because the bound step (with its wrappers) is what gets compiled.
    opt.step = torch.compile(opt.step, backend=HastenBackend(cfg))  # type: ignore[method-assign]


def _tensorize(group: dict[str, Any], key: str) -> None:
    value = group.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        group[key] = torch.tensor(float(value), dtype=torch.float32)


def compile_step(
    step_fn: F | None = None,
    *,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    update: Update = "auto",
    config: Any = None,
) -> F | Callable[[F], F]:
    """See :func:`hasten.compile_step` (defined in :mod:`hasten.compiler.api`)."""
    if update not in UPDATES:
        raise ValueError(f"update={update!r} is not valid; choose one of {', '.join(UPDATES)}")

    def wrap(fn: F) -> F:
        if not callable(fn):
            raise TypeError(f"compile_step expects a function, got {type(fn).__name__}")
        if isinstance(optimizers, torch.optim.Optimizer):
            opts = [optimizers]
        elif optimizers is None:
            opts = find_optimizers(fn)
        else:
            opts = list(optimizers)
        if not opts:
            raise ValueError(
                "compile_step found no optimizer: pass it, e.g. "
                "hasten.compile_step(train_step, optimizers=optimizer)"
            )
        chosen = [prepare_optimizer(o, update, config) for o in opts]

        @functools.wraps(fn)
        def step(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        step.optimizer_updates = tuple(chosen)  # type: ignore[attr-defined]
        return step  # type: ignore[return-value]

    return wrap(step_fn) if step_fn is not None else wrap
