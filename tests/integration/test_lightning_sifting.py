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
from tests._helpers import (  # noqa: E402
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
        self.trained: list[list[int]] = []  # sample ids of each batch trained on

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_epoch_start(self) -> None:
        self.batches_per_epoch.append(0)

    def training_step(self, batch, batch_idx):
        if not self.batches_per_epoch:  # resumed mid-epoch: Lightning skips the epoch start
            self.batches_per_epoch.append(0)
        self.batches_per_epoch[-1] += 1
        x, y = batch
        self.trained.append(x[:, 1].long().tolist())
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SiftedData(L.LightningDataModule):
    """The pattern: the DataModule reaches the model through self.trainer."""

    def __init__(
        self, n: int = 160, batch_size: int = 8, drop_last: bool = False, **sifting: object
    ) -> None:
        super().__init__()
        self.n, self.batch_size, self.drop_last = n, batch_size, drop_last
        self.sifting = sifting  # more sifting_dataloader arguments

    def train_dataloader(self):
        loader = DataLoader(
            PlantedDataset(self.n),
            batch_size=self.batch_size,
            shuffle=True,
            generator=torch.Generator().manual_seed(0),
            drop_last=self.drop_last,
        )
        return sifting_dataloader(
            self.trainer, loader, sift_config(beta=1.0, delay=4), planted_loss, **self.sifting
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
    # 20 batches a pass, delay 4 then keep 1/2: (4 + 8 + 10 + 10 + 2 headroom) / 3 -> 12
    assert len(loader) == 12
    # every epoch the planned length but the last, which ends with the third pass
    assert module.batches_per_epoch[:2] == [12, 12] and module.batches_per_epoch[2] <= 12
    assert trainer.global_step == sum(module.batches_per_epoch)
    stats = loader.stats
    assert stats.num_batches_out == trainer.global_step and 0.3 < stats.keep_rate < 0.7
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
            assert hasten.compile(module, regions="whole") is module  # in place, before fit
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


def _fit(tmp_path, name, epochs, ckpt_path=None, callbacks=(), **data):
    module = Module()
    trainer = _trainer(
        tmp_path / name,
        max_epochs=epochs,
        callbacks=list(callbacks),
        enable_checkpointing=bool(callbacks),
        logger=False,
    )
    # ckpt_path given, weights_only left to Lightning: its default (torch's) is True
    trainer.fit(module, datamodule=SiftedData(**data), ckpt_path=ckpt_path)
    return module, trainer


@pytest.mark.slow
@pytest.mark.parametrize("where", ["epoch_end", "mid_epoch"])
def test_lightning_resume_continues_the_exact_sifted_stream(tmp_path, where):
    # 10 incoming batches a pass (delay 4, then keep ~1/2): epochs of 5 cross data passes
    data = {"n": 80, "epoch_length": 5}
    reference, _ = _fit(tmp_path, "ref", 3, **data)
    assert len(reference.trained) == 15

    if where == "epoch_end":  # Lightning's usual checkpoint: the last of epoch 0
        saver = L.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_last=True)
        ckpt, done = tmp_path / "ck" / "last.ckpt", 5
    else:  # mid-epoch, after step 7 (epoch 1, batch 2)
        saver = L.callbacks.ModelCheckpoint(
            dirpath=str(tmp_path / "ck"), every_n_train_steps=7, save_top_k=-1
        )
        ckpt, done = tmp_path / "ck" / "epoch=1-step=7.ckpt", 7
    first, _ = _fit(tmp_path, "first", 3 if where == "mid_epoch" else 1, callbacks=[saver], **data)
    assert first.trained[:done] == reference.trained[:done]
    state = torch.load(ckpt, weights_only=True)  # plain data, sifting state included
    stream = state["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["ranks"][0]
    assert stream["loader"]["in_epoch"] and stream["loader"]["history"]["size"] > 0

    resumed, trainer = _fit(tmp_path, "resumed", 3, ckpt_path=str(ckpt), **data)
    # the resumed fit trains on exactly the batches the uninterrupted one did next
    assert resumed.trained == reference.trained[done:]
    assert trainer.global_step == 15
    assert trainer.train_dataloader.stats.num_orig_samples_seen > 0


@pytest.mark.slow
def test_checkpoint_false_resumes_with_a_fresh_stream(tmp_path):
    saver = L.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "ck"), save_last=True)
    _fit(tmp_path, "first", 1, callbacks=[saver], n=80, checkpoint=False)
    resumed, trainer = _fit(
        tmp_path, "second", 2, ckpt_path=str(tmp_path / "ck" / "last.ckpt"), n=80, checkpoint=False
    )
    loader = trainer.train_dataloader
    assert not hasattr(loader, "state_dict")  # Lightning saves no stream state
    assert trainer.current_epoch == 2 and len(resumed.batches_per_epoch) == 1
    assert loader.data_epoch == 0 and loader.stats.num_batches_in <= 10  # a fresh stream


def test_the_returned_stream_is_checkpointed_by_default(tmp_path):
    trainer = _trainer(tmp_path, max_epochs=1)
    loader = DataLoader(PlantedDataset(16), batch_size=4)
    stream = sifting_dataloader(trainer, loader, sift_config(), planted_loss, model=tiny_model())
    assert isinstance(stream, SiftedEpochs)
    state = stream.state_dict()
    assert state["world_size"] == 1 and len(state["ranks"]) == 1
    # Lightning plans the epochs: a resumed fit may use another length (max_epochs raised)
    longer = sifting_dataloader(
        trainer, loader, sift_config(), planted_loss, model=tiny_model(), epoch_length=9
    )
    longer.load_state_dict(state)
    assert len(longer) == 9
    with pytest.raises(ValueError, match="same number of processes"):
        stream.load_state_dict({"world_size": 2, "ranks": state["ranks"] * 2})
    with pytest.raises(ValueError, match="checkpoint=False"):
        stream.load_state_dict({"loader": {}})
