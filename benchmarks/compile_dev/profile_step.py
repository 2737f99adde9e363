"""Where does a compiled training step spend its time? torch.profiler, top ops by self CPU time.

python benchmarks/compile_dev/profile_step.py bert small [eager|hasten|hasten-bf16]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch

import hasten
from hasten.bench.models import get_model_spec


def main(name: str, size: str, how: str) -> None:
    spec = get_model_spec(name, size)
    model = spec.build(0)
    batch = spec.make_batch(torch.Generator().manual_seed(0))
    if how.startswith("hasten"):
        opts = {"cpp.enable_kernel_profile": True}
        if "fallback" in how:
            opts["fallback_random"] = True
        hasten.compile(
            model, precision="bf16" if how.endswith("bf16") else "fp32", inductor_options=opts
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        spec.loss(model, batch).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
    print(
        prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:4])
