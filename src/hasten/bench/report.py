"""Plain-text tables of benchmark results, for the terminal and for BENCHMARKS.md.

Every function takes the JSON-ready dicts the runners return (or load from a recorded file), so
a table can always be regenerated from a result file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["compile_table", "demo_table", "format_table", "machine_line", "sift_table"]


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[Any]], markdown: bool = False
) -> str:
    """Align ``rows`` under ``headers``; ``markdown=True`` gives a GitHub table."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(r) + " |" for r in cells[1:]]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(row, widths))

    lines = [line(cells[0]), line(["-" * w for w in widths])]
    lines += [line(r) for r in cells[1:]]
    return "\n".join(line.rstrip() for line in lines)


def _f(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "—" if x is None else f"{x:{spec}}{suffix}"


def machine_line(machine: dict[str, Any]) -> str:
    """One line naming the machine, for table captions."""
    cpu = machine["cpu"]
    gpu = machine.get("gpu")
    where = gpu["name"] if gpu else f"{cpu['usable_cores']} cores of {cpu['model']}"
    v = machine["versions"]
    return (
        f"{where}; torch {v['torch']}, hasten {v['hasten']}; {machine['date_utc']}; "
        f"load average {machine.get('load_average')}"
    )


def compile_table(result: dict[str, Any], markdown: bool = False) -> str:
    """Step time, speedup over eager fp32, compile time, memory and share of matmul peak."""
    rows = []
    base = result.get("baseline") or "eager"
    for c in result["candidates"]:
        if c["error"]:
            rows.append([c["name"], "—", "—", "—", "—", "—", "—", c["error"].split("\n")[0][:70]])
            continue
        step = c["step_s"]
        speed = c.get(f"speedup_vs_{base}")
        mem = c["peak_mem_bytes"]
        rows.append(
            [
                c["name"],
                f"{1e3 * step['median']:.2f} [{1e3 * step['p20']:.2f}, {1e3 * step['p80']:.2f}]",
                _f(speed and speed["median"], ".2f", "×"),
                _f(c["compile_s"], ".1f"),
                _f(c["samples_per_s"], ".0f"),
                _f(mem and mem / 2**20, ".1f"),
                _f(c["fraction_of_matmul_peak"] and 100 * c["fraction_of_matmul_peak"], ".1f", "%"),
                "",
            ]
        )
    headers = [
        "candidate",
        "step ms median [p20, p80]",
        f"speedup vs {base}",
        "1st-step extra s (compile)",
        "samples/s",
        "peak step MiB",
        "of matmul peak",
        "note",
    ]
    return format_table(headers, rows, markdown)


def _pct(ms: dict[str, Any] | None, signed: bool = False) -> str:
    if not ms:
        return "—"
    sign = "+" if signed else ""
    return f"{100 * ms['mean']:{sign}.2f} ± {100 * ms['sem']:.2f}"


def sift_table(result: dict[str, Any], markdown: bool = False) -> str:
    """Per task and run: accuracy, paired differences, compute and wall time."""
    rows = []
    for task, summary in result["summary"].items():
        for r in summary["rows"]:
            acc = r["test_acc"]
            cvf = r.get("compute_vs_full")
            forwarded = r.get("samples_forwarded", {}).get("mean")
            rows.append(
                [
                    task,
                    r["run"],
                    len(r["seeds"]),
                    f"{100 * acc['mean']:.2f} ± {100 * acc['std']:.2f} ({100 * acc['sem']:.2f})",
                    _pct(r.get("acc_minus_full"), signed=True),
                    _pct(r.get("acc_minus_matched"), signed=True),
                    "100%" if r["run"] == "full" else _f(cvf and 100 * cvf["mean"], ".1f", "%"),
                    f"{r['flops']['mean'] / 1e9:.3g}",
                    _f(forwarded, ".0f"),
                    f"{r['samples_backprop']['mean']:.0f}",
                    f"{r['wall_s']['mean']:.2f}",
                ]
            )
    headers = [
        "task",
        "run",
        "seeds",
        "test acc % mean ± std (sem)",
        "Δ vs full (± sem)",
        "Δ vs matched (± sem)",
        "compute",
        "GFLOPs",
        "fwd samples",
        "backprop samples",
        "wall s",
    ]
    return format_table(headers, rows, markdown)


def demo_table(result: dict[str, Any], markdown: bool = False) -> str:
    """The demo's four runs: time to target, compile apart, accuracy, samples, speedup.

    Each row is one run of one seed (the demo trains every variant once), and says so.
    """
    seed = (result.get("config") or {}).get("seed")
    one_seed = "one seed" + (f" ({seed})" if seed is not None else "")
    rows = []
    for r in result["rows"]:
        if "skipped" in r:
            rows.append([r["run"], "—", "—", "—", "—", "—", "—", "skipped: " + r["skipped"]])
            continue
        reached = r["time_to_target_s"]
        rows.append(
            [
                r["run"],
                _f(reached, ".1f") if reached is not None else "not reached",
                _f(r["compile_s"], ".1f") if r["compile_s"] is not None else "—",
                _f(r["time_to_target_incl_compile_s"], ".1f"),
                f"{100 * r['final_test_acc']:.2f}",
                f"{r['samples_backprop']:,}",
                _f(r["speedup"], ".2f", "×"),
                one_seed,
            ]
        )
    headers = [
        "run",
        "to target s",
        "compile s",
        "incl. compile s",
        "final test acc %",
        "samples backprop",
        "speedup",
        "note",
    ]
    return format_table(headers, rows, markdown)
