"""Run a recorded benchmark configuration and write its result files into benchmarks/results/.

    python benchmarks/record.py --list
    python benchmarks/record.py compile-cpu sift demo

Each name maps to one `hasten` command line, so a figure in BENCHMARKS.md can always be traced to
the exact command that produced it. Record on a quiet machine (see BENCHMARK_GUIDELINES.md), then
run `python benchmarks/render.py` to refresh BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

BASE_MODELS = ("gpt2", "bert", "llama")
BASE_CANDIDATES = (
    "eager,torch.compile,torch.compile+fused-AdamW,torch.compile-regional,"
    "hasten.compile,hasten.compile+compile_step,hasten.compile-blocks"
)


def _base_cpu(model: str) -> list[str]:
    # Few steady steps, as a 124M-parameter step takes ~4 s here: 3 warm-up steps (the first
    # included), then 5 interleaved rounds of 1 timed step per candidate.
    return [
        "bench",
        "compile",
        "--models",
        model,
        "--size",
        "base",
        "--candidates",
        BASE_CANDIDATES,
        "--first-calls",
        "--warmup",
        "3",
        "--rounds",
        "5",
        "--steps",
        "1",
        "--json",
        str(RESULTS / f"compile-cpu-base-{model}.json"),
    ]


def _sift_policies(datasets: str, epochs: str) -> list[str]:
    part = "large" if "large" in datasets else "small"
    return [
        "bench",
        "sift",
        "--datasets",
        datasets,
        "--epochs",
        epochs,
        "--seeds",
        "10",
        "--policies",
        "tuned",
        "--threads",
        "1",
        "--json",
        str(RESULTS / f"sift-policies-{part}.json"),
    ]


# Configurations whose result is the union of other configurations' result files.
MERGES: dict[str, list[str]] = {
    "compile-cpu-base": [f"compile-cpu-base-{m}" for m in BASE_MODELS],
    "sift-policies": ["sift-policies-small", "sift-policies-large"],
}

CONFIGS: dict[str, list[str]] = {
    # CPU: the small models, fp32 and bf16, eager / torch.compile / hasten side by side.
    "compile-cpu": [
        "bench",
        "compile",
        "--models",
        "gpt2,bert,roberta,cnn",
        "--size",
        "small",
        "--precision",
        "fp32,bf16",
        "--rounds",
        "8",
        "--steps",
        "5",
        "--json",
        str(RESULTS / "compile-cpu-small.json"),
        "--plot",
        str(RESULTS / "compile-cpu-small.png"),
    ],
    # GPU (H200 class): the base models (GPT-2 124M, RoBERTa-base), fp32 and bf16.
    "compile-gpu": [
        "bench",
        "compile",
        "--models",
        "gpt2,roberta,bert,cnn",
        "--size",
        "base",
        "--precision",
        "fp32,bf16",
        "--device",
        "cuda",
        "--rounds",
        "8",
        "--steps",
        "10",
        "--json",
        str(RESULTS / "compile-gpu-base.json"),
        "--plot",
        str(RESULTS / "compile-gpu-base.png"),
    ],
    # CPU, base sizes (GPT-2 124M, BERT-base, Llama-style 12x768 with GQA; batch 2x256), every
    # candidate, cold and warm first calls in processes of their own. One configuration per model
    # (each ~10-14 min on 2 cores); `compile-cpu-base` merges them into one file.
    **{f"compile-cpu-base-{m}": _base_cpu(m) for m in BASE_MODELS},
    # Data efficiency: full vs SageMaker's rule vs compute-matched, 10 paired seeds, each task
    # trained to the knee of its learning curve (the same budgets as sift-policies).
    "sift": [
        "bench",
        "sift",
        "--datasets",
        "digits,mnist1d,text",
        "--epochs",
        "digits=20,mnist1d=40,text=6",
        "--seeds",
        "10",
        "--beta",
        "0.5,1",
        "--threads",
        "1",
        "--json",
        str(RESULTS / "sift.json"),
        "--plot",
        str(RESULTS / "sift.png"),
    ],
    # Issue 11: the fed-back-loss pruning rules (issue 6's best, and the setting tuned for
    # issue 11) against full data, full data cut to the same compute, and RS2 at the same compute,
    # each task at the knee of its learning curve. Two parts (both cores when the machine is
    # quiet, else one after the other); `sift-policies` merges them.
    "sift-policies-small": _sift_policies("digits,mnist1d,text", "digits=20,mnist1d=40,text=6"),
    "sift-policies-large": _sift_policies("mnist1d-large", "mnist1d-large=12"),
    # Warm start: GPT-2 small compiled in a new process whose Inductor cache is warm (run it
    # right after compile-cpu, which compiles the same graphs); "1st-step extra s" is the figure.
    "compile-warm-start": [
        "bench",
        "compile",
        "--models",
        "gpt2",
        "--size",
        "small",
        "--precision",
        "fp32",
        "--candidates",
        "eager,torch.compile,hasten.compile+compile_step",
        "--rounds",
        "3",
        "--steps",
        "2",
        "--json",
        str(RESULTS / "compile-warm-start.json"),
    ],
    # Keras 3 on its TensorFlow and PyTorch backends: Keras's switches vs hasten.keras.compile.
    "keras-cpu": [
        "bench",
        "keras",
        "--depth",
        "4",
        "--rounds",
        "3",
        "--steps",
        "3",
        "--warmup",
        "2",
        "--json",
        str(RESULTS / "keras-cpu.json"),
    ],
    # The README's demo: table + plot.
    "demo": ["demo", "--out", str(RESULTS / "demo")],
}


def merge(name: str) -> Path:
    """Write ``name``.json from the result files of the configurations it merges (those
    recorded so far; a missing part is left out and named on stderr)."""
    results, parts, sift = [], [], []
    for part in MERGES[name]:
        path = RESULTS / f"{part}.json"
        if not path.exists():
            print(f"{name}: {part} not recorded yet: left out", file=sys.stderr)
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("kind") == "hasten.bench.sift":
            sift.append(data)
        else:
            results.extend(data["results"])
        parts.append(f"{part}.json")
    out = RESULTS / f"{name}.json"
    if sift:
        from hasten.bench.plots import plot_sift
        from hasten.bench.sift_experiment import merge_results

        merged = {**merge_results(sift), "merged_from": parts}
        out.write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
        plot_sift(merged, out.with_suffix(".png"))
        return out
    out.write_text(
        json.dumps(
            {"kind": "hasten.bench.compile", "merged_from": parts, "results": results}, indent=2
        )
        + "\n",
        encoding="utf-8",
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("names", nargs="*", help="configurations to run (see --list)")
    parser.add_argument("--list", action="store_true", help="show the configurations")
    args = parser.parse_args()
    if args.list or not args.names:
        for name, argv in CONFIGS.items():
            print(f"{name:12} hasten {shlex.join(argv)}")
        for name, parts in MERGES.items():
            print(f"{name:12} merges {', '.join(parts)} (run them first, one by one)")
        return 0
    unknown = [n for n in args.names if n not in CONFIGS and n not in MERGES]
    if unknown:
        parser.error(
            f"unknown configuration(s) {unknown}; choose from {', '.join([*CONFIGS, *MERGES])}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        if name in MERGES:
            print(f"== {name}: wrote {merge(name)}", flush=True)
            continue
        cmd = [sys.executable, "-m", "hasten.cli", *CONFIGS[name]]
        print(f"== {name}: hasten {shlex.join(CONFIGS[name])}", flush=True)
        code = subprocess.call(cmd)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
