"""Time one candidate's first call in a process of its own: ``python -m hasten.bench.first_call``.

The first call is the candidate's first whole training step (forward, backward, AdamW update)
after its model, optimizer and batch are built: for a compiled candidate it includes tracing and
compiling (cold cache) or loading the compiled artifacts (warm cache). Process start-up and
imports are timed apart (``import_s``) and are not part of it.

The parent (:func:`hasten.bench.compile_bench.run_compile_bench`) picks the Inductor cache by
setting ``TORCHINDUCTOR_CACHE_DIR`` in this process's environment before torch is imported.
Prints one JSON object on the last line of stdout::

    {"candidate": ..., "import_s": ..., "setup_s": ..., "first_call_s": ..., "error": null}
"""

from __future__ import annotations

import argparse
import json
import sys
import time

_T0 = time.perf_counter()


def measure(model: str, size: str, candidate: str, precision: str, device: str) -> dict:
    """Build ``candidate`` for ``model`` at ``size`` and time its first training step."""
    import torch

    from hasten.bench.compile_bench import candidates_for
    from hasten.bench.harness import synchronize
    from hasten.bench.models import get_model_spec

    out: dict = {"candidate": candidate, "precision": precision, "error": None}
    spec = get_model_spec(model, size)
    kind = candidate.removesuffix(f"-{precision}") if precision != "fp32" else candidate
    cands = {c.name: c for c in candidates_for(spec, (precision,), (kind,), device)}
    cand = cands[candidate]
    out["import_s"] = time.perf_counter() - _T0
    try:
        t0 = time.perf_counter()
        step = cand.setup()
        out["setup_s"] = time.perf_counter() - t0
        synchronize(device)
        t0 = time.perf_counter()
        step()
        synchronize(device)
        out["first_call_s"] = time.perf_counter() - t0
    except Exception as err:  # a failing candidate is a result
        out["error"] = f"{type(err).__name__}: {err}"[:2000]
    out["threads"] = torch.get_num_threads()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--size", required=True)
    parser.add_argument("--candidate", required=True)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    result = measure(args.model, args.size, args.candidate, args.precision, args.device)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
