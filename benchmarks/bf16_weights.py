"""bf16 weights with fp32 master weights against today's ``precision="bf16"`` (issue 20's spike).

    python benchmarks/bf16_weights.py [--models gpt2,llama] [--batch 2] [--seq 256]
        [--warmup 3] [--steps 10] [--threads 2] [--candidates a,b,...]
    python benchmarks/bf16_weights.py --numerics [--numerics-steps 300]
    python benchmarks/bf16_weights.py --update [--models gpt2,llama] [--steps 12]

A measurement, not a library feature: the optimizers below live in this script only. The
records also hold a ``hasten-bf16-weights`` row: a library prototype of the same idea
(``hasten.compile(model, precision="bf16", weights="bf16")``, the user's AdamW updating the
masters through hasten's optimizer pre-hook, one compiled kernel per parameter), measured in the
same runs and not merged, since it did not pay: in ``-run1`` the int16-split form, in the
main record the fp32-master form, whose code and tests are kept as
``benchmarks/prototypes/bf16-weights-lib.patch``.

Base-size models (:func:`hasten.bench.models.get_model_spec`, random weights), AdamW(lr=1e-4,
weight_decay=0.01), the loss the model computes (``model(**batch).loss``; Transformers upcasts the
logits to fp32 before the cross-entropy, so with bf16 weights the loss is fp32 from bf16 logits).
Every step is ``zero_grad``, forward, backward and the optimizer's ``step``, all timed.

==============================  =================================================================
candidate                       what runs
==============================  =================================================================
hasten-bf16                     ``hasten.compile(model, precision="bf16", regions="whole")`` and
                                a default ``AdamW`` (hasten switches it to the fused kernel):
                                fp32 parameters cast by autocast each step, today's bf16 mode
bf16-weights+master-AdamW       the model's parameters cast to bf16 (buffers keep their dtype:
                                activations bf16 end to end), ``hasten.compile(model,
                                regions="whole", verify_first_call=False)`` (precision fp32: no
                                autocast); an fp32 master copy of each parameter (taken before
                                the cast) is updated by ``AdamW(fused=True)`` from the bf16
                                gradients cast to fp32, then copied back into the bf16 parameter
                                (``torch._foreach_copy_``): the simplest correct form
bf16-weights+split-AdamW        the same model and compile; the bf16 parameters are views into
                                one flat bf16 buffer holding the master weight's top 16 bits
                                (rounded), a flat int16 buffer its remaining 16 bits, so the
                                master costs 2 bytes a parameter more, not 4; one update kernel
                                (``torch.compile``: Inductor C++) reads both halves, the bf16
                                gradients (concatenated into one flat buffer first) and the fp32
                                moments, applies AdamW in fp32 and writes both halves back: one
                                pass. Its compile is timed apart (``update_compile_s``)
hasten-fp32                     ``hasten.compile(model, regions="whole")`` in fp32, default AdamW
bf16-weights+fused-master       as ``bf16-weights+master-AdamW``, the update one compiled pass per
                                parameter (:func:`master_update`: the bf16 gradient read once,
                                master, moments and bf16 weight written once; nothing allocated
                                per step)
bf16-weights+split8-AdamW       the split master, per parameter: the bf16 parameter is the top
                                half, two uint8 tensors the low half (Inductor vectorizes uint8,
                                not int16), :func:`split8_update` compiled per parameter
==============================  =================================================================

``verify_first_call=False`` for the bf16-weight candidates: with precision fp32 hasten's first
call check compares a bf16 graph at fp32's tolerance (the library form would use bf16's).

How it runs: one child process per candidate and model, all alive at once (each has its own peak
memory), set up one after another (the first step, with the compiles, timed apart; ``--warmup``
steps in all), then ``--steps`` rounds of one timed step per candidate with the order rotated
each round, one process working at a time. Step time: median of the timed steps. Memory: the
process's peak RSS (``getrusage``) after the rounds. ``--profile``: then two more steps of each
candidate under ``torch.profiler``, self CPU time by category as bf16_step.py counts it (Inductor
kernels, matmuls, optimizer, ...; the profiler's own overhead included).

``--numerics``: tiny GPT-2 (2 x 32, vocab 128) as tests/unit/compiler/test_bf16.py trains it:
300 AdamW steps (lr 3e-3) over 16 fixed batches, dropout off, same data order and seed, for
``--numerics-seeds`` seeds (model init and data); fp32 eager, ``hasten-bf16`` and the two
bf16-weight forms above; the mean loss of the last 20 steps
against fp32's, the worst single step, and the split update against the master update (both in
fp32 arithmetic).

``--update``: the optimizer step alone, on each model's parameter shapes (random weights, bf16
gradients), every form and fp32 ``AdamW(fused=True)`` (today's ``precision="bf16"`` step) in one
process, rounds interleaved with the order rotated; then each form against fp32 AdamW over 3
steps from the same master. Memory-bound elementwise work with no bf16 matmul, so it means
about the same on a CPU without bf16 units (bf16 conversions then take integer shifts). Writes
``benchmarks/results/compile-cpu-bf16-update.json`` unless ``--json``.

Writes ``benchmarks/results/compile-cpu-bf16-weights-{amx,noamx}.json`` (``--json`` picks another
path) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
MARK = "@@bf16_weights "
CANDIDATES = (
    "hasten-bf16",
    "bf16-weights+master-AdamW",
    "bf16-weights+split-AdamW",
    "hasten-fp32",
    "bf16-weights+fused-master",
    "bf16-weights+split8-AdamW",
)
DEFAULT_CANDIDATES = ("hasten-bf16", "bf16-weights+master-AdamW", "bf16-weights+fused-master")
LR, BETAS, EPS, WD = 1e-4, (0.9, 0.999), 1e-8, 0.01


def _default_json() -> Path:
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        flags = ""
    kind = "amx" if "amx_bf16" in flags else "noamx"
    return RESULTS / f"compile-cpu-bf16-weights-{kind}.json"


# --------------------------------------------------------------------------- the two optimizers


class MasterAdamW:
    """fp32 master copies updated by ``AdamW(fused=True)``, copied back into bf16 parameters."""

    split = False

    def __init__(self, params: list, masters: list, *, lr: float, weight_decay: float) -> None:
        import torch

        self.params = params
        self.masters = masters
        self.opt = torch.optim.AdamW(
            masters, lr=lr, betas=BETAS, eps=EPS, weight_decay=weight_decay, fused=True
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                m.grad = None if p.grad is None else p.grad.float()
            self.opt.step()
            torch._foreach_copy_(self.params, self.masters)

    def master(self):
        import torch

        return torch.cat([m.reshape(-1) for m in self.masters])


def _adamw(w, grad, exp_avg, exp_avg_sq, decay, step_size, beta1, beta2, bc2_sqrt, eps):
    """AdamW's arithmetic in fp32 on a master weight ``w``: the new (weight, exp_avg, exp_avg_sq).

    As ``torch.optim.AdamW``'s, with ``decay = 1 - lr * weight_decay``, ``step_size = lr / (1 -
    beta1**step)`` and ``bc2_sqrt = sqrt(1 - beta2**step)`` computed in double on the host, as
    PyTorch does, and passed as 0-dim fp32 tensors so that no value recompiles.
    """
    g = grad.float()
    w = w * decay
    m = exp_avg + (g - exp_avg) * (1 - beta1)
    v = exp_avg_sq * beta2 + g * g * (1 - beta2)
    return w - step_size * m / (v.sqrt() / bc2_sqrt + eps), m, v


def _step_scalars(lr: float, weight_decay: float, step: int) -> list:
    import torch

    b1, b2 = BETAS
    return [
        torch.tensor(x, dtype=torch.float32)
        for x in (1 - lr * weight_decay, lr / (1 - b1**step), b1, b2, (1 - b2**step) ** 0.5, EPS)
    ]


def master_update(master, param, grad, exp_avg, exp_avg_sq, *scalars) -> None:
    """One AdamW step on an fp32 master and its bf16 parameter, in place, in one pass: the bf16
    gradient read once, the master, the moments and the bf16 weight (the master rounded to
    nearest) written once."""
    import torch

    w, m, v = _adamw(master, grad, exp_avg, exp_avg_sq, *scalars)
    master.copy_(w)
    param.copy_(w.to(torch.bfloat16))
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)


def split_update(top, low, grad, exp_avg, exp_avg_sq, *scalars) -> None:
    """One AdamW step on a master weight kept as two int16 halves, in place.

    ``top`` holds the bits of the bf16 weight the model uses (the master rounded to the nearest,
    ties away from zero), ``low`` the signed difference to the master's bits, so
    ``master_bits = (top << 16) + low`` exactly. Inductor writes this kernel as a scalar loop: it
    vectorizes no int16 load or store (torch 2.13).
    """
    import torch

    bits = (top.to(torch.int32) << 16) + low.to(torch.int32)
    w, m, v = _adamw(bits.view(torch.float32), grad, exp_avg, exp_avg_sq, *scalars)
    nb = w.view(torch.int32)
    t = (nb + 0x8000) >> 16
    top.copy_(t.to(torch.int16))
    low.copy_((nb - (t << 16)).to(torch.int16))
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)


def _low8(low_a, low_b):
    """The signed low half (int32) kept as two uint8 tensors, as :func:`split8_update` keeps it."""
    import torch

    return low_a.to(torch.int32) + low_b.to(torch.int32) * 256 - 0x8000


def split8_update(top, low_a, low_b, grad, exp_avg, exp_avg_sq, *scalars) -> None:
    """:func:`split_update` with the low half in two uint8 tensors, which Inductor vectorizes.

    ``top`` is the bf16 weight itself: read as fp32 it is its bits shifted left by 16, exactly.
    The low half is kept offset, ``u = low + 0x8000`` in ``[0, 0xFFFF]``, as ``low_a = u & 0xFF``
    and ``low_b = u >> 8``. The new top goes back through fp32 with its low 16 bits zero, so the
    cast to bf16 is exact (a NaN master stays NaN, its payload aside).
    """
    import torch

    bits = top.float().view(torch.int32) + _low8(low_a, low_b)
    w, m, v = _adamw(bits.view(torch.float32), grad, exp_avg, exp_avg_sq, *scalars)
    nb = w.view(torch.int32)
    t = ((nb + 0x8000) >> 16) << 16
    u = nb - t + 0x8000
    top.copy_(t.view(torch.float32).to(torch.bfloat16))
    low_a.copy_((u & 0xFF).to(torch.uint8))
    low_b.copy_((u >> 8).to(torch.uint8))
    exp_avg.copy_(m)
    exp_avg_sq.copy_(v)


def split_halves(master):
    """(top, low) int16 halves of an fp32 tensor, as :func:`split_update` keeps them."""
    import torch

    nb = master.view(torch.int32)
    t = (nb + 0x8000) >> 16
    return t.to(torch.int16), (nb - (t << 16)).to(torch.int16)


class FusedMasterAdamW:
    """bf16 parameters updated in place by one compiled call per parameter, nothing allocated per
    step: with an fp32 master each (:func:`master_update`), or with ``split=True`` the bf16
    parameter as the master's top half and two uint8 tensors its low half
    (:func:`split8_update`). One kernel serves every size (``dynamic=True``)."""

    def __init__(
        self, params: list, masters: list, *, lr: float, weight_decay: float, split: bool = False
    ) -> None:
        import torch

        self.params = params
        self.lr, self.wd = lr, weight_decay
        flat_masters = [m.detach().reshape(-1).float().clone() for m in masters]
        self.flat = [p.data.view(-1) for p in params]
        self.state: list[tuple] = []
        for p, w in zip(self.flat, flat_masters):
            if split:
                top, low16 = split_halves(w)
                p.copy_(top.view(torch.bfloat16))  # the master rounded as split8_update rounds
                u = low16.to(torch.int32) + 0x8000
                self.state.append(((u & 0xFF).to(torch.uint8), (u >> 8).to(torch.uint8)))
            else:
                self.state.append((w,))
        self.split = split
        self.exp_avg = [torch.zeros_like(m) for m in flat_masters]
        self.exp_avg_sq = [torch.zeros_like(m) for m in flat_masters]
        self.steps = 0
        # Inductor picks a kernel's threading from the size it traces: threaded at any size, so
        # that a kernel first traced on a bias does not run the largest weights on one thread
        self.kernel = torch.compile(
            split8_update if split else master_update,
            fullgraph=True,
            dynamic=True,
            options={"cpp.min_chunk_size": 1},
        )
        self.compile_s: float | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def master(self):
        import torch

        if not self.split:
            return torch.cat([w for (w,) in self.state])
        top = torch.cat([p.float() for p in self.flat]).view(torch.int32)
        return (top + self.low_bits()).view(torch.float32)

    def low_bits(self):
        """The split's low halves as signed int32 differences (``split=True`` only)."""
        import torch

        return torch.cat([_low8(a, b) for a, b in self.state])

    def step(self) -> None:
        import torch

        with torch.no_grad():
            self.steps += 1
            scalars = _step_scalars(self.lr, self.wd, self.steps)
            t0 = time.perf_counter()
            for p, flat, state, m, v in zip(
                self.params, self.flat, self.state, self.exp_avg, self.exp_avg_sq
            ):
                if p.grad is None:
                    continue
                grad = p.grad.reshape(-1)
                if self.split:
                    self.kernel(flat, *state, grad, m, v, *scalars)
                else:
                    self.kernel(state[0], flat, grad, m, v, *scalars)
            if self.compile_s is None:
                self.compile_s = time.perf_counter() - t0


class SplitAdamW:
    """bf16 parameters (views into one flat buffer: the masters' top halves) and one flat int16
    buffer of the masters' low halves; the gradients concatenated into one flat buffer and
    :func:`split_update` compiled over all of it each step."""

    split = True

    def __init__(
        self,
        params: list,
        masters: list,
        *,
        lr: float,
        weight_decay: float,
        compiled: bool = True,
    ) -> None:
        import torch

        self.params = params
        self.lr, self.wd = lr, weight_decay
        numel = sum(p.numel() for p in params)
        flat = torch.cat([m.detach().reshape(-1).float() for m in masters])
        top, low16 = split_halves(flat)
        self.top = top.view(torch.bfloat16)
        off = 0
        for p in params:
            n = p.numel()
            p.data = self.top[off : off + n].view(p.shape)
            off += n
        self.top_i16 = self.top.view(torch.int16)
        self.low = low16
        self.exp_avg = torch.zeros(numel)
        self.exp_avg_sq = torch.zeros(numel)
        self.steps = 0
        self.kernel = (
            torch.compile(split_update, fullgraph=True, dynamic=False) if compiled else split_update
        )
        self.compile_s: float | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    def low_bits(self):
        """The low halves as signed int32 differences."""
        import torch

        return self.low.to(torch.int32)

    def master(self):
        import torch

        return ((self.top_i16.to(torch.int32) << 16) + self.low_bits()).view(torch.float32)

    def step(self) -> None:
        import torch

        with torch.no_grad():
            grad = torch.cat(
                [
                    p.grad.reshape(-1)
                    if p.grad is not None
                    else torch.zeros(p.numel(), dtype=p.dtype)
                    for p in self.params
                ]
            )
            self.steps += 1
            scalars = _step_scalars(self.lr, self.wd, self.steps)
            t0 = time.perf_counter()
            self.kernel(self.top_i16, self.low, grad, self.exp_avg, self.exp_avg_sq, *scalars)
            if self.compile_s is None:
                self.compile_s = time.perf_counter() - t0


# --------------------------------------------------------------------------- child


def _build(name: str, model_name: str, size: str, batch: int, seq: int):
    import torch

    import hasten
    from hasten.bench.models import get_model_spec

    spec = get_model_spec(model_name, size)
    model = spec.build(0).train()
    data = spec.make_batch(torch.Generator().manual_seed(0), batch_size=batch)
    data = {k: v[:, :seq] if v.dim() == 2 else v for k, v in data.items()}
    opt: Any
    if name in ("hasten-bf16", "hasten-fp32"):
        precision = "bf16" if name == "hasten-bf16" else "fp32"
        hasten.compile(model, precision=precision, regions="whole")
        opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    else:
        opt = _bf16_weights(model, name, lr=LR, weight_decay=WD)
        hasten.compile(model, regions="whole", verify_first_call=False)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(**data).loss
        loss.backward()
        opt.step()

    return model, opt, step


def _bf16_weights(model, name: str, *, lr: float, weight_decay: float, compiled: bool = True):
    """Cast ``model`` to bf16 in place and return its master-weight optimizer."""
    import torch

    params = list(model.parameters())
    masters = [p.detach().float().clone() for p in params]
    for p in params:  # parameters only: buffers (rotary frequencies, masks) keep their dtype
        p.data = p.data.to(torch.bfloat16)
    if name == "bf16-weights+master-AdamW":
        return MasterAdamW(params, masters, lr=lr, weight_decay=weight_decay)
    if name in ("bf16-weights+fused-master", "bf16-weights+split8-AdamW"):
        split = name == "bf16-weights+split8-AdamW"
        return FusedMasterAdamW(params, masters, lr=lr, weight_decay=weight_decay, split=split)
    return SplitAdamW(params, masters, lr=lr, weight_decay=weight_decay, compiled=compiled)


def _bf16_step() -> Any:
    """bf16_step.py, whose process protocol (``Child``, ``serve``, ``run_rounds``), memory and
    profile this script shares."""
    import importlib.util

    module = sys.modules.get("bf16_step")
    if module is None:
        spec = importlib.util.spec_from_file_location(
            "bf16_step", Path(__file__).with_name("bf16_step.py")
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["bf16_step"] = module
        spec.loader.exec_module(module)
    return module


def child(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    common = _bf16_step()
    state: dict[str, Any] = {}

    def setup() -> dict[str, Any]:
        model, state["opt"], state["step"], info = common.set_up(
            lambda: _build(args.child, args.model, args.size, args.batch, args.seq), args.warmup
        )
        info["hasten"] = common.hasten_info(model)
        info["update_compile_s"] = getattr(state["opt"], "compile_s", None)
        return info

    def opt() -> dict[str, Any]:
        # the optimizer step alone, on the gradients of the last step (5 repeats)
        return {"s": statistics.median(common.timed(state["opt"].step) for _ in range(5))}

    def mem() -> dict[str, Any]:
        peak, current = common._rss_bytes()
        return {"maxrss_bytes": peak, "rss_bytes": current}

    return common.serve(
        MARK,
        {
            "setup": setup,
            "step": lambda: {"s": common.timed(state["step"])},
            "opt": opt,
            "profile": lambda: dict(common._profile(state["step"])),
            "mem": mem,
        },
    )


# --------------------------------------------------------------------------- parent


def run_model(model: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    common = _bf16_step()
    logs, script = Path(env["BF16_WEIGHTS_LOGS"]), Path(__file__).resolve()
    flags = common.child_flags(args)
    children = [
        common.Child(script, MARK, name, model, flags, logs, env) for name in args.candidates
    ]
    try:
        res = common.run_rounds(children, args.steps, model)
        for c in children:  # after the rounds: the update alone
            out = c.ask("opt")
            if "s" in out:
                res[c.name]["optimizer_step_s"] = out["s"]
        if args.profile:
            for c in children:
                res[c.name]["profile"] = c.ask("profile")
    finally:
        for c in children:
            c.close()
    common.summarize(res)
    return {"model": model, "tokens": [args.batch, args.seq], "candidates": list(res.values())}


def _record(args: argparse.Namespace, **settings: Any) -> dict[str, Any]:
    """A new record: the settings every run has, then ``settings``, and the machine's stamp."""
    from hasten.machine import machine_stamp

    common = {
        "size": args.size,
        "timed_steps": args.steps,
        "threads": args.threads,
        "nice": os.nice(0),
        "optimizer": f"AdamW(lr={LR}, weight_decay={WD})",
    }
    return {
        "kind": "hasten.bench.bf16_weights",
        "settings": {**common, **settings},
        "machine": machine_stamp(),
    }


def _finish(out: dict[str, Any], args: argparse.Namespace, started: float, note: str = "") -> int:
    """Stamp the end of a run on ``out``, write it to ``args.json`` and print its table."""
    return int(_bf16_step().finish(out, args.json, started, render, note))


def parent(args: argparse.Namespace) -> int:
    from hasten.bench.demo import save_json

    logs = Path(tempfile.mkdtemp(prefix="bf16_weights-logs-"))
    env = dict(os.environ, HF_HUB_OFFLINE="1", BF16_WEIGHTS_LOGS=str(logs))
    env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bf16_weights-inductor-")
    started = time.perf_counter()
    out = _record(
        args,
        batch=args.batch,
        seq=args.seq,
        warmup=args.warmup,
        inductor_cache="cold",
        candidates=list(args.candidates),
    )
    out["results"] = []
    if args.json.exists():  # keep a --numerics record taken before
        old = json.loads(args.json.read_text(encoding="utf-8"))
        out.update({k: old[k] for k in ("numerics", "numerics_machine") if k in old})
    for model in args.models:
        out["results"].append(run_model(model, args, env))
        save_json(out, args.json)
    return _finish(out, args, started, f"; child logs in {logs}")


def render(out: dict[str, Any]) -> str:
    if "update" in out:  # an --update record
        return render_update(out)
    s = out["settings"]
    lines = []
    if "results" in out:
        lines += [
            f"Batch {s['batch']} x {s['seq']} tokens, {s['warmup']} warm-up + {s['timed_steps']} "
            f"timed steps (median), {s['threads']} threads; load average at start "
            f"{out['machine'].get('load_average')}, at end {out.get('load_average_end')}; "
            f"CPU {out['machine']['cpu']['model']}.",
            "",
        ]
    for r in out.get("results", []):
        lines += [
            f"**{r['model']}** (batch {r['tokens'][0]} x {r['tokens'][1]})",
            "",
            "| candidate | step s (min-max) | vs hasten-bf16 | optimizer step s | first step s "
            "| peak RSS GiB |",
            "|---|---|---|---|---|---|",
        ]
        base = next((c.get("step_s") for c in r["candidates"] if c["name"] == "hasten-bf16"), None)
        for c in r["candidates"]:
            if "step_s" not in c:
                lines.append(f"| {c['name']} | error: {str(c.get('error'))[:120]} | | | | |")
                continue
            vs = f"{base / c['step_s']:.2f}x" if base else ""
            upd = c.get("update_compile_s")
            first = f"{c['first_step_s']:.1f}" + (
                f" (update kernel {upd:.1f})" if upd is not None else ""
            )
            lines.append(
                f"| {c['name']} | {c['step_s']:.3f} ({c['step_min_s']:.3f}-{c['step_max_s']:.3f}) "
                f"| {vs} | {c.get('optimizer_step_s', float('nan')):.3f} | {first} "
                f"| {c['maxrss_bytes'] / 2**30:.2f} |"
            )
        profiled = [c for c in r["candidates"] if isinstance(c.get("profile"), dict)]
        if profiled:
            lines += [
                "",
                "Self CPU time per step by category (2 profiled steps, after the rounds):",
                "",
                "| candidate | self CPU s/step | by category |",
                "|---|---|---|",
            ]
            for c in profiled:
                prof = c["profile"]
                cats = ", ".join(
                    f"{k.split(' (')[0]} {v * prof['self_cpu_s_per_step']:.3f}"
                    for k, v in prof["by_category"].items()
                )
                lines.append(f"| {c['name']} | {prof['self_cpu_s_per_step']:.3f} | {cats} |")
        lines.append("")
    num = out.get("numerics")
    if num:
        names = list(num["seeds"][0]["runs"])
        lines += [
            f"Numerics: tiny GPT-2 (dropout off), {num['steps']} AdamW steps (lr {num['lr']}), mean "
            f"loss of the last {num['tail']} steps against fp32 eager's on the same seed (model "
            "init and data), per seed; worst single step in brackets:",
            "",
            "| seed | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        for s_ in num["seeds"]:
            cells = []
            for n in names:
                r = s_["runs"][n]
                if n == "fp32-eager":
                    cells.append(f"{r['tail']:.4f}")
                else:
                    cells.append(
                        f"{100 * r['tail_rel']:+.2f} % ({100 * r['worst_step_rel']:.0f} %)"
                    )
            lines.append(f"| {s_['seed']} | " + " | ".join(cells) + " |")
        lines += ["", num["split_vs_master"], ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- numerics


def numerics(args: argparse.Namespace) -> dict[str, Any]:
    """The tiny-GPT-2 loss curves of fp32, hasten-bf16 and the two bf16-weight forms, per seed."""
    import torch
    from torch import nn

    import hasten
    from hasten.bench.models import get_model_spec

    torch.set_num_threads(args.threads)
    steps, lr, tail = args.numerics_steps, 3e-3, 20
    spec = get_model_spec("gpt2", "tiny")

    def fresh(seed: int) -> nn.Module:
        model = spec.build(seed=seed).train()
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
        return model

    def train(model, opt, data) -> list[float]:
        losses = []
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            loss = spec.loss(model, data[i % len(data)])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        return losses

    per_seed = []
    for seed in range(args.numerics_seeds):
        g = torch.Generator().manual_seed(seed)
        data = [spec.make_batch(g) for _ in range(16)]
        runs: dict[str, list[float]] = {}
        m = fresh(seed)
        opt: Any = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=WD)
        runs["fp32-eager"] = train(m, opt, data)
        m = hasten.compile(fresh(seed), precision="bf16", regions="whole")
        opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=WD)
        runs["hasten-bf16"] = train(m, opt, data)
        finals = {}
        for name in ("bf16-weights+master-AdamW", "bf16-weights+split-AdamW"):
            m = fresh(seed)
            opt = _bf16_weights(m, name, lr=lr, weight_decay=WD)
            hasten.compile(m, regions="whole", verify_first_call=False)
            runs[name] = train(m, opt, data)
            finals[name] = opt.master()
        ref = runs["fp32-eager"]
        ref_tail = sum(ref[-tail:]) / tail
        table = {}
        for name, losses in runs.items():
            t = sum(losses[-tail:]) / tail
            rel = [abs(b - a) / a for a, b in zip(ref, losses)]
            worst = max(range(steps), key=rel.__getitem__)
            table[name] = {
                "tail": t,
                "tail_rel": (t - ref_tail) / ref_tail,
                "worst_step": worst,
                "worst_step_rel": rel[worst],
                "losses": losses,
            }
        a, b = finals["bf16-weights+master-AdamW"], finals["bf16-weights+split-AdamW"]
        per_seed.append(
            {"seed": seed, "runs": table, "master_drift": float((a - b).norm() / a.norm())}
        )
    return {
        "model": "gpt2 tiny",
        "steps": steps,
        "lr": lr,
        "tail": tail,
        "seeds": per_seed,
        "split_vs_master": (
            "One update on 1M random weights, split kernel (compiled) against fp32 "
            f"AdamW(fused) on the same master: {_split_vs_master()}. After the {steps} steps the "
            "two forms' master weights differ by "
            + ", ".join(f"{s['master_drift']:.2e}" for s in per_seed)
            + " (relative norm, per seed): bf16 training is chaotic, and one weight rounded the "
            "other way at step 1 ends in another trajectory."
        ),
    }


def _split_vs_master() -> str:
    c = _against_fused("split-int16")
    return (
        f"after 3 steps the masters differ by at most {c['max_master_diff_of_update']:.1e} of the "
        f"largest update; the bf16 weight is the master rounded to nearest on "
        f"{c['weights'] - c['not_nearest']} of {c['weights']} weights, the other "
        f"{c['not_nearest']} ({c['ties']} of them exact ties) one bf16 ulp away"
    )


# --------------------------------------------------------------------------- the update alone

UPDATES = {
    "AdamW(fused)-fp32": "today's precision='bf16' optimizer step: fp32 parameters and fp32 "
    "gradients, torch.optim.AdamW(fused=True)",
    "master-AdamW": "bf16-weights+master-AdamW's step: fp32 copies of the bf16 gradients, "
    "AdamW(fused=True) on the fp32 masters, torch._foreach_copy_ back into the bf16 parameters",
    "fused-master": "bf16-weights+fused-master's step: master_update, one compiled pass per "
    "parameter (dynamic shapes, one kernel)",
    "split-int16": "bf16-weights+split-AdamW's step: gradients concatenated, split_update over "
    "the flat buffers (int16 low halves)",
    "split-uint8": "bf16-weights+split8-AdamW's step: split8_update, one compiled pass per "
    "parameter (the bf16 parameter is the master's top half, two uint8 tensors its low half)",
}
_FORM = {
    "master-AdamW": "bf16-weights+master-AdamW",
    "fused-master": "bf16-weights+fused-master",
    "split-int16": "bf16-weights+split-AdamW",
    "split-uint8": "bf16-weights+split8-AdamW",
}


def _update_optimizer(name: str, masters: list, grads: list):
    """``name``'s optimizer over fresh parameters shaped as ``masters``, gradients set."""
    import torch

    if name == "AdamW(fused)-fp32":
        params = [torch.nn.Parameter(m.clone()) for m in masters]
        for p, g in zip(params, grads):
            p.grad = g.float()
        return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    params = [torch.nn.Parameter(m.bfloat16()) for m in masters]
    for p, g in zip(params, grads):
        p.grad = g
    form = _FORM[name]
    kw: dict[str, Any] = {"lr": LR, "weight_decay": WD}
    if form == "bf16-weights+master-AdamW":
        return MasterAdamW(params, [m.clone() for m in masters], **kw)
    if form == "bf16-weights+split-AdamW":
        return SplitAdamW(params, masters, **kw)
    return FusedMasterAdamW(params, masters, split=name == "split-uint8", **kw)


def update_bench(args: argparse.Namespace) -> dict[str, Any]:
    """The optimizer step alone on each model's parameter shapes, every form in one process,
    rounds interleaved with the order rotated (memory-bound elementwise work: no bf16 matmul)."""
    import gc

    import torch

    from hasten.bench.models import get_model_spec

    torch.set_num_threads(args.threads)
    results = []
    for model in args.models:
        shapes = [p.shape for p in get_model_spec(model, args.size).build(0).parameters()]
        gen = torch.Generator().manual_seed(0)
        masters = [torch.randn(s, generator=gen) * 0.02 for s in shapes]
        grads = [(torch.randn(s, generator=gen) * 1e-3).bfloat16() for s in shapes]
        opts, first = {}, {}
        for name in args.updates:
            opts[name] = _update_optimizer(name, masters, grads)
            t0 = time.perf_counter()
            opts[name].step()
            first[name] = time.perf_counter() - t0
            print(f"{model} {name}: first step {first[name]:.1f} s", file=sys.stderr, flush=True)
        times: dict[str, list[float]] = {n: [] for n in opts}
        order = list(opts)
        for r in range(args.steps):
            for name in order[r % len(order) :] + order[: r % len(order)]:
                t0 = time.perf_counter()
                opts[name].step()
                times[name].append(time.perf_counter() - t0)
        ref = (
            statistics.median(times["AdamW(fused)-fp32"]) if "AdamW(fused)-fp32" in times else None
        )
        rows = []
        for name, ts in times.items():
            med = statistics.median(ts)
            rows.append(
                {
                    "name": name,
                    "runs": UPDATES[name],
                    "step_s": med,
                    "step_min_s": min(ts),
                    "step_max_s": max(ts),
                    "vs_fused_fp32": ref / med if ref else None,
                    "first_step_s": first[name],
                    "steps": ts,
                }
            )
        results.append(
            {
                "model": model,
                "parameters": sum(s.numel() for s in shapes),
                "tensors": len(shapes),
                "candidates": rows,
            }
        )
        del opts, masters, grads
        gc.collect()
    return {
        "results": results,
        "against_fp32_adamw": {n: _against_fused(n) for n in args.updates if n in _FORM},
    }


def _against_fused(name: str) -> dict[str, Any]:
    """``name``'s update against fp32 ``AdamW(fused=True)`` from the same master and bf16
    gradients, 3 steps on 1M random weights: the masters' largest difference as a share of the
    largest update, and how the bf16 weight is rounded from the master."""
    import torch

    g = torch.Generator().manual_seed(1)
    n = 1 << 20
    master = torch.randn(n, generator=g) * 0.02
    grad = (torch.randn(n, generator=g) * 1e-3).bfloat16()
    p = torch.nn.Parameter(master.clone())
    ref = torch.optim.AdamW([p], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    opt = _update_optimizer(name, [master], [grad])
    q = opt.params[0]
    for _ in range(3):
        p.grad = grad.float()
        ref.step()
        q.grad = grad
        opt.step()
    got = opt.master()
    err = float((got - p.detach()).abs().max() / (p.detach() - master).abs().max())
    off = q.detach().reshape(-1) != got.bfloat16()  # round to nearest, ties to even
    out = {"max_master_diff_of_update": err, "weights": n, "not_nearest": int(off.sum())}
    if opt.split:  # the split rounds ties away from zero
        out["ties"] = int((opt.low_bits()[off] == -0x8000).sum())
    return out


def render_update(out: dict[str, Any]) -> str:
    s = out["settings"]
    lines = [
        f"The optimizer step alone on each model's parameter shapes (random weights and bf16 "
        f"gradients), {s['timed_steps']} interleaved rounds (median), {s['threads']} threads; "
        f"load average at start {out['machine'].get('load_average')}, at end "
        f"{out.get('load_average_end')}; CPU {out['machine']['cpu']['model']}.",
        "",
    ]
    for r in out["update"]["results"]:
        lines += [
            f"**{r['model']}** ({r['parameters'] / 1e6:.1f} M parameters in {r['tensors']} "
            "tensors)",
            "",
            "| update | step s (min-max) | vs AdamW(fused) fp32 | first step s |",
            "|---|---|---|---|",
        ]
        for c in r["candidates"]:
            vs = f"{c['vs_fused_fp32']:.2f}x" if c["vs_fused_fp32"] else ""
            lines.append(
                f"| {c['name']} | {c['step_s']:.3f} ({c['step_min_s']:.3f}-{c['step_max_s']:.3f}) "
                f"| {vs} | {c['first_step_s']:.1f} |"
            )
        lines.append("")
    checks = out["update"].get("against_fp32_adamw", {})
    if checks:
        lines += [
            "Against fp32 `AdamW(fused=True)` from the same master and bf16 gradients (3 steps, "
            "1M random weights): the masters' largest difference as a share of the largest "
            "update; bf16 weights not the master rounded to nearest (ties to even):",
            "",
        ]
        for name, c in checks.items():
            lines.append(
                f"- {name}: {c['max_master_diff_of_update']:.1e}; {c['not_nearest']} of "
                f"{c['weights']}"
            )
        lines.append("")
    lines += ["| update | what runs |", "|---|---|"]
    lines += [f"| {c['name']} | {c['runs']} |" for c in out["update"]["results"][0]["candidates"]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="gpt2,llama")
    parser.add_argument("--size", default="base")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps (rounds)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--candidates", default=",".join(DEFAULT_CANDIDATES))
    parser.add_argument("--profile", action="store_true", help="profile 2 steps per candidate")
    parser.add_argument("--numerics", action="store_true", help="the tiny-model loss curves only")
    parser.add_argument(
        "--update",
        action="store_true",
        help="the optimizer step alone on the models' parameter shapes, in one process",
    )
    parser.add_argument("--updates", default=",".join(UPDATES), help="the --update forms")
    parser.add_argument("--numerics-steps", type=int, default=300)
    parser.add_argument("--numerics-seeds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--render", type=Path, help="print the table of this record and exit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render:
        print(render(json.loads(args.render.read_text(encoding="utf-8"))))
        return 0
    if args.child:
        return child(args)
    if args.json is None:
        args.json = RESULTS / "compile-cpu-bf16-update.json" if args.update else _default_json()
    if args.numerics:
        from hasten.bench.demo import save_json

        record = json.loads(args.json.read_text(encoding="utf-8")) if args.json.exists() else {}
        record["numerics"] = numerics(args)
        record.setdefault("settings", {})
        record["numerics_machine"] = __import__("hasten.machine").machine.machine_stamp()
        save_json(record, args.json)
        print(render(record))
        return 0
    args.models = [m for m in args.models.split(",") if m]
    if args.update:
        return update_main(args)
    args.candidates = [c for c in args.candidates.split(",") if c]
    unknown = [c for c in args.candidates if c not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidates {unknown}; choose from {', '.join(CANDIDATES)}")
    return parent(args)


def update_main(args: argparse.Namespace) -> int:
    args.updates = [u for u in args.updates.split(",") if u]
    unknown = [u for u in args.updates if u not in UPDATES]
    if unknown:
        raise SystemExit(f"unknown --updates {unknown}; choose from {', '.join(UPDATES)}")
    started = time.perf_counter()
    out = _record(args, updates=list(args.updates))
    out["update"] = update_bench(args)
    return _finish(out, args, started)


if __name__ == "__main__":
    sys.exit(main())
