"""bf16 training steps on CPU beside fp32: steady step, share of the bf16 limit, memory, profile.

    python benchmarks/bf16_step.py [--models gpt2,bert,llama] [--batch 1] [--seq 128]
        [--warmup 3] [--steps 8] [--threads 2] [--candidates a,b,...] [--no-profile]

Base-size models (:func:`hasten.bench.models.get_model_spec`, random weights), AdamW(lr=1e-4),
the loss the model computes (``model(**batch).loss``). Candidates (``--candidates`` picks; the
default is the first five):

=====================================  ===========================================================
candidate                              what runs
=====================================  ===========================================================
eager-fp32                             the model as it is, default AdamW
eager+autocast-bf16                    the step under ``torch.autocast("cpu", torch.bfloat16)``
torch.compile+autocast+fused-AdamW     ``torch.compile(model)``, the step under autocast,
                                       ``AdamW(fused=True)``: the informed user's bf16 step
hasten-bf16                            ``hasten.compile(model, precision="bf16",
                                       regions="whole")`` and the user's default AdamW (the two
                                       lines; hasten switches the AdamW to its fused kernel)
hasten-fp32                            the same without ``precision``
hasten-bf16+max-autotune               ``hasten-bf16`` with ``inductor_options={"max_autotune":
                                       True}`` (Inductor's CPU GEMM templates, chosen by timing)
=====================================  ===========================================================

``regions="whole"`` compiles at the first call, as ``hasten bench compile`` does: the default
``regions="auto"`` runs the first steps eagerly while a compile would not pay yet, which a
steady-step comparison must not measure.

How it runs: one child process per candidate and model, all alive at once (so each has its own
peak memory), set up one after another (compiles do not overlap; the first step, which includes
compiling, is timed apart), then ``--steps`` rounds of one timed step per candidate, the order
rotated each round (drift hits every candidate alike), only one process working at a time. The
step time is the median of the timed steps. The matmul peaks (2048^3 ``torch.mm``, best of 5, fp32
and bf16) are measured in the parent in the same run, before and after the rounds; the larger is
kept. A step's limit is its model FLOPs (``torch.utils.flop_counter`` on an eager step:
matmuls and attention, forward and backward) over the bf16 peak ("share of the bf16 limit"), and,
for the fp32 candidates, also over the fp32 peak. Memory per candidate: the process's peak RSS
(``getrusage`` maxrss: model, optimizer state, compiling and steps), its RSS after the rounds,
and the peak a step allocates above what it starts with (profiler allocator events,
:func:`hasten.bench.harness.peak_step_memory`). Then, unless ``--no-profile``, two more steps of
``hasten-bf16`` run under ``torch.profiler`` and the self CPU time is listed by op (an Inductor
graph's own kernels count as the self time of its ``CompiledFxGraph`` range; ``--kernel-names``
compiles ``hasten-bf16`` with ``cpp.enable_kernel_profile``, which names each kernel, and its
timed steps then include that instrumentation).

Writes ``benchmarks/results/compile-cpu-bf16-amx.json`` on a CPU with AMX tiles,
``compile-cpu-bf16-noamx.json`` on one without (``--json`` picks another path) and prints a
table; ``benchmarks/render.py`` renders it into BENCHMARKS.md (``--render FILE`` prints it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _default_json() -> Path:
    """The record's path by this CPU's kind: with AMX tiles or without."""
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        flags = ""
    return RESULTS / (
        "compile-cpu-bf16-amx.json" if "amx_bf16" in flags else "compile-cpu-bf16-noamx.json"
    )


MARK = "@@bf16_step "  # prefix of the child's protocol lines on stdout

CANDIDATES: dict[str, dict[str, Any]] = {
    "eager-fp32": {"kind": "eager", "precision": "fp32"},
    "eager+autocast-bf16": {"kind": "eager", "precision": "bf16"},
    "torch.compile+autocast+fused-AdamW": {"kind": "torch.compile", "precision": "bf16"},
    "hasten-bf16": {"kind": "hasten", "precision": "bf16"},
    "hasten-fp32": {"kind": "hasten", "precision": "fp32"},
    "hasten-bf16+max-autotune": {
        "kind": "hasten",
        "precision": "bf16",
        "inductor_options": {"max_autotune": True},
    },
}
DEFAULT_CANDIDATES = tuple(list(CANDIDATES)[:5])
PROFILED = "hasten-bf16"
PEER = "torch.compile+autocast+fused-AdamW"  # what an informed user runs in bf16 without hasten


# --------------------------------------------------------------------------- child


def _build(name: str, model_name: str, size: str, batch: int, seq: int, kernel_names: bool):
    """The candidate's step function (model, optimizer and batch inside it)."""
    import torch

    import hasten
    from hasten.bench.models import get_model_spec

    spec = get_model_spec(model_name, size)
    cand = CANDIDATES[name]
    model = spec.build(0)
    model.train()
    data = spec.make_batch(torch.Generator().manual_seed(0), batch_size=batch)
    data = {k: v[:, :seq] if v.dim() == 2 else v for k, v in data.items()}
    kind, precision = cand["kind"], cand["precision"]
    if kind == "torch.compile":
        model = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    else:
        if kind == "hasten":
            options = dict(cand.get("inductor_options", {}))
            if kernel_names:
                options["cpp.enable_kernel_profile"] = True
            hasten.compile(model, precision=precision, regions="whole", inductor_options=options)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = precision == "bf16" and kind != "hasten"

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(**data).loss
        loss.backward()
        opt.step()

    return model, opt, step


def _rss_bytes() -> tuple[int, int]:
    """(peak RSS, current RSS) of this process in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    current = 0
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) * 1024
    return peak, current


def _profile(step, steps: int = 2) -> dict[str, Any]:
    """Self CPU time by op over ``steps`` steps, largest first, and by category."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    by_name: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in prof.key_averages():
        by_name[e.key] += e.self_cpu_time_total / 1e6 / steps
        calls[e.key] += e.count // steps
    total = sum(by_name.values())
    rows = sorted(by_name.items(), key=lambda kv: -kv[1])
    cats: dict[str, float] = defaultdict(float)
    for op, s in rows:
        cats[_category(op)] += s
    return {
        "steps": steps,
        "self_cpu_s_per_step": total,
        "top": [
            {"op": k, "s_per_step": v, "share": v / total, "calls_per_step": calls[k]}
            for k, v in rows[:30]
        ],
        "by_category": {k: v / total for k, v in sorted(cats.items(), key=lambda kv: -kv[1])},
    }


def _category(op: str) -> str:
    if op.startswith("## Call CompiledFxGraph") or op.startswith("cpp_fused"):
        return "Inductor kernels (fused elementwise, norms, softmax, casts)"
    if op.startswith("CompiledFunction") or op.startswith("Torch-Compiled Region"):
        return "Inductor kernels (fused elementwise, norms, softmax, casts)"
    names = ("mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "_scaled_dot_product")
    if any(op == f"aten::{n}" or op.startswith(f"aten::{n}") for n in names) or "mkldnn" in op:
        return "matmul (oneDNN/MKL)"
    if "adam" in op.lower() or op.startswith("Optimizer.") or op.startswith("aten::_foreach"):
        return "optimizer"
    if "embedding" in op:
        return "embedding (and its backward)"
    if op in ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone"):
        return "copies and casts (eager)"
    return "other"


def serve(mark: str, commands: dict[str, Callable[[], dict[str, Any]]]) -> int:
    """A candidate's process: answer each command read from stdin with one ``mark``-prefixed
    JSON line (``quit`` ends it); a command that raises answers with the error, since a failing
    candidate is a result, not the end of the run."""

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(mark + json.dumps(obj) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            reply({})
            return 0
        try:
            fn = commands.get(cmd)
            reply(fn() if fn else {"error": f"unknown command {cmd!r}"})
        except Exception as err:
            reply({"error": f"{type(err).__name__}: {str(err)[:2000]}"})
    return 0


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def set_up(build: Callable[[], tuple[Any, Any, Callable[[], Any]]], warmup: int) -> tuple:
    """Build a candidate and run its first and warm-up steps: (model, optimizer, step, info)."""
    t0 = time.perf_counter()
    model, opt, step = build()
    info: dict[str, Any] = {"setup_s": time.perf_counter() - t0, "first_step_s": timed(step)}
    info["warmup_s"] = [timed(step) for _ in range(warmup - 1)]
    info["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    return model, opt, step, info


def hasten_info(model: Any) -> dict[str, Any]:
    """What hasten's report says of a compiled model's compile."""
    import hasten

    rep = hasten.compiler.compile_report(model)
    return {
        "graph_count": rep.graph_count,
        "compile_seconds": rep.compile_seconds,
        "fallback": rep.fallback,
    }


def child(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    from hasten.bench.harness import peak_step_memory

    state: dict[str, Any] = {}

    def setup() -> dict[str, Any]:
        model, _, state["step"], info = set_up(
            lambda: _build(
                args.child, args.model, args.size, args.batch, args.seq, args.kernel_names
            ),
            args.warmup,
        )
        if CANDIDATES[args.child]["kind"] == "hasten":
            info["hasten"] = hasten_info(model)
        return info

    def mem() -> dict[str, Any]:
        peak, current = _rss_bytes()
        step_peak, _ = peak_step_memory(state["step"])
        return {"maxrss_bytes": peak, "rss_bytes": current, "step_alloc_peak": step_peak}

    return serve(
        MARK,
        {
            "setup": setup,
            "step": lambda: {"s": timed(state["step"])},
            "mem": mem,
            "profile": lambda: _profile(state["step"]),
        },
    )


# --------------------------------------------------------------------------- parent


class Child:
    """One candidate's process (``script --child NAME --model MODEL`` plus ``flags``), driven
    one command at a time over stdin; its replies are the stdout lines starting with ``mark``,
    its stderr goes to ``logs/<model>-<name>.log``."""

    def __init__(
        self,
        script: Path,
        mark: str,
        name: str,
        model: str,
        flags: list[str],
        logs: Path,
        env: dict[str, str],
    ) -> None:
        self.name = name
        self.mark = mark
        cmd = [sys.executable, str(script), "--child", name, "--model", model, *flags]
        self.log = open(logs / f"{model}-{name}.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env
        )
        self.error: str | None = None

    def ask(self, cmd: str) -> dict[str, Any]:
        if self.error:
            return {"error": self.error}
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.error = f"the child exited (code {self.proc.poll()}); see its log"
            return {"error": self.error}
        for line in self.proc.stdout:
            if line.startswith(self.mark):
                out = json.loads(line[len(self.mark) :])
                if "error" in out:
                    self.error = out["error"]
                return out
        self.error = f"the child exited (code {self.proc.wait()}); see its log"
        return {"error": self.error}

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def child_flags(args: argparse.Namespace) -> list[str]:
    """The shape and thread flags every candidate's process is started with."""
    return [f"--{k}={getattr(args, k)}" for k in ("size", "batch", "seq", "warmup", "threads")]


def run_rounds(children: list[Child], steps: int, model: str) -> dict[str, dict[str, Any]]:
    """Set each candidate up (one at a time: compiles do not overlap), then ``steps`` rounds of
    one timed step each, the order rotated every round, then each one's memory."""
    res: dict[str, dict[str, Any]] = {c.name: {"name": c.name} for c in children}
    for c in children:
        t0 = time.perf_counter()
        res[c.name].update(c.ask("setup"))
        print(f"  {model} {c.name}: set up in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    for r in range(steps):
        k = r % len(children)
        for c in children[k:] + children[:k]:
            out = c.ask("step")
            if "s" in out:
                res[c.name].setdefault("step_times", []).append(out["s"])
            else:
                res[c.name]["error"] = out.get("error")
    for c in children:
        res[c.name].update(c.ask("mem"))
    return res


def summarize(res: dict[str, dict[str, Any]]) -> None:
    """Each candidate's step median, range and compile seconds (first step less a step)."""
    for r in res.values():
        times = r.get("step_times") or []
        if times and not r.get("error"):
            med = statistics.median(times)
            r["step_s"] = med
            r["step_min_s"], r["step_max_s"] = min(times), max(times)
            r["compile_s"] = max(0.0, r["first_step_s"] - med)


def _peaks(threads: int) -> dict[str, float]:
    import torch

    from hasten.bench.harness import measure_matmul_peak

    torch.set_num_threads(threads)
    return {
        "fp32": measure_matmul_peak("cpu", torch.float32, 2048),
        "bf16": measure_matmul_peak("cpu", torch.bfloat16, 2048),
    }


def _flops(model_name: str, size: str, batch: int, seq: int, threads: int) -> int:
    import torch

    from hasten.bench.harness import count_flops
    from hasten.bench.models import get_model_spec

    torch.set_num_threads(threads)
    spec = get_model_spec(model_name, size)
    model = spec.build(0)
    data = spec.make_batch(torch.Generator().manual_seed(0), batch_size=batch)
    data = {k: v[:, :seq] if v.dim() == 2 else v for k, v in data.items()}
    return count_flops(lambda: model(**data).loss.backward())


def _extra_flags(args: argparse.Namespace, name: str) -> list[str]:
    return ["--kernel-names"] if args.kernel_names and name == PROFILED else []


def run_model(model: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    flops = _flops(model, args.size, args.batch, args.seq, args.threads)
    peaks_before = _peaks(args.threads)
    print(f"{model}: {flops / 1e9:.1f} GFLOP/step", file=sys.stderr, flush=True)
    logs, script = Path(env["BF16_STEP_LOGS"]), Path(__file__).resolve()
    flags = child_flags(args)
    children = [
        Child(script, MARK, name, model, flags + _extra_flags(args, name), logs, env)
        for name in args.candidates
    ]
    try:
        res = run_rounds(children, args.steps, model)
        for c in children:
            res[c.name].update(CANDIDATES[c.name])
        profile = None
        if args.profile and PROFILED in res:
            prof = next(c for c in children if c.name == PROFILED)
            profile = prof.ask("profile")
    finally:
        for c in children:
            c.close()
    peaks_after = _peaks(args.threads)
    peaks = {k: max(peaks_before[k], peaks_after[k]) for k in peaks_before}
    summarize(res)
    for r in res.values():
        med = r.get("step_s")
        if med is None:
            continue
        r["bf16_limit_s"] = flops / peaks["bf16"]
        r["share_of_bf16_limit"] = r["bf16_limit_s"] / med
        r["share_of_own_limit"] = flops / peaks[r["precision"]] / med
    from hasten.bench.models import get_model_spec

    return {
        "model": model,
        "tokens": [args.batch, min(args.seq, get_model_spec(model, args.size).seq_len or args.seq)],
        "flops_per_step": flops,
        "matmul_peak_flops_per_s": peaks,
        "matmul_peaks_before_after": [peaks_before, peaks_after],
        "candidates": list(res.values()),
        "profile_hasten_bf16": profile,
    }


def parent(args: argparse.Namespace) -> int:
    from hasten.bench.demo import save_json
    from hasten.machine import machine_stamp

    logs = Path(tempfile.mkdtemp(prefix="bf16_step-logs-"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", BF16_STEP_LOGS=str(logs))
    if args.cache == "cold":
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bf16_step-inductor-")
    started = time.perf_counter()
    stamp = machine_stamp()
    out: dict[str, Any] = {
        "kind": "hasten.bench.bf16_step",
        "settings": {
            "size": args.size,
            "batch": args.batch,
            "seq": args.seq,
            "warmup": args.warmup,
            "timed_steps": args.steps,
            "threads": args.threads,
            "nice": os.nice(0),
            "inductor_cache": args.cache,
            "optimizer": "AdamW(lr=1e-4)",
            "candidates": list(args.candidates),
        },
        "machine": stamp,
        "results": [],
    }
    for model in args.models:
        out["results"].append(run_model(model, args, env))
        save_json(out, args.json)  # a partial record survives a later failure
    return finish(out, args.json, started, render, f"; child logs in {logs}")


def finish(
    out: dict[str, Any], path: Path, started: float, render: Callable[[dict], str], note: str = ""
) -> int:
    """Stamp the end of a run on ``out``, write it to ``path`` and print ``render``'s table
    (bf16_weights.py's records end the same way)."""
    from hasten.bench.demo import save_json

    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out["wall_s"] = time.perf_counter() - started
    save_json(out, path)
    print(render(out))
    print(f"wrote {path}{note}", file=sys.stderr)
    return 0


def render(out: dict[str, Any]) -> str:
    """The Markdown table (and profile) of a record."""
    s = out["settings"]
    lines = [
        f"Batch {s['batch']} x up to {s['seq']} tokens, {s['warmup']} warm-up + {s['timed_steps']} timed "
        f"steps (median), {s['threads']} threads, nice {s['nice']}, Inductor cache "
        f"{s['inductor_cache']}; load average at start {out['machine'].get('load_average')}, "
        f"at end {out.get('load_average_end')}.",
        "",
    ]
    for r in out["results"]:
        p = r["matmul_peak_flops_per_s"]
        limit = r["flops_per_step"] / p["bf16"]
        lines += [
            f"**{r['model']}** (batch {r['tokens'][0]} x {r['tokens'][1]} tokens, "
            f"{r['flops_per_step'] / 1e9:.1f} GFLOP/step; matmul peak fp32 "
            f"{p['fp32'] / 1e9:.0f}, bf16 {p['bf16'] / 1e9:.0f} GFLOP/s; bf16 limit "
            f"{limit:.3f} s)",
            "",
            "| candidate | step s (min-max) | vs eager fp32 | vs the informed peer "
            "| share of bf16 limit | compile s | peak RSS GiB | step alloc peak GiB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        base = next((c.get("step_s") for c in r["candidates"] if c["name"] == "eager-fp32"), None)
        peer = next((c.get("step_s") for c in r["candidates"] if c["name"] == PEER), None)
        for c in r["candidates"]:
            if "step_s" not in c:
                lines.append(f"| {c['name']} | error: {str(c.get('error'))[:120]} | | | | | | |")
                continue
            speed = f"{base / c['step_s']:.2f}x" if base else ""
            vs_peer = f"{peer / c['step_s']:.2f}x" if peer else ""
            lines.append(
                f"| {c['name']} | {c['step_s']:.3f} ({c['step_min_s']:.3f}-{c['step_max_s']:.3f})"
                f" | {speed} | {vs_peer} | {100 * c['share_of_bf16_limit']:.1f} % | {c['compile_s']:.1f} "
                f"| {c['maxrss_bytes'] / 2**30:.2f} | {c['step_alloc_peak'] / 2**30:.2f} |"
            )
        prof = r.get("profile_hasten_bf16")
        if prof and "top" in prof:
            cats = ", ".join(f"{k} {100 * v:.0f} %" for k, v in prof["by_category"].items())
            lines += [
                "",
                f"hasten-bf16 profile ({prof['self_cpu_s_per_step']:.3f} s self CPU per step): "
                f"{cats}. Top ops:",
                "",
                "| op | ms/step | share | calls/step |",
                "|---|---|---|---|",
            ]
            for row in prof["top"][:10]:
                op = row["op"].replace("|", "/")[:70]
                lines.append(
                    f"| `{op}` | {1e3 * row['s_per_step']:.1f} | {100 * row['share']:.1f} % "
                    f"| {row['calls_per_step']} |"
                )
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="gpt2,bert,llama")
    parser.add_argument("--size", default="base", help="model size (tiny: a smoke test)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="timed steps (rounds)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--candidates", default=",".join(DEFAULT_CANDIDATES))
    parser.add_argument("--cache", choices=("cold", "as-is"), default="cold")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--kernel-names", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--render", type=Path, help="print the table of this record and exit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text(encoding="utf-8"))))
        return 0
    if args.child:
        return child(args)
    if args.json is None:
        args.json = _default_json()
    args.models = [m for m in args.models.split(",") if m]
    args.candidates = [c for c in args.candidates.split(",") if c]
    unknown = [c for c in args.candidates if c not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidates {unknown}; choose from {', '.join(CANDIDATES)}")
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
