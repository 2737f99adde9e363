"""The ``hasten`` command: ``demo``, ``bench compile``, ``bench sift``, ``doctor``, ``cache``.

Run ``hasten --help`` or ``hasten <command> --help`` for what each does, with examples.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]

_EPILOG = """\
examples:
  hasten demo                                  eager vs hasten.compile vs sifting vs both
  hasten bench compile --models gpt2,bert --precision fp32,bf16
  hasten bench sift --datasets mnist1d --seeds 10 --beta 0.5,1
  hasten bench keras --backends tensorflow,torch --models transformer,cnn
  hasten doctor                                what is installed, what is missing, how to fix it
  hasten cache export cache.tar.gz             ship compiled kernels to another machine

Every command prints a table; --json PATH also writes the full result (raw samples, machine).
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; every option's default shown, as ArgumentDefaultsHelpFormatter
    does, except where there is none to show (``None``, a flag's ``False``) or the help says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            "default" in text
            or default in (None, False, argparse.SUPPRESS)
            or not action.option_strings
        ):
            return text
        if isinstance(default, (list, tuple)):
            default = ",".join(str(d) for d in default)
        return f"{text} (default: {str(default).replace('%', '%%')})"


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list, got nothing")
        try:
            return [kind(t) for t in items]
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from err

    return parse


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _epochs(text: str) -> int | dict[str, int]:
    """``40`` (every task) or ``mnist1d=40,text=6`` (per task)."""
    if "=" not in text:
        return _positive_int(text)
    out: dict[str, int] = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if not name.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"expected TASK=EPOCHS, got {item!r}")
        out[name.strip()] = _positive_int(value.strip())
    return out


def _choices(allowed: Sequence[str]) -> Callable[[str], str]:
    def check(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return text

    return check


def _demo_run(text: str) -> str:
    from hasten.bench.demo import VARIANTS

    aliases = {"compile": "hasten.compile", "both": "compile + sifting"}
    aliases.update({v.replace(" ", ""): v for v in VARIANTS})
    key = text.replace(" ", "")
    if key not in aliases:
        raise ValueError(f"{text!r} is not one of eager, compile, sifting, both")
    return aliases[key]


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=_positive_int,
        help="torch CPU threads (default: torch's; 1 is often fastest for tiny models)",
    )
    p.add_argument("--json", metavar="PATH", type=Path, help="also write the full result as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (logs, CI)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for documentation and tests)."""
    from hasten import __version__
    from hasten.bench.compile_bench import CANDIDATES, DEFAULT_CANDIDATES, PRECISIONS
    from hasten.bench.demo import VARIANTS
    from hasten.bench.models import MODEL_NAMES, SIZES

    fmt = _HelpFormatter
    parser = argparse.ArgumentParser(
        prog="hasten",
        description="hasten: faster, cheaper PyTorch training (training compiler + smart sifting).",
        epilog=_EPILOG,
        formatter_class=fmt,
    )
    parser.add_argument("--version", action="version", version=f"hasten {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo",
        help="train one model four ways side by side; print a table, write a plot",
        description=(
            "Train the same model four ways — eager, hasten.compile, sifting, both — from the\n"
            "same weights, data order and dropout, each over the whole schedule. Prints the\n"
            "whole run's seconds (compile apart and included), final accuracy, the time to the\n"
            "target accuracy, speedups and compute against eager, and writes a PNG of test\n"
            "accuracy against training seconds."
        ),
        epilog=(
            "examples:\n"
            "  hasten demo                      BBC News, small transformer, 6 epochs (2-3 minutes)\n"
            "  hasten demo --quick              digits in seconds (smoke test)\n"
            "  hasten demo --runs eager,sifting --threads 1   two of the four runs\n"
            "  hasten demo --out results/demo   where demo.png and demo.json go\n"
        ),
        formatter_class=fmt,
    )
    demo.add_argument("--out", type=Path, default=Path("out/demo"), help="output directory")
    demo.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: seconds-long run on digits that checks everything runs; its timings "
        "mean nothing (compile and start-up dominate)",
    )
    demo.add_argument(
        "--task", help="task to train (text_transformer, the default; digits, mnist1d, text)"
    )
    demo.add_argument(
        "--target", type=float, help="test accuracy the table times each run to, e.g. 0.9"
    )
    demo.add_argument(
        "--epochs", type=_positive_int, help="epochs every run trains (the schedule's length)"
    )
    demo.add_argument("--precision", choices=("fp32", "bf16"), help="hasten.compile precision")
    demo.add_argument(
        "--sift-policy",
        choices=("unbiased", "stale", "sagemaker"),
        help="sifting runs: 'unbiased' (default; InfoBatch's rule on the training step's own "
        "losses, no extra forward), 'stale' (SageMaker's rule on those losses) or 'sagemaker' "
        "(SiftingDataloader, an extra scoring forward)",
    )
    demo.add_argument(
        "--runs",
        type=_csv(_demo_run),
        default=list(VARIANTS),
        help="which runs, comma-separated, from eager, compile, sifting, both",
    )
    demo.add_argument("--seed", type=int, default=0, help="seed of weights and data order")
    demo.add_argument("--device", default="cpu", help="cpu or cuda")
    _add_output(demo)

    bench = sub.add_parser(
        "bench",
        help="side-by-side benchmarks (compile, sift)",
        description="Benchmarks that back every figure hasten publishes.",
        epilog=_EPILOG,
        formatter_class=fmt,
    )
    bsub = bench.add_subparsers(dest="bench_command", metavar="BENCHMARK", required=True)
    comp = bsub.add_parser(
        "compile",
        help="eager vs torch.compile vs hasten.compile training steps",
        description=(
            "Time whole training steps (forward, backward, AdamW) of models built from configs,\n"
            "eager vs torch.compile vs hasten.compile, interleaved in one process so machine\n"
            "drift hits all alike. Reports median step time with p20/p80, speedup over eager\n"
            "fp32 (median of per-round ratios), compile seconds apart, peak step memory, and\n"
            "model FLOP/s as a share of the matmul peak measured in the same run."
        ),
        epilog=(
            "examples:\n"
            "  hasten bench compile --models cnn --size small\n"
            "  hasten bench compile --models gpt2,bert,roberta --precision fp32,bf16 --rounds 8\n"
            "  hasten bench compile --size base --device cuda --json gpu.json\n"
        ),
        formatter_class=fmt,
    )
    comp.add_argument(
        "--models",
        type=_csv(_choices(MODEL_NAMES)),
        default=["gpt2", "bert", "roberta", "cnn"],
        help=f"comma-separated, from {','.join(MODEL_NAMES)}",
    )
    comp.add_argument(
        "--precision",
        type=_csv(_choices(PRECISIONS)),
        default=["fp32"],
        help="comma-separated: fp32, bf16; eager fp32 is always the baseline",
    )
    comp.add_argument(
        "--candidates",
        type=_csv(_choices(CANDIDATES)),
        default=list(DEFAULT_CANDIDATES),
        help=f"comma-separated, from {','.join(CANDIDATES)}; each name says what runs",
    )
    comp.add_argument("--size", choices=SIZES, default="small", help="model size")
    comp.add_argument("--rounds", type=_positive_int, default=5, help="interleaved rounds")
    comp.add_argument("--steps", type=_positive_int, default=5, help="timed steps per round")
    comp.add_argument("--warmup", type=_positive_int, default=3, help="untimed steps first")
    comp.add_argument("--device", default="cpu", help="cpu or cuda")
    comp.add_argument("--no-memory", action="store_true", help="skip the peak-memory step")
    comp.add_argument(
        "--matmul-n", type=int, default=None, help="matrix size for the matmul peak (0: skip)"
    )
    comp.add_argument(
        "--first-calls",
        action="store_true",
        help="also time each candidate's first step cold (own process, empty Inductor cache) "
        "and warm (own process, that cache); adds time to step 100 and break-even step",
    )
    comp.add_argument("--plot", metavar="PATH", type=Path, help="also write a PNG of speedups")
    _add_output(comp)

    sift = bsub.add_parser(
        "sift",
        help="does sifting beat simply training less? (accuracy vs compute)",
        description=(
            "On the same data and seeds: full-data training; sifted training (SageMaker's rule\n"
            "at each beta); full-data training cut to the sifted run's compute with its own\n"
            "learning-rate schedule; and RS2 (a fresh random subset each epoch) at that compute.\n"
            "Compute counts forward=1, backward=2 per sample, scoring forwards included.\n"
            "Prints accuracy mean ± std, paired differences ± standard error, compute relative\n"
            "to full data, samples backpropagated and scored, wall time."
        ),
        epilog=(
            "examples:\n"
            "  hasten bench sift --datasets digits --seeds 3\n"
            "  hasten bench sift --datasets digits,mnist1d,text --seeds 10 --beta 0.5,1\n"
            "  hasten bench sift --policies none --epochs 5   full data only (budget check)\n"
        ),
        formatter_class=fmt,
    )
    sift.add_argument(
        "--datasets",
        type=_csv(_choices(("digits", "mnist1d", "mnist1d-large", "text"))),
        default=["digits", "mnist1d", "text"],
        help="comma-separated: digits, mnist1d, mnist1d-large (50k samples), text (BBC News)",
    )
    sift.add_argument("--seeds", type=_positive_int, default=5, help="paired seeds per dataset")
    sift.add_argument("--beta", type=_csv(float), default=[0.5, 1.0], help="beta values")
    sift.add_argument(
        "--policies",
        type=_csv(str),
        default=["sagemaker"],
        help="policy families to compare with full data: sagemaker, unbiased, stale, tuned "
        "(hasten's pruning sampler, no extra forward); none: baseline only",
    )
    sift.add_argument(
        "--epochs",
        type=_epochs,
        help="override the epoch budget: N for every task, or TASK=N,... (e.g. mnist1d=40)",
    )
    sift.add_argument("--history", type=_positive_int, default=500, help="loss_history_length")
    sift.add_argument(
        "--delay",
        type=float,
        default=0.1,
        help="sift_delay as a fraction of the full run's steps",
    )
    sift.add_argument("--no-matched", action="store_true", help="skip compute-matched runs")
    sift.add_argument(
        "--no-rs2", action="store_true", help="skip the RS2 runs (random subset each epoch)"
    )
    sift.add_argument("--device", default="cpu", help="cpu or cuda")
    sift.add_argument(
        "--plot", metavar="PATH", type=Path, help="also write a PNG of accuracy against compute"
    )
    _add_output(sift)
    _add_bench_keras(bsub, fmt)

    doctor = sub.add_parser(
        "doctor",
        help="check torch, the C++ compiler, GPU/bf16, caches and integrations",
        description="Check what hasten needs and say how to fix what is missing.",
        formatter_class=fmt,
    )
    doctor.add_argument("--json", metavar="PATH", type=Path, help="also write the checks as JSON")
    _add_cache(sub, fmt)
    return parser


def _add_cache(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    cache = sub.add_parser(
        "cache",
        help="show, clear, export or import the compile cache (compiled kernels and graphs)",
        description=(
            "Inductor's on-disk compile cache, where a second process finds what the first\n"
            "compiled and starts warm: $TORCHINDUCTOR_CACHE_DIR, else <tmp>/torchinductor_<user>\n"
            "(--dir for a CompileConfig(cache_dir=...)). export/import move it as a .tar.gz with\n"
            "a manifest, so one job compiles and every node starts warm; entries hit only with the\n"
            "same torch version. Corrupt entries (a .so truncated by a killed compile) are found\n"
            "by show and doctor, and removed by hasten before its first compile in a process."
        ),
        epilog=(
            "examples:\n"
            "  hasten cache show\n"
            "  hasten cache export /shared/hasten-cache.tar.gz     on the node that compiled\n"
            "  hasten cache import /shared/hasten-cache.tar.gz     on every other node\n"
            "  hasten cache clear --corrupt                        only the corrupt entries\n"
        ),
        formatter_class=fmt,
    )
    csub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    actions = {
        "show": "where the cache is, its size, and any corrupt entries",
        "clear": "delete the cache's contents (--corrupt: only corrupt entries)",
        "export": "write the cache's intact entries to a .tar.gz archive",
        "import": "unpack an archive made by 'hasten cache export' into the cache",
    }
    for name, text in actions.items():
        p = csub.add_parser(
            name, help=text, description=text[0].upper() + text[1:] + ".", formatter_class=fmt
        )
        if name in ("export", "import"):
            p.add_argument("archive", metavar="PATH", type=Path, help="the .tar.gz archive")
        if name == "clear":
            p.add_argument("--corrupt", action="store_true", help="only the corrupt entries")
        if name == "show":
            p.add_argument("--json", metavar="PATH", type=Path, help="also write it as JSON")
        p.add_argument(
            "--dir",
            metavar="DIR",
            help="the cache directory (default: $TORCHINDUCTOR_CACHE_DIR, else torch's default)",
        )


def _add_bench_keras(bsub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    from hasten.bench.keras_bench import BACKENDS, CANDIDATES, MODELS

    k = bsub.add_parser(
        "keras",
        help="Keras's own switches vs hasten.keras.compile, on each Keras backend",
        description=(
            "Time whole Keras training steps (train_on_batch) of a transformer classifier and a\n"
            "small CNN on each backend (a subprocess each): Keras's default step, jit_compile,\n"
            "mixed_bfloat16, both, and hasten.keras.compile in fp32 and bf16. Medians of\n"
            "interleaved rounds, speed-up over Keras's default fp32 step, compile time apart."
        ),
        epilog=(
            "examples:\n"
            "  hasten bench keras --backends torch --models cnn --rounds 1\n"
            "  hasten bench keras --depth 4 --rounds 5 --json keras-cpu.json\n"
        ),
        formatter_class=fmt,
    )
    k.add_argument("--backends", type=_csv(_choices(BACKENDS)), default=list(BACKENDS))
    k.add_argument("--models", type=_csv(_choices(MODELS)), default=list(MODELS))
    k.add_argument(
        "--candidates",
        type=_csv(_choices(CANDIDATES)),
        default=list(CANDIDATES),
        help="comma-separated, from: " + ", ".join(CANDIDATES),
    )
    k.add_argument("--depth", type=_positive_int, default=4, help="transformer layers (4x256)")
    k.add_argument("--rounds", type=_positive_int, default=3, help="interleaved rounds")
    k.add_argument("--steps", type=_positive_int, default=3, help="timed steps per round")
    k.add_argument("--warmup", type=_positive_int, default=2, help="untimed steps first")
    _add_output(k)


def _cmd_bench_keras(args: argparse.Namespace) -> int:
    from hasten.bench.keras_bench import keras_table, run_keras_bench
    from hasten.bench.report import machine_line

    result = run_keras_bench(
        backends=args.backends,
        models=args.models,
        candidates=args.candidates,
        rounds=args.rounds,
        steps=args.steps,
        warmup=args.warmup,
        depth=args.depth,
        threads=args.threads,
    )
    print(keras_table(result))
    print(f"\nmachine: {machine_line(result['machine'])}")
    _write_json(args.json, result)
    return 0


def _write_json(path: Path | None, payload: Any) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"wrote {path}")


def _cmd_demo(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from hasten.bench import demo
    from hasten.bench.report import demo_table, machine_line

    base = demo.QUICK if args.quick else demo.DemoConfig()
    overrides = {
        k: v
        for k, v in {
            "task": args.task,
            "target": args.target,
            "epochs": args.epochs,
            "precision": args.precision,
            "sift_policy": args.sift_policy,
        }.items()
        if v is not None
    }
    fixed = {"seed": args.seed, "device": args.device, "threads": args.threads}
    config = demo.DemoConfig(**{**base.__dict__, **overrides, **fixed})
    demo.require_packages(config)  # before anything prints or trains
    if args.quick:
        print(
            "hasten demo --quick is a smoke test: it checks that every run works, in seconds; "
            "its timings mean nothing (compile and start-up dominate runs this short). Run "
            "`hasten demo` for the comparison."
        )
    print(
        f"hasten demo: task {config.task}, seed {config.seed}: each run trains the whole schedule "
        f"({config.epochs or 'the task budget of'} epochs); the table gives the whole run and the "
        f"time each run's test accuracy first reached {100 * config.target:g} %"
    )
    if any("compile" in run for run in args.runs):
        print(
            "hasten.compile runs as in your script: it times the first eager steps, compiles "
            "only if the run's remaining steps pay the compile back (on a CPU, C++ kernels: tens of "
            "seconds in a new cache, a few once cached), and the table shows compile seconds "
            "apart and the total you wait for."
        )
    bar = tqdm(desc="training (runs interleaved)", unit=" evals", disable=args.no_progress)

    def on_eval(name: str, point: dict[str, float]) -> None:
        acc, wall = 100 * point["test_acc"], point["wall_s"]
        bar.set_postfix_str(f"{name}: {acc:.1f}% at {wall:.1f} s", refresh=False)
        bar.update(1)

    result = demo.run_demo(config, variants=tuple(args.runs), on_eval=on_eval)
    bar.close()
    print()
    print(demo_table(result))
    said: dict[str, list[str]] = {}  # the sampler's own line: what it left out, the guard's why
    for row in result["rows"]:
        if row.get("sifting"):
            said.setdefault(row["sifting"]["summary"], []).append(row["run"])
    for line, runs in said.items():  # paired runs that pruned alike: one line for both
        print(f"{', '.join(runs)}: {line}")
    print(
        f"\none seed ({config.seed}) per run: the rows share initial weights, data order and "
        "dropout, so they differ only where the switches make them; the time to target moves "
        "with the seed more than the whole run does (--seed changes it)"
        + ("; --quick: timings mean nothing" if args.quick else "")
    )
    print(f"machine: {machine_line(result['machine'])}")
    out = Path(args.out)
    if result["runs"]:
        png = demo.plot_demo(result, out / "demo.png")
        print(f"wrote {png}")
    demo.save_json(result, out / "demo.json")
    print(f"wrote {out / 'demo.json'}")
    _write_json(args.json, result)
    return 0


def _cmd_bench_compile(args: argparse.Namespace) -> int:
    from hasten.bench.compile_bench import run_compile_bench
    from hasten.bench.harness import BenchConfig
    from hasten.bench.report import compile_table, machine_line

    config = BenchConfig(
        warmup=args.warmup,
        rounds=args.rounds,
        steps_per_round=args.steps,
        device=args.device,
        measure_memory=not args.no_memory,
        matmul_n=args.matmul_n,
        threads=args.threads,
    )
    results: list[dict[str, Any]] = []

    def show(result: Any) -> None:
        d = result.to_dict(baseline="eager")
        results.append(d)
        print(f"\n{d['name']} ({', '.join(args.precision)}), {d['flops_per_step']:.3g} FLOPs/step")
        print(compile_table(d))

    run_compile_bench(
        args.models,
        args.size,
        args.precision,
        args.candidates,
        config,
        progress=not args.no_progress,
        on_result=show,
        first_calls=args.first_calls,
    )
    if results:
        print(f"\nmachine: {machine_line(results[0]['machine'])}")
    payload = {"kind": "hasten.bench.compile", "results": results}
    _write_json(args.json, payload)
    if args.plot and results:
        from hasten.bench.plots import plot_compile

        print(f"wrote {plot_compile(payload, args.plot)}")
    return 0


def _cmd_bench_sift(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from hasten.bench.report import machine_line, sift_table
    from hasten.bench.sift_experiment import SiftExperimentConfig, run_sift_experiment

    config = SiftExperimentConfig(
        tasks=tuple(args.datasets),
        seeds=args.seeds,
        families=tuple(args.policies),
        betas=tuple(args.beta),
        loss_history_length=args.history,
        sift_delay_fraction=args.delay,
        compute_matched=not args.no_matched,
        rs2=not args.no_rs2,
        epochs=args.epochs,
        device=args.device,
        threads=args.threads,
    )
    per_seed = 1 + ("sagemaker" in config.families) * len(config.betas) * (
        1 + config.compute_matched + config.rs2
    )
    total = (
        len(config.tasks) * config.seeds * per_seed
        if set(config.families)
        <= {
            "sagemaker",
            "none",
        }
        else None
    )
    bar = tqdm(total=total, desc="runs", disable=args.no_progress)

    def on_run(task: str, rec: Any) -> None:
        bar.set_postfix_str(
            f"{task} seed {rec.seed} {rec.policy}: {100 * rec.test_acc:.1f}% in {rec.wall_s:.1f} s"
        )
        bar.update(1)

    result = run_sift_experiment(config, on_run=on_run)
    bar.close()
    print()
    print(sift_table(result))
    print(
        "\ncompute: forward=1, backward=2 per sample, scoring forwards included; "
        "Δ are paired by seed (mean ± standard error), in accuracy points"
    )
    print(f"machine: {machine_line(result['machine'])}")
    _write_json(args.json, result)
    if args.plot:
        from hasten.bench.plots import plot_sift

        print(f"wrote {plot_sift(result, args.plot)}")
    return 0


_DOCTOR_HEADINGS = {
    "required": "required: what hasten.compile and sifting need, and the machine they run on",
    "optional": "optional: the extras' packages (a missing one turns off only what it is for)",
}


def _cmd_doctor(args: argparse.Namespace) -> int:
    from hasten.doctor import GROUPS, run_checks

    checks = run_checks()
    marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "info": "info"}
    width = max(len(c.name) for c in checks)
    for group in GROUPS:
        members = [c for c in checks if c.group == group]
        if not members:
            continue
        print(f"{_DOCTOR_HEADINGS.get(group, group)}\n")
        for c in members:
            print(f"[{marks.get(c.status, c.status)}] {c.name:<{width}}  {c.detail}")
            if c.fix:
                label = "to add" if c.group == "optional" else "fix"
                print(f"       {'':<{width}}  {label}: {c.fix}")
        print()
    required = [c for c in checks if c.group != "optional"]
    failed = [c for c in required if c.status == "fail"]
    warned = [c for c in required if c.status == "warn"]
    optional = [c for c in checks if c.group == "optional"]
    missing = [c for c in optional if c.status != "ok"]
    print(
        f"required: {len(required)} checks, {len(failed)} failed, "
        f"{len(warned)} warning{'' if len(warned) == 1 else 's'}; "
        f"optional: {len(optional) - len(missing)} of {len(optional)} packages installed"
    )
    extras = sorted({m for c in missing for m in re.findall(r"hasten\[([\w-]+)\]", c.fix)})
    if extras:
        print(f"to add them (only what you need): pip install 'hasten[{','.join(extras)}]'")
    _write_json(args.json, {"kind": "hasten.doctor", "checks": [c.to_dict() for c in checks]})
    return 1 if failed else 0


def _cmd_cache(args: argparse.Namespace) -> int:
    from hasten.compiler import cache

    root = cache.cache_dir(args.dir)
    action = args.cache_command
    if action == "show":
        found = cache.scan(root)
        if not found.exists:
            print(f"compile cache: {root} (does not exist yet; created by the first compile)")
        else:
            print(
                f"compile cache: {root}\n  {found.files} files, {found.bytes / 2**20:.1f} MiB: "
                f"{found.graphs} compiled-graph entries, {found.kernels} kernel libraries"
            )
            for c in found.corrupt:
                print(f"  CORRUPT {c.path}: {c.reason}")
            if found.corrupt:
                print(
                    "  fix: hasten cache clear --corrupt (hasten also removes them itself "
                    "before its next compile)"
                )
        _write_json(getattr(args, "json", None), {"kind": "hasten.cache", **_scan_dict(found)})
        return 1 if found.corrupt else 0
    if action == "clear":
        n = cache.clear_cache(root, corrupt_only=args.corrupt)
        print(f"removed {n} {'corrupt ' if args.corrupt else ''}file(s) from {root}")
        return 0
    if action == "export":
        manifest = cache.export_cache(args.archive, root)
        skipped = manifest["skipped_corrupt"]
        print(
            f"wrote {args.archive}: {manifest['files']} files from {root} (torch "
            f"{manifest['torch']})" + (f"; left out {skipped} corrupt file(s)" if skipped else "")
        )
        return 0
    manifest = cache.import_cache(args.archive, root)
    print(
        f"imported {manifest['imported']} file(s) into {root} from {args.archive} (made with "
        f"torch {manifest['torch']} on {manifest['cpu']}, {manifest['created']})"
    )
    return 0


def _scan_dict(found: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(found)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hasten`` console script; returns the exit status."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # hasten never downloads models or data
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {
        "demo": _cmd_demo,
        "doctor": _cmd_doctor,
        ("bench", "compile"): _cmd_bench_compile,
        ("bench", "sift"): _cmd_bench_sift,
        "cache": _cmd_cache,
        ("bench", "keras"): _cmd_bench_keras,
    }
    key = (args.command, args.bench_command) if args.command == "bench" else args.command
    try:
        return handlers[key](args)
    except (ValueError, RuntimeError, ImportError) as err:
        print(f"hasten: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("hasten: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
