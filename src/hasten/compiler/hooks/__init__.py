"""The one boundary between hasten and torch's private internals (Dynamo, Inductor, ...).

Everything hasten uses of torch that is not public API goes through this package: private
modules (``torch._dynamo``, ``torch._inductor``, ``torch._functorch``, ``torch._C``), private
attributes, Inductor config keys and Dynamo counter names spelled as strings. The rest of hasten
calls these functions and torch's public API only, so a torch release that moves an internal
breaks one module here, not the compiler's logic.

Each hook has a *probe* (:func:`register`): a function that says, without side effects, whether
this torch has what the hook needs. A hook is one of two kinds:

* **optional** (most): an optimisation or a diagnostic. When its probe fails hasten skips it and
  compiles with plain Inductor; :func:`skipped` lists it, and the compile report carries one
  line per skipped hook (``torch hook skipped: ...``). Never an eager fallback, never a crash.
* **required**: what ``hasten.compile`` cannot work without (Dynamo's frame evaluation with a
  backend, Inductor's ``compile_fx``, ``nn.Module``'s compiled-call slot). When one fails,
  :func:`require` raises an error naming the hook and the torch range hasten supports.

``python -c "import hasten.compiler.hooks as h; print(h.table())"`` prints every hook and its
state on this torch.

Modules: :mod:`.dynamo` (TorchDynamo: frames, counters, limits), :mod:`.inductor` (Inductor
config, ``compile_fx``, its cache directory), :mod:`.kernels` (CPU kernels built a few to a
library), :mod:`.vec_isa` (Inductor's CPU ISA probe, once per cache directory), :mod:`.split`
(compiling a split graph part by part), :mod:`.optim` (the fused-optimizer kernels), :mod:`.nn`
(``nn.Module``'s private call slots, graph targets, torch's pytree), :mod:`.aten` (private ATen
ops, the oneDNN bf16 query).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "SUPPORTED_TORCH",
    "Hook",
    "HookUnavailableError",
    "hooks",
    "missing",
    "register",
    "require",
    "skipped",
    "table",
    "usable",
]

SUPPORTED_TORCH = ">=2.13"
"""The torch range the test suite passes on (``pyproject.toml`` declares the same floor): the
pin (2.13) and the newest release (2.15) pass; torch 2.6 compiles (five optional hooks skipped)
but 24 of the suite's 462 tests fail there (docs/compiler.md)."""


class HookUnavailableError(RuntimeError):
    """A torch internal that hasten cannot compile without is missing from this torch."""


@dataclass(frozen=True)
class Hook:
    """One use of a torch internal.

    Attributes:
        name: Short id, e.g. ``"dynamo.recompile_limit"``.
        what: What hasten does with it, for the report and :func:`table`.
        probe: Returns ``None`` when this torch has what the hook needs, else why not (it must
            not raise for a missing internal, and must have no side effects).
        required: hasten cannot compile without it (see the module docstring).
    """

    name: str
    what: str
    probe: Callable[[], str | None]
    required: bool = False


_HOOKS: dict[str, Hook] = {}


def register(
    name: str, what: str, *, required: bool = False
) -> Callable[[Callable[[], str | None]], Callable[[], str | None]]:
    """Decorator: register the decorated probe as hook ``name``."""

    def deco(probe: Callable[[], str | None]) -> Callable[[], str | None]:
        if name in _HOOKS:
            raise ValueError(f"torch hook {name!r} is registered twice")
        _HOOKS[name] = Hook(name, what, probe, required)
        return probe

    return deco


def hooks() -> tuple[Hook, ...]:
    """Every registered hook (the modules of this package imported)."""
    _load_all()
    return tuple(_HOOKS.values())


@functools.cache
def missing(name: str) -> str | None:
    """Why hook ``name`` is unusable on this torch (``None``: usable). Probed once, cached."""
    _load_all()
    hook = _HOOKS.get(name)
    if hook is None:
        raise KeyError(f"no torch hook named {name!r}; known: {', '.join(sorted(_HOOKS))}")
    try:
        return hook.probe()
    except Exception as err:  # a probe that trips over a moved internal: that is a "no"
        return f"its probe raised {type(err).__name__}: {err}"


def usable(name: str) -> bool:
    """Whether hook ``name`` works on this torch."""
    return missing(name) is None


def require(name: str) -> None:
    """Raise :class:`HookUnavailableError` when required hook ``name`` is unusable."""
    why = missing(name)
    if why is not None:
        import torch

        raise HookUnavailableError(
            f"hasten cannot compile on torch {torch.__version__}: {_HOOKS[name].what} "
            f"({name}) is unavailable: {why}. hasten supports torch{SUPPORTED_TORCH}; install a "
            "torch in that range, or run the model without hasten.compile."
        )


def skipped() -> tuple[str, ...]:
    """One line per optional hook that this torch lacks and hasten therefore skips."""
    return tuple(
        f"{h.name} ({h.what}): {missing(h.name)}"
        for h in hooks()
        if not h.required and missing(h.name) is not None
    )


def table() -> str:
    """Every hook and whether this torch has it, one line each."""
    rows = []
    for h in hooks():
        why = missing(h.name)
        state = "ok" if why is None else ("MISSING" if h.required else "skipped")
        kind = "required" if h.required else "optional"
        rows.append(f"{state:8} {kind:8} {h.name}: {h.what}" + (f" ({why})" if why else ""))
    return "\n".join(rows)


def _load_all() -> None:
    # Importing a module registers its hooks; none of them imports torch's internals at import.
    from hasten.compiler.hooks import (  # noqa: F401
        aten,
        dynamo,
        inductor,
        kernels,
        nn,
        optim,
        split,
        vec_isa,
    )
