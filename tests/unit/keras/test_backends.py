"""hasten.keras on the TensorFlow and PyTorch backends of Keras, one subprocess per backend.

Keras fixes its backend at import (``KERAS_BACKEND``), so the checks run in
``backend_checks.py`` in a fresh interpreter and come back as JSON; each test reads its part.
Tolerances: fp32 losses within 1e-5 relative of the uncompiled model (same weights, same batches);
the bf16 candidates within hasten.keras's bf16 tolerance (5e-2) of Keras's own mixed step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("keras")
SCRIPT = Path(__file__).with_name("backend_checks.py")
ROOT = Path(__file__).resolve().parents[3]
BACKENDS = ["tensorflow", "torch"]


def _run(backend: str) -> dict:
    if backend == "tensorflow":
        pytest.importorskip("tensorflow")
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise AssertionError(
            f"{backend} checks failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(scope="module", params=BACKENDS)
def checks(request) -> dict:
    return _run(request.param)


@pytest.mark.slow
def test_parity_with_uncompiled_model(checks):
    p = checks["parity"]
    report = p["report"]
    assert report["backend"] == checks["backend"]
    names = [c["name"] for c in report["candidates"]]
    assert names[0] == "keras" and report["chosen"] in names
    chosen = next(c for c in report["candidates"] if c["name"] == report["chosen"])
    assert chosen["verified"] and chosen["step_ms"] > 0
    assert p["line"].startswith(f"hasten.keras: {checks['backend']} fp32")
    for a, b in zip(p["losses"], p["losses_plain"]):
        assert a == pytest.approx(b, rel=1e-5)
    assert p["warnings"] == []


@pytest.mark.slow
def test_fallback_names_the_cause(checks):
    f = checks["fallback"]
    report = f["report"]
    assert report["chosen"] == "keras"
    failed = [c for c in report["candidates"] if c["error"]]
    assert failed and all("injected compiler failure" in c["error"] for c in failed)
    assert len(f["warnings"]) == len(failed)
    assert "injected compiler failure" in f["warnings"][0]
    assert f["loss_after"] == f["loss_after"]  # the model still trains (finite, not NaN)


@pytest.mark.slow
def test_mixed_precision_policy(checks):
    p = checks["precision"]
    assert p["bf16_builder"]["policy"] == "mixed_bfloat16"
    assert p["bf16_layer_dtype"] == "bfloat16"
    assert not p["bf16_builder"]["loss_scaling"]  # bf16 needs none
    assert p["bf16_clone"]["policy"] == "mixed_bfloat16"
    assert p["bf16_clone"]["built"].startswith("cloned")
    assert p["clone_is_new"] and p["clone_weights_equal"]
    assert p["fp16_loss_scaling"]  # Keras wraps the optimizer for mixed_float16
    assert "Pass a function" in p["subclass_error"]
    for c in p["bf16_builder"]["candidates"]:
        assert c["error"] is None and c["verified"], c


@pytest.mark.slow
def test_bf16_on_a_cpu_that_emulates_it_warns(checks):
    w = checks["bf16_emulated"]
    if (
        w["without"] == [] and w["with"] == []
    ):  # a GPU in the backend's sight: Keras runs bf16 there
        pytest.skip("the backend sees a GPU")
    assert len(w["without"]) == 1 and "precision='fp32'" in w["without"][0]
    assert w["with"] == []


@pytest.mark.slow
def test_sifting_fit_keeps_law_and_loses_nothing(checks):
    s = checks["sifting"]
    stats = s["stats"]
    assert stats["samples_fed_back"] == stats["samples_kept"]  # every kept sample trained once
    assert stats["samples_not_fed_back"] == 0
    assert s["all_seen"] and s["compute_loss_restored"]
    fractions = stats["epoch_kept_fractions"]
    assert fractions[0] == 1.0 and fractions[-1] == 1.0  # epoch 0 all data; annealed last epoch
    assert max(fractions[1:-1]) < 0.95  # pruned epochs
    assert s["history"]["sift_keep_rate"] == pytest.approx(fractions)
    assert s["guarded_records"] == 4 and s["guarded_reported"]
    assert (
        s["guarded_summary"].startswith("hasten sifting: trained on")
        and "guard" in s["guarded_summary"]
    )
    if checks["backend"] == "tensorflow":
        assert s["tfdata_size"] == 96
        t = s["tfdata_stats"]
        assert t["samples_fed_back"] == t["samples_kept"] and t["samples_not_fed_back"] == 0


@pytest.mark.slow
def test_torch_backend_three_epochs_no_recompiles(checks):
    if checks["backend"] != "torch":
        pytest.skip("PyTorch backend only")
    r = checks["no_recompiles"]
    # the training graph; validation (one call an epoch, 3 in all) stays eager: a new variant is
    # captured once it has come back RARE_CALLS times, as a short last batch would be
    assert r["variants"] == 1 and r["eager_variants"] == 0
    assert r["graphs"] >= 1 and r["recompiles"] == 0
    assert r["warnings"] == [] and r["dynamo_logs"] == []
    assert len(r["val_loss"]) == 3


def test_import_hasten_does_not_import_keras():
    code = (
        "import sys, hasten, hasten.keras; "
        "print(any(m.split('.')[0] in ('keras', 'tensorflow') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
