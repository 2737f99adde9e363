"""Smart sifting in the Hugging Face ``Trainer``: ``enable_sifting(trainer, sift_config, loss)``.

::

    from hasten.integrations.transformers import enable_sifting

    trainer = Trainer(model=model, args=TrainingArguments(..., max_steps=1000), train_dataset=ds)
    enable_sifting(trainer, sift_config, loss=PerSampleCrossEntropy())
    trainer.train()

What it changes on this one ``trainer`` object (nothing global):

* ``trainer.get_train_dataloader`` builds the Trainer's own loader as before (Accelerate's, so
  sharded per rank under ``torchrun`` and moved to the device), wraps it in a
  :class:`~hasten.sifting.SiftingDataloader` scoring with ``trainer.model``, and hands the Trainer
  a :class:`~hasten.integrations.epochs.SiftedEpochs`: epochs of a fixed number of sifted batches
  over an endless stream of data passes. The Trainer plans steps, gradient accumulation and the
  learning-rate schedule from ``len(train_dataloader)``, so that length must be exact; a sifting
  pass's length is not known in advance (see :mod:`hasten.integrations.epochs`).
* A :class:`SiftingCallback` adds ``sift/keep_rate``, ``sift/samples_seen`` ... to every log
  (progress printer, TensorBoard, W&B, ``trainer.state.log_history``), counts summed over ranks,
  and saves each rank's sifting state with every checkpoint.
* ``trainer.train(resume_from_checkpoint=...)`` restores that state, so the sifted stream goes
  on with the batch an uninterrupted run would have trained on next.

Length of training:

* ``set_epochs=False`` (default): train by steps. ``TrainingArguments(max_steps=N)`` is required;
  the Trainer stops after exactly ``N`` optimizer steps. Its "epochs" are then blocks of about
  one data pass (the expected length of a sifted pass after the sift delay).
* ``set_epochs=True``: ``num_train_epochs=E`` trains ``E`` epochs whose length is the expected
  number of sifted batches of ``E`` data passes (sift delay included) divided by ``E``. The
  total is exact and known up front (schedules end where they should); the data passes behind
  it are about ``E``, more if the policy keeps more than its expected rate, fewer if less.
  ``max_steps`` still takes precedence when set, as in the Trainer.

Gradient accumulation: every optimizer step gets exactly ``gradient_accumulation_steps``
micro-batches (the epoch length is exact, so the Trainer's last, shorter accumulation of an
epoch is the one it planned), and the Trainer's ``num_items_in_batch`` is counted on the sifted
batches it trains on. Sifted batches are full except the last of each data pass; set
``dataloader_drop_last=True`` for only-full batches.

Compiling: :func:`compile_trainer` (``compile_trainer(trainer)``, before ``trainer.train()``)
compiles ``trainer.model`` in place with ``hasten.compile`` (so the Trainer, its DDP wrapper and
the sifting scorer all run the compiled module) and makes the Trainer's AdamW the fused one
(``optim="adamw_torch_fused"``: the same update in one kernel, instead of a for-loop of small
ones that the compiled model would then wait on), saying so in one log line. ``hasten.compile(model)``
before building the Trainer compiles the same way but leaves ``TrainingArguments.optim`` alone.
``TrainingArguments(torch_compile_backend="hasten")`` is refused by Accelerate (it accepts only
its own list of backend names); see ``docs/integrations.md``.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import warnings
from typing import Any

import torch

try:
    import transformers
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "hasten's Hugging Face integration needs transformers and accelerate; install them with "
        "`pip install 'hasten[hf]'`"
    ) from err

from hasten.integrations.epochs import SiftedEpochs, expected_batches
from hasten.integrations.metrics import find_sifting_loader, sifting_metrics
from hasten.sifting.loader import SiftingDataloader

__all__ = ["SiftingCallback", "compile_trainer", "enable_sifting"]

logger = logging.getLogger("hasten")

_MARK = "_hasten_sifting"
_RESUME = "_hasten_sifting_resume"


def _state_file(checkpoint_dir: str, rank: int) -> str:
    """Where :class:`SiftingCallback` saves rank ``rank``'s sifting state in a checkpoint."""
    return os.path.join(checkpoint_dir, f"hasten_sifting_rank{rank}.pt")


def enable_sifting(
    trainer: Any,
    sift_config: Any,
    loss: Any,
    set_epochs: bool = False,
    **loader_kwargs: Any,
) -> Any:
    """Make ``trainer`` train on sifted batches (SageMaker's ``enable_sifting`` signature).

    Args:
        trainer: A ``transformers.Trainer`` (or subclass) with a ``train_dataset``.
        sift_config: A :class:`~hasten.sifting.RelativeProbabilisticSiftConfig` (or a dict).
        loss: Per-sample loss: a :class:`~hasten.sifting.Loss` (``loss(model, batch, original)``)
            or a callable ``fn(model, batch)``; batches are the Trainer's collated dicts, on the
            device. :class:`~hasten.sifting.PerSampleCrossEntropy` fits classifiers and
            token classifiers.
        set_epochs: ``False``: train by ``max_steps`` (required). ``True``: train
            ``num_train_epochs`` epochs of fixed length (see the module docstring).
        **loader_kwargs: Keyword arguments for :class:`~hasten.sifting.SiftingDataloader`
            (``batch_transforms``, ``seed``, ``log_interval`` ...).

    Returns:
        ``trainer``, changed in place.

    Raises:
        TypeError: ``trainer`` is not a Transformers ``Trainer``, or ``set_epochs`` is not a bool.
        ValueError: ``set_epochs=False`` without ``max_steps``; sifting enabled twice.
    """
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(
            f"enable_sifting expects a transformers.Trainer, got {type(trainer).__name__}"
        )
    if not isinstance(set_epochs, bool):
        raise TypeError(f"set_epochs must be True or False, got {set_epochs!r}")
    if getattr(trainer, _MARK, False):
        raise ValueError("sifting is already enabled on this trainer; call enable_sifting once")
    args = trainer.args
    if not set_epochs and args.max_steps <= 0:
        raise ValueError(
            "enable_sifting(set_epochs=False) trains by steps, but TrainingArguments.max_steps is "
            f"{args.max_steps}: set max_steps=<optimizer steps>, or pass set_epochs=True to train "
            "num_train_epochs epochs of the expected sifted length"
        )
    if loader_kwargs.get("batch_transforms") is None:  # the built-in codec pads merged rows
        derived = _padding_from(trainer)
        pad_values = {**derived.pop("pad_values", {}), **(loader_kwargs.get("pad_values") or {})}
        loader_kwargs = {**derived, **loader_kwargs}
        if pad_values:
            loader_kwargs["pad_values"] = pad_values
    # build the loader once now: config, loss and batch-size errors surface here, not mid-train
    SiftingDataloader(sift_config, [], model=trainer.model, loss_impl=loss, **loader_kwargs)

    original = trainer.get_train_dataloader  # the bound method (the class's, or a user's override)

    @functools.wraps(original)
    def get_train_dataloader() -> SiftedEpochs:
        sifted = SiftingDataloader(
            sift_config, original(), model=trainer.model, loss_impl=loss, **loader_kwargs
        )
        if set_epochs and trainer.args.max_steps <= 0:
            passes = max(1, round(trainer.args.num_train_epochs))
            stream = SiftedEpochs(sifted, passes=passes)
        else:
            stream = SiftedEpochs(sifted, max(1, expected_batches(sifted, 1, delay=False)))
        saved = getattr(trainer, _RESUME, None)
        if saved is not None:  # hasten's own file in the user's checkpoint
            _load_stream_state(stream, saved)
        return stream

    train = trainer.train

    @functools.wraps(train)
    def train_with_sifting(resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        ckpt = resume_from_checkpoint
        if ckpt is True:
            from transformers.trainer_utils import get_last_checkpoint

            ckpt = get_last_checkpoint(trainer.args.output_dir)
        if not ckpt:
            return train(resume_from_checkpoint, *args, **kwargs)
        saved = _state_file(str(ckpt), trainer.args.process_index)
        if not os.path.isfile(saved):
            warnings.warn(
                f"the checkpoint {ckpt} holds no sifting state ({os.path.basename(saved)}): the "
                "sifted data stream starts afresh instead of where it stopped",
                stacklevel=2,
            )
            saved = None
        # the restored stream is positioned exactly; the Trainer's own batch skipping would
        # rebuild an unsifted loader, so it is turned off for this call
        skip = trainer.args.ignore_data_skip
        trainer.args.ignore_data_skip = True
        setattr(trainer, _RESUME, saved)
        try:
            return train(resume_from_checkpoint, *args, **kwargs)
        finally:
            trainer.args.ignore_data_skip = skip
            setattr(trainer, _RESUME, None)

    trainer.get_train_dataloader = get_train_dataloader
    trainer.train = train_with_sifting
    trainer.callback_handler.callbacks.insert(0, SiftingCallback())
    setattr(trainer, _MARK, True)
    return trainer


# Trainer optimizers with a fused twin that computes the same update in one kernel.
_FUSED_TWIN = {"adamw_torch": "adamw_torch_fused"}


def compile_trainer(
    trainer: Any, config: Any = None, *, fused_optimizer: bool = True, **settings: Any
) -> Any:
    """Compile ``trainer.model`` with ``hasten.compile`` and give it the fused optimizer.

    Args:
        trainer: A ``transformers.Trainer`` whose optimizer is not created yet (before
            ``train()``).
        config: A :class:`hasten.CompileConfig` (``None``: the defaults).
        fused_optimizer: Switch ``TrainingArguments.optim="adamw_torch"`` (the for-loop AdamW,
            Transformers' default before 4.55) to ``"adamw_torch_fused"``, logging it. Optimizers
            you passed to the Trainer yourself, and other ``optim`` values, are kept.
        **settings: ``hasten.compile`` keywords, e.g. ``precision="bf16"``.

    Returns:
        ``trainer``, changed in place. A model already compiled by hasten is not recompiled.

    Example::

        trainer = Trainer(model=model, args=args, train_dataset=ds)
        compile_trainer(trainer)       # logs: hasten: compiled BertForSequenceClassification ...
        trainer.train()
    """
    import hasten
    import hasten.compiler  # a subpackage: not an attribute of hasten until imported

    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(
            f"compile_trainer expects a transformers.Trainer, got {type(trainer).__name__}"
        )
    try:
        hasten.compiler.compile_report(trainer.model)
    except ValueError:  # not compiled by hasten yet
        hasten.compile(trainer.model, config, **settings)
    if fused_optimizer:
        _prefer_fused_optimizer(trainer)
    return trainer


def _prefer_fused_optimizer(trainer: Any) -> str | None:
    """Switch the Trainer's optimizer to its fused twin where there is one; the line logged."""
    from transformers.training_args import OptimizerNames

    args = trainer.args
    current = getattr(args.optim, "value", args.optim)
    fused = _FUSED_TWIN.get(current)
    if fused is None or getattr(trainer, "optimizer", None) is not None:
        return None
    device = next((p.device.type for p in trainer.model.parameters()), "cpu")
    if device not in ("cpu", "cuda"):
        return None  # fused AdamW has kernels for CPU and CUDA only
    args.optim = OptimizerNames(fused)
    line = (
        f"hasten: TrainingArguments.optim {current!r} -> {fused!r} (the same AdamW update in one "
        "fused kernel, for the hasten-compiled model); compile_trainer(..., "
        "fused_optimizer=False) keeps it"
    )
    from hasten.compiler.report import log_line

    log_line(line)
    return line


def _padding_from(trainer: Any) -> dict[str, Any]:
    """``pad_values`` and ``padding_side`` for the sifting loader, from the Trainer's tokenizer
    (``processing_class``, or the data collator's) and collator, so that batches the collator
    padded to their own longest sequence merge with the tokenizer's pad ids."""
    collator = getattr(trainer, "data_collator", None)
    tokenizer = None
    # processing_class since Transformers 4.46; the plain attribute `tokenizer` before it
    owners = (getattr(trainer, "processing_class", None), vars(trainer).get("tokenizer"), collator)
    for owner in owners:
        for candidate in (getattr(owner, "tokenizer", None), owner):
            if getattr(candidate, "pad_token_id", None) is not None:
                tokenizer = candidate
                break
        if tokenizer is not None:
            break
    values: dict[str, Any] = {}
    out: dict[str, Any] = {}
    if tokenizer is not None:
        names = getattr(tokenizer, "model_input_names", None) or ["input_ids"]
        values[names[0]] = tokenizer.pad_token_id
        type_pad = getattr(tokenizer, "pad_token_type_id", None)
        if isinstance(type_pad, int):
            values["token_type_ids"] = type_pad
        if getattr(tokenizer, "padding_side", None) in ("left", "right"):
            out["padding_side"] = tokenizer.padding_side
    label_pad = getattr(collator, "label_pad_token_id", None)
    if isinstance(label_pad, int):
        values["labels"] = label_pad
    if values:
        out["pad_values"] = values
    return out


def _load_stream_state(stream: SiftedEpochs, path: str) -> None:
    """Restore ``stream`` from a state file :class:`SiftingCallback` wrote (plain data, so it
    loads with ``weights_only=True``)."""
    fresh = f"delete {path} to resume the checkpoint with a fresh sifted stream"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise RuntimeError(
            f"{path} does not load with torch.load(weights_only=True): an earlier hasten wrote "
            f"sifting state holding Python objects, which this hasten does not read; {fresh}"
        ) from err
    try:
        stream.load_state_dict(state)
    except ValueError as err:
        raise ValueError(f"cannot resume the sifted stream from {path}: {err}. Or {fresh}") from err


class SiftingCallback(transformers.TrainerCallback):
    """Adds the sifting statistics to every Trainer log (``on_log``).

    Inserted first among the Trainer's callbacks by :func:`enable_sifting`, so the reporters after
    it (printer, TensorBoard, W&B ...) see the ``sift/...`` entries; they are also written into the
    ``trainer.state.log_history`` entry of that log. Counts are summed over ranks (one small
    ``all_reduce`` per log, which every rank runs, as the Trainer logs on every rank). See
    :func:`~hasten.integrations.metrics.sifting_metrics` for the names.

    Args:
        prefix: Put before every name (default ``"sift/"``).
    """

    def __init__(self, prefix: str = "sift/") -> None:
        self.prefix = prefix

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        loader = find_sifting_loader(kwargs.get("train_dataloader"))
        if loader is None or logs is None:
            return
        metrics = sifting_metrics(loader, self.prefix)
        logs.update(metrics)
        history = state.log_history
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(metrics)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = find_sifting_loader(kwargs.get("train_dataloader"))
        if loader is not None:  # warns once when training ended with nothing sifted
            loader._check_delay_reached()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        stream = kwargs.get("train_dataloader")
        if not isinstance(stream, SiftedEpochs):
            return
        # every rank writes its own state (the main process may not have made the folder yet)
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        torch.save(stream.state_dict(), _state_file(folder, args.process_index))
