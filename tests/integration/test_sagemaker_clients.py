"""Client code written for SageMaker smart sifting, run with only the import prefix changed.

In the style of AWS's published examples (our own code): a Lightning DataModule returning a plain
``SiftingDataloader`` with a ``Loss`` on the transformed batch and a ``ListBatch`` transform, a
linear schedule sized from ``trainer.estimated_stepping_batches``, the ``TrainingMetricsRecorder``
callback, a Hugging Face ``Trainer`` whose ``get_train_dataloader`` wraps the Trainer's own
(Accelerate-prepared) loader, and training metrics scraped from the log with SageMaker's regexes.
"""

from __future__ import annotations

import importlib
import logging
import re

import pytest
import torch
from torch.utils.data import DataLoader

from hasten.smart_sifting.data_model.data_model_interface import SiftingBatch, SiftingBatchTransform
from hasten.smart_sifting.data_model.list_batch import ListBatch
from hasten.smart_sifting.dataloader.sift_dataloader import SiftingDataloader
from hasten.smart_sifting.loss.abstract_sift_loss_module import Loss
from hasten.smart_sifting.sift_config.sift_configs import (
    LossConfig,
    RelativeProbabilisticSiftConfig,
    SiftingBaseConfig,
)
from tests._helpers import RecordingDataset, complete_passes, tiny_model

SAGEMAKER_LOGGER = "hasten.smart_sifting.dataloader.sift_dataloader"
REGEXES = {  # the metric definitions of AWS's example notebooks
    "seen": r"num_orig_samples_seen: (\S+)",
    "kept": r"num_orig_samples_kept: (\S+)",
    "batch": r"Batch size for next sifted batch: (\S+)",
}


def _sift_config(delay: int) -> RelativeProbabilisticSiftConfig:
    return RelativeProbabilisticSiftConfig(
        beta_value=1.0,
        loss_history_length=200,
        loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=delay)),
    )


class ListBatchTransform(SiftingBatchTransform):
    """(features, labels) <-> ListBatch, as the AWS text and image examples do."""

    def transform(self, batch) -> SiftingBatch:
        features, labels = batch
        return ListBatch(list(features), labels.tolist())

    def reverse_transform(self, list_batch: ListBatch):
        return torch.stack(list_batch.inputs), torch.tensor(list_batch.labels)


class ClassifierLoss(Loss):
    """Per-sample cross entropy on the transformed batch."""

    def __init__(self) -> None:
        self.celoss = torch.nn.CrossEntropyLoss(reduction="none")

    def loss(self, model, transformed_batch, original_batch=None):
        inputs = torch.stack(transformed_batch.inputs)
        labels = torch.tensor(transformed_batch.labels, device=inputs.device)
        return self.celoss(model(inputs), labels)


def _scrape(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    return {
        k: [m.group(1) for line in lines if (m := re.search(rx, line))] for k, rx in REGEXES.items()
    }


def _lightning_client(pl):
    """The SageMaker Lightning client, written against one Lightning distribution."""
    from hasten.smart_sifting.metrics.lightning import TrainingMetricsRecorder

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_model()
            self.trained: list[int] = []
            self.planned: int | None = None

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.trained += x[:, 1].long().tolist()
            return torch.nn.functional.cross_entropy(self(x), y)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            self.planned = total = self.trainer.estimated_stepping_batches
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / total))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    class Data(pl.LightningDataModule):
        def __init__(self, dataset) -> None:
            super().__init__()
            self.dataset = dataset

        def train_dataloader(self):
            loader = DataLoader(self.dataset, batch_size=16, shuffle=True)
            return SiftingDataloader(
                sift_config=_sift_config(delay=5),
                orig_dataloader=loader,
                batch_transforms=ListBatchTransform(),
                loss_impl=ClassifierLoss(),
                model=self.trainer.lightning_module,
            )

    return Classifier, Data, TrainingMetricsRecorder


@pytest.mark.slow
@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_lightning_plain_sifting_dataloader_over_epochs(package, tmp_path, caplog):
    pl = pytest.importorskip(package)
    Classifier, Data, TrainingMetricsRecorder = _lightning_client(pl)
    caplog.set_level(logging.INFO, logger=SAGEMAKER_LOGGER)  # as a SageMaker client does
    dataset = RecordingDataset(480)  # 30 batches of 16 per data pass
    model = Classifier()
    trainer = pl.Trainer(
        max_epochs=4,
        accelerator="cpu",
        devices=1,
        logger=pl.loggers.CSVLogger(str(tmp_path)),
        log_every_n_steps=1000,  # longer than the fit: the recorder still logs at epoch ends
        callbacks=[TrainingMetricsRecorder()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=Data(dataset))
    loader = trainer.train_dataloader
    stats = loader.stats

    # the schedule planned from estimated_stepping_batches is the one taken (within 5 %)
    assert abs(trainer.global_step - model.planned) <= 0.05 * model.planned
    # no pass cut: every sample of every pass drawn exactly once, over >= 3 passes
    assert complete_passes(dataset.drawn, 480) >= 3
    assert stats.num_orig_samples_seen == len(dataset.drawn)
    # every kept sample trained on, except the rows of the pass still running at the end
    assert len(model.trained) == stats.num_samples_yielded
    assert stats.num_orig_samples_kept - stats.num_samples_yielded == loader._buffer.count
    assert stats.num_samples_dropped_at_epoch_end == 0 and 0.3 < stats.keep_rate < 0.7
    assert "sift/keep_rate" in trainer.logged_metrics

    metrics = _scrape(caplog.text)
    assert len(metrics["seen"]) >= 4 and len(metrics["seen"]) == len(metrics["kept"])
    seen = [int(v) for v in metrics["seen"]]
    assert seen == sorted(seen) and seen[-1] <= stats.num_orig_samples_seen
    assert {int(v) for v in metrics["batch"]} == {16}


@pytest.mark.slow
def test_hf_trainer_get_train_dataloader_override_under_accelerate(tmp_path, caplog):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    caplog.set_level(logging.INFO, logger=SAGEMAKER_LOGGER)

    class Features(RecordingDataset):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return {"x": x, "labels": y}

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = tiny_model()

        def forward(self, x, labels=None):
            logits = self.net(x)
            loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
            return {"loss": loss, "logits": logits}

    def loss(model, batch):
        return torch.nn.functional.cross_entropy(
            model(batch["x"])["logits"], batch["labels"], reduction="none"
        )

    class SiftingImplementedTrainer(transformers.Trainer):
        def get_train_dataloader(self):
            dl = super().get_train_dataloader()  # Accelerate's DataLoaderShard: batch_size=None
            self.orig_batch_size = dl.batch_size
            return SiftingDataloader(
                sift_config=_sift_config(delay=4),
                orig_dataloader=dl,
                loss_impl=loss,
                model=self.model,
            )

    dataset = Features(240)  # 15 batches of 16 per data pass
    trainer = SiftingImplementedTrainer(
        model=Model(),
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path),
            per_device_train_batch_size=16,
            num_train_epochs=3,
            learning_rate=0.05,
            optim="sgd",
            lr_scheduler_type="linear",
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=1000,
            seed=0,
        ),
        train_dataset=dataset,
    )
    out = trainer.train()
    loader = trainer.callback_handler.train_dataloader
    assert trainer.orig_batch_size is None and isinstance(loader, SiftingDataloader)
    # max_steps planned from len() is exactly what ran: len() held for every epoch
    assert out.global_step == trainer.state.max_steps == 3 * len(loader)
    assert loader.stats.num_batches_out == 3 * len(loader)
    assert complete_passes(dataset.drawn, 240) >= 2
    assert loader.stats.num_samples_dropped_at_epoch_end == 0
    metrics = _scrape(caplog.text)
    assert metrics["seen"] and {int(v) for v in metrics["batch"]} == {16}


def test_recorder_is_a_callback_of_every_installed_lightning():
    from hasten.smart_sifting.metrics.lightning import TrainingMetricsRecorder

    found = 0
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            pl = importlib.import_module(name)
        except ImportError:
            continue
        found += 1
        assert isinstance(TrainingMetricsRecorder(), pl.Callback)
    assert found
