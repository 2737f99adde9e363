"""hasten.keras.compile on Keras's PyTorch backend: its candidates and its one line, run as a
script (``KERAS_BACKEND`` is read when Keras is imported). Nothing compiles: trials are faked
where a test needs timings. Each case starts with a ``PHASE <name>`` line on stdout and stderr;
the last line is ``RESULT <json>``.
"""

from __future__ import annotations

import json
import logging
import os
import sys

os.environ["KERAS_BACKEND"] = "torch"

import keras
import numpy as np

import hasten.keras as hk
from hasten.keras import _compile

X = np.random.default_rng(0).normal(size=(16, 8)).astype("float32")
Y = (X[:, 0] > 0).astype("int32")


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    inp = keras.Input((8,))
    model = keras.Model(inp, keras.layers.Dense(2)(keras.layers.Dense(8, activation="relu")(inp)))
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def fake_trials(step_ms: dict[str, float], first_s: dict[str, float] | None = None) -> None:
    """Keras's default step runs its real trial (eager: nothing compiles); the other candidates
    return its losses and the step time given (and first step, default 0.01 s), without
    running."""
    real = _compile._trial
    reference: list[list[float]] = []

    def trial(model, batch, steps, warmup, stochastic):
        name = (
            "hasten" if "call" in model.__dict__ else "keras+jit" if model.jit_compile else "keras"
        )
        if name == "keras":
            reference.append(real(model, batch, 1, 0, stochastic)[0])
        return reference[0], (first_s or {}).get(name, 0.01), [step_ms[name] / 1e3] * steps

    _compile._trial = trial


def phase(name: str) -> None:
    """Mark where a case starts on both streams (the test splits them there)."""
    for stream in (sys.stdout, sys.stderr):
        print(f"PHASE {name}", file=stream, flush=True)


def main() -> dict:
    # the cases in an order that only adds logging set-up: no handler anywhere, then the
    # compiler's own stderr handler on "hasten", then the application's basicConfig
    phase("quiet")
    hk.compile(build(), (X, Y), candidates=[], verbose=False)
    phase("plain")
    hk.compile(build(), (X, Y), candidates=[])
    phase("logged")
    from hasten.compiler.report import log_line

    log_line("hasten: an earlier line of the compiler")
    hk.compile(build(), (X, Y), candidates=[])
    phase("configured")
    logging.basicConfig(level=logging.INFO, format="LOG %(message)s", stream=sys.stdout)
    hk.compile(build(), (X, Y), candidates=[])
    phase("choice")
    fake_trials({"keras": 10.0, "keras+jit": 4.0, "hasten": 6.0})
    model = hk.compile(build(), (X, Y), verbose=False)
    report = model.hasten_report
    # the run's length decides: compiling steps cost their first step (in seconds)
    steady = {"keras": 10.0, "keras+jit": 4.0, "hasten": 6.0}
    fake_trials(steady, {"keras": 0.01, "keras+jit": 5.0, "hasten": 2.0})
    run: dict[str, object] = {}
    short = hk.compile(build(), (X, Y), verbose=False, epochs=1, steps_per_epoch=50)
    run["short"] = [short.hasten_report.chosen, short.hasten_report.run_steps]
    run["short_reason"] = short.hasten_report.reason
    long = hk.compile(build(), (X, Y), verbose=False, epochs=10, steps_per_epoch=1000)
    run["long"] = [long.hasten_report.chosen, long.hasten_report.run_steps]
    fake_trials({"keras": 10.0, "keras+jit": 9.9, "hasten": 6.0})  # first steps all 0.01 s
    chosen = hk.compile(build(), Batches(), verbose=False, epochs=3)
    forward = chosen.__dict__.get("_hasten_keras_forward")
    run["hasten"] = [chosen.hasten_report.chosen, chosen.hasten_report.run_steps]
    run["hasten_plan_steps"] = None if forward is None else forward.config.steps
    errors = []
    for kw in ({"epochs": 2}, {"steps_per_epoch": 5}, {"epochs": 0, "steps_per_epoch": 5}):
        try:
            hk.compile(build(), (X, Y), verbose=False, candidates=[], **kw)
        except ValueError as err:
            errors.append(str(err))
    phase("end")
    return {
        "names": [c.name for c in report.candidates],
        "chosen": report.chosen,
        "jit_compile": bool(model.jit_compile),
        "call_replaced": "call" in model.__dict__,
        "run": run,
        "errors": errors,
    }


class Batches(keras.utils.PyDataset):
    """Five batches of (X, Y): an epoch of five steps."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int):
        return X, Y


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()))
