"""compile_trainer and the compiler's fused optimizer: the Trainer's own SGD/AdamW steps fused,
and compile_trainer(fused_optimizer=False) keeps every optimizer as made. Nothing compiles:
gradients are set by hand and only the optimizer steps."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import hasten  # noqa: E402
from hasten.integrations.transformers import compile_trainer  # noqa: E402
from tests._models import tiny_bert_classifier  # noqa: E402


def _trainer(tmp_path, **args):
    targs = transformers.TrainingArguments(
        str(tmp_path), max_steps=1, report_to=[], use_cpu=True, **args
    )
    return transformers.Trainer(model=tiny_bert_classifier(), args=targs, train_dataset=[])


def _step(trainer) -> torch.optim.Optimizer:
    optimizer = trainer.create_optimizer()
    for p in trainer.model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    return optimizer


def test_the_trainers_sgd_steps_fused(tmp_path):
    trainer = _trainer(tmp_path, optim="sgd")
    compile_trainer(trainer, regions="whole")
    assert trainer.args.optim.value == "sgd"  # not renamed
    assert all(g["fused"] is True for g in _step(trainer).param_groups)


@pytest.mark.parametrize("compiled_before", [False, True])
def test_fused_optimizer_false_keeps_every_optimizer_as_made(tmp_path, compiled_before):
    trainer = _trainer(tmp_path, optim="adamw_torch")
    if compiled_before:
        hasten.compile(trainer.model, regions="whole")
    compile_trainer(trainer, fused_optimizer=False, regions="whole")
    assert trainer.args.optim.value == "adamw_torch"
    assert all(not g["fused"] for g in _step(trainer).param_groups)
