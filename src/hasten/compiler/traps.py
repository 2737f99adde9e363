"""Known compile traps: found on the model before compiling, fixed when the fix is exact, named.

* ``DistributedDataParallel`` (and ``nn.Module.compile()``) around a module whose ``forward`` lives
  in torch itself, such as ``nn.Sequential``: TorchDynamo skips torch's own frames, so
  ``torch.compile(DDP(nn.Sequential(...)))`` and ``nn.Sequential(...).compile()`` compile nothing,
  silently. hasten compiles the wrapped module inside DDP, through a forward function of its own
  that Dynamo traces, so the whole module becomes one graph.
* Transformers models whose ``loss_type`` is unset or unrecognised (GPT-2's ``GPT2LMHeadModel``):
  the ``loss_function`` property logs a ``warning_once`` inside ``forward``, which breaks the graph.
  It then uses ``ForCausalLM`` anyway, so setting ``loss_type = "ForCausalLM"`` changes nothing but
  the warning and the graph break.
* Transformers models that build a KV cache in training (``config.use_cache=True``): every forward
  concatenates keys and values into a cache returned as outputs. Named, not changed (it changes
  what the model returns).
"""

from __future__ import annotations

from torch import nn

__all__ = ["apply_fixes", "unwrap_data_parallel"]


def unwrap_data_parallel(model: nn.Module) -> tuple[nn.Module, str | None]:
    """The module to compile in place, and a note when it is not ``model`` itself."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    if isinstance(model, (DistributedDataParallel, DataParallel)):
        inner = model.module
        return inner, (
            f"{type(model).__name__}({type(inner).__name__}): compiled the wrapped module in place "
            "(model.module), since compiling the wrapper skips torch's own frames and, for a "
            "module like nn.Sequential, compiles nothing"
        )
    return model, None


def apply_fixes(model: nn.Module, fix: bool = True) -> list[str]:
    """Find known traps in ``model``; fix the exact ones when ``fix``. Returns one line per trap."""
    notes: list[str] = []
    covered: list[str] = []  # outermost Transformers models found so far (their parts are theirs)
    for name, module in model.named_modules():
        if not _is_transformers_model(module) or any(name.startswith(c) for c in covered):
            continue
        covered.append(f"{name}." if name else "")
        where = f"{name or 'model'} ({type(module).__name__})"
        notes.extend(_loss_type(module, where, fix))
        notes.extend(_use_cache(module, where))
    return notes


def _is_transformers_model(module: nn.Module) -> bool:
    return any(
        c.__module__.startswith("transformers.") and c.__name__ == "PreTrainedModel"
        for c in type(module).__mro__
    )


def _loss_type(module: nn.Module, where: str, fix: bool) -> list[str]:
    if "_loss_function" in vars(module):
        return []
    try:
        from transformers.loss.loss_utils import LOSS_MAPPING
    except ImportError:  # an older or newer Transformers without the loss registry
        return []
    loss_type = getattr(module, "loss_type", None)
    if loss_type in LOSS_MAPPING:
        return []
    if not fix:
        return [
            f"{where}: loss_type={loss_type!r} is unrecognised, so Transformers logs a warning "
            "inside forward (a graph break); set model.loss_type='ForCausalLM'"
        ]
    # Exactly what the loss_function property falls back to, minus the warning it logs.
    module.loss_type = "ForCausalLM"
    return [
        f"{where}: loss_type was {loss_type!r}; set it to 'ForCausalLM' (the default Transformers "
        "falls back to), removing the warning logged inside forward that broke the graph"
    ]


def _use_cache(module: nn.Module, where: str) -> list[str]:
    config = getattr(module, "config", None)
    if not getattr(config, "use_cache", False):
        return []
    if not getattr(module, "training", False) or not hasattr(module, "can_generate"):
        return []
    try:
        generates = module.can_generate()
    except Exception:  # can_generate may inspect things a partial model lacks
        return []
    if not generates:
        return []
    return [
        f"{where}: config.use_cache=True builds a KV cache in every training forward (copies "
        "kept as outputs); set model.config.use_cache=False while training"
    ]
