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
* Transformers models that pick their loss from ``config.problem_type``: when it is ``None`` the
  first forward with labels sets it (from ``num_labels`` and the labels' dtype), a change
  TorchDynamo guards on, so the second call recompiled the whole model. The
  ``*ForSequenceClassification`` heads set it in ``forward``; the image, audio and video
  classifiers (ViT, Swin, ConvNeXt, ResNet ...) in their loss function
  (``ForSequenceClassificationLoss``). hasten sets it before that first call, by the same rule,
  from the call's labels (:func:`call_fixes`): the value the model would have set itself.
* A short last batch (a data set not divisible by the batch size): TorchDynamo specialized the
  first graph on the batch size and recompiled the model for the smaller one, a whole compile
  for one step (docs/compiler.md#known-traps). With ``CompileConfig(dynamic=None)``, the default, a call of
  another batch size runs eagerly while such calls are rare (:class:`OddBatches`); measured
  against compiling with a dynamic batch dimension from the start in ``docs/compiler.md``.
* Transformers models that build a KV cache in training (``config.use_cache=True``): every forward
  concatenates keys and values into a cache returned as outputs. Named, not changed (it changes
  what the model returns).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from hasten.compiler.hooks.nn import tree_leaves

__all__ = ["OddBatches", "apply_fixes", "batch_size", "call_fixes", "unwrap_data_parallel"]

CallFix = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], bool]


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


def call_fixes(model: nn.Module, fix: bool = True) -> tuple[list[CallFix], list[str]]:
    """Fixes that need a call's inputs, to run before calls of ``model`` (outside the trace).

    Each fix returns ``True`` once done (then it is dropped). Returns the fixes and, for traps
    found but not fixed (``fix=False``), one line each.
    """
    if not _is_transformers_model(model):
        return [], []
    setter = _problem_type_setter(model)
    if setter is None:
        return [], []
    config = getattr(model, "config", None)
    if getattr(config, "problem_type", "set") is not None:
        return [], []
    where = f"model ({type(model).__name__})"
    if not fix:
        return [], [
            f"{where}: config.problem_type is None, so the first forward with labels sets it "
            f"(in {setter}), which recompiles the model; set model.config.problem_type before "
            "training"
        ]
    return [_problem_type_fix(where, setter)], []


def _code_names(fn: Any) -> tuple[str, ...]:
    import inspect

    try:  # Transformers wraps forward in decorators (can_return_tuple ...): read the original
        fn = inspect.unwrap(fn)
    except ValueError:  # a cycle of __wrapped__
        return ()
    code = getattr(fn, "__code__", None)
    return code.co_names if code is not None else ()


def _problem_type_setter(model: nn.Module) -> str | None:
    """Where a first call with labels sets ``config.problem_type``, or ``None`` if nowhere.

    ``"forward"``: the model's ``forward`` does (BERT's, RoBERTa's ... sequence classifiers).
    ``"loss_function"``: ``forward`` calls ``self.loss_function`` and the loss it resolves to does
    (Transformers' ``ForSequenceClassificationLoss``, the loss of the ``ForImageClassification``,
    ``ForAudioClassification`` and ``ForVideoClassification`` heads: ViT, Swin, ConvNeXt,
    ResNet ...). The loss is looked up as the ``loss_function`` property would (a loss set on the
    model, else ``LOSS_MAPPING[model.loss_type]``) without reading the property, which logs a
    warning for an unknown ``loss_type``.
    """
    names = _code_names(type(model).forward)
    if "problem_type" in names:
        return "forward"
    if "loss_function" not in names:
        return None
    loss = vars(model).get("_loss_function")
    if loss is None:
        try:
            from transformers.loss.loss_utils import LOSS_MAPPING
        except ImportError:  # a Transformers without the loss registry
            return None
        loss = LOSS_MAPPING.get(getattr(model, "loss_type", None))
    return "loss_function" if "problem_type" in _code_names(loss) else None


def _problem_type_fix(where: str, setter: str = "forward") -> CallFix:
    def fix(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        config = model.config
        if config.problem_type is not None:  # set by the user or the model meanwhile
            return True
        labels = kwargs.get("labels")
        if not isinstance(labels, torch.Tensor):
            return False  # not a call that sets it: try the next one
        # Transformers' own rule (BertForSequenceClassification.forward, and
        # ForSequenceClassificationLoss from config.num_labels), applied early.
        num_labels = model.num_labels if setter == "forward" else config.num_labels
        if num_labels == 1:
            config.problem_type = "regression"
        elif num_labels > 1 and labels.dtype in (torch.long, torch.int):
            config.problem_type = "single_label_classification"
        else:
            config.problem_type = "multi_label_classification"
        _note(
            model,
            f"{where}: config.problem_type was None; set it to {config.problem_type!r} "
            f"before the first call with labels (what that call would have set, in {setter}), "
            "so the model is not recompiled at its second call",
        )
        return True

    return fix


def _note(model: nn.Module, line: str) -> None:
    from hasten.compiler.report import record_of

    record = record_of(model)
    if record is not None:
        with record.lock:
            record.fixes.append(line)


def batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    """The batch size of a call: the most common size of dim 0 among its tensor inputs.

    ``None`` when no input is a tensor with a dimension.
    """
    sizes = [
        t.shape[0]
        for t in tree_leaves((args, kwargs))
        if isinstance(t, torch.Tensor) and t.dim() > 0
    ]
    return Counter(sizes).most_common(1)[0][0] if sizes else None


class OddBatches:
    """Decides when a call whose batch size is not the compiled one runs eagerly instead.

    A short last batch (a data set not divisible by the batch size) made TorchDynamo recompile
    the model for its size, a whole compile to run one step. Compiling shape-generic from the
    first call avoids that but switches off passes that need static shapes
    (``split_at_returned_logits``) and was slower per step
    (docs/compiler.md#short-last-batch-eager-not-a-recompile). So the graph
    stays specialized on the first batch size, and a call of another batch size runs eagerly
    while such calls stay rare: the first one always, later ones while they are at most one in
    :attr:`RARE` of the variant's calls. Once they
    are not rare (batch sizes that keep changing), the next one goes to TorchDynamo, which
    recompiles with a dynamic batch dimension, and this stops for good.

    One other size that keeps coming back (each pass's short last batch, one call in 7 of a
    Trainer's evaluation of 445 articles in batches of 64) is not a changing shape: where
    ``recompile_pays`` is given (the compile plan knows the variant's gain and compile cost), it
    runs eagerly until what running those calls eagerly has cost reaches a recompile's cost.
    The count rule recompiled BERT-base's evaluation for its 37-article batch (11.2 s) to save
    ~0.1 s a pass.
    """

    RARE = 8

    def __init__(self, recompile_pays: Callable[[float, int], bool] | None = None) -> None:
        """``recompile_pays(fraction, odd_calls)``: whether ``odd_calls`` calls of the other
        size (``fraction`` of the compiled size), run eagerly, have cost as much as compiling
        for it (asked for one recurring other size only)."""
        self.size: int | None = None  # the compiled batch size; None: not known, or gave up
        self.calls = 0
        self.odd = 0
        self.odd_sizes: set[int] = set()
        self.active = True
        self.recompile_pays = recompile_pays

    def run_eagerly(self, size: int | None) -> bool:
        """Count a call of batch ``size``; ``True``: run it eagerly, not through the graph."""
        self.calls += 1
        if not self.active or size is None:
            return False
        if self.size is None:
            self.size = size
            return False
        if size == self.size:
            return False
        # the first other size always runs eagerly: a short last batch can come early (a short
        # epoch or segment; `make demo` saw one at the 2nd call, and recompiling cost 14 s)
        self.odd_sizes.add(size)
        if self.odd == 0 or (self.odd + 1) * self.RARE <= self.calls:
            self.odd += 1
            return True
        if (
            self.recompile_pays is not None
            and len(self.odd_sizes) == 1
            and not self.recompile_pays(size / self.size, self.odd + 1)
        ):
            self.odd += 1
            return True
        self.active = False  # not rare: let TorchDynamo compile for changing sizes
        return False


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
