"""Run under ``torchrun --nproc_per_node=N``: one compile per node (``hasten.compiler.ranks``).

    torchrun --nproc_per_node=2 --standalone ddp_compile_once.py OUT_DIR MODE [MODEL]

MODE: ``normal`` (local rank 0 compiles, the others reuse its cache); ``leader_fails`` (rank 0's
compile raises: the others must compile locally at once); ``leader_stalls`` (rank 0 sleeps in its
compile past ``rank_wait_s``: the others must stop waiting and compile locally); ``independent``
(``rank_wait_s=0``: every rank compiles on its own, the baseline). MODEL: ``tiny``
(a small stack of identical blocks, default) or ``gpt2-small`` (for the CPU-seconds measurement).
Writes ``rank{r}.json`` into OUT_DIR: first-step wall and CPU seconds (this process and its
waited-for children; run with ``TORCHINDUCTOR_COMPILE_THREADS=1`` so no compile worker escapes
the count), the rank gate's outcomes, graphs, fallback and the trained parameters' checksum.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _leave import leave
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hasten
from hasten.compiler.api import compile_report

STEPS = 3
WAIT_S = 4.0  # rank_wait_s for leader_stalls (the leader sleeps longer than this)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Tiny(nn.Module):
    def __init__(self, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def cpu_s() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    which = sys.argv[3] if len(sys.argv) > 3 else "tiny"
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        torch.manual_seed(0)
        if which == "tiny":
            model: nn.Module = Tiny()

            def loss_of(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
                return nn.functional.cross_entropy(m(ids).flatten(0, 1), ids.flatten())

            shape, vocab = (4, 16), 64
        else:
            from hasten.bench.models import get_model_spec

            spec = get_model_spec("gpt2", "small")
            model = spec.build(seed=0)
            model.config.use_cache = False

            def loss_of(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
                return m(input_ids=ids, labels=ids).loss

            shape, vocab = (8, 128), spec.hparams["vocab"]
        if rank == 0 and mode in ("leader_fails", "leader_stalls"):
            import hasten.compiler.backend as backend

            real = backend.HastenBackend.__call__

            def broken(self, gm, example_inputs, **kw):  # type: ignore[no-untyped-def]
                if mode == "leader_fails":
                    raise RuntimeError("injected: the compiling rank's compile failed")
                time.sleep(WAIT_S + 6)  # leader_stalls: longer than the others wait
                return real(self, gm, example_inputs, **kw)

            backend.HastenBackend.__call__ = broken  # type: ignore[method-assign]
        wait = {"leader_stalls": WAIT_S, "independent": 0.0}.get(mode, 600.0)
        ddp = DDP(model)
        # GPT-2 is compiled by block, as in the recorded compile-ranks.json: compiled whole under
        # DDP it fell back to eager then (FakeTensorDeviceMismatchError, fixed since in backend.py's
        # compile_parts; test_ddp_compile.py pins it)
        regions = "whole" if which == "tiny" else "blocks"
        hasten.compile(ddp, rank_wait_s=wait, regions=regions)
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(100 + rank)
        first_s = first_cpu = 0.0
        losses = []
        for i in range(STEPS):
            ids = torch.randint(0, vocab, shape, generator=g)
            t0, c0 = time.perf_counter(), cpu_s()
            loss = loss_of(ddp, ids)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i == 0:
                first_s, first_cpu = time.perf_counter() - t0, cpu_s() - c0
            losses.append(loss.item())
        report = compile_report(model)
        gate = None
        for m in model.modules():
            impl = m.__dict__.get("_compiled_call_impl")
            if impl is not None:
                gate = impl.code.gate
                break
        result = {
            "rank": rank,
            "first_step_s": first_s,
            "first_cpu_s": first_cpu,
            "compile_s": report.compile_seconds,
            "graphs": len(report.graphs),
            "fallback": report.fallback,
            "outcomes": gate.outcomes if gate is not None else None,
            "waited_s": gate.waited_s if gate is not None else None,
            "losses": losses,
            "param_sum": float(sum(p.detach().double().sum() for p in model.parameters())),
        }
        (out / f"rank{rank}.json").write_text(json.dumps(result))
        leave()  # see _leave.py
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
