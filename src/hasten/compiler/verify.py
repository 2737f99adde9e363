"""``verify``: train eager and compiled copies from the same state and compare them.

Both copies start from a deep copy of the model, get their own optimizer from the same factory,
and train on the same batch with the same random seed each step. Dropout is switched off in both
copies by default: compiled code draws its dropout masks differently from eager (same distribution,
different bits), which would hide real numerical differences behind noise.

Tolerances (per precision of the compiled copy; the eager copy always runs the model as it is):

=========  ======================  =========================================
precision  loss, relative, per step  parameters: ||p_c - p_e|| / ||p_e - p_0||
=========  ======================  =========================================
fp32       1e-4                    1e-2
bf16       3e-2                    2e-1
fp16       3e-2                    2e-1
=========  ======================  =========================================

The parameter check is relative to how far training moved the parameters, so it means the same
for any learning rate: 1e-2 says the compiled update agrees with the eager one to 1 %.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

__all__ = ["TOLERANCES", "VerifyResult", "verify_training"]

TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-4, 1e-2),
    "bf16": (3e-2, 2e-1),
    "fp16": (3e-2, 2e-1),
}


@dataclass(frozen=True)
class VerifyResult:
    """Eager vs compiled training, step by step. ``bool(result)`` is ``result.passed``.

    Attributes:
        passed: Losses and parameters agree within the tolerances.
        precision: Precision of the compiled copy.
        eager_losses: Loss of each step, eager.
        compiled_losses: Loss of each step, compiled.
        max_loss_rel_diff: Largest ``|l_c - l_e| / max(|l_e|, 1e-12)`` over the steps.
        param_rel_diff: ``||p_c - p_e|| / ||p_e - p_0||`` over all parameters together.
        worst_param: The parameter with the largest relative difference, and that difference.
        loss_tol: The loss tolerance used.
        param_tol: The parameter tolerance used.
        notes: What verify changed in the copies (dropout) or noticed (a fallback to eager).
        report: The compile report of the compiled copy.
    """

    passed: bool
    precision: str
    eager_losses: tuple[float, ...]
    compiled_losses: tuple[float, ...]
    max_loss_rel_diff: float
    param_rel_diff: float
    worst_param: tuple[str, float]
    loss_tol: float
    param_tol: float
    notes: tuple[str, ...]
    report: Any

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        lines = [
            f"hasten.verify: {verdict} ({len(self.eager_losses)} steps, precision {self.precision})",
            f"  loss: max relative difference {self.max_loss_rel_diff:.2e} (tolerance {self.loss_tol:.0e})",
            f"  parameters: ||compiled - eager|| / ||eager update|| = {self.param_rel_diff:.2e} "
            f"(tolerance {self.param_tol:.0e}); worst {self.worst_param[0]} {self.worst_param[1]:.2e}",
            "  step  eager loss      compiled loss",
        ]
        for i, (a, b) in enumerate(zip(self.eager_losses, self.compiled_losses)):
            lines.append(f"  {i:>4}  {a:<14.8g}  {b:.8g}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _disable_dropout(model: nn.Module) -> int:
    n = 0
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            m.p = 0.0
            n += 1
    return n


def verify_training(
    model: nn.Module,
    batch: Any,
    loss_fn: Callable[[nn.Module, Any], torch.Tensor],
    optimizer_factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
    steps: int,
    config: Any,
    disable_dropout: bool,
    seed: int,
) -> VerifyResult:
    """The body of :func:`hasten.verify` (see there)."""
    from hasten.compiler import api
    from hasten.compiler.config import compile_at_once, resolve_config

    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not callable(loss_fn) or not callable(optimizer_factory):
        raise TypeError("loss_fn and optimizer_factory must be callables (see hasten.verify)")
    cfg = compile_at_once(resolve_config(config, {}).replace(fallback="eager"))
    eager, compiled = copy.deepcopy(model), copy.deepcopy(model)
    notes: list[str] = []
    if disable_dropout:
        n = _disable_dropout(eager)
        _disable_dropout(compiled)
        if n:
            notes.append(
                f"dropout switched off in both copies ({n} modules) to compare like with like"
            )
    start = {k: v.detach().clone() for k, v in eager.named_parameters()}
    api.compile(compiled, cfg)
    runs = []
    for copy_ in (eager, compiled):
        opt = optimizer_factory(copy_.parameters())
        losses = []
        for step in range(steps):
            with torch.random.fork_rng(devices=_rng_devices(copy_)):
                torch.manual_seed(seed + step)
                loss = loss_fn(copy_, batch)
                loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))  # host sync: once per verification step
        runs.append(losses)
    rep = api.compile_report(compiled)
    if rep.fallback:
        notes.append(f"the compiled copy fell back to eager: {rep.fallback}")
    loss_tol, param_tol = TOLERANCES[cfg.precision]
    loss_diff = max(abs(c - e) / max(abs(e), 1e-12) for e, c in zip(*runs))
    num = den = 0.0
    worst = ("", 0.0)
    pc = dict(compiled.named_parameters())
    for name, pe in eager.named_parameters():
        d = (pc[name].detach() - pe.detach()).double()
        u = (pe.detach() - start[name]).double()
        num += float(d.pow(2).sum())
        den += float(u.pow(2).sum())
        rel = float(d.norm() / u.norm().clamp_min(1e-30))
        if rel > worst[1] and float(u.norm()) > 0:
            worst = (name, rel)
    param_diff = math.sqrt(num) / max(math.sqrt(den), 1e-30)
    finite = all(math.isfinite(x) for x in runs[0] + runs[1])
    passed = finite and loss_diff <= loss_tol and param_diff <= param_tol and not rep.fallback
    return VerifyResult(
        passed=passed,
        precision=cfg.precision,
        eager_losses=tuple(runs[0]),
        compiled_losses=tuple(runs[1]),
        max_loss_rel_diff=loss_diff,
        param_rel_diff=param_diff,
        worst_param=worst,
        loss_tol=loss_tol,
        param_tol=param_tol,
        notes=tuple(notes),
        report=rep,
    )


def _rng_devices(model: nn.Module) -> list[int]:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
