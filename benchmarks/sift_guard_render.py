"""Render the guard's records: ``benchmarks/results/sift-guard-<task>.json`` (the grid) and
``sift-hf-short*.json`` (the short HF fine-tune) into ``benchmarks/results/sift-guard.md``.

    python benchmarks/sift_guard_render.py
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

RESULTS = Path("benchmarks/results")
TASKS = ("digits", "text", "mnist1d", "mnist1d-large")
NAMES = {"text": "BBC News", "mnist1d": "MNIST-1D", "mnist1d-large": "MNIST-1D 50k"}


def _pts(stat: dict | None) -> str:
    if not stat:
        return "—"
    return f"{100 * stat['mean']:+.2f} ± {100 * stat['sem']:.2f}"


def grid_table() -> list[str]:
    lines = [
        "| task | run | seeds | compute saved | Δ vs full data (pts) | Δ vs compute-matched cut | Δ vs RS2 |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in TASKS:
        path = RESULTS / f"sift-guard-{task}.json"
        if not path.exists():
            continue
        rows = json.loads(path.read_text())["summary"][task]["rows"]
        for row in rows:
            if row["run"] == "full" or ":" in row["run"]:
                continue
            saved = 1 - row["compute_vs_full"]["mean"]
            lines.append(
                f"| {NAMES.get(task, task)} | `{row['run']}` | {len(row['seeds'])} | {saved:.1%} | "
                f"{_pts(row.get('acc_minus_full'))} | {_pts(row.get('acc_minus_matched'))} | "
                f"{_pts(row.get('acc_minus_rs2'))} |"
            )
    return lines


def hf_table() -> list[str]:
    runs = []
    for path in sorted(RESULTS.glob("sift-hf-short*.json")):
        runs += json.loads(path.read_text())["runs"]
    full = {r["seed"]: r["test_accuracy"] for r in runs if r["arm"] == "full"}
    lines = [
        "| arm | seeds | test accuracy | Δ vs full, paired (pts) | steps | samples trained | train loss at the end |",
        "|---|---|---|---|---|---|---|",
    ]
    order = ("full", "full2", "recipe", "nocatchup", "random", "reweight", "late", "guarded")
    for arm in order:
        rs = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        if not rs:
            continue
        acc = [r["test_accuracy"] for r in rs]
        diff = [100 * (r["test_accuracy"] - full[r["seed"]]) for r in rs if r["seed"] in full]
        kept = []
        for r in rs:
            planned = r.get("epochs_planned") or []
            kept.append(sum(e["kept"] for e in planned) / (1686 * 3) if planned else 1.0)
        if arm == "full2":
            kept = [2 / 3] * len(rs)
        sem = statistics.stdev(diff) / len(diff) ** 0.5 if len(diff) > 1 else float("nan")
        lines.append(
            f"| `{arm}` | {len(rs)} | {statistics.fmean(acc):.3f} | "
            f"{statistics.fmean(diff):+.1f} ± {sem:.1f} | {statistics.fmean(r['steps'] for r in rs):.0f} | "
            f"{statistics.fmean(kept):.0%} | {statistics.fmean(r['final_train_loss'] for r in rs):.2f} |"
        )
    return lines


def main() -> None:
    text = [
        "# The pruning guard, measured",
        "",
        "Written by `benchmarks/sift_guard_render.py` from `sift-guard-<task>.json`",
        "(`benchmarks/sift_guard_grid.py`) and `sift-hf-short*.json` (`benchmarks/sift_hf_short.py`).",
        "2 shared CPU cores, 1 torch thread per run; compute = forward + backward per sample",
        "(audited samples included). Mean ± standard error of the paired per-seed difference.",
        "",
        "## Recorded tasks: the rule alone (`stale-b1-fed`, guard=None) and guarded (default)",
        "",
        *grid_table(),
        "",
        "## Short HF Trainer fine-tune (BERT 2x128 from config, BBC News, 3 epochs)",
        "",
        *hf_table(),
        "",
    ]
    out = RESULTS / "sift-guard.md"
    out.write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
