"""Plain-text tables of benchmark results, for the terminal and for BENCHMARKS.md.

Every function takes the JSON-ready dicts the runners return (or load from a recorded file), so
a table can always be regenerated from a result file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hasten.bench.stats import break_even_step

__all__ = [
    "compile_table",
    "demo_table",
    "first_call_table",
    "format_table",
    "machine_line",
    "sift_table",
]


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
    git = machine.get("git")
    commit = f"; commit {git['commit'][:10]}{' (modified)' if git['dirty'] else ''}" if git else ""
    return (
        f"{where}; torch {v['torch']}, hasten {v['hasten']}{commit}; {machine['date_utc']}; "
        f"load average {machine.get('load_average')}"
    )


# Names an older recorded result used; shown as what ran (hasten.compile + compile_step).
_LEGACY_NAMES = {
    "hasten": "hasten.compile+compile_step",
    "hasten-bf16": "hasten.compile+compile_step-bf16",
}


def _label(c: dict[str, Any]) -> str:
    return _LEGACY_NAMES.get(c["name"], c["name"])


def compile_table(result: dict[str, Any], markdown: bool = False) -> str:
    """Step time, speedup over eager fp32, compile time, memory and share of matmul peak.

    A result whose candidates carry first-call timings (``bench compile --first-calls``) gets
    :func:`first_call_table` instead."""
    if any(c.get("info", {}).get("first_call") for c in result["candidates"]):
        return first_call_table(result, markdown)
    rows = []
    base = result.get("baseline") or "eager"
    for c in result["candidates"]:
        if c["error"]:
            rows.append([_label(c), "—", "—", "—", "—", "—", "—", c["error"].split("\n")[0][:70]])
            continue
        step = c["step_s"]
        speed = c.get(f"speedup_vs_{base}")
        mem = c["peak_mem_bytes"]
        rows.append(
            [
                _label(c),
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


def _first_call_s(c: dict[str, Any], which: str) -> float | None:
    fc = c.get("info", {}).get("first_call", {}).get(which) or {}
    return None if fc.get("error") else fc.get("first_call_s")


def first_call_table(result: dict[str, Any], markdown: bool = False, to_step: int = 100) -> str:
    """Cold and warm first call, steady step, time to step ``to_step`` and break-even step.

    Cold: the first training step in a new process with an empty Inductor cache; warm: the same
    in a second new process reusing that cache. Time to step N = cold first call + (N - 1)
    steady steps (median); break-even: the first step at which that is no more than eager's.
    """
    base = result.get("baseline") or "eager"
    by_name = {c["name"]: c for c in result["candidates"]}
    b = by_name.get(base)
    b_cold = _first_call_s(b, "cold") if b else None
    b_step = b["step_s"]["median"] if b and b.get("step_s") else None
    rows = []
    for c in result["candidates"]:
        cold, warm = _first_call_s(c, "cold"), _first_call_s(c, "warm")
        errors = [
            (c.get("info", {}).get("first_call", {}).get(w) or {}).get("error")
            for w in ("cold", "warm")
        ]
        note = c["error"] or next((e for e in errors if e), None) or ""
        note = note.split("\n")[0][:70]
        step = c.get("step_s")
        speed = c.get(f"speedup_vs_{base}")
        if step is None:
            rows.append(
                [_label(c), _f(cold, ".1f"), _f(warm, ".1f"), "—", "—", "—", "—", "—", "—", note]
            )
            continue
        med = step["median"]
        to_n = None if cold is None else cold + (to_step - 1) * med
        if c["name"] == base or cold is None or b_cold is None or b_step is None:
            even = "—"
        else:
            n = break_even_step(cold, med, b_cold, b_step)
            even = "never" if n is None else str(n)
        mem = c["peak_mem_bytes"]
        frac = c["fraction_of_matmul_peak"]
        rows.append(
            [
                _label(c),
                _f(cold, ".1f"),
                _f(warm, ".1f"),
                f"{med:.3g} [{step['p20']:.3g}, {step['p80']:.3g}]",
                _f(speed and speed["median"], ".2f", "×"),
                _f(to_n, ".0f"),
                even,
                _f(mem and mem / 2**20, ".0f"),
                _f(frac and 100 * frac, ".1f", "%"),
                note,
            ]
        )
    headers = [
        "candidate",
        "cold first call s (own process, empty cache)",
        "warm first call s (own process, warm cache)",
        "steady step s median [p20, p80]",
        f"steady speedup vs {base}",
        f"time to step {to_step} s (cold first call + {to_step - 1} steady)",
        f"break-even step vs {base} (cold)",
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
                    _pct(r.get("acc_minus_rs2"), signed=True),
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
        "Δ vs RS2 (± sem)",
        "compute",
        "GFLOPs",
        "fwd samples",
        "backprop samples",
        "wall s",
    ]
    return format_table(headers, rows, markdown)


def demo_table(result: dict[str, Any], markdown: bool = False) -> str:
    """The demo's runs: the whole run's seconds (compile included, and apart) and final test
    accuracy, the time to the target accuracy (compile spent by then included), the speedup
    over eager of both (eager's time over the run's), and compute (forward + backward +
    scoring) against eager's.

    Each row is one run of one seed (the demo trains every variant once), and says so; a
    compiled row whose compile plan kept every call eager says that too (its speed is eager's).
    """
    config = result.get("config") or {}
    seed = config.get("seed")
    target = config.get("target")
    to = f"to {100 * target:g} %" if target is not None else "to target"
    one_seed = "one seed" + (f" ({seed})" if seed is not None else "")
    sifted = any(r.get("sifting") for r in result["rows"])  # no sifting row: no sifting column
    rows = []
    for r in result["rows"]:
        if "skipped" in r:
            rows.append([r["run"], *["—"] * (8 if sifted else 7), "skipped: " + r["skipped"]])
            continue
        reached = r["time_to_target_incl_compile_s"]
        sift = r.get("sifting")
        if sift and sift.get("samples_planned"):
            left = sift["samples_left_out"]
            saved = (
                f"{left:,} of {sift['samples_planned']:,} samples "
                f"({left / sift['samples_planned']:.0%}) in {sift['epochs_planned']} epochs"
            )
        else:
            saved = "—"
        rows.append(
            [
                r["run"],
                _f(r["whole_run_s"], ".1f"),
                _f(r["compile_s"], ".1f") if r["compile_s"] is not None else "—",
                f"{100 * r['final_test_acc']:.2f}",
                _f(reached, ".1f") if reached is not None else "not reached",
                _f(r["speedup_whole_run"], ".2f", "×"),
                _f(r["speedup_time_to_target_incl_compile"], ".2f", "×"),
                _f(r.get("compute_vs_eager"), ".2f", "×"),
                *([saved] if sifted else []),
                one_seed
                + (
                    "; ran eagerly: the compile plan found no compile that pays over this run"
                    if r.get("compiled_graphs") == 0
                    else ""
                ),
            ]
        )
    headers = [
        "run",
        "whole run s",
        "of it compile s",
        "final test acc %",
        f"{to} s",
        "speedup whole run",
        f"speedup {to}",
        "compute vs eager",
        *(["sifting left out"] if sifted else []),
        "note",
    ]
    return format_table(headers, rows, markdown)
