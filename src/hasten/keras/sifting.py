"""Sifting in Keras ``fit``: prune each epoch from the losses the training step computed.

The two epoch-level rules of :class:`~hasten.sifting.pruning.PruningSampler`, with the same
policies and the same keep-rate law (the pure functions of :mod:`hasten.sifting.policy` and
:mod:`hasten.sifting.unbiased`, the loss table of :mod:`hasten.sifting.feedback`):

- :class:`~hasten.sifting.pruning_config.StaleRelativePruningConfig`: SageMaker's relative rule,
  keep a sample with probability ``percentile ** beta`` among the stored losses;
- :class:`~hasten.sifting.pruning_config.UnbiasedPruningConfig`: InfoBatch's unbiased rule, drop
  below-mean samples with probability ``prune_ratio`` and weight the kept ones
  ``1 / (1 - prune_ratio)`` (passed to Keras as ``sample_weight``).

The loop, with the hook points::

    data = SiftingPyDataset(x, y, batch_size=64, config=cfg, num_epochs=E)   # plans epoch 0
    model.fit(data, epochs=E, callbacks=[data.callback()])
      on_train_begin      the callback wraps model.compute_loss: the training step also writes
                          its per-sample losses (no extra forward) into a small Keras variable
      on_epoch_begin(e)   plan epoch e: one read of the loss table, the policy, a shuffle
      data[i]             batch i of the plan: (x, y, sample_weight); its indices queue up
      on_train_batch_end  read the step's per-sample losses (one host read of batch_size floats)
                          and store them under the queued indices; catch the LR schedule up
      on_epoch_end        keep rate and statistics go into the epoch's logs (sift_keep_rate ...)

Every sample the plan keeps is yielded exactly once per epoch; never-seen samples are always kept
(so epoch 0 trains on all data), and the last ``anneal_fraction`` of the epochs train on all data.
Keras fixes the number of steps per epoch at the first epoch (all data), so a pruned epoch ends
early; Keras's "ran out of data" warning for that is silenced while the callback runs.

LR catch-up (as the Hugging Face and Lightning adapters do, through the same
:func:`hasten.integrations.core.full_data_steps`): a ``LearningRateSchedule`` is indexed by the
optimizer's iterations, and one sized for ``epochs`` full-data epochs would end with the shorter,
pruned run still partway along it. While the callback runs, the optimizer's schedule is indexed by
the steps a full-data run would have taken by now (``max`` of those and the iterations taken:
never back), set after every step; the schedule itself is put back at the end of the fit.
"""

from __future__ import annotations

import collections
import math
import warnings
from typing import Any

import keras
import numpy as np

from hasten.integrations.core import full_data_steps
from hasten.keras._plan import EpochPlanner
from hasten.sifting.pruning_config import coerce_pruning_config

__all__ = ["SiftingCallback", "SiftingPyDataset", "sifting_dataset"]

_RAN_OUT = "Your input ran out of data"


class SiftingPyDataset(keras.utils.PyDataset):
    """A ``keras.utils.PyDataset`` over in-memory samples that leaves out what a pruning rule
    drops, epoch by epoch, from the losses the training step itself computed.

    Args:
        x: Inputs: an array, or a list/tuple/dict of arrays, with samples along axis 0.
        y: Targets, same layout (or ``None``).
        sample_weight: Optional per-sample weights, multiplied with the policy's weights.
        batch_size: Samples per batch (the last batch of an epoch may be smaller).
        config: :class:`~hasten.sifting.pruning_config.UnbiasedPruningConfig`,
            :class:`~hasten.sifting.pruning_config.StaleRelativePruningConfig` or an equivalent
            dict with a ``"policy"`` key.
        num_epochs: Epochs of the run: needed when the config anneals (``anneal_fraction``).
        seed: Seed of the pruning draws and the shuffle.
        shuffle: Shuffle the kept samples each epoch.
        loss: Per-sample loss ``fn(y_true, y_pred) -> [batch]`` to record; default: the model's
            compiled loss, unreduced.

    Attributes:
        stats: A :class:`~hasten.sifting.pruning.PruningStats` (as for the PyTorch sampler).
        table: The :class:`~hasten.sifting.feedback.SampleLosses` the training step feeds.
    """

    def __init__(
        self,
        x: Any,
        y: Any = None,
        sample_weight: Any = None,
        *,
        batch_size: int,
        config: Any,
        num_epochs: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        loss: Any = None,
    ) -> None:
        super().__init__(workers=1, use_multiprocessing=False)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        self.config = coerce_pruning_config(config)
        self.x, self.y = x, y
        self.sample_weight = None if sample_weight is None else np.asarray(sample_weight, "float32")
        sizes = {len(a) for a in keras.tree.flatten((x, y, self.sample_weight)) if a is not None}
        if len(sizes) != 1:
            raise ValueError(
                f"x, y and sample_weight must hold the same number of samples, got {sorted(sizes)}"
            )
        self.size = sizes.pop()
        self.batch_size = batch_size
        self.num_epochs = num_epochs
        self.shuffle = bool(shuffle)
        self.loss = loss
        self.planner = EpochPlanner(
            self.size, self.config, num_epochs=num_epochs, seed=seed, shuffle=shuffle
        )
        self.table = self.planner.table
        self.stats = self.planner.stats
        self._queue: collections.deque[np.ndarray] = collections.deque()

    # ------------------------------------------------------------------ PyDataset protocol

    @property
    def num_batches(self) -> int:
        """Batches of the epoch planned (Keras reads it when the epoch's iteration starts)."""
        return max(1, math.ceil(len(self.planner.order) / self.batch_size))

    def __len__(self) -> int:
        return self.num_batches

    def __getitem__(self, index: int) -> tuple[Any, Any, np.ndarray]:
        order, weights = self.planner.order, self.planner.weights
        lo = index * self.batch_size
        if not 0 <= lo < max(1, len(order)):
            raise IndexError(f"batch {index} is past the {self.num_batches} of this epoch")
        rows = order[lo : lo + self.batch_size]
        self._queue.append(rows)
        w = np.ones(len(rows), "float32") if weights is None else weights[lo : lo + len(rows)]
        if self.sample_weight is not None:
            w = w * self.sample_weight[rows]
        take = lambda a: np.asarray(a)[rows]  # noqa: E731
        return keras.tree.map_structure(take, self.x), keras.tree.map_structure(take, self.y), w

    # ------------------------------------------------------------------ epochs and feedback

    @property
    def epoch(self) -> int:
        return self.planner.epoch

    def start_epoch(self, epoch: int) -> None:
        """Plan ``epoch`` (a no-op if planned) and forget batches queued but not trained on."""
        self._queue.clear()
        self.planner.plan(epoch)

    def record(self, losses: np.ndarray) -> None:
        """Store the losses of the oldest queued batch (the one Keras just trained on)."""
        if not self._queue:
            raise RuntimeError(
                "hasten.keras sifting got a training step's losses but no batch is queued: "
                "the dataset must feed fit directly, with workers=1 and steps_per_execution=1"
            )
        rows = self._queue.popleft()
        self.planner.record(rows, losses[: len(rows)])

    def callback(self) -> SiftingCallback:
        """The callback that feeds this dataset from the training step; pass it to ``fit``."""
        return SiftingCallback(self)


class SiftingCallback(keras.callbacks.Callback):
    """Feeds a :class:`SiftingPyDataset` the per-sample losses of each training step and puts
    the keep rate into Keras's logs (``sift_keep_rate``: this epoch's share of the data,
    ``sift_kept_fraction``: the run's so far)."""

    def __init__(self, dataset: SiftingPyDataset) -> None:
        super().__init__()
        self.dataset = dataset
        self._buffer: Any = None
        self._restore: Any = None
        self._filters: Any = None
        self._schedule: _CaughtUp | None = None
        self._epoch = 0
        self._trained = 0  # batches of this epoch trained on

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        if getattr(model, "steps_per_execution", 1) != 1:
            raise ValueError(
                "hasten.keras sifting reads every step's losses: compile the model with "
                "steps_per_execution=1"
            )
        self._buffer = keras.Variable(
            np.zeros(self.dataset.batch_size, "float32"), trainable=False, name="hasten_sift_losses"
        )
        per_sample = _per_sample_loss(model, self.dataset.loss)
        original = model.compute_loss
        buffer, size = self._buffer, self.dataset.batch_size

        def compute_loss(x=None, y=None, y_pred=None, sample_weight=None, training=True):
            total = original(x, y, y_pred, sample_weight, training=training)
            if training:
                losses = keras.ops.cast(keras.ops.stop_gradient(per_sample(y, y_pred)), "float32")
                padded = keras.ops.slice_update(keras.ops.zeros((size,), "float32"), (0,), losses)
                buffer.assign(padded)
            return total

        object.__setattr__(model, "compute_loss", compute_loss)
        self._restore = original
        self._schedule = _CaughtUp.install(model.optimizer)
        model.make_train_function(force=True)  # fit made it before this hook: remake it
        self._filters = warnings.filters[:]
        warnings.filterwarnings("ignore", message=_RAN_OUT)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.dataset.start_epoch(epoch)
        self._epoch, self._trained = epoch, 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # HOST SYNC: batch_size floats per step (Keras reads its logs back every step anyway)
        self.dataset.record(keras.ops.convert_to_numpy(self._buffer.value))
        self._trained += 1
        if self._schedule is not None:
            self._schedule.step.assign(self.steps_into_schedule())

    def steps_into_schedule(self) -> int:
        """Optimizer steps a full-data fit would have taken by now (at most its ``epochs``)."""
        data = self.dataset
        planned = math.ceil(data.size / data.batch_size)  # a full-data epoch's batches
        target = full_data_steps(self._epoch, self._trained, data.num_batches, planned)
        epochs = (self.params or {}).get("epochs")
        return min(target, epochs * planned) if isinstance(epochs, int) else target

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            s = self.dataset.stats
            logs["sift_keep_rate"] = s.epoch_kept_fractions[-1]
            logs["sift_kept_fraction"] = s.kept_fraction
            logs["sift_audited"] = s.samples_audited

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.dataset.planner.report()  # one line: what was pruned, saved, the guard's verdict
        if self._restore is not None and "compute_loss" in self.model.__dict__:
            object.__delattr__(self.model, "compute_loss")
            self.model.train_function = None
        self._restore = None
        if self._schedule is not None:
            self._schedule.uninstall()
            self._schedule = None
        if self._filters is not None:
            warnings.filters[:] = self._filters
            self._filters = None


@keras.saving.register_keras_serializable(package="hasten")
class _CaughtUp(keras.optimizers.schedules.LearningRateSchedule):
    """The optimizer's ``LearningRateSchedule``, indexed by ``max(iterations, step)``: ``step``
    is the full-data steps the callback sets after each training step (see the module doc).
    Saved mid-fit (a ``ModelCheckpoint``), it is saved under this name with the wrapped
    schedule's config, and loads back as the wrapped schedule itself (loading needs
    ``hasten.keras`` imported); the fit puts the user's schedule back when it ends."""

    def __init__(self, schedule: Any) -> None:
        super().__init__()
        self.schedule = schedule
        self.step = keras.Variable(0, dtype="int64", trainable=False, name="hasten_sift_lr_step")
        self._optimizer: Any = None

    def __call__(self, step: Any) -> Any:
        return self.schedule(keras.ops.maximum(keras.ops.cast(step, "int64"), self.step))

    def get_config(self) -> dict[str, Any]:
        return {"schedule": keras.saving.serialize_keras_object(self.schedule)}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Any:
        # the user's schedule, not the wrapper: a loaded model steps by its own iterations
        return keras.saving.deserialize_keras_object(config["schedule"])

    @classmethod
    def install(cls, optimizer: Any) -> _CaughtUp | None:
        """Wrap ``optimizer``'s schedule (a loss-scale optimizer's inner one); ``None`` where
        its learning rate is a number or a plain callable, which the steps do not index."""
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        schedule = getattr(inner, "_learning_rate", None)  # Keras keeps the schedule here
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            return None
        if isinstance(schedule, cls):  # a fit interrupted before its on_train_end
            schedule.uninstall()
            schedule = schedule.schedule
        wrapped = cls(schedule)
        inner.learning_rate = wrapped
        wrapped._optimizer = inner
        return wrapped

    def uninstall(self) -> None:
        if self._optimizer is not None and self._optimizer._learning_rate is self:
            self._optimizer.learning_rate = self.schedule
        self._optimizer = None


def _per_sample_loss(model: Any, loss: Any) -> Any:
    fn = loss if loss is not None else model.loss
    if isinstance(fn, str):
        fn = keras.losses.get(fn)
    if isinstance(fn, (dict, list, tuple)) or fn is None:
        raise ValueError(
            "hasten.keras sifting needs one per-sample loss: the model was compiled with "
            f"{type(fn).__name__} losses; pass SiftingPyDataset(..., loss=fn(y_true, y_pred))"
        )
    call = fn.call if isinstance(fn, keras.losses.Loss) else fn

    def per_sample(y: Any, y_pred: Any) -> Any:
        out = call(y, keras.ops.cast(y_pred, "float32"))
        if len(out.shape) > 1:
            out = keras.ops.mean(keras.ops.reshape(out, (keras.ops.shape(out)[0], -1)), axis=-1)
        return out

    return per_sample


def sifting_dataset(
    source: Any, *, batch_size: int, config: Any, **kwargs: Any
) -> SiftingPyDataset:
    """A :class:`SiftingPyDataset` from a ``tf.data.Dataset`` or a ``keras.utils.PyDataset``.

    Sifting needs every sample by index, so the source is read once into memory: a
    ``tf.data.Dataset`` of single samples ``(x, y)`` or ``(x, y, w)`` (as from
    ``from_tensor_slices``; a batched one is unbatched), or a ``PyDataset`` of batches.
    """
    if isinstance(source, keras.utils.PyDataset):
        batches = [source[i] for i in range(len(source))]
    elif type(source).__module__.startswith("tensorflow") and hasattr(source, "as_numpy_iterator"):
        import tensorflow as tf

        spec = source.element_spec
        first = keras.tree.flatten(spec)[0]
        if first.shape.rank and first.shape[0] is None:  # batched: samples along axis 0
            source = source.unbatch()
        items = list(source.as_numpy_iterator())
        batches = [keras.tree.map_structure(lambda *v: np.stack(v), *items)] if items else []
        del tf
    else:
        raise TypeError(
            f"sifting_dataset takes a tf.data.Dataset or a keras.utils.PyDataset, got "
            f"{type(source).__name__}; for arrays use SiftingPyDataset(x, y, ...)"
        )
    if not batches:
        raise ValueError("the source dataset is empty")
    parts = [tuple(b) if isinstance(b, (tuple, list)) else (b,) for b in batches]
    joined = [
        keras.tree.map_structure(lambda *v: np.concatenate(v), *[p[k] for p in parts])
        for k in range(len(parts[0]))
    ]
    x, y, w = (*joined, None, None)[:3]
    return SiftingPyDataset(x, y, w, batch_size=batch_size, config=config, **kwargs)
