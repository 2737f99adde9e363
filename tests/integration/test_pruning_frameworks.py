"""The PruningSampler recipes of docs/sifting.md, run in the HF Trainer and in Lightning: losses fed
back from their training steps land on the right samples, epochs are pruned, and a
progress-driven learning-rate schedule ends with the run."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from hasten.sifting import PruningSampler, UnbiasedPruningConfig

os.environ.setdefault("HF_HUB_OFFLINE", "1")

N, EPOCHS = 96, 4


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


def _check(sampler: PruningSampler, ds: PlantedDicts) -> None:
    seen = sampler.table.seen
    assert seen.all()
    torch.testing.assert_close(sampler.table.losses, ds.planted)  # each loss on its own sample
    fractions = sampler.stats.epoch_kept_fractions
    assert len(fractions) == EPOCHS
    assert fractions[0] == 1.0 and fractions[-1] == 1.0  # nothing seen yet / final full phase
    assert min(fractions[1:-1]) < 0.95


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_hf_trainer_recipe(tmp_path):
    pytest.importorskip("accelerate")  # the Trainer needs it (hasten[hf])
    transformers = pytest.importorskip("transformers")

    class PruningTrainer(transformers.Trainer):
        def __init__(self, *args, pruning_config, **kwargs):
            super().__init__(*args, **kwargs)
            self.pruner = PruningSampler(
                self.train_dataset,
                pruning_config,
                num_epochs=int(self.args.num_train_epochs),
                seed=self.args.seed,
            )

        def _get_train_sampler(self, train_dataset=None):
            return self.pruner

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            losses = _planted_losses(model, inputs["x"])
            loss = self.pruner.update(losses)
            return (loss, None) if return_outputs else loss

    ds = PlantedDicts()
    model = nn.Linear(2, 2)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        num_train_epochs=EPOCHS,
        per_device_train_batch_size=8,
        learning_rate=0.1,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    holder: dict[str, PruningSampler] = {}
    # the schedule reads the sampler's progress, so it ends with the run however short epochs are
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda _: 1.0 - holder["s"].progress if "s" in holder else 1.0
    )
    trainer = PruningTrainer(
        model=model,
        args=args,
        train_dataset=ds,
        optimizers=(opt, sched),
        pruning_config=UnbiasedPruningConfig(prune_ratio=0.8, anneal_fraction=0.25),
    )
    holder["s"] = trainer.pruner
    trainer.train()
    _check(trainer.pruner, ds)
    assert trainer.pruner.progress == 1.0
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lightning_recipe():
    L = pytest.importorskip("lightning.pytorch")
    ds = PlantedDicts()

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(2, 2)
            self.sampler: PruningSampler | None = None

        def train_dataloader(self) -> DataLoader:
            # built here, after any process group exists, so the sampler sees the ranks
            self.sampler = PruningSampler(
                ds,
                UnbiasedPruningConfig(prune_ratio=0.8, anneal_fraction=0.25),
                num_epochs=self.trainer.max_epochs,
            )
            return DataLoader(ds, batch_size=8, sampler=self.sampler)

        def training_step(self, batch, batch_idx):
            assert self.sampler is not None
            return self.sampler.update(_planted_losses(self.net, batch["x"]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Module()
    trainer = L.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(module)
    assert module.sampler is not None
    _check(module.sampler, ds)
