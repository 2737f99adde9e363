"""Helpers shared by the unit and integration suites.

Planted data (samples whose loss and identity are planted in their features), tiny models, and
:func:`torchrun`, which runs a script of ``tests/integration/scripts`` on several CPU ranks.
Test modules import from here, never from one another.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hasten.compiler.hooks.aten import native_bf16_cpu
from hasten.sifting import RelativeProbabilisticSiftConfig

# precision="bf16" on CPU is refused where the CPU would emulate bf16 (no AVX512-BF16 or AMX)
NEEDS_NATIVE_BF16 = pytest.mark.skipif(
    native_bf16_cpu() is False,
    reason="CPU without native bf16 (precision='bf16' is refused there)",
)


def sift_config(beta: float = 1.0, history: int = 256, delay: int = 0, repeat: bool = False):
    return RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=history,
        loss_based_sift_config={
            "sift_config": {"sift_delay": delay, "repeat_delay_per_epoch": repeat}
        },
    )


class PlantedDataset(Dataset):
    """Sample i: x = [loss_i, i, noise...], label = i % 3. ``fmt`` picks the sample structure."""

    def __init__(self, n: int, fmt: str = "tuple", features: int = 4, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.rand(n, features, generator=g)
        self.x[:, 1] = torch.arange(n, dtype=torch.float32)
        self.fmt = fmt

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> Any:
        x, y = self.x[i], i % 3
        if self.fmt == "tensor":
            return x
        if self.fmt == "tuple":
            return x, y
        if self.fmt == "dict":
            return {"x": x, "labels": y}
        if self.fmt == "nested":
            return {
                "inputs": (x, {"mask": torch.full((2,), float(i))}),
                "labels": y,
                "name": f"s{i}",
                "task": "cls",
            }
        raise ValueError(self.fmt)


def planted_x(batch: Any) -> torch.Tensor:
    """The feature tensor of a batch of any of the formats above."""
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, dict) or hasattr(batch, "keys"):
        if "inputs" in batch:
            return batch["inputs"][0]
        return batch["x"]
    return batch[0]


def planted_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Loss = feature 0 (uniform in [0, 1)); runs the model so scoring really happens."""
    x = planted_x(batch)
    return x[:, 0] + 0.0 * model(x).sum(dim=1)


def ids_of(batch: Any) -> list[int]:
    return planted_x(batch)[:, 1].long().tolist()


def tiny_model(features: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, 8), nn.ReLU(), nn.Linear(8, 3))


def loader(n: int = 256, batch_size: int = 16, fmt: str = "tuple", **kw: Any) -> DataLoader:
    return DataLoader(PlantedDataset(n, fmt), batch_size=batch_size, **kw)


class RecordingDataset(PlantedDataset):
    """A :class:`PlantedDataset` that records every index loaded, in order (``num_workers=0``)."""

    def __init__(self, n: int, fmt: str = "tuple", **kw: Any) -> None:
        super().__init__(n, fmt, **kw)
        self.drawn: list[int] = []

    def __getitem__(self, i: int) -> Any:
        self.drawn.append(int(i))
        return super().__getitem__(i)


def complete_passes(drawn: list[int], n: int) -> int:
    """How many whole data passes ``drawn`` holds; asserts that each of them drew every index
    exactly once and that the pass in progress at the end drew none twice."""
    full, rest = divmod(len(drawn), n)
    for p in range(full):
        chunk = drawn[p * n : (p + 1) * n]
        assert sorted(chunk) == list(range(n)), f"pass {p} did not draw every sample exactly once"
    tail = drawn[full * n :]
    assert len(set(tail)) == len(tail), "the last, unfinished pass drew a sample twice"
    assert rest == len(tail)
    return full


class Planted(Dataset):
    """Sample i = (planted loss of i, i). Planted losses are distinct, so a loss stored under the
    wrong index cannot go unnoticed."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.planted = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).float()
        self.planted = self.planted / n + 0.01

    def __len__(self) -> int:
        return len(self.planted)

    def __getitem__(self, i: int):
        return self.planted[i], i


SCRIPTS = Path(__file__).parent / "integration" / "scripts"
ROOT = Path(__file__).parents[1]


def torchrun(
    script: str,
    out: Path,
    timeout: float,
    nproc: int = 2,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> list[dict]:
    """Run ``tests/integration/scripts/<script>`` on ``nproc`` CPU ranks; each rank writes
    ``out/rank<r>.json``, returned in rank order. A hang fails the test at ``timeout`` seconds.

    ``--standalone`` binds the rendezvous store to a port the OS assigns at bind time. A port
    picked free beforehand (``--master-port``) can be taken by another process in between, which
    on a machine shared with other test runs is not hypothetical. ``args`` follow ``out`` on the
    script's command line; ``env`` adds to the environment.
    """
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--standalone",
        str(SCRIPTS / script),
        str(out),
        *args,
    ]
    full = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
    full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(
            cmd, env=full, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"torchrun did not finish in {timeout} s (a hang?):\n{err.stderr}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]
