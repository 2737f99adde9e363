"""Why a residual CNN trails ``torch.compile`` under ``hasten.compile``: an ablation.

    python benchmarks/cnn_gap.py [--rounds 20] [--steps 5]

Two residual CNNs (convolutions, BatchNorm, residual adds), fp32, default AdamW for every
candidate (the two-line comparison): the benchmark's ``cnn`` (small) and an *unseen* bottleneck
net designed here (1x1-3x3-1x1 blocks, SiLU, 40x40 inputs), which hasten was never tuned on.
Candidates, interleaved round by round in one process:

=====================================  ======================================================
candidate                              what runs
=====================================  ======================================================
eager                                  the model as is
torch.compile                          ``torch.compile(model)``
hasten.compile                         ``hasten.compile(model)`` (its defaults)
hasten.compile, passes off             every hasten graph pass disabled
hasten.compile, fallback_random off    Inductor's own RNG (hasten's CPU default switched off)
hasten.compile, passes+setting off     both: only hasten's runtime wrapper differs
torch.compile(backend='hasten')        hasten's backend (passes, settings) without its wrapper
=====================================  ======================================================

Many short rounds (default 20 x 5 steps) so a 5 % difference is outside the noise: the table
gives the median and p20/p80 of per-round ratios to torch.compile. Writes
``benchmarks/results/cnn-gap.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from hasten.bench.harness import BenchConfig, Candidate, run_benchmark
from hasten.bench.models import get_model_spec
from hasten.bench.stats import summarize

RESULTS = Path(__file__).resolve().parent / "results"


class Bottleneck(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        mid = c_out // 4
        self.a = nn.Sequential(nn.Conv2d(c_in, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU())
        self.b = nn.Sequential(
            nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(mid),
            nn.SiLU(),
        )
        self.c = nn.Sequential(nn.Conv2d(mid, c_out, 1, bias=False), nn.BatchNorm2d(c_out))
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.skip = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.c(self.b(self.a(x))) + self.skip(x))


class BottleneckNet(nn.Module):
    """The unseen CNN: stem, three stages of two bottleneck blocks, pooled linear head."""

    def __init__(self, widths: tuple[int, ...] = (64, 128, 256), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.SiLU()
        )
        blocks: list[nn.Module] = []
        prev = 32
        for i, w in enumerate(widths):
            blocks += [Bottleneck(prev, w, 1 if i == 0 else 2), Bottleneck(w, w, 1)]
            prev = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(prev, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def _models():
    spec = get_model_spec("cnn", "small")
    g = torch.Generator().manual_seed(0)
    yield "cnn-small", lambda: spec.build(0), spec.make_batch(g)
    g = torch.Generator().manual_seed(0)
    batch = torch.randn(24, 3, 40, 40, generator=g), torch.randint(0, 10, (24,), generator=g)

    def build() -> nn.Module:
        torch.manual_seed(0)
        return BottleneckNet()

    yield "unseen-bottleneck-cnn", build, batch


VARIANTS = {
    "eager": None,
    "torch.compile": None,
    "hasten.compile": {},
    "hasten.compile, passes off": {"passes": "off"},
    "hasten.compile, fallback_random off": {"inductor_options": {"fallback_random": False}},
    "hasten.compile, passes+setting off": {
        "passes": "off",
        "inductor_options": {"fallback_random": False},
    },
    "torch.compile(backend='hasten')": None,
}


PASSES_CHANGED: dict[str, dict[str, int]] = {}  # candidate -> pass -> changes reported


def _setup(name: str, build, batch):
    def setup():
        import hasten
        from hasten.compiler import compile_report
        from hasten.compiler.passes import pass_names

        model = build()
        model.train()
        if name == "torch.compile":
            model = torch.compile(model)
        elif name == "torch.compile(backend='hasten')":
            model = torch.compile(model, backend="hasten")
        elif name != "eager":
            kw = dict(VARIANTS[name])
            if kw.pop("passes", None) == "off":
                kw["passes"] = {n: False for n in pass_names()}
            model = hasten.compile(model, **kw)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x, y = batch

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()

        if name.startswith("hasten.compile"):

            def step_and_note() -> None:
                step()
                if name not in PASSES_CHANGED:
                    stats = compile_report(model).pass_stats
                    PASSES_CHANGED[name] = {
                        s.name: sum(s.changes.values()) for s in stats if s.changed
                    }

            return step_and_note
        return step

    return setup


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=RESULTS / "cnn-gap.json")
    args = parser.parse_args()
    out = []
    for model_name, build, batch in _models():
        torch._dynamo.reset()
        cands = [Candidate(n, _setup(n, build, batch)) for n in VARIANTS]
        config = BenchConfig(
            warmup=5, rounds=args.rounds, steps_per_round=args.steps, measure_memory=False
        )
        res = run_benchmark(cands, config, name=model_name, progress=True)
        d = res.to_dict(baseline="torch.compile")
        d["passes_changed"] = dict(PASSES_CHANGED)
        PASSES_CHANGED.clear()
        base = res.get("torch.compile")
        for c, cr in zip(d["candidates"], res.candidates):
            if cr.ok and base.ok:
                ratios = [b / x for b, x in zip(base.round_means, cr.round_means)]
                c["vs_torch_compile"] = summarize(ratios).to_dict()
        out.append(d)
        print(f"\n{model_name}: speed vs torch.compile, median [p20, p80] of {args.rounds} rounds")
        for c in d["candidates"]:
            v = c.get("vs_torch_compile")
            step = c["step_s"]
            if v is None:
                print(f"  {c['name']}: {c['error']}")
                continue
            print(
                f"  {c['name']:40} step {1e3 * step['median']:7.2f} ms "
                f"[{1e3 * step['p20']:.2f}, {1e3 * step['p80']:.2f}]  "
                f"{v['median']:.3f}x [{v['p20']:.3f}, {v['p80']:.3f}]  "
                f"first step {c['first_step_s']:.1f} s"
            )
        print(f"  passes that changed a graph: {d['passes_changed']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"kind": "cnn-gap", "results": out}, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
