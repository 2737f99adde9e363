import pytest

from hasten.bench.compile_bench import (
    CANDIDATES,
    candidates_for,
    repeated_blocks,
    run_compile_bench,
)
from hasten.bench.harness import BenchConfig
from hasten.bench.models import get_model_spec

QUICK = BenchConfig(warmup=1, rounds=2, steps_per_round=1, matmul_n=64)


def test_candidates_cover_precisions_with_eager_fp32_first():
    spec = get_model_spec("mlp", "tiny")
    names = [c.name for c in candidates_for(spec, ("fp32", "bf16"))]
    assert names == [
        "eager",
        "torch.compile",
        "hasten.compile",
        "hasten.compile+compile_step",
        "eager-bf16",
        "torch.compile-bf16",
        "hasten.compile-bf16",
        "hasten.compile+compile_step-bf16",
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
    (res,) = run_compile_bench(["mlp"], "tiny", ("fp32",), ("eager", "hasten.compile"), QUICK)
    assert res.get("eager").ok
    assert "hasten.compiler" in res.get("hasten.compile").error


@pytest.mark.slow
def test_torch_compile_candidate_really_compiles():
    from torch._dynamo.utils import counters

    before = counters["stats"]["unique_graphs"]
    (res,) = run_compile_bench(["mlp"], "tiny", ("fp32",), ("eager", "torch.compile"), QUICK)
    assert res.get("torch.compile").ok
    assert counters["stats"]["unique_graphs"] > before  # Dynamo captured a graph: it compiled
    assert res.get("torch.compile").compile_s > 0  # and the first step paid for it


def test_every_candidate_says_what_it_runs():
    spec = get_model_spec("gpt2", "tiny")
    cands = {c.name: c for c in candidates_for(spec, kinds=CANDIDATES)}
    assert list(cands) == list(CANDIDATES)
    assert cands["torch.compile+fused-AdamW"].info["optimizer"] == "AdamW(lr=1e-4, fused=True)"
    assert cands["torch.compile"].info["optimizer"] == "AdamW(lr=1e-4)"
    assert "fused by hasten.compile" in cands["hasten.compile"].info["optimizer"]
    assert "compile_step" in cands["hasten.compile+compile_step"].info["optimizer"]


def test_fused_adamw_candidate_uses_the_fused_kernel(monkeypatch):
    import torch

    made = []
    real = torch.optim.AdamW

    def spy(*args, **kwargs):
        made.append(kwargs.get("fused"))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    monkeypatch.setattr(torch, "compile", lambda m, **_: m)  # what runs is not the point here
    spec = get_model_spec("mlp", "tiny")
    (cand,) = [
        c for c in candidates_for(spec, kinds=("torch.compile+fused-AdamW",)) if c.name != "eager"
    ]
    cand.setup()()
    assert made == [True]


def test_regional_candidate_finds_the_repeated_blocks():
    for name, n in (("gpt2", 2), ("bert", 2), ("llama", 2), ("cnn", 2)):
        blocks = repeated_blocks(get_model_spec(name, "tiny").build())
        assert len(blocks) == n and len({type(b) for b in blocks}) == 1, name
    import torch

    assert repeated_blocks(torch.nn.Linear(2, 2)) == []


@pytest.mark.slow
def test_first_calls_run_in_processes_of_their_own():
    (res,) = run_compile_bench(["mlp"], "tiny", ("fp32",), ("eager",), QUICK, first_calls=True)
    fc = res.get("eager").info["first_call"]
    for which in ("cold", "warm"):
        assert fc[which]["error"] is None, fc[which]
        assert fc[which]["first_call_s"] > 0 and fc[which]["import_s"] > 0


def test_blocks_candidate_compiles_by_block_without_the_training_kv_cache(monkeypatch):
    import hasten.bench._hasten_api as api

    seen = {}

    def spy(model, precision="fp32", **overrides):
        seen.update(overrides, use_cache=model.config.use_cache)
        return model  # what runs is not the point here

    monkeypatch.setattr(api, "hasten_compile", spy)
    spec = get_model_spec("gpt2", "tiny")
    (cand,) = [
        c for c in candidates_for(spec, kinds=("hasten.compile-blocks",)) if c.name != "eager"
    ]
    cand.setup()
    # reuse_host_memory=False: the candidates share one process, and the malloc setting is
    # process-wide (it would speed the eager and torch.compile rounds too)
    assert seen == {"regions": "blocks", "reuse_host_memory": False, "use_cache": False}
