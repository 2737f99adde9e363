"""``CompileConfig``: every choice ``hasten.compile`` makes, in one validated, frozen object.

::

    import hasten

    model = hasten.compile(model)                                  # the defaults
    model = hasten.compile(model, precision="bf16")                # keyword overrides
    cfg = hasten.CompileConfig(mode="max-autotune", passes={"attention_to_sdpa": False})
    model = hasten.compile(model, cfg)

Bad values and bad combinations raise ``ValueError``/``TypeError`` naming the fix, when the config
is built (or, for checks that need the model's device, when ``hasten.compile`` sees the model).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import torch

__all__ = [
    "FALLBACKS",
    "GLUES",
    "MODES",
    "PRECISIONS",
    "REGIONS",
    "STARTS",
    "CompileConfig",
    "compile_at_once",
    "normalize_precision",
    "resolve_config",
]

Mode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
Precision = Literal["fp32", "bf16", "fp16"]
# Other spellings ``precision`` accepts: Lightning's Trainer(precision=...) names and dtype names.
PrecisionAlias = Literal[
    "bf16-mixed", "16-mixed", "32-true", "32", "16", "bfloat16", "float16", "float32"
]
Fallback = Literal["eager", "raise"]
Regions = Literal["auto", "blocks", "whole"]
Glue = Literal["eager", "modules", "loss"]
Start = Literal["wait", "eager"]

MODES: tuple[str, ...] = (
    "default",
    "reduce-overhead",
    "max-autotune",
    "max-autotune-no-cudagraphs",
)
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp16")
_PRECISION_ALIASES: dict[Any, str] = {
    "bf16-mixed": "bf16",
    "16-mixed": "fp16",
    "16": "fp16",
    "32-true": "fp32",
    "32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
}
# Lightning settings hasten does not mean the same thing by: named, with what to do instead.
_PRECISION_REFUSED: dict[str, str] = {
    "bf16-true": "casts the parameters themselves to bfloat16",
    "16-true": "casts the parameters themselves to float16",
    "64-true": "trains in float64",
    "64": "trains in float64",
    "transformer-engine": "uses NVIDIA Transformer Engine's fp8 layers",
}
FALLBACKS: tuple[str, ...] = ("eager", "raise")
REGIONS: tuple[str, ...] = ("auto", "blocks", "whole")
GLUES: tuple[str, ...] = ("eager", "modules", "loss")
STARTS: tuple[str, ...] = ("wait", "eager")


@dataclass(frozen=True, kw_only=True)
class CompileConfig:
    """How ``hasten.compile`` compiles a model. All fields are keyword-only.

    Example::

        cfg = CompileConfig(precision="bf16", fallback="raise")
        cfg2 = cfg.replace(mode="max-autotune")
    """

    mode: Mode = "default"
    """Inductor's mode. ``"max-autotune"`` benchmarks GEMM kernels (C++ templates on CPU, Triton
    on GPU) at compile time: slower compiles, sometimes faster steps. ``"reduce-overhead"`` adds
    CUDA graphs (GPU only)."""

    precision: Precision | PrecisionAlias | torch.dtype = "fp32"
    """``"fp32"`` keeps the model's numerics. ``"bf16"`` runs the forward (and so the backward)
    under bfloat16 autocast, applied by hasten inside the compiled forward, so the training loop
    stays as it is; parameters, gradients and optimizer state stay fp32, and floating outputs come
    back as fp32. Needs a CPU with native bf16 (AVX512-BF16/AMX) or a GPU that supports it.
    ``"fp16"`` is the same with float16 and needs CUDA and a gradient scaler (see
    ``hasten.compiler.grad_scaler``). Also accepted, and stored as one of those three:
    ``torch.float32``/``torch.bfloat16``/``torch.float16`` and Lightning's ``"32-true"``,
    ``"bf16-mixed"``, ``"16-mixed"`` (see :func:`normalize_precision`)."""

    passes: Mapping[str, bool] = field(default_factory=dict, hash=False)
    """Turn hasten's graph passes on or off by name, e.g. ``{"attention_to_sdpa": False}``;
    passes not named keep their default (see ``hasten.compiler.passes.pass_names()``)."""

    dynamic: bool | None = None
    """Dynamic shapes: ``None`` lets TorchDynamo mark a dimension dynamic after it changed once,
    except the batch size: a call of another batch size than the compiled one runs eagerly while
    such calls stay rare (the short last batch of an epoch), instead of recompiling (see
    ``hasten.compiler.traps.OddBatches``); ``True`` compiles shape-generic kernels up front;
    ``False`` specializes on every shape."""

    fullgraph: bool = False
    """Demand one graph for the whole forward: a graph break is an error (then handled by
    ``fallback``) instead of a split."""

    fallback: Fallback = "eager"
    """What happens when compiling fails: ``"eager"`` warns, naming the cause, and runs the model
    eagerly from then on, so training never stops; ``"raise"`` raises the error."""

    verify_first_call: bool = True
    """Check each compiled variant (training, evaluation, ...) against eager on the first batch
    it runs: outputs and gradients, from the same state (RNG, BatchNorm statistics), one extra
    compiled and one eager forward and backward per variant. On a mismatch beyond the
    precision's tolerance hasten does not train on the wrong result: it retries with safer
    settings (its own passes off, then Inductor options off), runs the variant eagerly if none
    agrees, and warns once, naming the worst tensor, what it tried and a reproducer it wrote
    (see :mod:`hasten.compiler.check`). ``False`` skips the check."""

    cache_dir: str | None = None
    """Inductor's on-disk cache (compiled kernels and graphs), which makes the second process
    start warm. ``None`` keeps torch's default (``$TORCHINDUCTOR_CACHE_DIR`` or a temp dir)."""

    fix_known_traps: bool = True
    """Fix known compile traps on the model before compiling when the fix cannot change results
    (e.g. set Transformers' ``loss_type`` to the default it falls back to, so the warning it logs
    inside ``forward`` no longer breaks the graph). Each fix is reported by ``hasten.explain``."""

    fused_optimizer: bool = True
    """Step the model's optimizer with its fused kernel: an ``Adam``, ``AdamW``, ``SGD`` or
    ``Adagrad`` over this model's parameters whose param groups leave ``fused``/``foreach`` to
    PyTorch switches to ``fused=True`` before its first step (one multi-tensor update instead of
    a loop over the parameters; same arithmetic, reordered), logged once. Explicit choices
    (``fused``, ``foreach``, ``capturable``, ``differentiable``) are kept. ``False`` leaves the
    optimizer as made. See :mod:`hasten.compiler.optimizer`."""

    reuse_host_memory: bool | None = None
    """CPU under glibc: large buffers (a language model's logits and their gradient, a large
    parameter's gradient: tens to hundreds of MB) reuse freed process memory instead of fresh pages
    from the operating system at every step: ``malloc`` stops using ``mmap`` and keeps up to
    2 GiB of free heap. ``None`` (default): on when the model has a parameter of 32 MiB or more
    (a GPT-2-, BERT- or Llama-sized embedding); ``True``: on for any CPU model; ``False``: never.
    GPT-2 124M's bf16 step ran 1.30-1.35x as fast at about 10 % more peak RSS, level over 300
    steps; glibc's aligned allocations can fragment the heap (a 64 MiB buffer reallocated in a
    loop held 0.67 GiB). Process-wide and lasting (malloc has no per-call setting), applied when a
    model is compiled for a CPU, logged once; skipped where another allocator is preloaded or
    ``MALLOC_*`` is set; processes forked later get glibc's usual thresholds back. See
    :mod:`hasten.compiler.host_memory`."""

    warn_recompiles: int = 4
    """Warn, with the guards that failed, once a compiled forward has been recompiled this many
    times: half of torch's limit (8), after which Dynamo silently runs it eagerly; a warning also
    comes when the limit is hit. ``0`` disables. (Switching train/eval or grad/no-grad recompiles
    once or twice in a normal loop, which is why the default is not lower.)"""

    regions: Regions = "auto"
    """What one compiled graph covers, and when it is compiled. ``"whole"``: the model's whole
    call, one graph when nothing breaks it, compiled at the first call. ``"blocks"``: each block
    that repeats (children of an ``nn.ModuleList`` or ``nn.Sequential`` of one class and
    parameter shapes, e.g. a transformer's layers) is compiled once and the compiled code shared
    by all of them; the code around the blocks (embeddings, final norm, head, loss) runs
    eagerly. Cold compile time then stops growing with depth. ``"auto"`` (default): the whole
    model, compiled when the run pays for it (:mod:`hasten.compiler.plan`): with ``steps`` known,
    only if the steps left save more than the compile costs, and for a model with repeated
    blocks the cheapest of eager, blocks and whole by the run's expected total time (blocks win
    medium runs); otherwise once the run has spent a compile's worth of time eagerly; and back
    to eager if the compiled step measures slower.
    Under ``torch.distributed`` "auto" compiles at the first call, as "whole". FSDP2 models are
    always compiled by unit."""

    glue: Glue = "eager"
    """With ``regions="blocks"``, what runs the code around the blocks. ``"eager"`` (default):
    all of it runs eagerly. ``"modules"``: each outermost submodule with parameters outside the
    blocks (embeddings, final norm, LM head) is compiled as a region of its own. ``"loss"``: a
    Transformers model's loss function (``model.loss_function``) is compiled as a region of its
    own, standing in for it during each call only. Both were measured against ``"eager"``
    (docs/compiler.md#regions-compiled-once-per-repeated-block): ``"modules"`` cost compile time
    and gained no speed; ``"loss"`` made the steady step a little faster and the cold first call
    slower, against what block mode is for. Other values of ``regions`` need ``"eager"``; FSDP2
    models, compiled by unit, ignore it."""

    steps: int | None = None
    """How many training steps (training-mode calls) the run will make, when known: with
    ``regions="auto"`` hasten then compiles only if the rest of the run pays back the compile
    (see :mod:`hasten.compiler.plan`). The trainer integrations pass it themselves. ``None``: not
    known; the plan compiles once the run has spent a compile's worth of time eagerly."""

    start: Start = "wait"
    """``"wait"``: the first call compiles, and training waits for it. ``"eager"`` (no-wait
    start): a helper process compiles each region into the on-disk cache while training runs
    eagerly; the first call after it finished compiles from that cache (seconds) and runs
    compiled from then on, with the same numerics. Pays on a GPU, where eager steps leave the
    CPU free; on a CPU with few cores the helper competes with the eager steps (measured in
    docs/compiler.md#starting-fast). See :mod:`hasten.compiler.nowait`."""

    rank_wait_s: float = 600.0
    """Under ``torchrun`` with several ranks on a node, local rank 0 compiles each region first
    and the other ranks wait for it, at most this many seconds, then compile from the cache it
    filled (tracing only), so the node compiles once. A rank stops waiting at once when the
    compiling rank died or failed, and compiles locally. ``0`` turns this off (every rank
    compiles on its own). See :mod:`hasten.compiler.ranks`."""

    inductor_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Extra Inductor config (``torch._inductor.config`` names), scoped to this model's
    compilation. Overrides what ``mode`` and hasten choose."""

    def __post_init__(self) -> None:
        _one_of("mode", self.mode, MODES)
        object.__setattr__(self, "precision", normalize_precision(self.precision))
        _one_of("fallback", self.fallback, FALLBACKS)
        _one_of("regions", self.regions, REGIONS)
        _one_of("glue", self.glue, GLUES)
        if self.glue != "eager" and self.regions != "blocks":
            raise ValueError(
                f"CompileConfig.glue={self.glue!r} is about the code around the repeated blocks, "
                f"which regions={self.regions!r} does not compile by; set regions='blocks' too, "
                "or leave glue='eager'"
            )
        _one_of("start", self.start, STARTS)
        for name in (
            "fullgraph",
            "fix_known_traps",
            "verify_first_call",
            "fused_optimizer",
        ):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"CompileConfig.{name} must be True or False")
        for name in ("dynamic", "reuse_host_memory"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(f"CompileConfig.{name} must be None, True or False")
        if isinstance(self.warn_recompiles, bool) or not isinstance(self.warn_recompiles, int):
            raise TypeError("CompileConfig.warn_recompiles must be an int (0 disables the warning)")
        if self.warn_recompiles < 0:
            raise ValueError("CompileConfig.warn_recompiles must be >= 0 (0 disables the warning)")
        if self.steps is not None and (
            isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1
        ):
            raise ValueError(
                f"CompileConfig.steps must be a positive int (the run's training steps) or None, "
                f"not {self.steps!r}"
            )
        if isinstance(self.rank_wait_s, bool) or not isinstance(self.rank_wait_s, (int, float)):
            raise TypeError("CompileConfig.rank_wait_s must be a number of seconds (0 disables)")
        if not self.rank_wait_s >= 0:
            raise ValueError("CompileConfig.rank_wait_s must be >= 0 seconds (0 disables)")
        object.__setattr__(self, "passes", MappingProxyType(_check_passes(self.passes)))
        if not isinstance(self.inductor_options, Mapping):
            raise TypeError(
                "CompileConfig.inductor_options must be a mapping of Inductor config names"
            )
        object.__setattr__(self, "inductor_options", MappingProxyType(dict(self.inductor_options)))
        _check_inductor_options(self.inductor_options)
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)):
                raise TypeError(
                    "CompileConfig.cache_dir must be a path (str or os.PathLike) or None"
                )
            object.__setattr__(self, "cache_dir", os.fspath(self.cache_dir))
            _check_cache_path(self.cache_dir, "CompileConfig.cache_dir")
        if self.precision == "fp16" and not torch.cuda.is_available():
            raise ValueError(
                "precision='fp16' needs a CUDA device (float16 autocast with gradient scaling); "
                "on CPU use precision='bf16' (or 'fp32')"
            )

    def replace(self, **changes: Any) -> CompileConfig:
        """A copy with ``changes`` applied (and validated)."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(
                f"unknown CompileConfig field(s) {sorted(unknown)}; "
                f"fields are {[f.name for f in dataclasses.fields(self)]}"
            )
        return dataclasses.replace(self, **changes)

    def enabled_passes(self) -> tuple[str, ...]:
        """The names of the passes that will run, in pipeline order."""
        from hasten.compiler.passes.registry import get_pass, pass_names

        return tuple(n for n in pass_names() if self.passes.get(n, get_pass(n).default))

    def check_device(self, device: torch.device) -> None:
        """Reject settings the model's ``device`` cannot run, naming the fix.

        Raises:
            ValueError: fp16 off CUDA, bf16 on hardware without bf16 support, CUDA graphs off CUDA.
        """
        if self.precision == "fp16" and device.type != "cuda":
            raise ValueError(
                f"precision='fp16' needs the model on a CUDA device, but it is on {device}; "
                "use precision='bf16' on CPU, or move the model to CUDA first"
            )
        if self.precision == "bf16":
            from hasten.compiler.hooks.aten import native_bf16_cpu

            if device.type == "cuda" and not torch.cuda.is_bf16_supported():
                raise ValueError(
                    "precision='bf16' is not supported by this GPU; use precision='fp16' "
                    "(with a gradient scaler) or 'fp32'"
                )
            if device.type == "cpu" and not torch.backends.mkldnn.is_available():
                raise ValueError("precision='bf16' on CPU needs oneDNN; use precision='fp32'")
            if device.type == "cpu" and native_bf16_cpu() is False:
                raise ValueError(
                    "precision='bf16' needs a CPU with native bfloat16 (AVX512-BF16 or AMX); "
                    "this one lists neither and would emulate it, slower than fp32 ('hasten "
                    "doctor' shows what it has); use precision='fp32'"
                )
        if self.mode == "reduce-overhead" and device.type != "cuda":
            raise ValueError(
                f"mode='reduce-overhead' uses CUDA graphs and does nothing for a model on "
                f"{device}; use mode='default' (or 'max-autotune')"
            )


def normalize_precision(precision: Any) -> Precision:
    """``"fp32"``, ``"bf16"`` or ``"fp16"`` for any spelling ``CompileConfig.precision`` accepts.

    Raises:
        ValueError: an unknown value, or a Lightning setting with other semantics
            (``"bf16-true"`` casts the weights; hasten's ``"bf16"`` keeps them fp32).
        TypeError: neither a string nor a ``torch.dtype``.
    """
    if precision in PRECISIONS:
        return precision  # type: ignore[no-any-return]
    if not isinstance(precision, (str, torch.dtype)):
        raise TypeError(
            f"CompileConfig.precision must be a string or a torch.dtype, not "
            f"{type(precision).__name__}; e.g. precision='bf16' or precision=torch.bfloat16"
        )
    key = precision.strip().lower() if isinstance(precision, str) else precision
    if key in _PRECISION_ALIASES:
        return _PRECISION_ALIASES[key]  # type: ignore[return-value]
    if key in PRECISIONS:
        return key  # type: ignore[return-value]
    if isinstance(key, str) and key in _PRECISION_REFUSED:
        raise ValueError(
            f"CompileConfig.precision={precision!r}: in Lightning this {_PRECISION_REFUSED[key]}, "
            "which hasten.compile does not do (its 'bf16'/'fp16' are mixed precision: "
            "parameters, gradients and optimizer state stay fp32); use precision='bf16' for "
            "mixed precision, or cast the model yourself (model.to(torch.bfloat16)) and keep "
            "precision='fp32'"
        )
    raise ValueError(
        f"CompileConfig.precision={precision!r} is not valid; choose one of 'fp32', 'bf16', "
        "'fp16' (also accepted: torch.float32/bfloat16/float16, '32-true', 'bf16-mixed', "
        "'16-mixed')"
    )


def _check_cache_path(path: str, what: str) -> None:
    """Reject a cache path Inductor cannot build kernels in, naming it and the fix."""
    if any(ch.isspace() for ch in path):
        raise ValueError(
            f"{what}={path!r} contains whitespace; Inductor (torch {torch.__version__}) passes "
            "cache paths to the C++ compiler unquoted, so every kernel build there fails "
            "('C++ compile error'). Use a path without spaces, e.g. "
            f"{path.strip().replace(' ', '_')!r}"
        )


def _one_of(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(
            f"CompileConfig.{name}={value!r} is not valid; choose one of "
            + ", ".join(repr(c) for c in choices)
        )


def _check_passes(passes: Any) -> dict[str, bool]:
    from hasten.compiler.passes.registry import pass_names

    if not isinstance(passes, Mapping):
        raise TypeError(
            "CompileConfig.passes must map pass names to True/False, "
            "e.g. passes={'attention_to_sdpa': False}"
        )
    known = pass_names()
    out: dict[str, bool] = {}
    for name, on in passes.items():
        if name not in known:
            raise ValueError(
                f"unknown pass {name!r} in CompileConfig.passes; known passes: {', '.join(known)}"
            )
        if not isinstance(on, bool):
            raise TypeError(f"CompileConfig.passes[{name!r}] must be True or False, not {on!r}")
        out[name] = on
    return out


def resolve_config(config: CompileConfig | None, overrides: dict[str, Any]) -> CompileConfig:
    """The config a call of ``hasten.compile(model, config, **overrides)`` compiles with."""
    if config is not None and not isinstance(config, CompileConfig):
        raise TypeError(
            f"config must be a hasten.CompileConfig or None, not {type(config).__name__}; "
            "pass settings as keywords, e.g. hasten.compile(model, precision='bf16')"
        )
    cfg = config or CompileConfig()
    return cfg.replace(**overrides) if overrides else cfg


def compile_at_once(cfg: CompileConfig) -> CompileConfig:
    """``cfg`` compiling at the first call: ``regions="auto"``'s plan would start eagerly."""
    return cfg.replace(regions="whole") if cfg.regions == "auto" else cfg


def _check_inductor_options(options: Mapping[str, Any]) -> None:
    from hasten.compiler.hooks.inductor import check_option

    for key in options:
        if not isinstance(key, str):
            raise TypeError(f"CompileConfig.inductor_options keys must be str, not {key!r}")
        check_option(key)
