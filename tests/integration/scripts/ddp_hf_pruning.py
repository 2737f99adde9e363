"""Run under ``torchrun --nproc_per_node=2``: the Hugging Face Trainer with
``enable_sifting(trainer, UnbiasedPruningConfig(...))`` on two CPU ranks. The pruning sampler
shards the kept indices itself (Accelerate's batch sharding made a pass-through); each rank feeds
back its own shard's planted losses. Writes ``rank{r}.json`` into argv[1]."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers
from torch import nn

from hasten import UnbiasedPruningConfig
from hasten.integrations.transformers import enable_sifting
from tests.integration.scripts._leave import leave

N, EPOCHS = 90, 4


class Planted(torch.utils.data.Dataset):
    """Sample i: x = [planted loss of i, i]."""

    def __init__(self) -> None:
        self.planted = torch.rand(N, generator=torch.Generator().manual_seed(0)) + 0.01

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"x": torch.stack((self.planted[i], torch.tensor(float(i)))), "labels": i % 2}


class Net(nn.Linear):
    def forward(self, x, labels=None):
        return super().forward(x)


class Recording(transformers.Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trained: list[list[int]] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.trained.append(inputs["x"][:, 1].long().tolist())
        return super().training_step(model, inputs, num_items_in_batch)


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        str(out / "trainer"),
        num_train_epochs=EPOCHS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=0.1,
        logging_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        remove_unused_columns=False,
        ddp_backend="gloo",
    )
    ds = Planted()
    trainer = Recording(model=Net(2, 2), args=args, train_dataset=ds)
    config = UnbiasedPruningConfig(prune_ratio=0.8, anneal_fraction=0.25, guard=None)
    enable_sifting(trainer, config, loss=lambda m, b: b["x"][:, 0] + 0.0 * m(b["x"]).sum(1))
    result = trainer.train()
    sampler = trainer.hasten_pruning_sampler
    sampler.set_epoch(EPOCHS)  # a collective: merges the last epoch's losses on both ranks
    logged = [h for h in trainer.state.log_history if "sift/keep_rate" in h]
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "global_step": result.global_step,
                "trained": trainer.trained,
                "fractions": sampler.stats.epoch_kept_fractions[:EPOCHS],
                "fed_back": sampler.stats.samples_fed_back,
                "losses_match": bool(torch.allclose(sampler.table.losses, ds.planted)),
                "logged": logged[-1] if logged else None,
            }
        )
    )
    leave()


if __name__ == "__main__":
    main()
