"""Shared by the scripts that time training-step candidates interleaved in one child process
(``dropout_rng.py``, ``pass_ab.py``): the rounds, the child's run, and the rows of a record."""

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
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith(mark)), None)
    if proc.returncode or line is None:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{label}: child failed ({proc.returncode})")
    return json.loads(line[len(mark) :])


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
