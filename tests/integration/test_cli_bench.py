"""`hasten bench compile` and `hasten bench sift` for real at tiny sizes."""

import json

import pytest

from hasten.bench import _hasten_api
from hasten.cli import main

pytestmark = pytest.mark.slow  # compiles and trains


def test_bench_compile_tiny_mlp_all_candidates(tmp_path, capsys):
    path = tmp_path / "compile.json"
    argv = [
        "bench",
        "compile",
        "--size",
        "tiny",
        "--models",
        "mlp",
        "--rounds",
        "2",
        "--steps",
        "2",
        "--warmup",
        "2",
        "--matmul-n",
        "128",
        "--no-progress",
        "--json",
        str(path),
    ]
    assert main(argv) == 0
    assert "torch.compile" in capsys.readouterr().out
    (result,) = json.loads(path.read_text())["results"]
    cands = {c["name"]: c for c in result["candidates"]}
    assert cands["eager"]["error"] is None and cands["torch.compile"]["error"] is None
    # compiling shows up apart from the steps (fast when an identical graph is already in the
    # in-process cache, as after other tests: only above zero is certain)
    assert cands["torch.compile"]["compile_s"] > 0.0
    if _hasten_api.compiler_unavailable() is None:
        assert cands["hasten.compile"]["error"] is None, cands["hasten.compile"]["error"]
    else:
        assert "hasten.compiler" in cands["hasten.compile"]["error"]
    assert result["flops_per_step"] > 0 and result["machine"]["cpu"]["model"]


def test_bench_sift_digits_tiny(tmp_path, capsys):
    if reason := _hasten_api.sifting_unavailable():
        pytest.skip(reason)
    path = tmp_path / "sift.json"
    argv = [
        "bench",
        "sift",
        "--datasets",
        "digits",
        "--seeds",
        "2",
        "--beta",
        "1",
        "--epochs",
        "2",
        "--threads",
        "1",
        "--no-progress",
        "--json",
        str(path),
    ]
    assert main(argv) == 0
    assert "sift-b1" in capsys.readouterr().out
    result = json.loads(path.read_text())
    kinds = [r["policy"] for r in result["runs"]]
    assert kinds == ["full", "sift-b1", "matched:sift-b1", "rs2:sift-b1"] * 2
    rows = {r["run"]: r for r in result["summary"]["digits"]["rows"]}
    assert rows["sift-b1"]["compute_vs_full"]["mean"] < 1.0
