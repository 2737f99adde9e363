"""Inductor's (and AOTAutograd's) internals hasten uses: ``compile_fx``, its config keys, its
cache directory, the post-grad custom-pass hook, pointwise-use analysis.

Every Inductor config key hasten sets is spelled here and nowhere else; :func:`supported_patches`
drops a hasten key this torch does not know (its hook is then skipped, see
:mod:`hasten.compiler.hooks`), so a renamed key costs a speed-up, never a compile.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from hasten.compiler.hooks import register, require, usable

__all__ = [
    "CACHEABLE_FUNCTIONS",
    "FALLBACK_RANDOM",
    "LAYOUT_OPTIMIZATION",
    "PATTERN_MATCHER",
    "POST_GRAD_PASS",
    "VEC_ISA_OK",
    "cache_dir",
    "check_option",
    "compile_fx",
    "file_hash",
    "is_pointwise_use",
    "lower_pointwise_op",
    "mode_options",
    "post_grad_pass",
    "scoped",
    "supported_patches",
    "temporary_cache_dir",
]

FALLBACK_RANDOM = "fallback_random"
"""ATen's RNG in compiled code (eager's dropout masks; cheaper than Inductor's on CPU)."""
POST_GRAD_PASS = "post_grad_custom_pre_pass"
"""Where hasten's post-grad passes hook into Inductor."""
CACHEABLE_FUNCTIONS = "unsafe_marked_cacheable_functions"
"""hasten's own functions let into AOTAutograd's cache (keyed by their file's hash)."""
VEC_ISA_OK = "cpp.vec_isa_ok"
"""Inductor takes the CPU's ISA as checked (see :mod:`hasten.compiler.hooks.vec_isa`)."""
LAYOUT_OPTIMIZATION = "layout_optimization"
"""Inductor's layout choice (channels-last convolutions); off in the first-call check's retries."""
PATTERN_MATCHER = "pattern_matcher"
"""Inductor's pattern rewrites; off in the first-call check's safest retry."""

# hasten's own keys, each an optional hook: the name of its probe
_KEY_HOOKS = {
    FALLBACK_RANDOM: "inductor.fallback_random",
    POST_GRAD_PASS: "inductor.post_grad_pass",
    CACHEABLE_FUNCTIONS: "inductor.cacheable_functions",
    VEC_ISA_OK: "inductor.vec_isa",
}


def _has_key(key: str) -> bool:
    import torch._inductor.config as config

    obj: Any = config
    for part in key.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def _key_probe(key: str) -> Callable[[], str | None]:
    return lambda: None if _has_key(key) else f"no Inductor config key {key!r}"


register("inductor.fallback_random", "ATen's RNG for dropout on CPU (eager's masks, cheaper)")(
    _key_probe(FALLBACK_RANDOM)
)
register("inductor.cacheable_functions", "AOTAutograd's cache hit for graphs with hasten's ops")(
    _key_probe(CACHEABLE_FUNCTIONS)
)
register("inductor.layout_optimization", "the first-call check's retry without Inductor's layouts")(
    _key_probe(LAYOUT_OPTIMIZATION)
)
register("inductor.pattern_matcher", "the first-call check's retry without Inductor's patterns")(
    _key_probe(PATTERN_MATCHER)
)


# --- compile_fx (required) -------------------------------------------------------------------


@register("inductor.compile_fx", "Inductor's compile_fx with config patches", required=True)
def _probe_compile_fx() -> str | None:
    import inspect

    from torch._inductor import compile_fx as module

    fn = getattr(module, "compile_fx", None)
    if not callable(fn):
        return "no torch._inductor.compile_fx.compile_fx"
    if "config_patches" not in inspect.signature(fn).parameters:
        return "compile_fx takes no config_patches"
    return None


def compile_fx(gm: Any, example_inputs: Sequence[Any], patches: Mapping[str, Any]) -> Any:
    """AOTAutograd + Inductor on ``gm``, with Inductor config ``patches`` for this compile."""
    require("inductor.compile_fx")
    from torch._inductor.compile_fx import compile_fx as inductor_compile_fx

    return inductor_compile_fx(gm, list(example_inputs), config_patches=dict(patches))


@register("inductor.mode_options", "torch.compile modes (max-autotune, ...) as Inductor options")
def _probe_mode_options() -> str | None:
    import torch._inductor as inductor

    return (
        None if callable(getattr(inductor, "list_mode_options", None)) else "no list_mode_options"
    )


def mode_options(mode: str) -> dict[str, Any]:
    """The Inductor options of ``torch.compile``'s ``mode`` (``{}`` for the default, or when this
    torch cannot list them: the mode's options are then not applied)."""
    if mode == "default" or not usable("inductor.mode_options"):
        return {}
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def supported_patches(patches: Mapping[str, Any]) -> dict[str, Any]:
    """``patches`` less hasten's own keys that this torch's Inductor does not have."""
    from hasten.compiler.hooks import missing

    return {
        k: v for k, v in patches.items() if k not in _KEY_HOOKS or missing(_KEY_HOOKS[k]) is None
    }


def check_option(key: str) -> None:
    """Raise ``ValueError`` unless ``key`` is an Inductor config option of this torch."""
    if not _has_key(key):
        import torch

        raise ValueError(
            f"unknown Inductor option {key!r} in CompileConfig.inductor_options (torch "
            f"{torch.__version__}); see torch._inductor.list_options() for the names"
        )


# --- the post-grad custom pass ---------------------------------------------------------------


@register("inductor.post_grad_pass", "hasten's post-grad passes (Inductor's custom-pass hook)")
def _probe_post_grad() -> str | None:
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass  # noqa: F401
    except ImportError as err:
        return str(err)
    return _key_probe(POST_GRAD_PASS)()


def post_grad_pass(run: Callable[[Any], None], uuid: Callable[[], Any]) -> Any:
    """An Inductor custom graph pass calling ``run(graph)``, cached under ``uuid()``; ``None``
    when this torch has no such hook (hasten's post-grad passes are then skipped)."""
    if not usable("inductor.post_grad_pass"):
        return None
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class HastenPostGradPass(CustomGraphPass):
        def __call__(self, graph: Any) -> None:
            run(graph)

        def uuid(self) -> Any:
            return uuid()

    return HastenPostGradPass()


def file_hash(files: Sequence[str]) -> str:
    """A stable hash of the contents of ``files`` (hasten's own; part of Inductor cache keys)."""
    h = hashlib.sha256()
    for path in files:
        h.update(os.fsencode(os.path.basename(path)))
        with open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


# --- pointwise uses (the unfuse_bias_add pass) -----------------------------------------------


@register("inductor.is_pointwise_use", "unfuse_bias_add's check that a use fuses pointwise")
def _probe_pointwise() -> str | None:
    from torch._inductor import utils

    return None if callable(getattr(utils, "is_pointwise_use", None)) else "no is_pointwise_use"


def is_pointwise_use(node: Any) -> bool:
    """Whether Inductor fuses ``node`` as a pointwise use; ``False`` when this torch cannot say
    (the pass then changes nothing)."""
    if not usable("inductor.is_pointwise_use"):
        return False
    from torch._inductor.utils import is_pointwise_use as inductor_is_pointwise_use

    return bool(inductor_is_pointwise_use(node))


# --- a custom op lowered as one pointwise expression (the cheap_dropout_rng pass) ------------


@register("inductor.lower_pointwise_op", "hasten's dropout hash lowered as one fused expression")
def _probe_lower_pointwise() -> str | None:
    try:
        from torch._inductor import ir, lowering, virtualized
    except ImportError as e:
        return f"no {e.name}"
    if not callable(getattr(lowering, "register_lowering", None)):
        return "no lowering.register_lowering"
    if not callable(getattr(getattr(ir, "Pointwise", None), "create", None)):
        return "no ir.Pointwise.create"
    return None if hasattr(virtualized, "ops") else "no virtualized.ops"


def lower_pointwise_op(op: Any, dtype: Any, body: Callable[[Any, Any, Any], Any]) -> bool:
    """Lower ``op(key, numel)`` (a 0-dim tensor and a length, returning a 1-D ``dtype`` tensor of
    ``numel`` elements) as one Inductor pointwise node whose value at flat index ``i`` is
    ``body(ops, i, key)``: ``ops`` is Inductor's op handler, ``i`` the index as an int64 value,
    ``key`` the loaded scalar.

    Composed of separate aten ops, an expression that uses a value twice (``x ^ (x >> 16)``) is
    re-expanded by every use when Inductor inlines it: a three-round integer hash made GPT-2
    124M's cold compile 133 s instead of 30 s. Inside one body a value is a Python variable,
    computed once. Returns ``False`` (nothing registered) when this torch lacks the internals;
    registering twice is a no-op.
    """
    if not usable("inductor.lower_pointwise_op"):
        return False
    import torch
    from torch._inductor import ir, lowering
    from torch._inductor.virtualized import ops

    if op in lowering.lowerings:
        return True

    def lower(key: Any, numel: Any) -> Any:
        load_key = key.make_loader()

        def inner_fn(index: Sequence[Any]) -> Any:
            return body(ops, ops.index_expr(index[0], torch.int64), load_key([]))

        return ir.Pointwise.create(
            device=key.get_device(), dtype=dtype, inner_fn=inner_fn, ranges=[numel]
        )

    lowering.register_lowering(op, type_promotion_kind=None)(lower)
    return True


# --- config scoped to one compile, the cache directory ---------------------------------------


@register("functorch.eager_backward", "the backward lowered with the forward (errors at call 1)")
def _probe_eager_backward() -> str | None:
    import torch._functorch.config as config

    ok = hasattr(config, "force_non_lazy_backward_lowering")
    return None if ok else "no functorch config force_non_lazy_backward_lowering"


@register("inductor.temporary_cache_dir", "CompileConfig.cache_dir scoped to hasten's compiles")
def _probe_temporary_cache_dir() -> str | None:
    from torch._inductor.runtime import cache_dir_utils

    ok = hasattr(cache_dir_utils, "temporary_cache_dir")
    return None if ok else "no cache_dir_utils.temporary_cache_dir"


def temporary_cache_dir(directory: str) -> contextlib.AbstractContextManager[Any]:
    """Inductor's cache directory set to ``directory`` while the context is active (a context
    that sets ``$TORCHINDUCTOR_CACHE_DIR`` on a torch without Inductor's own)."""
    if usable("inductor.temporary_cache_dir"):
        from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir as scoped_dir

        return scoped_dir(directory)
    return _env_cache_dir(directory)


@contextlib.contextmanager
def _env_cache_dir(directory: str) -> Iterator[None]:
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


@contextlib.contextmanager
def scoped(cache_dir: str | None) -> Iterator[None]:
    """Config that must hold while Inductor compiles one graph (forward and eager backward)."""
    with contextlib.ExitStack() as stack:
        if usable("functorch.eager_backward"):
            import torch._functorch.config as functorch_config

            stack.enter_context(functorch_config.patch(force_non_lazy_backward_lowering=True))
        if cache_dir is not None:
            stack.enter_context(temporary_cache_dir(cache_dir))
        yield


def cache_dir() -> str:
    """Inductor's cache directory now (``$TORCHINDUCTOR_CACHE_DIR`` or its default)."""
    import importlib

    for where in ("cache_dir_utils", "runtime_utils"):  # torch >= 2.7, older
        found = getattr(
            _optional_module(f"torch._inductor.runtime.{where}", importlib), "cache_dir", None
        )
        if callable(found):
            return str(found())
    import getpass

    default = os.path.join(tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}")
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR", default)


def _optional_module(name: str, importlib: Any) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def cpp_compiler() -> str:
    """The C++ compiler Inductor uses on CPU (raises when none is found)."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    return str(get_cpp_compiler())
