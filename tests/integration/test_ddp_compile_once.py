"""One compile per node under ``torchrun --nproc_per_node=2`` (gloo): local rank 0 compiles, rank 1
reuses its cache; a failing or stalled compiling rank never hangs the other."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("hasten.compiler")

from tests._helpers import torchrun

SCRIPT = "ddp_compile_once.py"


def run_job(out: Path, mode: str, timeout: float, nproc: int = 2, model: str = "tiny") -> list:
    """Run the script on ``nproc`` CPU ranks with a fresh Inductor cache; a hang fails the test.

    The timeouts are generous: on a loaded 2-core machine one cold compile took minutes."""
    env = {
        "TORCHINDUCTOR_CACHE_DIR": str(out / "inductor-cache"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",  # every compile's CPU time is counted per rank
    }
    return torchrun(SCRIPT, out, timeout, nproc, args=(mode, model), env=env)


@pytest.mark.slow
def test_rank_1_reuses_rank_0s_compile_and_trains_the_same(tmp_path):
    r0, r1 = run_job(tmp_path, "normal", timeout=900)
    assert r0["outcomes"] == ["led"] and r1["outcomes"] == ["followed"]
    assert r0["graphs"] >= 1 and r1["graphs"] >= 1
    assert r0["fallback"] is None and r1["fallback"] is None
    # DDP all-reduces the gradients: both ranks end with the same parameters (fp32 sums)
    assert r0["param_sum"] == pytest.approx(r1["param_sum"], rel=1e-9)
    # rank 1 found rank 0's kernels: it spent less CPU on its first step than rank 0 did
    assert r1["first_cpu_s"] < r0["first_cpu_s"]


@pytest.mark.slow
def test_a_failing_compiling_rank_does_not_hold_up_the_other(tmp_path):
    r0, r1 = run_job(tmp_path, "leader_fails", timeout=900)
    assert r0["fallback"] is not None and "injected" in r0["fallback"]  # rank 0 runs eagerly
    assert r1["outcomes"] == ["leader failed"]
    assert r1["graphs"] >= 1 and r1["fallback"] is None  # compiled locally, at once
    assert r1["waited_s"] < 30
    assert r0["param_sum"] == pytest.approx(r1["param_sum"], rel=1e-9)


@pytest.mark.slow
def test_a_stalled_compiling_rank_is_waited_for_a_bounded_time(tmp_path):
    r0, r1 = run_job(tmp_path, "leader_stalls", timeout=900)
    assert r1["outcomes"] == ["timed out"]
    assert 4.0 <= r1["waited_s"] < 8.0  # rank_wait_s=4, then rank 1 compiled on its own
    assert r0["graphs"] >= 1 and r1["graphs"] >= 1
    assert r0["param_sum"] == pytest.approx(r1["param_sum"], rel=1e-9)
