"""Checks of hasten.keras on one Keras backend, run as a script (Keras picks its backend from
KERAS_BACKEND at import, so each backend needs its own process). Prints one JSON object.

    KERAS_BACKEND=torch python tests/unit/keras/backend_checks.py
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras

import hasten.keras as hk
from hasten.keras import _compile
from hasten.sifting.pruning_config import UnbiasedPruningConfig

BACKEND = keras.backend.backend()
RNG = np.random.default_rng(0)
X = RNG.normal(size=(96, 8)).astype("float32")
Y = (X[:, 0] + X[:, 1] > 0).astype("int32")


def build(seed: int = 0, policy_scope: bool = False) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inp)
    h = keras.layers.LayerNormalization()(h)
    out = keras.layers.Dense(2)(h)
    model = keras.Model(inp, out)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def parity() -> dict:
    plain = build()
    hist_plain = plain.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = hk.compile(build(), (X[:16], Y[:16]), verbose=False)
        hist = model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return {
        "report": model.hasten_report.as_dict(),
        "line": str(model.hasten_report),
        "losses": hist.history["loss"],
        "losses_plain": hist_plain.history["loss"],
        "warnings": [str(w.message) for w in caught if "hasten" in str(w.message)],
    }


def fallback() -> dict:
    real = _compile._trial

    def failing(model, *args, **kwargs):
        if model.jit_compile or "call" in model.__dict__:  # any candidate but Keras's default
            raise RuntimeError("injected compiler failure")
        return real(model, *args, **kwargs)

    _compile._trial = failing
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = hk.compile(build(), (X[:16], Y[:16]), verbose=False)
    finally:
        _compile._trial = real
    loss = float(model.train_on_batch(X[:16], Y[:16]))
    return {
        "report": model.hasten_report.as_dict(),
        "warnings": [
            str(w.message) for w in caught if issubclass(w.category, hk.HastenKerasWarning)
        ],
        "loss_after": loss,
    }


def precision() -> dict:
    out: dict = {}
    model = hk.compile(build, (X[:16], Y[:16]), precision="bf16", verbose=False)
    out["bf16_builder"] = model.hasten_report.as_dict()
    out["bf16_layer_dtype"] = model.layers[1].compute_dtype
    fp32 = build()
    clone = hk.compile(fp32, (X[:16], Y[:16]), precision="bf16", verbose=False)
    out["bf16_clone"] = clone.hasten_report.as_dict()
    out["clone_is_new"] = clone is not fp32
    # the clone starts from the given weights: compile restored them after its trial steps
    out["clone_weights_equal"] = all(
        np.array_equal(a, b) for a, b in zip(fp32.get_weights(), clone.get_weights())
    )
    model16 = hk.compile(build, (X[:16], Y[:16]), precision="fp16", verbose=False, candidates=[])
    out["fp16_loss_scaling"] = model16.hasten_report.loss_scaling

    class Sub(keras.Model):
        def __init__(self):
            super().__init__()
            self.d = keras.layers.Dense(2)

        def call(self, x):
            return self.d(x)

    sub = Sub()
    sub.compile(optimizer="adam", loss="mse")
    sub(X[:2])
    try:
        hk.compile(sub, (X[:16], np.zeros((16, 2), "float32")), precision="bf16", verbose=False)
        out["subclass_error"] = None
    except ValueError as err:
        out["subclass_error"] = str(err)
    return out


def bf16_emulated() -> dict:
    """precision='bf16' warns on a CPU whose flags list no bf16 unit, and not on one that has."""
    from hasten import machine

    avx512 = "fpu sse2 avx avx2 avx512f avx512bw avx512vl"
    out: dict = {}
    real = machine._cpuinfo_field
    try:
        for name, flags in (("without", avx512), ("with", avx512 + " avx512_bf16 amx_bf16")):
            machine._cpuinfo_field = lambda field, flags=flags: flags if field == "flags" else None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                hk.compile(build, (X[:16], Y[:16]), precision="bf16", verbose=False, candidates=[])
            out[name] = [str(w.message) for w in caught if "emulated" in str(w.message)]
    finally:
        machine._cpuinfo_field = real
    return out


def torch_no_recompiles() -> dict:
    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("torch._dynamo").addHandler(Grab(level=logging.WARNING))
    model = build()
    _compile._configure(model, _compile._Candidate("hasten", False, hasten=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hist = model.fit(
            X[:80], Y[:80], batch_size=16, epochs=3, verbose=0, validation_data=(X[80:], Y[80:])
        )
    from hasten.compiler.api import compile_report

    fwd = model.__dict__["call"]
    reports = [compile_report(g) for g in fwd.graphs.values() if g is not None]
    return {
        "variants": len(fwd.graphs),
        "eager_variants": sum(g is None for g in fwd.graphs.values()),
        "graphs": sum(len(r.graphs) for r in reports),
        "recompiles": sum(len(r.recompiles) for r in reports),
        "warnings": [str(w.message) for w in caught if "recompil" in str(w.message).lower()],
        "dynamo_logs": [m for m in records if "recompile" in m.lower()],
        "val_loss": hist.history["val_loss"],
    }


def sifting() -> dict:
    out: dict = {}
    model = build()
    data = hk.SiftingPyDataset(
        X,
        Y,
        batch_size=16,
        config=UnbiasedPruningConfig(prune_ratio=0.5, guard=None),  # the rule's own law
        num_epochs=6,
    )
    hist = model.fit(data, epochs=6, callbacks=[data.callback()], verbose=0)
    out["history"] = {k: [float(v) for v in vals] for k, vals in hist.history.items()}
    out["stats"] = data.stats.as_dict()
    out["all_seen"] = bool(data.table.seen.all())
    out["compute_loss_restored"] = "compute_loss" not in model.__dict__
    # the default guard through Keras fit: the same planner, one line at the end of the fit
    guarded = hk.SiftingPyDataset(
        X, Y, batch_size=16, config=UnbiasedPruningConfig(prune_ratio=0.5), num_epochs=4
    )
    build().fit(guarded, epochs=4, callbacks=[guarded.callback()], verbose=0)
    out["guarded_records"] = len(guarded.planner.guard.state.epochs)
    out["guarded_reported"] = guarded.planner.report() is None  # the callback reported it
    out["guarded_summary"] = guarded.planner.summary()
    if BACKEND == "tensorflow":
        import tensorflow as tf

        ds = tf.data.Dataset.from_tensor_slices((X, Y)).batch(10)
        data2 = hk.sifting_dataset(ds, batch_size=16, config={"policy": "stale_relative"})
        model2 = build()
        model2.fit(data2, epochs=3, callbacks=[data2.callback()], verbose=0)
        out["tfdata_stats"] = data2.stats.as_dict()
        out["tfdata_size"] = data2.size
    return out


if __name__ == "__main__":
    checks = {
        "parity": parity,
        "fallback": fallback,
        "precision": precision,
        "bf16_emulated": bf16_emulated,
        "sifting": sifting,
    }
    if BACKEND == "torch":
        checks["no_recompiles"] = torch_no_recompiles
    wanted = sys.argv[1:] or list(checks)
    result = {"backend": BACKEND}
    for name in wanted:
        result[name] = checks[name]()
    print("RESULT " + json.dumps(result))
