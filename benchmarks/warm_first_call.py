"""GPT-2 124M's first training step in a new process, hasten.compile by region mode.

Run ``python benchmarks/warm_first_call.py blocks|whole`` twice with the same
``TORCHINDUCTOR_CACHE_DIR``: the first run fills the cache (cold), the second is the warm first
call. Prints one JSON line: set-up (imports, model, wrapping), the first step (forward, backward,
AdamW) and the second step. ``results/compile-warm-first-call.json`` holds the recorded runs.
"""

from __future__ import annotations

import json
import sys
import time

_T0 = time.perf_counter()


def main(regions: str) -> dict[str, float | str]:
    import torch

    import hasten
    from hasten.bench.models import get_model_spec

    spec = get_model_spec("gpt2", "base")
    model = spec.build(seed=0)
    model.config.use_cache = False
    model = hasten.compile(model, regions=regions)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = spec.make_batch()
    out: dict[str, float | str] = {"regions": regions, "setup_s": time.perf_counter() - _T0}
    for name in ("first_call_s", "second_step_s"):
        t0 = time.perf_counter()
        spec.loss(model, batch).backward()
        opt.step()
        opt.zero_grad()
        out[name] = time.perf_counter() - t0
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1] if len(sys.argv) > 1 else "whole")))
