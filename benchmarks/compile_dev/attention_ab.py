"""Does attention_to_sdpa help beyond Inductor? Interleaved training steps + Inductor's counter.

    python benchmarks/compile_dev/attention_ab.py nanogpt
    python benchmarks/compile_dev/attention_ab.py gpt2-eager

Variants: eager, torch.compile (Inductor alone, with its own fuse_attention patterns), hasten
without the pass, hasten with it. Reports step time (median, p20), peak RSS growth is not
measurable per variant in one process, so it reports the bytes Inductor saves for backward
instead (sum of saved activation sizes of the forward graph).
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int, block: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.d = heads, d
        self.drop = nn.Dropout(0.0)
        self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def attn(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.d, dim=2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab=8192, d=256, heads=4, layers=4, block=128):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.blocks = nn.ModuleList(Block(d, heads, block) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def build(kind: str, seq: int = 128, batch: int = 8):
    g = torch.Generator().manual_seed(0)
    if kind == "nanogpt":
        torch.manual_seed(0)
        model = NanoGPT(block=seq)
        idx = torch.randint(0, 8192, (batch, seq), generator=g)
        return model, (idx, idx), lambda m, b: m(*b)
    from hasten.bench.models import get_model_spec

    spec = get_model_spec(kind.split("-")[0], "small")
    model = spec.build(0)
    model.set_attn_implementation("eager")
    return model, spec.make_batch(g), spec.loss


def saved_bytes(fn) -> int:
    """Bytes of the tensors autograd keeps for backward during ``fn()`` (activation memory)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return total


def main(kind: str, seq: int = 128, batch: int = 8, rounds: int = 8) -> None:
    from torch._dynamo.utils import counters

    import hasten

    variants = {}
    for name in ["eager", "inductor", "hasten_nopass", "hasten"]:
        model, data, loss_fn = build(kind, seq, batch)
        counters.clear()
        if name == "inductor":
            run = torch.compile(model)
        elif name.startswith("hasten"):
            run = hasten.compile(model, passes={"attention_to_sdpa": name == "hasten"})
        else:
            run = model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step(run=run, opt=opt, data=data, loss_fn=loss_fn):
            loss = loss_fn(run, data)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        t0 = time.perf_counter()
        loss = step()
        step()
        saved = saved_bytes(lambda run=run, data=data, loss_fn=loss_fn: loss_fn(run, data))
        print(
            f"{name}: warm-up {time.perf_counter() - t0:.1f}s loss {float(loss.detach()):.5f} "
            f"saved for backward {saved / 2**20:.1f} MiB "
            f"inductor fuse_attention={counters['inductor']['fuse_attention']}",
            flush=True,
        )
        variants[name] = step
    times = {n: [] for n in variants}
    for _ in range(rounds):
        for n, step in variants.items():
            t0 = time.perf_counter()
            step()
            times[n].append(time.perf_counter() - t0)
    base = statistics.median(times["inductor"])
    for n, t in times.items():
        print(
            f"{n:>14}: median {statistics.median(t) * 1e3:7.1f} ms  min {min(t) * 1e3:7.1f} ms"
            f"  vs inductor {base / statistics.median(t):.2f}x"
        )


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
