import json
import time

import pytest
import torch

from hasten.bench.harness import (
    BenchConfig,
    Candidate,
    count_flops,
    measure_matmul_peak,
    peak_step_memory,
    rotated,
    run_benchmark,
)
from hasten.bench.machine import machine_stamp

FAST = BenchConfig(warmup=2, rounds=3, steps_per_round=2, matmul_n=64)


def test_rotated_gives_every_item_the_lead_equally():
    items = ["a", "b", "c"]
    leads = [rotated(items, r)[0] for r in range(6)]
    assert leads == ["a", "b", "c", "a", "b", "c"]
    assert sorted(rotated(items, 4)) == items


def _logging_candidate(name, log):
    def setup():
        log.append((name, "setup"))
        return lambda: log.append((name, "step"))

    return Candidate(name, setup)


def test_rounds_interleave_candidates_in_rotated_order():
    log = []
    cands = [_logging_candidate(n, log) for n in ("a", "b", "c")]
    result = run_benchmark(cands, FAST)
    steps = [n for n, kind in log if kind == "step"]
    # set-up phase: each candidate's warm-up steps, in order
    assert steps[:6] == ["a", "a", "b", "b", "c", "c"]
    # timed rounds: 2 steps per candidate, order rotated every round
    rounds = steps[6 : 6 + 18]
    assert (
        rounds
        == ["a"] * 2
        + ["b"] * 2
        + ["c"] * 2
        + ["b"] * 2
        + ["c"] * 2
        + ["a"] * 2
        + ["c"] * 2
        + ["a"] * 2
        + ["b"] * 2
    )
    # one memory step each at the end
    assert steps[24:] == ["a", "b", "c"]
    for c in result.candidates:
        assert len(c.step_times) == 6 and len(c.round_means) == 3


def test_speedup_is_paired_per_round():
    def sleeper(seconds):
        return Candidate(f"sleep{seconds}", lambda: lambda: time.sleep(seconds))

    cfg = BenchConfig(warmup=1, rounds=3, steps_per_round=2, measure_memory=False, matmul_n=0)
    result = run_benchmark([sleeper(0.004), sleeper(0.002)], cfg)
    speed = result.speedup("sleep0.002", "sleep0.004")
    assert speed.n == 3
    assert 1.3 < speed.median < 2.5  # 2x nominal; sleep overshoot and a loaded machine blur it
    assert result.get("sleep0.004").compile_s is not None


def test_failing_candidate_is_recorded_and_others_continue():
    def broken():
        raise RuntimeError("cannot build")

    calls = []

    def flaky_setup():
        def step():
            calls.append(1)
            if len(calls) > 3:
                raise ValueError("diverged")

        return step

    log = []
    result = run_benchmark(
        [
            _logging_candidate("ok", log),
            Candidate("broken", broken),
            Candidate("flaky", flaky_setup),
        ],
        FAST,
    )
    assert result.get("ok").ok
    assert "cannot build" in result.get("broken").error
    assert "diverged" in result.get("flaky").error
    assert not result.get("flaky").ok
    assert result.speedup("flaky", "ok") is None


def test_bad_arguments():
    with pytest.raises(ValueError, match="at least one"):
        run_benchmark([], FAST)
    c = Candidate("x", lambda: lambda: None)
    with pytest.raises(ValueError, match="unique"):
        run_benchmark([c, c], FAST)
    with pytest.raises(ValueError, match="rounds"):
        BenchConfig(rounds=0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            BenchConfig(device="cuda")


def test_count_flops_of_known_matmul_and_linear_step():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert count_flops(lambda: a @ b) == 2 * 8 * 16 * 4
    lin = torch.nn.Linear(16, 4, bias=False)
    x = torch.randn(8, 16)  # no grad wrt input: backward is the weight gradient only
    assert count_flops(lambda: lin(x).sum().backward()) == 2 * (2 * 8 * 16 * 4)


def test_peak_step_memory_sees_a_planted_allocation():
    size = 4 * 2**20

    def step():
        t = torch.empty(size, dtype=torch.uint8)
        t.fill_(1)
        del t

    peak, method = peak_step_memory(step, "cpu")
    assert size <= peak < size + 2**20, (peak, method)
    small, _ = peak_step_memory(lambda: torch.ones(4).sum(), "cpu")
    assert small < 2**16


def test_matmul_peak_is_positive():
    flops = measure_matmul_peak("cpu", torch.float32, n=64, repeats=2)
    assert 0 < flops < 1e16


def test_result_is_stamped_and_json_ready():
    result = run_benchmark([Candidate("a", lambda: lambda: torch.ones(8).sum())], FAST)
    d = result.to_dict(baseline="a")
    text = json.dumps(d)
    assert json.loads(text)["machine"]["versions"]["torch"] == torch.__version__
    assert d["candidates"][0]["speedup_vs_a"]["median"] == 1.0
    assert d["matmul_peak_flops_per_s"]["fp32"] > 0


def test_machine_stamp_fields():
    s = machine_stamp()
    assert s["cpu"]["usable_cores"] >= 1 and s["cpu"]["model"]
    assert s["versions"]["hasten"] and s["versions"]["torch"] == torch.__version__
    assert s["date_utc"].endswith("+00:00")
    assert (s["gpu"] is None) == (not torch.cuda.is_available())
    git = s["git"]  # tests run from a checkout: its commit, 40 hex digits
    assert git is None or (len(git["commit"]) == 40 and git["dirty"] in (True, False))


@pytest.mark.gpu
def test_cuda_timing_and_memory_paths():
    size = 64 * 2**20

    def step():
        t = torch.empty(size, dtype=torch.uint8, device="cuda")
        t.fill_(1)

    peak, method = peak_step_memory(step, "cuda")
    assert method == "cuda.max_memory_allocated" and size <= peak < 2 * size
    cfg = BenchConfig(warmup=1, rounds=2, steps_per_round=2, device="cuda", matmul_n=1024)
    result = run_benchmark([Candidate("cuda", lambda: step)], cfg)
    assert result.get("cuda").ok and result.matmul_peak["fp32"] > 1e11
    assert result.machine["gpu"]["name"]
