"""GPT-2 124M's first training step in a new process, hasten.compile with regions="blocks" or "whole".

Run ``python benchmarks/warm_first_call.py blocks|whole`` twice with the same
``TORCHINDUCTOR_CACHE_DIR``: the first run fills the cache (cold), the second is the warm first
call. Prints one JSON line: set-up (imports, model, wrapping), first step (forward, backward,
AdamW), and the second step. ``results/compile-warm-first-call.json`` holds the recorded runs.
"""

import json, sys, time
t0 = time.perf_counter()
import torch
import hasten
from hasten.bench.models import get_model_spec
spec = get_model_spec("gpt2", "base")
model = spec.build(seed=0)
model.config.use_cache = False
regions = sys.argv[1]
model = hasten.compile(model, regions=regions)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
batch = spec.make_batch()
imp = time.perf_counter() - t0
t0 = time.perf_counter()
loss = spec.loss(model, batch); loss.backward(); opt.step(); opt.zero_grad()
first = time.perf_counter() - t0
t0 = time.perf_counter()
loss = spec.loss(model, batch); loss.backward(); opt.step(); opt.zero_grad()
print(json.dumps({"regions": regions, "setup_s": imp, "first_call_s": first, "second_step_s": time.perf_counter() - t0}))
