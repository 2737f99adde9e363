"""The pruning front-end's one switch in the HF Trainer and in Lightning: every loss fed back
from their training steps lands on its own sample, with loader workers prefetching, gradient
accumulation, and pruned epochs chained by ``max_steps`` (the case where a prefetched batch of
the next epoch could be attributed to the wrong one)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import hasten

os.environ.setdefault("HF_HUB_OFFLINE", "1")

N = 96


class PlantedDicts(Dataset):
    """Sample i: features [planted_i, i], label i % 2; its "loss" is planted_i (plus a zero
    multiple of the model output so gradients flow)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.planted = torch.rand(N, generator=g) + 0.01

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.stack((self.planted[i], torch.tensor(float(i)))), "labels": i % 2}


def _planted_losses(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x[:, 0] + 0.0 * model(x).sum(dim=1)


def _check(sampler: hasten.PruningSampler, ds: PlantedDicts, epochs: int) -> None:
    seen = sampler.table.seen
    assert seen.all()
    torch.testing.assert_close(sampler.table.losses, ds.planted)  # each loss on its own sample
    fractions = sampler.stats.epoch_kept_fractions
    assert len(fractions) >= epochs
    assert fractions[0] == 1.0
    assert min(fractions[1:]) < 0.9


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("by", ["epochs", "steps"])
def test_hf_trainer_switch_attributes_every_loss(tmp_path, by):
    pytest.importorskip("accelerate")  # the Trainer needs it (hasten[hf])
    transformers = pytest.importorskip("transformers")
    from hasten.integrations.transformers import enable_sifting

    class Net(nn.Linear):
        def forward(self, x, labels=None):  # labels: the Trainer passes the batch
            return super().forward(x)

    ds = PlantedDicts()
    length = {"num_train_epochs": 4} if by == "epochs" else {"max_steps": 20}
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=2,
        dataloader_num_workers=2,  # the loader prefetches ahead of the feedback
        learning_rate=0.1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
        **length,
    )
    trainer = transformers.Trainer(model=Net(2, 2), args=args, train_dataset=ds)
    config = hasten.UnbiasedPruningConfig(prune_ratio=0.8, anneal_fraction=0.0, guard=None)
    enable_sifting(trainer, config, loss=lambda model, b: _planted_losses(model, b["x"]))
    trainer.train()
    _check(trainer.hasten_pruning_sampler, ds, 4)
    if by == "steps":
        assert trainer.state.global_step == 20


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lightning_switch_attributes_every_loss():
    L = pytest.importorskip("lightning.pytorch")
    from hasten.integrations.lightning import Sifting

    ds = PlantedDicts()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(2, 2)

        def training_step(self, batch, batch_idx):
            losses = _planted_losses(self.net, batch["x"])
            return {"loss": losses.mean(), "per_sample_loss": losses}

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    sifting = Sifting(
        hasten.UnbiasedPruningConfig(prune_ratio=0.8, anneal_fraction=0.25, guard=None)
    )
    trainer = L.Trainer(
        max_epochs=4,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=2,
        callbacks=[sifting],
    )
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2)
    trainer.fit(Module(), train_dataloaders=loader)
    _check(sifting.sampler, ds, 4)
    assert sifting.sampler.stats.epoch_kept_fractions[-1] == 1.0  # the annealed last epoch
