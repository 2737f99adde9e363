import pytest

from hasten.bench.compile_bench import candidates_for, run_compile_bench
from hasten.bench.harness import BenchConfig
from hasten.bench.models import get_model_spec

QUICK = BenchConfig(warmup=1, rounds=2, steps_per_round=1, matmul_n=64)


def test_candidates_cover_precisions_with_eager_fp32_first():
    spec = get_model_spec("mlp", "tiny")
    names = [c.name for c in candidates_for(spec, ("fp32", "bf16"))]
    assert names == [
        "eager",
        "torch.compile",
        "hasten",
        "eager-bf16",
        "torch.compile-bf16",
        "hasten-bf16",
    ]
    precisions = [c.precision for c in candidates_for(spec, ("bf16",), ("eager",))]
    assert precisions == ["fp32", "bf16"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"precisions": ("fp8",)}, "precision"), ({"kinds": ("xla",)}, "candidate")],
)
def test_bad_choices_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        candidates_for(get_model_spec("mlp", "tiny"), **kwargs)


def test_eager_candidates_train_at_both_precisions():
    spec = get_model_spec("mlp", "tiny")
    (res,) = run_compile_bench(["mlp"], "tiny", ("fp32", "bf16"), ("eager",), QUICK)
    assert [c.name for c in res.candidates] == ["eager", "eager-bf16"]
    assert all(c.ok for c in res.candidates)
    # model FLOPs of one step: forward 2*B*sum(in*out), backward twice that less the first
    # layer's input gradient (inputs do not require grad)
    b, d, h, k = spec.batch_size, 16, 32, 4
    fwd = 2 * b * (d * h + h * h + h * k)
    assert res.flops_per_step == 3 * fwd - 2 * b * d * h
    assert res.machine["model"]["name"] == "mlp"


def test_hasten_candidate_reports_why_it_cannot_run():
    from hasten.bench import _hasten_api

    if _hasten_api.compiler_unavailable() is None:
        pytest.skip("hasten.compiler is available; the slow integration test covers it")
    (res,) = run_compile_bench(["mlp"], "tiny", ("fp32",), ("eager", "hasten"), QUICK)
    assert res.get("eager").ok
    assert "hasten.compiler" in res.get("hasten").error


@pytest.mark.slow
def test_torch_compile_candidate_really_compiles():
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    (res,) = run_compile_bench(["mlp"], "tiny", ("fp32",), ("eager", "torch.compile"), QUICK)
    assert res.get("torch.compile").ok
    assert counters["stats"]["unique_graphs"] > before  # Dynamo captured a graph: it compiled
    assert res.get("torch.compile").compile_s > 0  # and the first step paid for it
