"""Fill BENCHMARKS.md's tables from the recorded result files (never by hand).

    python benchmarks/render.py          # rewrite the blocks in place
    python benchmarks/render.py --check  # exit 1 if BENCHMARKS.md is out of date

A block sits between `<!-- BEGIN name -->` and `<!-- END name -->`; `name` is a result file in
benchmarks/results/ (without `.json`, or `demo` for results/demo/demo.json).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from hasten.bench.report import compile_table, demo_table, format_table, machine_line, sift_table

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DOC = HERE / "BENCHMARKS.md"
_CONFIG = {
    "compile-cpu-small": "compile-cpu",
    "compile-gpu-base": "compile-gpu",
    "compile-cpu-base": "compile-cpu-base-gpt2` (then `-bert`, `-llama`, one at a time), then "
    "`python benchmarks/record.py compile-cpu-base",
}
# records a benchmark script renders itself (its ``render``): kind -> script
_SCRIPT_KINDS = {
    f"hasten.bench.{script}": script
    for script in (
        "bf16_step",
        "bf16_weights",
        "host_memory",
        "dropout_rng",
        "plan_prior",
        "pass_ab",
    )
}
BLOCK = re.compile(
    r"(<!-- BEGIN (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- END (?P=name) -->)", re.S
)


def _source(path: Path) -> str:
    return f"_Source: `{path.relative_to(HERE)}`._"


def render_block(name: str) -> str:
    path = RESULTS / "demo" / "demo.json" if name == "demo" else RESULTS / f"{name}.json"
    if not path.exists():
        return f"_Not recorded yet: `python benchmarks/record.py {_CONFIG.get(name, name)}`._\n"
    data = json.loads(path.read_text(encoding="utf-8"))
    kind = data.get("kind")
    parts: list[str] = []
    if kind == "hasten.bench.compile":
        png = path.with_suffix(".png")
        if png.exists():
            parts.append(f"![speedup over eager fp32]({png.relative_to(HERE)})\n")
        merged = bool(data.get("merged_from"))  # separate runs: a machine line for each
        for result in data["results"]:
            flops = result["flops_per_step"]
            parts.append(f"**{result['name']}** ({flops:.3g} model FLOPs per step)\n")
            parts.append(compile_table(result, markdown=True) + "\n")
            if merged:
                parts.append(f"_Machine: {machine_line(result['machine'])}._\n")
        machine = data["results"][0]["machine"] if data["results"] and not merged else None
        if machine is None:
            parts.append(_source(path) + "\n")
    elif kind == "cnn-gap":
        parts.append(_cnn_gap(data) + "\n")
        machine = data["results"][0]["machine"] if data["results"] else None
    elif name == "gpt2-base-limit":
        parts.append(_limit(data) + "\n")
        machine = data["machine"]
    elif kind == "hasten.bench.sift":
        parts.append(sift_table(data, markdown=True) + "\n")
        png = path.with_suffix(".png")
        if png.exists():
            parts.append(f"![test accuracy against compute]({png.relative_to(HERE)})\n")
        machine = data["machine"]
        for extra in data.get("machines", [])[1:]:  # merged parts ran side by side
            parts.append(f"_Machine (part 2): {machine_line(extra)}._\n")
    elif kind == "hasten.bench.keras":
        from hasten.bench.keras_bench import keras_table

        parts.append(keras_table(data, markdown=True) + "\n")
        machine = data["machine"]
    elif kind == "hasten.whole_run":
        parts.append(_whole_run(data) + "\n")
        machine = data["machine"]
    elif kind in _SCRIPT_KINDS:
        parts.append(_script_render(_SCRIPT_KINDS[kind], data) + "\n")
        machine = data["machine"]
    elif kind == "hasten.hf_whole_run":
        parts.append(_hf_whole_run(data) + "\n")
        machine = data["machine"]
    elif kind == "hasten.two_lines_isolated":
        parts.append(_two_lines_isolated(data) + "\n")
        machine = data["machine"]
    elif kind == "hasten.demo":
        parts.append(demo_table(data, markdown=True) + "\n")
        parts.append("![test accuracy against training seconds](results/demo/demo.png)\n")
        machine = data["machine"]
    else:
        raise ValueError(f"{path}: unknown result kind {kind!r}")
    if machine:
        parts.append(f"_Machine: {machine_line(machine)}._ {_source(path)}\n")
    return "\n".join(parts)


def _script_render(script: str, data: dict) -> str:
    """A benchmark script's own table (one script writes and renders its record)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(script, HERE / f"{script}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.render(data))


_HF_ARMS = {
    "plain": "the `Trainer` as made (`adamw_torch`)",
    "hasten": "the same, then `compile_trainer(trainer)` (default plan, told the run's length)",
    "torch_compile": "`TrainingArguments(torch_compile=True)`",
    "torch_compile_fused": '`torch_compile=True`, `optim="adamw_torch_fused"`',
    "regional_fused": '`layer.compile()` on each encoder block, `optim="adamw_torch_fused"`',
}


def _hf_whole_run(data: dict) -> str:
    """hf_whole_run.py: each arm's whole fine-tune (evaluations included) against the plain one."""
    c = data["config"]
    runs = data["runs"]
    # the plain arm's cold runs are the reference (a warm plain run has no cache to use)
    plain = [
        r["seconds"]
        for r in runs
        if r["arm"] == "plain" and "seconds" in r and r.get("cache", "cold") == "cold"
    ]
    base = statistics.median(plain) if plain else None
    warm = any(r.get("cache") == "warm" for r in runs)
    lines = [
        f"BERT {c['layers']} layers x {c['hidden']}, {c['epochs']} epochs of "
        f"{c['train'] or 'all'} BBC News articles ({c['seq']} tokens, batch 32, AdamW at "
        f"{c.get('lr', 5e-4):g}"
        + (f", {c['warmup']:.0%} warm-up" if c.get("warmup") else "")
        + "), evaluation on "
        f"the 445 test articles after each epoch; each arm in a new process with an empty "
        f"Inductor cache; {c['rounds']} round(s), arms in turn"
        + ("; warm: the arm again, in the cache its cold run left." if warm else "."),
        "",
        "| arm | cache | what runs | whole run s | vs plain (cold) | optimizer steps "
        "| evaluations s | test accuracy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        arm, cache = r["arm"], r.get("cache", "cold")
        if "seconds" not in r:
            lines.append(f"| {arm} | {cache} | {_HF_ARMS.get(arm, '')} | error | | | | |")
            continue
        evals = " + ".join(f"{e:.1f}" for e in r.get("eval_runtime_s", []) if e is not None)
        ratio = f"{base / r['seconds']:.2f}×" if base else ""
        lines.append(
            f"| {arm} | {cache} | {_HF_ARMS.get(arm, '')} | {r['seconds']:.1f} | {ratio} "
            f"| {r['steps']} | {evals} | {100 * r['test_accuracy']:.1f} % |"
        )
    return "\n".join(lines)


def _two_lines_isolated(data: dict) -> str:
    """two_lines_isolated.py: per-process step medians and the per-round peer / hasten ratio."""
    peer, ours = data["candidates"]
    lines = [
        f"{data['rounds']} rounds; per round one new process per candidate (order alternating), "
        f"{data['warmup']} untimed steps then {data['steps']} timed; warm Inductor cache.",
        "",
        f"| model | `{peer}` ms per process | `{ours}` ms per process | median ms "
        f"(peer / hasten) | peer / hasten per round: median [min, max] |",
        "|---|---|---|---|---|",
    ]
    for r in data["results"]:
        per_process = {
            c: " / ".join(f"{x['median_s'] * 1e3:.0f}" for x in r["runs"][c]) for c in (peer, ours)
        }
        med = r["medians_s"]
        lines.append(
            f"| {r['model']}-{data['size']} | {per_process[peer]} | {per_process[ours]} "
            f"| {med[peer] * 1e3:.0f} / {med[ours] * 1e3:.0f} "
            f"| **{r['ratio_median']:.3f}×** [{min(r['ratios']):.3f}, {max(r['ratios']):.3f}] |"
        )
    return "\n".join(lines)


def _whole_run(data: dict) -> str:
    """Time to step N, compile included, per candidate and cache state.

    Each cell: seconds, then the ratio eager / candidate; hasten's rows also carry
    torch.compile (default settings) / hasten, the issue's two targets side by side. The
    steady column is the median of the last measured steps with their 20th-80th percentiles
    (the spread inside one run). With several rounds (``--rounds``) a cell is the median of the
    rounds' times, its ratios the median of the per-round ratios, with their range.
    """
    import itertools
    import statistics

    ns = [str(n) for n in data["ns"]]
    runs = [r for r in data["runs"] if "time_to" in r]
    rounds = data.get("rounds", 1)
    ref_of = {
        (r["candidate"], r["cache"], r.get("round", 0)): r["time_to"]
        for r in runs
        if r["candidate"] in ("eager", "torch.compile")
    }
    rows = []
    for cache in ("cold", "warm"):
        by: dict[str, dict[str, list[tuple[float, bool, int]]]] = {}
        steady: dict[str, list[float]] = {}
        for r in runs:
            if r["cache"] != cache:
                continue
            name = r["candidate"]
            if name.startswith("hasten(steps="):
                name = "hasten.compile(model, steps=N)"
            elif name.startswith("hasten-eager-or-whole(steps="):
                name = "hasten.compile(model, steps=N), eager-or-whole rule"
            for n, v in r["time_to"].items():
                by.setdefault(name, {}).setdefault(n, []).append(
                    (v["s"], v["extrapolated"], r.get("round", 0))
                )
            cum = r["cum_s"]
            if len(cum) > data["tail"]:
                tail = [b - a for a, b in itertools.pairwise(cum)][-data["tail"] :]
                steady[name] = tail  # steps=N: the longest run's (the last round's)
        for name, figs in by.items():
            cells = []
            for n in ns:
                if n not in figs:
                    cells.append("—")
                    continue
                t = statistics.median(f[0] for f in figs[n])
                extra = any(f[1] for f in figs[n])
                ratios = []
                for peer in ("eager", "torch.compile") if name.startswith("hasten") else ("eager",):
                    per = [
                        ref[n]["s"] / s
                        for s, _, k in figs[n]
                        if (ref := ref_of.get((peer, cache, k), {})).get(n)
                    ]
                    if len(per) == 1:
                        ratios.append(f"{per[0]:.2f}×")
                    elif per:
                        ratios.append(
                            f"{statistics.median(per):.2f}× [{min(per):.2f}, {max(per):.2f}]"
                        )
                cells.append(f"{t:.1f}{'*' if extra else ''} ({', '.join(ratios)})")
            tail = steady.get(name)
            if tail:
                q = statistics.quantiles(tail, n=10) if len(tail) > 1 else [tail[0]] * 9
                cells.append(
                    f"{1e3 * statistics.median(tail):.0f} [{1e3 * q[1]:.0f}, {1e3 * q[7]:.0f}]"
                )
            else:
                cells.append("—")
            rows.append([cache, name, *cells])
    headers = ["cache", "candidate", *[f"to step {n} s" for n in ns], "steady ms [p20, p80]"]
    shape = f"batch {data.get('batch') or 'default'}, seq {data.get('seq') or 'default'}"
    several = (
        f" {rounds} interleaved rounds, each on new caches: a time is the rounds' median, a ratio "
        "the median of the per-round ratios [their range]."
        if rounds > 1
        else ""
    )
    head = (
        f"**{data['model']} {data['size']}** ({shape}); each run a new process, candidates "
        f"interleaved; measured up to step {data['measure']}, `*` extrapolated from the median "
        f"of the last {data['tail']} measured steps. In brackets: eager's time / the "
        f"candidate's (and, for hasten, torch.compile's / hasten's); >1 means faster.{several}\n"
    )
    return head + "\n" + format_table(headers, rows, markdown=True)


def _cnn_gap(data: dict) -> str:
    rows = []
    for result in data["results"]:
        for c in result["candidates"]:
            v, step = c.get("vs_torch_compile"), c["step_s"]
            if c["error"] or not v:
                rows.append([result["name"], c["name"], "—", "—", (c["error"] or "")[:70]])
                continue
            rows.append(
                [
                    result["name"],
                    c["name"],
                    f"{1e3 * step['median']:.1f} [{1e3 * step['p20']:.1f}, {1e3 * step['p80']:.1f}]",
                    f"{v['median']:.3f}× [{v['p20']:.3f}, {v['p80']:.3f}]",
                    f"{c['first_step_s']:.1f}",
                ]
            )
    headers = [
        "model",
        "candidate",
        "step ms median [p20, p80]",
        "speed vs torch.compile, per-round ratio median [p20, p80]",
        "first step s",
    ]
    return format_table(headers, rows, markdown=True)


def _limit(data: dict) -> str:
    peaks = data["matmul_peak_flops_per_s"]
    lines = [
        f"Model FLOPs per step {data['flops_per_step'] / 1e9:.1f} G; matmul peak in this run: "
        + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in peaks.items())
        + "; the limit is FLOPs / peak.\n"
    ]
    rows = []
    for c in data["candidates"]:
        if c["error"]:
            rows.append([c["name"], "—", "—", "—", "—", c["error"][:70]])
            continue
        step = c["step_s"]
        rows.append(
            [
                c["name"],
                f"{step['median']:.3f} [{step['p20']:.3f}, {step['p80']:.3f}]",
                f"{c['limit_s']:.3f} ({c['precision']})",
                f"{100 * c['fraction_of_matmul_peak']:.1f}%",
                f"{c['peak_mem_bytes'] / 2**20:.0f}" if c["peak_mem_bytes"] else "—",
                "",
            ]
        )
    headers = [
        "candidate",
        "step s median [p20, p80]",
        "limit s",
        "of limit",
        "peak step MiB",
        "note",
    ]
    lines.append(format_table(headers, rows, markdown=True))
    prof = data.get("profile_hasten_fp32")
    if prof:
        lines.append(
            "\nWhere a `hasten.compile+compile_step` fp32 step goes (torch.profiler, self CPU "
            "time per step, Inductor kernels named; top 15):\n"
        )
        prows = [
            [r["op"][:80], f"{1e3 * r['s_per_step']:.1f}", f"{100 * r['share']:.1f}%"]
            for r in prof[:15]
        ]
        lines.append(format_table(["op", "ms per step", "share"], prows, markdown=True))
    return "\n".join(lines)


def update_blocks(doc: Path, render: Callable[[str], str], *, check: bool, command: str) -> int:
    """Rewrite every block of ``doc`` with ``render(name)``; with ``check``, only compare.

    Returns the exit status: 1 when ``check`` finds the file out of date (``command`` fixes it).
    """
    text = doc.read_text(encoding="utf-8")
    new = BLOCK.sub(lambda m: m.group(1) + render(m.group("name")) + m.group(4), text)
    if check:
        if new != text:
            print(f"{doc.name} is out of date: run {command}", file=sys.stderr)
            return 1
        return 0
    doc.write_text(new, encoding="utf-8")
    print(f"rendered {doc}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args()
    return update_blocks(DOC, render_block, check=args.check, command="python benchmarks/render.py")


if __name__ == "__main__":
    sys.exit(main())
