"""Run under ``torchrun --nproc_per_node=2``: a Lightning DDP fit on sifted batches, ranks keeping
very different fractions, resumed from a mid-epoch checkpoint (which Lightning writes on rank 0
only) with its default ``weights_only`` loading. Writes ``rank{r}.json`` into the directory given
as the first argument."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import lightning.pytorch as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from hasten.integrations.lightning import sifting_dataloader
from hasten.sifting import RelativeProbabilisticSiftConfig
from tests.integration.scripts._leave import leave

N = 160  # 80 samples a rank: 10 incoming batches of 8 a rank per data pass
STOP = 7  # the checkpoint: after optimizer step 7 (epoch 1 of 5-batch epochs)


class Planted(torch.utils.data.Dataset):
    """Sample i: x = [i, noise...], y = i % 3."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(N, 4, generator=g)
        self.x[:, 0] = torch.arange(N, dtype=torch.float32)

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        return self.x[i], i % 3


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        self.trained: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.trained.append(x[:, 0].long().tolist())
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Data(L.LightningDataModule):
    def train_dataloader(self):
        rank = self.trainer.global_rank
        # Lightning swaps in a DistributedSampler (seeded, shuffled) for this DataLoader
        loader = DataLoader(Planted(), batch_size=8, shuffle=True)
        config = RelativeProbabilisticSiftConfig(
            beta_value=3.0,
            loss_history_length=64,
            loss_based_sift_config={"sift_config": {"sift_delay": 2}},
        )

        # rank 0: i.i.d. losses, keeps about a quarter; rank 1: each loss tops its history,
        # keeps nearly all. Functions of the sample and of counters the state restores.
        def loss(model, batch):
            x = batch[0]
            if rank == 0:
                planted = x[:, 1]
            else:
                planted = stream.stats.num_orig_samples_scored + torch.arange(len(x)).float()
            return planted + 0.0 * model.net(x).sum(1)

        stream = sifting_dataloader(self.trainer, loader, config, loss, epoch_length=5, seed=rank)
        return stream


def fit(root: Path, name: str, ckpt_path: str | None = None, callbacks=()) -> tuple:
    module = Module()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=3,
        callbacks=list(callbacks),
        enable_checkpointing=bool(callbacks),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root / name),
    )
    trainer.fit(module, datamodule=Data(), ckpt_path=ckpt_path)
    return module, trainer


def main() -> None:
    out = Path(sys.argv[1])
    reference, trainer = fit(out, "ref")
    stats = trainer.train_dataloader.stats.as_dict()
    saver = L.callbacks.ModelCheckpoint(
        dirpath=str(out / "ck"), every_n_train_steps=STOP, save_top_k=-1
    )
    fit(out, "first", callbacks=[saver])
    ckpt = out / "ck" / f"epoch=1-step={STOP}.ckpt"
    resumed, trainer = fit(out, "resumed", ckpt_path=str(ckpt))
    rank = trainer.global_rank
    saved = torch.load(ckpt, weights_only=True)["loops"]["fit_loop"]["state_dict"]
    state = saved["combined_loader"][0]
    result = {
        "rank": rank,
        "reference": reference.trained,
        "resumed": resumed.trained,
        "keep_rate": stats["keep_rate"],
        "world_size_saved": state["world_size"],
        "buffered_at_stop": state["ranks"][rank]["loader"]["buffer"]["count"],
        "global_step": trainer.global_step,
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    leave()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
