"""Shared by the scripts that time training-step candidates interleaved in one child process
(``dropout_rng.py``, ``pass_ab.py``): the rounds, the child's run, and the rows of a record; and
:func:`child_json`, how every script that measures in child processes runs one
(``host_memory.py`` and ``plan_prior.py`` too)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any


def build_step(
    name: str, model_name: str, batch: int, seq: int, **hasten_options: Any
) -> Callable[[], None]:
    """One candidate's training step on a base-size model (random weights, ``batch`` x ``seq``
    tokens, AdamW lr 1e-4, weight decay 0.01, the model's own loss): ``zero_grad``, forward,
    backward, ``step()``. A name starting ``torch.compile`` is the peer (``torch.compile``,
    ``AdamW(fused=True)``, bf16 autocast if the name says ``autocast``); any other is
    ``hasten.compile(model, precision=..., regions="whole", **hasten_options)`` (bf16 if the name
    says so) with a default AdamW, which hasten fuses. Nothing runs until the step is called."""
    import torch

    import hasten
    from hasten.bench.models import get_model_spec

    spec = get_model_spec(model_name, "base")
    model = spec.build(0).train()
    data = spec.make_batch(torch.Generator().manual_seed(0), batch_size=batch)
    data = {k: v[:, :seq] if v.dim() == 2 else v for k, v in data.items()}
    if name.startswith("torch.compile"):
        compiled = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
        autocast = "autocast" in name

        def forward() -> Any:
            with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
                return compiled(**data).loss

    else:
        precision = "bf16" if "bf16" in name else "fp32"
        hasten.compile(model, precision=precision, regions="whole", **hasten_options)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

        def forward() -> Any:
            return model(**data).loss

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        forward().backward()
        opt.step()

    return step


def interleave(steps: dict[str, Callable[[], None]], rounds: int) -> dict[str, list[float]]:
    """Each round times one step of every candidate, the order rotated each round."""
    names = list(steps)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            started = time.perf_counter()
            steps[name]()
            times[name].append(time.perf_counter() - started)
    return times


def run_child(cmd: list[str], mark: str, label: str) -> dict[str, Any]:
    """Run a child (``cmd``) with Inductor's FX-graph and AOTAutograd caches off and its own
    cache directory, and return the JSON it printed after ``mark``."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TORCHINDUCTOR_FX_GRAPH_CACHE="0",
        TORCHINDUCTOR_AUTOGRAD_CACHE="0",
        TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="interleaved-"),
    )
    return child_json(cmd, mark, label, env)


def child_json(cmd: list[str], mark: str, label: str, env: dict[str, str]) -> dict[str, Any]:
    """Run a child (``cmd``, in ``env``) and return the JSON it printed after ``mark``; exit with
    the end of its output where it failed or printed none."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(mark)), None)
    if proc.returncode or line is None:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{label}: child failed ({proc.returncode})")
    return json.loads(line[len(mark) :])


def record(kind: str, args: Any, **settings: Any) -> dict[str, Any]:
    """A new record of these scripts: base size, ``args``' batch, sequence, rounds and threads
    (and ``settings``), Inductor caches off, the machine and its load average."""
    from hasten.machine import machine_stamp

    return {
        "kind": kind,
        "settings": {
            **settings,
            "size": "base",
            "batch": args.batch,
            "seq": args.seq,
            "rounds": args.rounds,
            "threads": args.threads,
            "inductor_cache": "off (FX graph and AOTAutograd caches disabled)",
        },
        "machine": machine_stamp(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "results": [],
    }


def candidate_rows(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per candidate: the median step, its range, the first step, and the speed against the
    first candidate (the peer)."""
    rows = [
        {
            "candidate": name,
            "step_s": statistics.median(ts),
            "min_s": min(ts),
            "max_s": max(ts),
            "first_step_s": raw["first_step_s"][name],
            "times_s": ts,
        }
        for name, ts in raw["step_s"].items()
    ]
    for row in rows:
        row["vs_peer"] = rows[0]["step_s"] / row["step_s"]
    return rows
