"""What hasten's first-call check costs: GPT-2 124M and the small CNN, check on and off.

Each configuration runs in a fresh process; the Inductor cache is filled first (one unrecorded
run per model), so the recorded first calls are warm and differ by the check, not by kernel
builds. Per process: the first training step (forward, backward, AdamW: it compiles, and with
the check on, checks), the check's own seconds as the compile report states them (the eager run,
the comparison and one more compiled step), and the second step. Rounds alternate on/off.

    python benchmarks/check_cost.py [rounds] [cnn] [gpt2]   # writes results/check-cost.json
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r"""
import json, re, sys, time, warnings
import torch, torch.nn as nn, torch.nn.functional as F
import hasten
which, verify = sys.argv[1], sys.argv[2] == "on"
torch.manual_seed(0)
from hasten.bench.models import get_model_spec
spec = get_model_spec("gpt2" if which == "gpt2" else "cnn", "base" if which == "gpt2" else "small")
model = spec.build(seed=0)
if hasattr(model, "config"):
    model.config.use_cache = False
batch = spec.make_batch()
loss = lambda: spec.loss(model, batch)
hasten.compile(model, verify_first_call=verify, regions="whole")
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
out = {}
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for name in ("first_call_s", "second_step_s"):
        t0 = time.perf_counter()
        loss().backward(); opt.step(); opt.zero_grad()
        out[name] = time.perf_counter() - t0
checks = hasten.compiler.compile_report(model).checks
m = [re.search(r"the check took ([0-9.]+) s", c) for c in checks]
out["check_s"] = sum(float(x.group(1)) for x in m if x)
out["checks"] = list(checks)
print("RESULT " + json.dumps(out))
"""


def run(which: str, verify: str, env: dict[str, str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, which, verify],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=True,
    )
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def main(rounds: int, models: tuple[str, ...] = ("cnn", "gpt2")) -> None:
    sys.path.insert(0, str(HERE.parent / "src"))
    from hasten.bench.machine import machine_stamp

    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="hasten-check-cost-"))
    record: dict = {"machine": machine_stamp(), "load_before": os.getloadavg(), "models": {}}
    out = HERE / "results" / "check-cost.json"
    if out.exists():  # a run of some models keeps the others' record
        old = json.loads(out.read_text())
        record["models"] = {k: v for k, v in old.get("models", {}).items() if k not in models}
        record["earlier_machine"] = old.get("machine")
    for which in models:
        t0 = time.perf_counter()
        cold = run(which, "on", env)  # fills the cache; the check's result also tells a mismatch
        rows: dict[str, list[dict]] = {"on": [], "off": []}
        for i in range(rounds):
            for verify in ("on", "off") if i % 2 == 0 else ("off", "on"):
                rows[verify].append(run(which, verify, env))
        on, off = rows["on"], rows["off"]
        med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
        summary = {
            "cold_first_call_check_on_s": cold["first_call_s"],
            "cold_check_s": cold["check_s"],
            "checks": cold["checks"],
            "warm_first_call_on_s": med(on, "first_call_s"),
            "warm_first_call_off_s": med(off, "first_call_s"),
            "check_s": med(on, "check_s"),
            "first_call_on_minus_off_s": med(on, "first_call_s") - med(off, "first_call_s"),
            "check_share_of_warm_first_call": med(on, "check_s") / med(on, "first_call_s"),
            "check_share_of_cold_first_call": cold["check_s"] / cold["first_call_s"],
            "second_step_on_s": med(on, "second_step_s"),
            "second_step_off_s": med(off, "second_step_s"),
            "rounds": rounds,
            "raw": rows,
            "wall_s": time.perf_counter() - t0,
        }
        record["models"][which] = summary
        print(which, json.dumps({k: v for k, v in summary.items() if k not in ("raw", "checks")}))
    record["load_after"] = os.getloadavg()
    out.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3, tuple(sys.argv[2:]) or ("cnn", "gpt2"))
