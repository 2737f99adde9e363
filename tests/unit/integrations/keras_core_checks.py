"""The integration core's scenario through the Keras adapter (hasten.keras.sifting), in a real
``model.fit``, as a script: Keras fixes its backend at import (``KERAS_BACKEND``), so
``test_core.py`` runs this in a fresh interpreter and reads one JSON line back.

    KERAS_BACKEND=torch python tests/unit/integrations/keras_core_checks.py

The scenario is test_core's: the planted dataset (sample i's loss is ``x[i, 0]``, its id
``x[i, 1]``), batches of 8, 3 epochs, a seed; the per-sample loss fed back is the planted one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings

os.environ.setdefault("KERAS_BACKEND", "torch")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import hasten.keras as hk
from hasten.keras import _compile
from tests._helpers import PlantedDataset
from tests.unit.integrations.test_core import BATCH, CONFIGS, EPOCHS, SEED, N

X = PlantedDataset(N).x.numpy()
Y = X[:, :2].copy()  # y_true carries the planted loss: the per-sample loss below returns it


class Logged(hk.SiftingPyDataset):
    """Logs what the adapter feeds back: the batch's sample ids, the losses it stores for them,
    and the loss Keras trains on (``sum(w * l) / batch``, the sampler's weighted mean)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.batches: list[list[int]] = []
        self.losses: list[float] = []
        self.misattributed = 0.0
        self._weights: list[np.ndarray] = []

    def __getitem__(self, index):
        x, y, w = super().__getitem__(index)
        self._weights.append(w)
        return x, y, w

    def start_epoch(self, epoch):
        super().start_epoch(epoch)
        self._weights.clear()

    def record(self, losses):
        rows = self._queue[0]
        got = losses[: len(rows)]
        self.misattributed = max(self.misattributed, float(np.abs(got - X[rows, 0]).max()))
        w = self._weights.pop(0)
        self.batches.append([int(i) for i in X[rows, 1]])
        self.losses.append(float((w * X[rows, 0]).mean()))
        super().record(losses)


@keras.saving.register_keras_serializable(package="hasten_tests")
class StepAsRate(keras.optimizers.schedules.LearningRateSchedule):
    """lr = step * 1e-6: the schedule's position can be read back from the learning rate."""

    def __call__(self, step):
        return keras.ops.cast(step, "float32") * 1e-6

    def get_config(self):
        return {}


class Positions(keras.callbacks.Callback):
    """After every training step: the step the schedule is indexed by for the next one."""

    def __init__(self):
        super().__init__()
        self.after_step: list[int] = []

    def on_train_batch_end(self, batch, logs=None):
        self.after_step.append(round(float(self.model.optimizer.learning_rate) * 1e6))


def run(name: str) -> dict:
    keras.utils.set_random_seed(0)
    inp = keras.Input((X.shape[1],))
    model = keras.Model(inp, keras.layers.Dense(2)(inp))
    model.compile(optimizer=keras.optimizers.SGD(StepAsRate()), loss="mse")
    data = Logged(
        X,
        Y,
        batch_size=BATCH,
        config=CONFIGS[name],
        num_epochs=EPOCHS,
        seed=SEED,
        loss=lambda y_true, y_pred: y_true[:, 0] + 0.0 * y_pred[:, 0],
    )
    run_length = _compile._run_steps(data, EPOCHS, None)  # what hasten.keras.compile tells
    positions = Positions()
    saved = os.path.join(tempfile.mkdtemp(), "model.keras")  # a checkpoint written mid-fit
    callbacks = [data.callback(), positions, keras.callbacks.ModelCheckpoint(saved)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(data, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=callbacks)
    reloaded = keras.saving.load_model(saved, compile=True).optimizer._learning_rate
    stats = data.stats
    return {
        "batches": data.batches,
        "losses": data.losses,
        "misattributed": data.misattributed,
        "kept_fractions": stats.epoch_kept_fractions,
        "fed_back": stats.samples_fed_back,
        "kept": stats.samples_kept,
        "not_fed_back": stats.samples_not_fed_back,
        "positions": positions.after_step,
        "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
        "lr_after": round(float(model.optimizer.learning_rate) * 1e6),
        "schedule_after": type(model.optimizer._learning_rate).__name__,
        "reloaded_schedule": type(reloaded).__name__,
        "run_length": run_length,
        "run_length_unknown": _compile._run_steps(data, None, None),
    }


if __name__ == "__main__":
    names = sys.argv[1:] or list(CONFIGS)
    print(
        "RESULT " + json.dumps({"backend": keras.backend.backend(), **{n: run(n) for n in names}})
    )
