"""The HF Trainer's pruning front-end: the PruningSampler checks feedback against the batches of
the DataLoader the Trainer builds on it."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hasten.integrations.transformers import enable_sifting  # noqa: E402
from hasten.sifting import UnbiasedPruningConfig  # noqa: E402
from tests._models import tiny_bert_classifier  # noqa: E402


def test_the_pruning_sampler_reads_the_trainers_batches(tmp_path):
    # enable_sifting builds the PruningSampler without batch_size=: it reads the batches of
    # the DataLoader the Trainer builds on it (which auto_find_batch_size may rebuild smaller)
    data = [
        {"input_ids": torch.randint(0, 32, (8,)), "labels": torch.tensor(i % 2)} for i in range(8)
    ]
    args = transformers.TrainingArguments(
        str(tmp_path), per_device_train_batch_size=4, report_to=[], use_cpu=True
    )
    trainer = transformers.Trainer(model=tiny_bert_classifier(), args=args, train_dataset=data)
    enable_sifting(trainer, UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.0))
    sampler = trainer.hasten_pruning_sampler
    assert sampler.batch_size is None
    batch = next(iter(trainer.get_train_dataloader()))
    assert len(batch["labels"]) == 4
    with pytest.raises(ValueError, match=r"has 4 samples \(batch size from the DataLoader's"):
        sampler.update(torch.ones(2))
