"""``hasten bench keras``: Keras's own switches against ``hasten.keras.compile``, per backend.

For each backend (one subprocess each: Keras fixes its backend at import) and model, the
candidates run whole Keras training steps (``train_on_batch``: forward, backward, optimizer) in
the shared harness (:func:`hasten.bench.harness.run_benchmark`: warm-up, interleaved rounds,
medians, compile time apart)::

    keras                               Keras's default step (TensorFlow: tf.function; PyTorch: eager)
    keras jit_compile                   Keras's jit_compile=True (XLA; PyTorch: torch.compile)
    keras mixed_bfloat16                Keras's mixed_bfloat16 policy
    keras mixed_bfloat16 + jit_compile  both
    hasten.keras                        hasten.keras.compile(model, batch)          (fp32)
    hasten.keras bf16                   hasten.keras.compile(build, batch, precision="bf16")

The speed-up column is against ``keras`` fp32 (median of per-round ratios). ``setup s`` for the
hasten candidates includes hasten's own search (its trial steps of every configuration).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

__all__ = ["BACKENDS", "CANDIDATES", "MODELS", "keras_table", "run_keras_bench"]

BACKENDS = ("tensorflow", "torch")
MODELS = ("transformer", "cnn")
CANDIDATES = (
    "keras",
    "keras jit_compile",
    "keras mixed_bfloat16",
    "keras mixed_bfloat16 + jit_compile",
    "hasten.keras",
    "hasten.keras bf16",
)
BASELINE = "keras"
_BF16 = {"keras mixed_bfloat16", "keras mixed_bfloat16 + jit_compile", "hasten.keras bf16"}


def run_keras_bench(
    *,
    backends: list[str],
    models: list[str],
    candidates: list[str],
    rounds: int = 3,
    steps: int = 3,
    warmup: int = 2,
    depth: int = 4,
    threads: int | None = None,
) -> dict[str, Any]:
    """Run the benchmark on every backend (a subprocess each) and return the JSON-ready result."""
    from hasten.bench.machine import machine_stamp

    results: list[dict[str, Any]] = []
    for backend in backends:
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
        cmd = [
            sys.executable,
            "-m",
            "hasten.bench.keras_bench",
            "--models",
            ",".join(models),
            "--candidates",
            ",".join(candidates),
            "--rounds",
            str(rounds),
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--depth",
            str(depth),
        ]
        if threads:
            cmd += ["--threads", str(threads)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise RuntimeError(
                f"hasten bench keras: the {backend} run failed:\n{proc.stderr[-4000:]}"
            )
        results.extend(json.loads(lines[-1][len("RESULT ") :]))
    return {
        "kind": "hasten.bench.keras",
        "settings": {"rounds": rounds, "steps": steps, "warmup": warmup, "depth": depth},
        "results": results,
        "machine": machine_stamp(),
    }


# ---------------------------------------------------------------------- inside one backend


def _model_spec(name: str, depth: int) -> tuple[Any, tuple[Any, Any], str]:
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    layers = keras.layers
    if name == "transformer":
        seq, dim, heads, batch = 128, 256, 4, 16

        def build() -> Any:
            inp = keras.Input((seq,), dtype="int32")
            h = layers.Embedding(1000, dim)(inp)
            for _ in range(depth):
                a = layers.MultiHeadAttention(heads, dim // heads)(h, h)
                h = layers.LayerNormalization()(h + a)
                f = layers.Dense(dim * 4, activation="gelu")(h)
                h = layers.LayerNormalization()(h + layers.Dense(dim)(f))
            out = layers.Dense(4, dtype="float32")(layers.GlobalAveragePooling1D()(h))
            return keras.Model(inp, out)

        data = (rng.integers(0, 1000, (batch, seq)).astype("int32"), rng.integers(0, 4, batch))
        label = f"transformer {depth}x{dim}, {batch}x{seq} tokens"
    elif name == "cnn":

        def build() -> Any:
            inp = keras.Input((32, 32, 3))
            h = layers.Conv2D(32, 3, padding="same", activation="relu")(inp)
            h = layers.BatchNormalization()(h)
            h = layers.Conv2D(64, 3, strides=2, padding="same", activation="relu")(h)
            h = layers.Conv2D(128, 3, strides=2, padding="same", activation="relu")(h)
            out = layers.Dense(10, dtype="float32")(layers.GlobalAveragePooling2D()(h))
            return keras.Model(inp, out)

        data = (rng.normal(size=(64, 32, 32, 3)).astype("float32"), rng.integers(0, 10, 64))
        label = "small CNN, 64x32x32x3"
    else:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    return build, data, label


def _compiled(build: Any, jit: bool) -> Any:
    import keras

    keras.utils.set_random_seed(0)
    model = build()
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit,
    )
    return model


def _setup(name: str, build: Any, data: tuple[Any, Any], info: dict[str, Any]) -> Any:
    import keras

    from hasten.bench import _hasten_api

    x, y = data
    bf16 = name in _BF16
    policy = "mixed_bfloat16" if bf16 else "float32"
    previous = keras.config.dtype_policy()
    if name.startswith("hasten"):
        model = _hasten_api.keras_compile(
            lambda: _compiled(build, False), (x, y), precision="bf16" if bf16 else "fp32"
        )
        report = model.hasten_report
        info.update(chosen=report.chosen, reason=report.reason, trials=report.as_dict())
    else:
        keras.config.set_dtype_policy(policy)
        try:
            model = _compiled(build, "jit_compile" in name)
        finally:
            keras.config.set_dtype_policy(previous)
    return lambda: model.train_on_batch(x, y)


def _run_backend(args: argparse.Namespace) -> list[dict[str, Any]]:
    import keras

    from hasten.bench.harness import BenchConfig, Candidate, run_benchmark

    backend = keras.backend.backend()
    cfg = BenchConfig(
        warmup=args.warmup,
        rounds=args.rounds,
        steps_per_round=args.steps,
        measure_memory=False,
        matmul_n=0,
        threads=args.threads,
    )
    out = []
    for model_name in args.models.split(","):
        build, data, label = _model_spec(model_name, args.depth)
        cands, infos = [], []
        for name in args.candidates.split(","):
            info: dict[str, Any] = {}
            infos.append(info)
            cands.append(
                Candidate(
                    name,
                    lambda n=name, i=info, b=build, d=data: _setup(n, b, d, i),
                    precision="bf16" if name in _BF16 else "fp32",
                    info=info,
                )
            )
        result = run_benchmark(
            cands, cfg, name=f"{backend}: {label}", samples_per_step=len(data[1])
        )
        d = result.to_dict(baseline=BASELINE if BASELINE in args.candidates.split(",") else None)
        for c, info in zip(d["candidates"], infos):
            c["info"].update(
                info
            )  # filled in by set-up (hasten's choice), after the harness copied it
        d.update(backend=backend, model=model_name, label=label)
        out.append(d)
    return out


# ---------------------------------------------------------------------- table


def keras_table(result: dict[str, Any], markdown: bool = False) -> str:
    """One table row per backend, model and candidate: step time, speed-up, compile time."""
    from hasten.bench.report import format_table

    header = [
        "backend",
        "model",
        "candidate",
        "ms/step (p20-p80)",
        "vs keras fp32",
        "setup+compile s",
    ]
    rows = []
    for r in result["results"]:
        for c in r["candidates"]:
            step = c["step_s"]
            speed = c.get(f"speedup_vs_{BASELINE}")
            if step is None:
                ms = f"failed: {(c['error'] or '')[:60]}"
            else:
                ms = f"{step['median'] * 1e3:.1f} ({step['p20'] * 1e3:.1f}-{step['p80'] * 1e3:.1f})"
            name = c["name"]
            if c["info"].get("chosen"):
                name += f" → {c['info']['chosen']}"
            setup = (c["setup_s"] or 0.0) + (c["compile_s"] or 0.0)
            rows.append(
                [
                    r["backend"],
                    r["label"],
                    name,
                    ms,
                    f"{speed['median']:.2f}x" if speed else "—",
                    f"{setup:.1f}",
                ]
            )
    return format_table(header, rows, markdown=markdown)


def _main() -> None:
    p = argparse.ArgumentParser(description="one backend of hasten bench keras (internal)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--threads", type=int)
    print("RESULT " + json.dumps(_run_backend(p.parse_args())), flush=True)


if __name__ == "__main__":
    _main()
