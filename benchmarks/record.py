"""Run a recorded benchmark configuration and write its result files into benchmarks/results/.

    python benchmarks/record.py --list
    python benchmarks/record.py compile-cpu sift demo

Each name maps to one `hasten` command line, so a figure in BENCHMARKS.md can always be traced to
the exact command that produced it. Record on a quiet machine (see BENCHMARK_GUIDELINES.md), then
run `python benchmarks/render.py` to refresh BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

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
    # Pruning policies (zero extra forward) vs SageMaker's rule vs full and compute-matched data,
    # each task at the knee of its learning curve (digits 20, MNIST-1D 40, text 6 epochs).
    "sift-policies": [
        "bench",
        "sift",
        "--datasets",
        "digits,mnist1d,text",
        "--epochs",
        "digits=20,mnist1d=40,text=6",
        "--seeds",
        "10",
        "--policies",
        "sagemaker,unbiased,stale",
        "--beta",
        "1,6",
        "--threads",
        "1",
        "--json",
        str(RESULTS / "sift-policies.json"),
        "--plot",
        str(RESULTS / "sift-policies.png"),
    ],
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
        "eager,torch.compile,hasten",
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
        return 0
    unknown = [n for n in args.names if n not in CONFIGS]
    if unknown:
        parser.error(f"unknown configuration(s) {unknown}; choose from {', '.join(CONFIGS)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        cmd = [sys.executable, "-m", "hasten.cli", *CONFIGS[name]]
        print(f"== {name}: hasten {shlex.join(CONFIGS[name])}", flush=True)
        code = subprocess.call(cmd)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
