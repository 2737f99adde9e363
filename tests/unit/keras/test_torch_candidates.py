"""hasten.keras.compile on the PyTorch backend tries Keras's own jit_compile=True, and says its
choice in one line (``torch_candidates_checks.py``, one subprocess per case: Keras fixes its
backend at import). Nothing compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hasten.keras._compile import candidates_for

SCRIPT = Path(__file__).with_name("torch_candidates_checks.py")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def run() -> tuple[dict, dict[str, str]]:
    """The script's result, and what each case wrote (stdout and stderr together)."""
    pytest.importorskip("keras")
    env = {**os.environ, "KERAS_BACKEND": "torch", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise AssertionError(f"failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    cases: dict[str, str] = {}
    for stream in (proc.stdout, proc.stderr):
        name = None
        for line in stream.splitlines():
            if line.startswith("PHASE "):
                name = line.split()[1]
            elif name is not None:
                cases[name] = cases.get(name, "") + line + "\n"
    return json.loads(lines[-1][len("RESULT ") :]), cases


def test_every_switch_keras_offers_on_torch_is_a_candidate():
    names = [c.name for c in candidates_for("torch")]
    assert names == ["keras", "keras+jit", "hasten"]
    jit = next(c for c in candidates_for("torch") if c.name == "keras+jit")
    assert jit.jit_compile and not jit.hasten
    assert [c.name for c in candidates_for("tensorflow")] == ["keras", "keras+xla"]


def test_keras_jit_is_chosen_when_it_is_the_fastest(run):
    result, _ = run
    assert result["names"] == ["keras", "keras+jit", "hasten"]
    assert result["chosen"] == "keras+jit"
    assert result["jit_compile"] and not result["call_replaced"]


@pytest.mark.parametrize("case", ["plain", "logged", "configured"])
def test_the_choice_line_is_shown_once(run, case):
    text = run[1].get(case, "")
    assert text.count("hasten.keras: torch fp32 (float32): chose keras") == 1, text


def test_verbose_false_prints_nothing(run):
    assert "hasten.keras:" not in run[1].get("quiet", "")


def test_the_runs_length_decides_with_the_compiling_step_counted(run):
    result, _ = run
    r = result["run"]
    # 50 steps: keras 0.01 s + 49 x 10 ms beats keras+jit's 5 s and hasten's 2 s first steps
    assert r["short"] == ["keras", 50] and "over the run's 50 steps" in r["short_reason"]
    # 10,000 steps: keras+jit's 4 ms steps pay back its 5 s compile, and beat hasten's 6 ms
    assert r["long"] == ["keras+jit", 10000]
    # epochs x len(PyDataset): hasten's compiler chosen, and told the run's length
    assert r["hasten"] == ["hasten", 15] and r["hasten_plan_steps"] == 15


def test_a_half_given_run_length_is_named(run):
    result, _ = run
    first, second, third = result["errors"]
    assert "steps_per_epoch=ceil(len(x) / batch_size)" in first
    assert "pass epochs=" in second
    assert "epochs must be an int >= 1" in third
