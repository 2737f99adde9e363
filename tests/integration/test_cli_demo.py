"""`hasten demo --quick` end to end: trains, prints the table, writes the plot and the JSON."""

import json

import pytest

from hasten.bench import _hasten_api
from hasten.cli import main

pytestmark = pytest.mark.slow  # compiles (when hasten.compiler is present) and trains


def test_demo_quick_writes_table_plot_and_json(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(["demo", "--quick", "--out", str(out), "--threads", "1", "--no-progress"])
    assert code == 0
    text = capsys.readouterr().out
    for word in (
        "eager",
        "hasten.compile",
        "sifting",
        "compile + sifting",
        "whole run s",
        "to 80 % s",
    ):
        assert word in text
    png = (out / "demo.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    result = json.loads((out / "demo.json").read_text())
    rows = {r["run"]: r for r in result["rows"]}
    assert list(rows) == ["eager", "hasten.compile", "sifting", "compile + sifting"]
    eager = rows["eager"]
    assert eager["time_to_target_s"] is not None and eager["speedup_whole_run"] == 1.0
    # every run trains its whole schedule; the time to target is read off its curve
    assert eager["time_to_target_s"] <= eager["whole_run_s"]
    assert result["runs"]["eager"]["samples_backprop"] == 3 * result["dataset"]["n_train"]
    compiler_missing = _hasten_api.compiler_unavailable()
    sifting_missing = _hasten_api.sifting_unavailable()
    assert ("skipped" in rows["hasten.compile"]) == bool(compiler_missing)
    assert ("skipped" in rows["sifting"]) == bool(sifting_missing)
    if not sifting_missing:
        # the default sifting feeds the training step's own losses back: no scoring forward
        assert rows["sifting"]["samples_scored"] == 0
        assert result["runs"]["sifting"]["info"]["config"]["policy"] == "unbiased"
    if not compiler_missing:
        assert rows["hasten.compile"]["compile_s"] > 0
    for name, run in result["runs"].items():
        walls = [p["wall_s"] for p in run["curve"]]
        assert walls == sorted(walls), name
