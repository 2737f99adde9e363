"""Lightning with sifting: the DataModule pattern, exact epochs, the metrics callback, samplers."""

from __future__ import annotations

import csv

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

L = pytest.importorskip("lightning.pytorch")

from hasten.integrations.epochs import SiftedEpochs  # noqa: E402
from hasten.integrations.lightning import sifting_dataloader  # noqa: E402
from hasten.smart_sifting.metrics.lightning import TrainingMetricsRecorder  # noqa: E402
from tests.unit.sifting._helpers import (  # noqa: E402
    PlantedDataset,
    planted_loss,
    sift_config,
    tiny_model,
)


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_model()
        self.batches_per_epoch: list[int] = []
        self.losses: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_epoch_start(self) -> None:
        self.batches_per_epoch.append(0)

    def training_step(self, batch, batch_idx):
        self.batches_per_epoch[-1] += 1
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SiftedData(L.LightningDataModule):
    """The pattern: the DataModule reaches the model through self.trainer."""

    def __init__(self, n: int = 160, batch_size: int = 8, drop_last: bool = False) -> None:
        super().__init__()
        self.n, self.batch_size, self.drop_last = n, batch_size, drop_last

    def train_dataloader(self):
        loader = DataLoader(
            PlantedDataset(self.n),
            batch_size=self.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
            drop_last=self.drop_last,
        )
        return sifting_dataloader(
            self.trainer, loader, sift_config(beta=1.0, delay=4), planted_loss
        )


def _trainer(tmp_path, **kw):
    base = {
        "accelerator": "cpu",
        "devices": 1,
        "logger": L.loggers.CSVLogger(str(tmp_path), name="run"),
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "log_every_n_steps": 1,
    }
    base.update(kw)
    return L.Trainer(**base)


@pytest.mark.slow
def test_fit_with_sifting_datamodule_and_metrics_callback(tmp_path):
    module = Module()
    trainer = _trainer(tmp_path, max_epochs=3, callbacks=[TrainingMetricsRecorder(every_n_steps=2)])
    trainer.fit(module, datamodule=SiftedData())

    loader = trainer.train_dataloader
    assert not hasattr(loader, "state_dict")  # not checkpointed unless checkpoint=True
    # 20 batches a pass, delay 4 then keep 1/2: (4 + 8 + 10 + 10) / 3 passes -> 11 per epoch
    assert len(loader) == 11
    assert module.batches_per_epoch == [11, 11, 11]  # every epoch exactly the planned length
    assert trainer.global_step == 33
    stats = loader.stats
    assert stats.num_batches_out == 33 and 0.3 < stats.keep_rate < 0.7
    assert loader.loader.model is module  # scored with the module being trained
    assert loader.data_epoch >= 2

    # the callback's values reached the logger (CSV) and the trainer's metrics
    assert trainer.callback_metrics["sift/keep_rate"] == pytest.approx(stats.keep_rate, abs=0.05)
    trainer.logger.finalize("success")
    with open(f"{trainer.logger.log_dir}/metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("sift/keep_rate")]
    assert len(rows) >= 10
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(set(steps))
    seen = [float(r["sift/samples_seen"]) for r in rows]
    assert seen == sorted(seen) and seen[-1] > seen[0]


def test_distributed_sampler_is_added_as_lightning_would(tmp_path):
    ds = PlantedDataset(40)
    model = tiny_model()
    cfg = sift_config()

    def inner(trainer):
        loader = DataLoader(ds, batch_size=4, shuffle=True)
        return sifting_dataloader(
            trainer, loader, cfg, planted_loss, model=model
        ).loader.orig_dataloader

    # a DDP trainer, not launched: rank 0 of 2
    ddp = _trainer(tmp_path, strategy="ddp", devices=2, max_epochs=1)
    sampler = inner(ddp).sampler
    assert isinstance(sampler, DistributedSampler)
    assert (sampler.num_replicas, sampler.rank, sampler.shuffle) == (2, 0, True)

    # use_distributed_sampler=False: the user's loader is left as built
    mine = _trainer(tmp_path, strategy="ddp", devices=2, use_distributed_sampler=False)
    assert isinstance(inner(mine).sampler, RandomSampler)

    # one process: nothing to shard
    assert isinstance(inner(_trainer(tmp_path, max_epochs=1)).sampler, RandomSampler)


def test_bad_use_is_named(tmp_path):
    trainer = _trainer(tmp_path, max_epochs=1)
    loader = DataLoader(PlantedDataset(8), batch_size=4)
    with pytest.raises(ValueError, match="train_dataloader"):
        sifting_dataloader(trainer, loader, sift_config(), planted_loss)  # no module attached
    with pytest.raises(TypeError, match="Lightning Trainer"):
        sifting_dataloader(object(), loader, sift_config(), planted_loss)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="every_n_steps"):
        TrainingMetricsRecorder(every_n_steps=0)


@pytest.mark.slow
def test_compiled_lightning_module_fits_with_sifting(tmp_path):
    pytest.importorskip("hasten.compiler")  # the compiler lands in its own branch
    import hasten
    from hasten.compiler.api import compile_report

    def fit(compiled: bool) -> Module:
        torch.manual_seed(0)
        module = Module()
        if compiled:
            assert hasten.compile(module) is module  # in place, before fit
        trainer = _trainer(tmp_path / str(compiled), max_epochs=2, logger=False)
        # drop_last: only full sifted batches, so no recompile for a short last batch
        trainer.fit(module, datamodule=SiftedData(n=80, drop_last=True))
        return module

    eager, comp = fit(False), fit(True)
    report = compile_report(comp)
    assert report.fallback is None and report.graph_count >= 1 and not report.graph_breaks
    assert len(report.recompiles) <= 1  # only the scorer's graph (no autograd), nothing else
    assert comp.batches_per_epoch == eager.batches_per_epoch
    # the 4 delay steps train on the same unscored batches: same losses in fp32
    assert comp.losses[:4] == pytest.approx(eager.losses[:4], rel=1e-4)
    assert list(comp.state_dict()) == list(eager.state_dict())


@pytest.mark.slow
def test_lightning_checkpoints_resume_with_default_loading(tmp_path):
    ckpt = L.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_last=True)
    first = _trainer(tmp_path, max_epochs=1, callbacks=[ckpt], enable_checkpointing=True)
    first.fit(Module(), datamodule=SiftedData(n=80))
    resumed = Module()
    second = _trainer(tmp_path, max_epochs=2)
    # weights_only=True (Lightning's default) loads it: the loader state is not in it
    second.fit(resumed, datamodule=SiftedData(n=80), ckpt_path=str(tmp_path / "ck" / "last.ckpt"))
    assert second.current_epoch == 2 and len(resumed.batches_per_epoch) == 1


def test_checkpoint_true_gives_lightning_the_stream_state(tmp_path):
    trainer = _trainer(tmp_path, max_epochs=1)
    loader = DataLoader(PlantedDataset(16), batch_size=4)
    stream = sifting_dataloader(
        trainer, loader, sift_config(), planted_loss, model=tiny_model(), checkpoint=True
    )
    assert isinstance(stream, SiftedEpochs)
    assert callable(stream.state_dict) and callable(stream.load_state_dict)
