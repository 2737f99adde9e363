"""hasten.keras on the PyTorch backend: a short last batch runs eagerly, not as a new capture.

Each new input shape is a capture and a compile of its own (and counts against the variant
limit); a fit whose epochs end on a short batch (90 rows in batches of 16: 10 left) made one per
epoch end. Runs in a subprocess (Keras fixes its backend at import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("keras")
ROOT = Path(__file__).resolve().parents[3]

SCRIPT = r"""
import json, warnings
import numpy as np
import keras
from hasten.keras import _compile
rng = np.random.default_rng(0)
x = rng.normal(size=(90, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int32")
keras.utils.set_random_seed(0)
inp = keras.Input((8,))
model = keras.Model(inp, keras.layers.Dense(2)(keras.layers.Dense(16, activation="relu")(inp)))
model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
_compile._configure(model, _compile._Candidate("hasten", False, hasten=True))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    hist = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
fwd = model.__dict__["call"]
shapes = sorted({k[3][0][0][0] for k in fwd.graphs})
print("RESULT " + json.dumps({"batch_sizes_captured": shapes, "loss": hist.history["loss"],
      "warnings": [str(w.message) for w in caught if "variant" in str(w.message)]}))
"""


@pytest.mark.slow
def test_a_short_last_batch_is_not_captured():
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["batch_sizes_captured"] == [16], result
    assert not result["warnings"], result
    assert all(v == v for v in result["loss"])  # finite, training went on
