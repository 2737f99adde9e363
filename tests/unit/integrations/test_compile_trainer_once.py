"""compile_trainer with ``TrainingArguments(torch_compile=True)``: the model is compiled once, by
hasten; the Trainer's own torch.compile is turned off for that trainer, with one log line.

(``torch_compile_backend="hasten"`` itself is refused by Accelerate while the Trainer is built,
before hasten runs: ``tests/integration/test_hf_trainer.py`` pins that as a canary.)
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from accelerate.utils import DynamoBackend  # noqa: E402
from torch._dynamo.eval_frame import OptimizedModule  # noqa: E402

import hasten  # noqa: E402
from hasten.compiler.api import compile_report  # noqa: E402
from hasten.integrations.transformers import compile_trainer  # noqa: E402
from tests._models import tiny_bert_classifier  # noqa: E402


def _trainer(tmp_path, **args):
    model = tiny_bert_classifier()
    model.config.problem_type = "single_label_classification"  # else set on the first forward
    g = torch.Generator().manual_seed(0)
    data = [
        {"input_ids": torch.randint(0, 32, (8,), generator=g), "labels": torch.tensor(i % 2)}
        for i in range(8)
    ]
    base = {"max_steps": 1, "report_to": [], "use_cpu": True, "save_strategy": "no"}
    targs = transformers.TrainingArguments(str(tmp_path), **{**base, **args})
    return transformers.Trainer(model=model, args=targs, train_dataset=data)


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]


def test_torch_compile_true_is_turned_off_for_the_trainer_with_one_log_line(tmp_path, caplog):
    trainer = _trainer(tmp_path, torch_compile=True)
    assert trainer.args.torch_compile_backend == "inductor"  # what the Trainer would do
    assert trainer.accelerator.state.dynamo_plugin.backend == DynamoBackend.INDUCTOR
    with caplog.at_level(logging.INFO, logger="hasten"):
        compile_trainer(trainer, regions="whole")
        compile_trainer(
            trainer, regions="whole"
        )  # a second call: compiled already, nothing to turn off
    compile_report(trainer.model)  # compiled by hasten, in place (raises if not)
    args = trainer.args
    assert not args.torch_compile and args.torch_compile_backend is None
    assert trainer.accelerator.state.dynamo_plugin.backend == DynamoBackend.NO
    (line,) = _lines(caplog)  # said once
    assert "torch_compile=True, backend 'inductor'" in line and "turned off" in line
    assert "hasten.compile" in line
    # what the Trainer runs to prepare the model, for training and for evaluation
    prepared = trainer.accelerator.prepare_model(trainer.model)
    assert prepared is trainer.model and not isinstance(prepared, OptimizedModule)


def test_without_torch_compile_nothing_is_said(tmp_path, caplog):
    trainer = _trainer(tmp_path)
    with caplog.at_level(logging.INFO, logger="hasten"):
        compile_trainer(trainer, regions="whole")
    assert not _lines(caplog)
    assert trainer.accelerator.state.dynamo_plugin.backend == DynamoBackend.NO


def test_a_model_hasten_compiled_before_the_trainer_is_not_compiled_again(tmp_path):
    trainer = _trainer(tmp_path, torch_compile=True)
    hasten.compile(trainer.model, regions="whole")
    impl = trainer.model._compiled_call_impl
    compile_trainer(trainer, regions="whole")
    assert trainer.model._compiled_call_impl is impl
    assert trainer.accelerator.state.dynamo_plugin.backend == DynamoBackend.NO


@pytest.mark.slow
def test_training_with_torch_compile_true_compiles_once_with_hasten(tmp_path):
    trainer = _trainer(tmp_path, torch_compile=True, max_steps=2, per_device_train_batch_size=4)
    compile_trainer(trainer, fallback="raise", regions="whole")
    trainer.train()
    assert not isinstance(trainer.model_wrapped, OptimizedModule)
    assert not any(isinstance(m, OptimizedModule) for m in trainer.accelerator._models)
    report = compile_report(trainer.model)
    assert report.fallback is None
    assert report.graph_count == 1 and not report.recompiles
