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
* ``set_epochs=True``: ``num_train_epochs=E`` trains ``E`` whole data passes, as SageMaker's
  loader does. The Trainer plans ``E`` epochs of the expected sifted batches of ``E`` passes
  (sift delay included) divided by ``E``, plus a little headroom (at most 2.5 %, see
  :func:`~hasten.sifting.core.length.fit_headroom`); passes carry across epochs, and the fit
  ends when the last pass does (the last epoch cut short there, at a whole optimizer step), so
  it takes within about 2.5 % of the planned steps and its schedule ends about there. Passes
  that keep more than the plan holds are cut at the plan's end, with a warning.
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
With ``TrainingArguments(torch_compile=True)`` the Trainer would ``torch.compile`` the model
again when it prepares it: :func:`compile_trainer` turns that off for its trainer (one log line
says so), so the model is compiled once, by hasten.

``TrainingArguments(torch_compile=True, torch_compile_backend="hasten")``, Transformers' route for
a TorchDynamo backend, fails while the ``Trainer`` is built (Accelerate <= 1.15 turns the name
into its closed ``DynamoBackend`` enum: ``ValueError: 'HASTEN' is not a valid DynamoBackend``),
before any hasten code runs; hasten does not patch Accelerate or Transformers to change that.
Leave the backend unset and call ``compile_trainer(trainer)``; see ``docs/integrations.md``.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch

try:
    import transformers
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "hasten's Hugging Face integration needs transformers and accelerate; install them with "
        "`pip install 'hasten[hf]'`"
    ) from err

from hasten.integrations._front_end import is_pruning_config
from hasten.integrations.core import PrunedPasses, RankState, catch_up, training_calls
from hasten.integrations.epochs import SiftedEpochs, expected_batches
from hasten.integrations.metrics import (
    find_pruning_sampler,
    find_sifting_loader,
    front_end_metrics,
)
from hasten.sifting import (
    PerSampleCrossEntropy,
    PruningSampler,
    SiftingDataloader,
    coerce_pruning_config,
)
from hasten.sifting.loss import as_loss

__all__ = ["SiftingCallback", "compile_trainer", "enable_sifting", "is_pruning_config"]

logger = logging.getLogger("hasten")

_MARK = "_hasten_sifting"
_RESUME = "_hasten_sifting_resume"


_RANK_STATE = RankState(
    "state",
    not_ours="this file holds no hasten sifting state",
    other_world="the checkpoint's sifting state comes from {saved} process(es), this run has "
    "{world}: the sifted stream resumes exactly only with the same number of processes",
)
"""Each rank's sifting state, one file per rank in every checkpoint (every rank saves)."""


def _state_file(checkpoint_dir: str, rank: int) -> str:
    """Where :class:`SiftingCallback` saves rank ``rank``'s sifting state in a checkpoint."""
    return RankState.file(checkpoint_dir, rank)


def enable_sifting(
    trainer: Any,
    sift_config: Any,
    loss: Any = None,
    set_epochs: bool = False,
    **kwargs: Any,
) -> Any:
    """Make ``trainer`` sift its training data; the config picks the front-end.

    * A pruning config (:class:`~hasten.sifting.StaleRelativePruningConfig`,
      :class:`~hasten.sifting.UnbiasedPruningConfig`, or a dict with a ``"policy"`` key): a
      :class:`~hasten.sifting.PruningSampler` becomes the Trainer's sampler and the training
      step's own per-sample losses are fed back to it (no extra forward, no subclass). Trains
      ``num_train_epochs`` pruned epochs, or exactly ``max_steps`` steps when set. See
      :func:`_enable_pruning` below and ``docs/integrations.md``.
    * A loader config (:class:`~hasten.sifting.RelativeProbabilisticSiftConfig` or its dict):
      SageMaker's ``enable_sifting``: a :class:`~hasten.sifting.SiftingDataloader` around the
      Trainer's loader, scoring every batch with an extra forward.

    Args:
        trainer: A ``transformers.Trainer`` (or subclass) with a ``train_dataset``.
        sift_config: A pruning config or a loader config (see above).
        loss: Per-sample loss: a :class:`~hasten.sifting.Loss` (``loss(model, batch, original)``)
            or a callable ``fn(model, batch)``; batches are the Trainer's collated dicts, on the
            device. Required for a loader config (it scores with it). For a pruning config it
            *is* the training step's loss (it replaces ``Trainer.compute_loss`` during training
            steps); default :class:`~hasten.sifting.PerSampleCrossEntropy` (classifiers,
            token classifiers).
        set_epochs: Loader config only: ``False``: train by ``max_steps`` (required). ``True``:
            train ``num_train_epochs`` epochs of fixed length (see the module docstring).
        **kwargs: Loader config: keyword arguments for
            :class:`~hasten.sifting.SiftingDataloader` (``batch_transforms``, ``seed``,
            ``log_interval`` ...). Pruning config: ``seed`` (default ``args.data_seed``, else
            ``args.seed``), ``shuffle`` (default ``True``) and ``scorer`` of the
            :class:`~hasten.sifting.PruningSampler`.

    Returns:
        ``trainer``, changed in place.

    Raises:
        TypeError: ``trainer`` is not a Transformers ``Trainer``, ``set_epochs`` is not a bool,
            a loader config without ``loss``, or a pruning config over a dataset without length.
        ValueError: ``set_epochs=False`` without ``max_steps`` (loader config); a setup the
            pruning front-end cannot train exactly (the message names the fix); sifting
            enabled twice.
    """
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(
            f"enable_sifting expects a transformers.Trainer, got {type(trainer).__name__}"
        )
    if not isinstance(set_epochs, bool):
        raise TypeError(f"set_epochs must be True or False, got {set_epochs!r}")
    if getattr(trainer, _MARK, False):
        raise ValueError("sifting is already enabled on this trainer; call enable_sifting once")
    if is_pruning_config(sift_config):
        _enable_pruning(trainer, sift_config, loss, **kwargs)
    else:
        _enable_loader(trainer, sift_config, loss, set_epochs, **kwargs)
    _wrap_train_for_resume(trainer)
    trainer.callback_handler.callbacks.insert(0, SiftingCallback())
    setattr(trainer, _MARK, True)
    return trainer


def _enable_loader(
    trainer: Any, sift_config: Any, loss: Any, set_epochs: bool, **loader_kwargs: Any
) -> None:
    if loss is None:
        raise TypeError(
            "a SiftingDataloader config scores every batch with a per-sample loss: pass "
            "enable_sifting(trainer, config, loss=PerSampleCrossEntropy()) (or your own)"
        )
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
            # by epochs: whole data passes, the last epoch ending with the last pass
            stream = SiftedEpochs(
                sifted,
                passes=passes,
                finish_passes=True,
                step_multiple=trainer.args.gradient_accumulation_steps,
            )
        else:
            stream = SiftedEpochs(sifted, max(1, expected_batches(sifted, 1, delay=False)))
        saved = getattr(trainer, _RESUME, None)
        if saved is not None:  # hasten's own file in the user's checkpoint
            _load_stream_state(stream, saved)
        return stream

    trainer.get_train_dataloader = get_train_dataloader


_PRUNING_KWARGS = ("seed", "shuffle", "scorer")


def _enable_pruning(trainer: Any, config: Any, loss: Any, **kwargs: Any) -> None:
    """The :class:`~hasten.sifting.PruningSampler` front-end in the Trainer.

    * Sampler: the Trainer's own train loader (collator, workers, ``dataloader_drop_last``...)
      is built around the pruning sampler. Under ``torchrun`` the sampler shards the kept
      indices itself (equal counts per rank), so Accelerate's batch sharding of that loader is
      made a pass-through, as Transformers does for its own rank-aware ``BatchRebalanceSampler``.
    * Feedback: during training steps ``compute_loss`` is ``sampler.update(loss(model,
      inputs))``: the per-sample losses of the step's own forward are stored and their
      (for the unbiased rule, reweighted) mean is backpropagated; the Trainer divides it by the
      micro-batches of the optimizer step, as it does for a model's batch-mean loss.
      Evaluation keeps the Trainer's ``compute_loss``.
    * Length: by epochs (``max_steps`` unset), one Trainer epoch is one pruned epoch of the
      sampler, and training ends after ``num_train_epochs`` of them; the Trainer plans its
      steps and learning-rate schedule from the first, full epoch, so the schedule is advanced
      to the run's progress after every step (it ends when the run does). By steps
      (``max_steps``), the pruned epochs follow one another in Trainer epochs of a fixed number
      of batches, and training takes exactly ``max_steps`` steps.
    * Gradient accumulation: a pruned epoch whose batches are not a multiple of
      ``gradient_accumulation_steps`` ends at the last full optimizer step (the rest of its
      kept samples are left for the next epoch: counted in ``samples_not_fed_back``), so every
      optimizer step has all its micro-batches from one epoch and none leaks into the next.
    """
    unknown = sorted(set(kwargs) - set(_PRUNING_KWARGS))
    if unknown:
        raise TypeError(
            f"enable_sifting with a pruning config takes {list(_PRUNING_KWARGS)} as extra "
            f"keywords, got {unknown} (SiftingDataloader keywords apply to a loader config)"
        )
    config = coerce_pruning_config(config)
    args = trainer.args
    dataset = trainer.train_dataset
    if dataset is None:
        raise ValueError("the pruning front-end needs the Trainer's train_dataset")
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        raise TypeError(
            f"the pruning front-end picks dataset indices, so it needs a map-style dataset "
            f"(__len__ and indexing); {type(dataset).__name__} is not one. Use the loader "
            "front-end (RelativeProbabilisticSiftConfig) for iterable datasets"
        )
    if loss is None:
        if float(getattr(args, "label_smoothing_factor", 0.0) or 0.0) > 0:
            raise ValueError(
                f"TrainingArguments.label_smoothing_factor={args.label_smoothing_factor}: the "
                "Trainer smooths inside its own loss, which the pruning front-end replaces by a "
                "per-sample loss. Pass loss=<per-sample loss that smooths>, e.g. "
                "CallableLoss(lambda model, b: F.cross_entropy(model(**{k: v for k, v in "
                "b.items() if k != 'labels'}).logits, b['labels'], reduction='none', "
                "label_smoothing=0.1))"
            )
        if getattr(trainer, "compute_loss_func", None) is not None:
            raise ValueError(
                "the Trainer has a compute_loss_func, which the pruning front-end would replace "
                "by per-sample cross-entropy: pass loss=<the same loss per sample "
                "(reduction='none')>"
            )
        if type(trainer).compute_loss is not transformers.Trainer.compute_loss:
            raise ValueError(
                f"{type(trainer).__name__} overrides compute_loss, which the pruning front-end "
                "replaces during training steps: pass loss=<your loss per sample "
                "(reduction='none')> to say what to train on"
            )
        loss = PerSampleCrossEntropy()
    per_sample = _per_sample_loss(loss)
    strategy = getattr(args, "train_sampling_strategy", "random")
    if strategy not in ("random", None):
        raise ValueError(
            f"TrainingArguments.train_sampling_strategy={strategy!r}: the pruning sampler "
            "replaces the Trainer's sampler; use the default 'random'"
        )
    by_steps = args.max_steps > 0
    anneal = float(getattr(config, "anneal_fraction", 0.0))
    if by_steps and anneal > 0:
        raise ValueError(
            f"{type(config).__name__}(anneal_fraction={anneal}) trains the last epochs on all "
            f"data, but TrainingArguments(max_steps={args.max_steps}) trains by steps, so the "
            "number of epochs is not known: train by num_train_epochs (max_steps=-1), or set "
            "anneal_fraction=0"
        )
    seed = kwargs.get("seed")
    if seed is None:
        seed = args.data_seed if args.data_seed is not None else args.seed
    sampler = PruningSampler(
        dataset,
        config,
        num_epochs=None if by_steps else max(1, math.ceil(args.num_train_epochs - 1e-9)),
        seed=seed,
        shuffle=kwargs.get("shuffle", True),
        scorer=kwargs.get("scorer"),
        num_replicas=args.world_size,
        rank=args.process_index,
        # no batch_size=: the sampler reads it from the Trainer's DataLoader each epoch (the
        # one auto_find_batch_size rebuilds smaller is checked against its own batches too)
    )
    holder: dict[str, PrunedPasses] = {}

    trainer._get_train_sampler = lambda train_dataset=None: sampler
    original = trainer.get_train_dataloader

    @functools.wraps(original)
    def get_train_dataloader() -> PrunedPasses:
        loader = original()
        if find_pruning_sampler(loader) is not sampler:
            raise RuntimeError(
                "the Trainer's get_train_dataloader did not build its loader on the pruning "
                "sampler (an override that ignores _get_train_sampler?); build it on "
                "trainer._get_train_sampler() or use a loader config"
            )
        _unshard(loader, sampler)
        stream = PrunedPasses(
            loader,
            sampler,
            accumulation=trainer.args.gradient_accumulation_steps,
            by_steps=trainer.args.max_steps > 0,
        )
        saved = getattr(trainer, _RESUME, None)
        if saved is not None:
            _load_stream_state(stream, saved)
        holder["stream"] = stream
        return stream

    original_step = trainer.training_step
    in_step = [False]

    @functools.wraps(original_step)
    def training_step(*a: Any, **kw: Any) -> Any:
        in_step[0] = True
        try:
            return original_step(*a, **kw)
        finally:
            in_step[0] = False

    original_loss = trainer.compute_loss

    @functools.wraps(original_loss)
    def compute_loss(model: Any, inputs: Any, return_outputs: bool = False, **kw: Any) -> Any:
        stream = holder.get("stream")
        if not in_step[0] or stream is None or return_outputs:
            return original_loss(model, inputs, return_outputs=return_outputs, **kw)
        return stream.feed_back(per_sample(model, inputs))

    trainer.get_train_dataloader = get_train_dataloader
    trainer.training_step = training_step
    trainer.compute_loss = compute_loss
    # the loss is ours, a per-micro-batch mean: the Trainer divides it by the micro-batches of
    # the step and neither counts num_items_in_batch nor passes it to the model
    trainer.model_accepts_loss_kwargs = False
    if hasattr(trainer, "loss_is_scaled_for_ga"):
        trainer.loss_is_scaled_for_ga = False
    trainer.hasten_pruning_sampler = sampler


def _per_sample_loss(loss: Any) -> Callable[[Any, Any], torch.Tensor]:
    found = as_loss(loss)
    if found is not None:
        return lambda model, batch: found.loss(model, batch, batch)
    raise TypeError(
        f"loss must be a hasten Loss (loss.loss(model, batch)) or a callable fn(model, batch) "
        f"returning one loss per sample, got {type(loss).__name__}"
    )


def _unshard(loader: Any, sampler: PruningSampler) -> None:
    """Make Accelerate's batch sharding of ``loader`` a pass-through: the pruning sampler
    already gives this rank its own shard (and it must not pad a short last batch with repeats,
    whose losses would have no index of this epoch to go to)."""
    shard = getattr(loader, "batch_sampler", None)
    inner = getattr(shard, "batch_sampler", None)
    if hasattr(shard, "num_processes") and getattr(inner, "sampler", None) is sampler:
        if getattr(shard, "split_batches", False):
            raise ValueError(
                "Accelerate's split_batches splits each batch across the processes, and the "
                "pruning sampler already gives every process its own shard: turn "
                "split_batches off (accelerator_config={'split_batches': False})"
            )
        shard.num_processes = 1
        shard.process_index = 0
        shard.even_batches = False


def _wrap_train_for_resume(trainer: Any) -> None:
    """``trainer.train(resume_from_checkpoint=...)`` restores each rank's sifting state."""
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

    trainer.train = train_with_sifting


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
            Transformers' default before 4.55) to ``"adamw_torch_fused"``, logging it. Other
            ``optim`` values and optimizers you passed to the Trainer are not renamed; the
            compiled model's Adam/AdamW/SGD/Adagrad among them still step fused where their
            flags leave it to PyTorch (``hasten.compile``'s ``fused_optimizer``).
            ``False`` turns both off.
        **settings: ``hasten.compile`` keywords, e.g. ``precision="bf16"``.

    Returns:
        ``trainer``, changed in place. A model already compiled by hasten is not recompiled.
        When the Trainer would ``torch.compile`` the model itself (``TrainingArguments(
        torch_compile=True)``, any ``torch_compile_backend``), that is turned off for this
        trainer (``torch_compile=False`` on its arguments, Accelerate's TorchDynamo plugin set
        to ``"no"``) and a log line says so: the model is compiled once, by hasten.

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
        if "steps" not in settings and (config is None or config.steps is None):
            steps = _training_calls(trainer)
            if steps is not None:
                settings = {**settings, "steps": steps}  # regions="auto" plans for the run
        if not fused_optimizer:  # the compiler's own switch to fused kernels, off too
            settings = {**settings, "fused_optimizer": False}
        hasten.compile(trainer.model, config, **settings)
    else:
        if not fused_optimizer:
            from hasten.compiler.optimizer import watch

            watch(trainer.model, False)
    _turn_off_trainer_compile(trainer)
    if fused_optimizer:
        _prefer_fused_optimizer(trainer)
    return trainer


def _turn_off_trainer_compile(trainer: Any) -> str | None:
    """Keep the Trainer from ``torch.compile``-ing the hasten-compiled model; the line logged.

    The Trainer hands ``TrainingArguments.torch_compile_backend`` to Accelerate's
    ``TorchDynamoPlugin`` when it is built, and Accelerate compiles the model in ``prepare``
    (training and evaluation) unless the plugin's backend is ``"no"``. Both are set off here, on
    this trainer's arguments and accelerator (and only when they were on): a later
    ``create_accelerator_and_postprocess`` (hyperparameter search) builds its plugin from the
    arguments, so it stays off too.
    """
    args = trainer.args
    accelerator = getattr(trainer, "accelerator", None)
    plugin = getattr(getattr(accelerator, "state", None), "dynamo_plugin", None)
    planned = getattr(plugin, "backend", None)
    planned = str(getattr(planned, "value", planned) or "no").lower()
    if not args.torch_compile and planned == "no":
        return None
    if args.torch_compile:
        source = f"TrainingArguments.torch_compile=True, backend {args.torch_compile_backend!r}"
    else:  # Accelerate's own setting (ACCELERATE_DYNAMO_BACKEND, `accelerate config`)
        source = f"Accelerate's dynamo backend {planned!r}"
    args.torch_compile = False
    args.torch_compile_backend = None
    args.torch_compile_mode = None
    if planned != "no":
        from accelerate.utils import DynamoBackend

        plugin.backend = DynamoBackend.NO
    line = (
        f"hasten: the Trainer's own torch.compile ({source}) is turned off for this trainer: "
        "compile_trainer compiled the model with hasten.compile, and torch.compile would "
        "compile it a second time"
    )
    from hasten.compiler.report import log_line

    log_line(line)
    return line


def _training_calls(trainer: Any) -> int | None:
    """How many training forward calls (micro-batches) the Trainer's run will make, if known."""
    args = trainer.args
    accumulate = max(int(getattr(args, "gradient_accumulation_steps", 1) or 1), 1)
    if getattr(args, "max_steps", -1) and args.max_steps > 0:
        return training_calls(int(args.max_steps), accumulate)
    data = getattr(trainer, "train_dataset", None)
    try:
        rows = len(data)  # type: ignore[arg-type]
    except TypeError:  # an iterable dataset: the plan learns the length as it goes
        return None
    batch = max(int(args.per_device_train_batch_size) * max(int(args.n_gpu), 1), 1)
    batches = math.floor(rows / batch) if args.dataloader_drop_last else math.ceil(rows / batch)
    return training_calls(float(args.num_train_epochs) * batches)


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


def _load_stream_state(stream: SiftedEpochs | PrunedPasses, path: str) -> None:
    """Restore ``stream`` from a state file :class:`SiftingCallback` wrote (plain data, so it
    loads with ``weights_only=True``)."""
    fresh = f"delete {path} to resume the checkpoint with a fresh sifted stream"
    state = _RANK_STATE.load_file(path)
    try:
        stream.load_state_dict(state)
    except ValueError as err:
        raise ValueError(f"cannot resume the sifted stream from {path}: {err}. Or {fresh}") from err


class SiftingCallback(transformers.TrainerCallback):
    """Adds the sifting statistics to every Trainer log (``on_log``); keeps the pruning
    front-end's epochs and schedule in step with the Trainer (``on_step_end``).

    Inserted first among the Trainer's callbacks by :func:`enable_sifting`, so the reporters after
    it (printer, TensorBoard, W&B ...) see the ``sift/...`` entries; they are also written into the
    ``trainer.state.log_history`` entry of that log. Counts are summed over ranks (one small
    ``all_reduce`` per log, which every rank runs, as the Trainer logs on every rank). See
    :func:`~hasten.integrations.metrics.sifting_metrics` (loader config) and
    :func:`~hasten.integrations.metrics.pruning_metrics` (pruning config) for the names.

    With a pruning config trained by epochs, after every optimizer step it also: advances the
    Trainer's learning-rate scheduler to the steps a full-data run would have taken at this
    point of the run (so a schedule the Trainer sized from full epochs ends with the shorter,
    pruned run; in full-data epochs that is the step just taken, so nothing changes); sets
    ``state.epoch`` to the pruned epochs done; and ends training after the last one.

    With a loader config trained by epochs (``set_epochs=True``), it ends training at the end
    of the epoch in which the fit's last data pass ended (see
    :class:`~hasten.integrations.epochs.SiftedEpochs`'s ``finish_passes``), with ``state.epoch``
    rounded up to that epoch's end.

    Args:
        prefix: Put before every name (default ``"sift/"``).
    """

    def __init__(self, prefix: str = "sift/") -> None:
        self.prefix = prefix

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if logs is None:
            return
        metrics = front_end_metrics(kwargs.get("train_dataloader"), self.prefix)
        if metrics is None:
            return
        logs.update(metrics)
        history = state.log_history
        if history and history[-1].get("step") == state.global_step:
            history[-1].update(metrics)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        stream = kwargs.get("train_dataloader")
        if isinstance(stream, SiftedEpochs) and stream.finished:
            # the fit's last data pass is over, inside this epoch: it is the last one
            control.should_training_stop = True
            state.epoch = float(math.ceil(state.epoch - 1e-9))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        stream = kwargs.get("train_dataloader")
        if not isinstance(stream, PrunedPasses) or stream.by_steps:
            return
        if stream.pass_length > 0:
            state.epoch = stream.pass_index + stream.fed_back / stream.pass_length
        catch_up([kwargs.get("lr_scheduler")], stream.steps_into_schedule(), state.max_steps)
        if stream.done:
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loader = find_sifting_loader(kwargs.get("train_dataloader"))
        if loader is not None:  # warns once when training ended with nothing sifted
            loader._check_delay_reached()
        sampler = find_pruning_sampler(kwargs.get("train_dataloader"))
        if sampler is not None:  # one line: what was pruned, what it saved, the guard's verdict
            sampler.report()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        stream = kwargs.get("train_dataloader")
        if not isinstance(stream, (SiftedEpochs, PrunedPasses)):
            return
        # every rank writes its own state (the main process may not have made the folder yet)
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        _RANK_STATE.save_file(folder, args.process_index, stream.state_dict())
