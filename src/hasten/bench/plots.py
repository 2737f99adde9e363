"""PNG figures of benchmark results (matplotlib, Agg backend), drawn from the result dicts.

Like the tables in :mod:`hasten.bench.report`, every figure can be redrawn from a recorded result
file: nothing here measures anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hasten.bench._optional import require

__all__ = ["plot_compile", "plot_sift"]


def _pyplot() -> Any:
    matplotlib = require("matplotlib")
    matplotlib.use("Agg", force=False)
    return require("matplotlib.pyplot")


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _policy_of(run: str) -> str:
    """``"matched:X"`` and ``"rs2:X"`` belong to policy ``X``."""
    return run.split(":", 1)[1] if ":" in run else run


def plot_sift(result: dict[str, Any], path: str | Path) -> Path:
    """Test accuracy against compute (% of full data) per task: one point per run kind, with
    standard-error bars; a policy and its compute-matched baselines share a colour (full-data cut:
    open square, RS2: open triangle)."""
    plt = _pyplot()
    tasks = list(result["summary"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.8), dpi=120, squeeze=False)
    for ax, task in zip(axes[0], tasks):
        rows = result["summary"][task]["rows"]
        base = {_policy_of(r["run"]) for r in rows if r["run"] != "full"}
        colours = {name: f"C{i + 1}" for i, name in enumerate(sorted(base))}
        for r in rows:
            frac = 1.0 if r["run"] == "full" else (r.get("compute_vs_full") or {}).get("mean")
            if frac is None:
                continue
            acc = r["test_acc"]
            baseline = r["run"].split(":", 1)[0] if ":" in r["run"] else None
            colour = "C0" if r["run"] == "full" else colours[_policy_of(r["run"])]
            ax.errorbar(
                100 * frac,
                100 * acc["mean"],
                yerr=100 * acc["sem"],
                fmt={"matched": "s", "rs2": "^"}.get(baseline or "", "o"),
                mfc="white" if baseline else colour,
                color=colour,
                capsize=3,
                label=r["run"],
            )
        ax.set_title(f"{task} ({len(rows[0]['seeds'])} seeds)", fontsize=9)
        ax.set_xlabel("compute, % of full data (fwd=1, bwd=2; scoring included)", fontsize=8)
        ax.set_ylabel("test accuracy % (mean ± sem)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _finish(plt, fig, path)


def plot_compile(result: dict[str, Any], path: str | Path) -> Path:
    """Speedup over eager fp32 (median, p20–p80 whiskers) for every candidate of every model."""
    plt = _pyplot()
    models = result["results"]
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(models)), 3.8), dpi=120)
    names: list[str] = []
    for m in models:
        for c in m["candidates"]:
            if c["name"] not in names:
                names.append(c["name"])
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for j, m in enumerate(models):
            c = next((c for c in m["candidates"] if c["name"] == name), None)
            speed = c and c.get(f"speedup_vs_{m.get('baseline') or 'eager'}")
            if not speed:
                continue
            xs.append(j + (i - (len(names) - 1) / 2) * width)
            ys.append(speed["median"])
            lo.append(speed["median"] - speed["p20"])
            hi.append(speed["p80"] - speed["median"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=name, color=f"C{i}")
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.set_xticks(range(len(models)), [m["name"] for m in models])
    ax.set_ylabel("speedup over eager fp32 (median, p20–p80)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(plt, fig, path)


def _finish(plt: Any, fig: Any, path: str | Path) -> Path:
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)
