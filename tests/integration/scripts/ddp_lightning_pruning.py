"""Run under ``torchrun --nproc_per_node=2``: a Lightning DDP fit with the ``Sifting`` callback
and a pruning config. The pruning sampler shards the kept indices itself (Lightning leaves it
alone); each rank hands back its shard's planted losses. Writes ``rank{r}.json`` into argv[1]."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from hasten import UnbiasedPruningConfig
from hasten.integrations.lightning import Sifting
from tests.integration.scripts._leave import leave

N, EPOCHS = 90, 4


class Planted(torch.utils.data.Dataset):
    """Sample i: x = [planted loss of i, i]."""

    def __init__(self) -> None:
        self.planted = torch.rand(N, generator=torch.Generator().manual_seed(0)) + 0.01

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return torch.stack((self.planted[i], torch.tensor(float(i)))), i % 2


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(2, 2)
        self.trained: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        x, _ = batch
        self.trained.append(x[:, 1].long().tolist())
        losses = x[:, 0] + 0.0 * self.net(x).sum(1)
        return {"loss": losses.mean(), "per_sample_loss": losses}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    out = Path(sys.argv[1])
    ds = Planted()
    sifting = Sifting(UnbiasedPruningConfig(prune_ratio=0.8, anneal_fraction=0.25, guard=None))
    module = Module()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=EPOCHS,
        callbacks=[sifting],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(out / "fit"),
    )
    trainer.fit(module, train_dataloaders=DataLoader(ds, batch_size=4, shuffle=True))
    sampler = sifting.sampler
    sampler.set_epoch(EPOCHS)  # a collective: merges the last epoch's losses on both ranks
    result = {
        "trained": module.trained,
        "global_step": trainer.global_step,
        "fractions": sampler.stats.epoch_kept_fractions[:EPOCHS],
        "losses_match": bool(torch.allclose(sampler.table.losses, ds.planted)),
        "logged_fed_back": float(trainer.callback_metrics["sift/samples_fed_back"]),
        "fed_back": sampler.stats.samples_fed_back,
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    leave()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
