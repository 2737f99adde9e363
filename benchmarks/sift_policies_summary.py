"""Fill the tables of benchmarks/results/sift-policies.md from the recorded result files.

    python benchmarks/sift_policies_summary.py          # rewrite the blocks in place
    python benchmarks/sift_policies_summary.py --check  # exit 1 if the file is out of date

Blocks sit between ``<!-- BEGIN name -->`` and ``<!-- END name -->``; the prose around them is
written by hand. Sources: ``sift-policies.json`` (``python benchmarks/record.py sift-policies``),
``sift-policies-tuning.json`` (``benchmarks/sift_policies_tune.py``) and ``scoring_cost.json``
(``benchmarks/scoring_cost.py``).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from render import update_blocks  # benchmarks/render.py, beside this script

from hasten.bench.report import format_table, machine_line

RESULTS = Path(__file__).resolve().parent / "results"
DOC = RESULTS / "sift-policies.md"
TARGET_SAVING = 0.40  # issue 11: >= 40 % less compute ...
TARGET_POINTS = 0.3  # ... within 0.3 points of full data, >= 0.3 above both matched baselines


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _ms(values: list[float]) -> tuple[float, float, float]:
    n = len(values)
    mean = statistics.mean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    return mean, std, std / math.sqrt(n)


def _by_run(result: dict[str, Any], task: str) -> dict[str, dict[int, dict[str, Any]]]:
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for r in result["runs"]:
        if r["task"] == task:
            out.setdefault(r["policy"], {})[r["seed"]] = r
    return out


def _paired(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]], key: str) -> str:
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return "—"
    mean, _, sem = _ms([a[s][key] - b[s][key] for s in seeds])
    return f"{100 * mean:+.2f} ± {100 * sem:.2f}"


def results_block(result: dict[str, Any]) -> str:
    parts = []
    for task in result["summary"]:
        runs = _by_run(result, task)
        full = runs["full"]
        epochs = next(iter(full.values()))["epochs_planned"]
        rows = []
        for name, recs in runs.items():
            seeds = sorted(recs)
            acc = _ms([recs[s]["test_acc"] for s in seeds])
            share = _ms([recs[s]["compute"] / full[s]["compute"] for s in seeds if s in full])[0]
            wall = _ms([recs[s]["wall_s"] for s in seeds])[0]
            wall_ratio = _ms([recs[s]["wall_s"] / full[s]["wall_s"] for s in seeds if s in full])
            matched = runs.get(f"matched:{name}")
            rs2 = runs.get(f"rs2:{name}")
            rows.append(
                [
                    name,
                    len(seeds),
                    f"{100 * share:.1f}%",
                    f"{100 * acc[0]:.2f} ± {100 * acc[1]:.2f} (± {100 * acc[2]:.2f})",
                    "—" if name == "full" else _paired(recs, full, "test_acc"),
                    _paired(recs, matched, "test_acc") if matched else "—",
                    _paired(recs, rs2, "test_acc") if rs2 else "—",
                    f"{statistics.mean(recs[s]['flops'] for s in seeds) / 1e9:.3g}",
                    f"{wall:.2f} ({wall_ratio[0]:.2f}×)",
                ]
            )
        headers = [
            "run",
            "seeds",
            "compute vs full",
            "test acc % mean ± std (± sem)",
            "Δ vs full (± sem)",
            "Δ vs matched (± sem)",
            "Δ vs RS2 (± sem)",
            "GFLOP-eq.",
            "wall s (vs full)",
        ]
        parts.append(f"**{task}** ({epochs} epochs)\n")
        parts.append(format_table(headers, rows, markdown=True) + "\n")
    machines = result.get("machines") or [result["machine"]]
    for i, machine in enumerate(machines):  # parts of a merged record ran side by side
        tasks = (result.get("merged_from_tasks") or [list(result["summary"])])[i]
        parts.append(f"_Machine ({', '.join(tasks)}): {machine_line(machine)}._\n")
    if result.get("load_average_end"):
        parts.append(f"_Load average at the end: {result['load_average_end']}._\n")
    return "\n".join(parts)


def _diff(a: dict[int, dict[str, Any]], b: dict[int, dict[str, Any]]) -> tuple[float, float]:
    seeds = sorted(set(a) & set(b))
    mean, _, sem = _ms([a[s]["test_acc"] - b[s]["test_acc"] for s in seeds])
    return 100 * mean, 100 * sem


def targets_block(result: dict[str, Any]) -> str:
    """Issue 11's targets per task and policy: >= 40 % less compute, within 0.3 points of full
    data, and >= 0.3 points above both compute-matched baselines (judged on the paired means)."""
    rows = []
    for task in result["summary"]:
        runs = _by_run(result, task)
        full = runs["full"]
        for name, recs in runs.items():
            if name == "full" or ":" in name:
                continue
            seeds = sorted(set(recs) & set(full))
            saving = 1 - statistics.mean(recs[s]["compute"] / full[s]["compute"] for s in seeds)
            cells, missed = [], [] if saving >= TARGET_SAVING else ["saving"]
            d, e = _diff(recs, full)
            cells.append(f"{d:+.2f} ± {e:.2f}")
            if d < -TARGET_POINTS:
                missed.append("vs full")
            for prefix in ("matched", "rs2"):
                base = runs.get(f"{prefix}:{name}")
                if base is None:
                    cells.append("—")
                    missed.append(f"no {prefix} run")
                    continue
                d, e = _diff(recs, base)
                cells.append(f"{d:+.2f} ± {e:.2f}")
                if d < TARGET_POINTS:
                    missed.append(f"vs {prefix}")
            verdict = "yes" if not missed else "no: " + ", ".join(missed)
            rows.append([task, name, f"{100 * saving:.1f}%", *cells, verdict])
    headers = [
        "task",
        "policy",
        "compute saved",
        "Δ vs full (± sem)",
        "Δ vs matched (± sem)",
        "Δ vs RS2 (± sem)",
        f"met? (≥{100 * TARGET_SAVING:.0f}% saved, ≥−{TARGET_POINTS} vs full, "
        f"≥+{TARGET_POINTS} vs matched and RS2)",
    ]
    return format_table(headers, rows, markdown=True) + "\n"


def _tuning_row(name: str, s: dict[str, Any]) -> list[Any]:
    """One tuning candidate's row: seeds, compute, validation accuracy and its two deltas."""
    return [
        name,
        s["seeds"],
        f"{100 * s['compute_share']:.1f}%",
        f"{100 * s['acc']:.2f}",
        f"{100 * s['acc_minus_full']:+.2f} ± {100 * (s['acc_minus_full_sem'] or 0):.2f}",
        f"{100 * s['acc_minus_curve']:+.2f} ± {100 * (s['acc_minus_curve_sem'] or 0):.2f}",
    ]


def tuning_block(tuning: dict[str, Any]) -> str:
    rows = [_tuning_row(name, s) for name, s in tuning["mnist1d_round2"]["summary"].items()]
    headers = ["run", "seeds", "compute", "val acc %", "Δ vs full40", "Δ vs full-data curve"]
    return format_table(headers, rows, markdown=True) + "\n"


def tuning11_block(tuning: dict[str, Any]) -> str:
    """Issue 11's tuning rounds: per task, each candidate on the validation split."""
    parts = []
    for task, t in tuning["issue11"]["tasks"].items():
        rows = [_tuning_row(name, s) for name, s in t["summary"].items()]
        headers = [
            "run",
            "seeds",
            "compute",
            "val acc %",
            f"Δ vs full{t['epochs']}",
            "Δ vs full-data curve",
        ]
        parts.append(f"**{task}** ({t['epochs']} epochs; seeds {t['seeds']})\n")
        parts.append(format_table(headers, rows, markdown=True) + "\n")
    return "\n".join(parts)


def scoring_block(cost: dict[str, Any]) -> str:
    rows = []
    for task, t in cost["tasks"].items():
        for name, r in t["rows"].items():
            if "error" in r:
                rows.append([task, name, "error", "", r["error"][:60]])
                continue
            lo, hi = r["p20_p80_us"]
            compile_s = r.get("compile_s")
            rows.append(
                [
                    task,
                    name,
                    f"{r['us_per_sample']:.2f} [{lo:.2f}, {hi:.2f}]",
                    f"{r['vs_train_step']:.3f}",
                    f"{compile_s:.1f}" if name.startswith("pass-compiled") and compile_s else "",
                ]
            )
    headers = [
        "task",
        "candidate",
        "µs per sample, median [p20, p80]",
        "share of a training step",
        "compile s",
    ]
    machine = cost.get("machine")
    tail = f"\n_Machine: {machine_line(machine)}._\n" if machine else ""
    return format_table(headers, rows, markdown=True) + "\n" + tail


def render(name: str) -> str:
    if name in ("results", "targets"):
        result = _load("sift-policies.json")
        if result is None:
            return "_Not recorded yet: `python benchmarks/record.py sift-policies`._\n"
        return results_block(result) if name == "results" else targets_block(result)
    if name in ("tuning", "tuning11"):
        tuning = _load("sift-policies-tuning.json")
        if not tuning or (name == "tuning11" and "issue11" not in tuning):
            return "_No tuning record._\n"
        return tuning_block(tuning) if name == "tuning" else tuning11_block(tuning)
    if name == "scoring":
        cost = _load("scoring_cost.json")
        return scoring_block(cost) if cost else "_Not recorded: benchmarks/scoring_cost.py._\n"
    raise ValueError(f"unknown block {name!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    return update_blocks(
        DOC, render, check=args.check, command="python benchmarks/sift_policies_summary.py"
    )


if __name__ == "__main__":
    sys.exit(main())
