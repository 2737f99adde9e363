"""compile_trainer: compiles the Trainer's model in place and picks the fused AdamW, saying so.

hasten.compile is lazy (nothing compiles before the first call), so these tests stay quick.
"""

from __future__ import annotations

import logging
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
    model = tiny_bert_classifier()
    data = [{"input_ids": torch.randint(0, 32, (8,)), "labels": torch.tensor(0)}] * 4
    targs = transformers.TrainingArguments(
        str(tmp_path), max_steps=1, report_to=[], use_cpu=True, **args
    )
    return transformers.Trainer(model=model, args=targs, train_dataset=data)


def test_for_loop_adamw_becomes_fused_with_a_log_line(tmp_path, caplog):
    trainer = _trainer(tmp_path, optim="adamw_torch")
    with caplog.at_level(logging.INFO, logger="hasten"):
        assert compile_trainer(trainer, regions="whole") is trainer
    assert trainer.args.optim.value == "adamw_torch_fused"
    assert "'adamw_torch' -> 'adamw_torch_fused'" in caplog.text
    assert "fused_optimizer=False" in caplog.text  # how to keep it
    hasten.compiler.compile_report(trainer.model)  # compiled in place (raises if not)
    optimizer = trainer.create_optimizer()
    assert optimizer.defaults.get("fused") is True


def test_opting_out_and_other_optimizers_are_left_alone(tmp_path, caplog):
    trainer = _trainer(tmp_path, optim="adamw_torch")
    compile_trainer(trainer, fused_optimizer=False, regions="whole")
    assert trainer.args.optim.value == "adamw_torch"
    trainer = _trainer(tmp_path, optim="sgd")
    with caplog.at_level(logging.INFO, logger="hasten"):
        compile_trainer(trainer, precision="fp32", regions="whole")
    assert trainer.args.optim.value == "sgd" and "->" not in caplog.text


def test_a_model_compiled_already_is_kept(tmp_path):
    trainer = _trainer(tmp_path)
    hasten.compile(trainer.model, fallback="raise", regions="whole")
    impl = trainer.model._compiled_call_impl
    compile_trainer(trainer, regions="whole")
    assert trainer.model._compiled_call_impl is impl
    with pytest.raises(TypeError, match=r"transformers\.Trainer"):
        compile_trainer(object())


def test_the_run_length_reaches_the_compile_plan(tmp_path):
    trainer = _trainer(tmp_path, gradient_accumulation_steps=2)  # max_steps=1, 2 micro-batches
    compile_trainer(trainer)
    assert trainer.model._compiled_call_impl.code.config.steps == 2
    by_epochs = _trainer(tmp_path, per_device_train_batch_size=3)
    by_epochs.args.max_steps = -1
    by_epochs.args.num_train_epochs = 2
    compile_trainer(by_epochs)  # 4 rows in batches of 3: 2 batches a pass, 2 passes
    assert by_epochs.model._compiled_call_impl.code.config.steps == 4
    given = _trainer(tmp_path)
    compile_trainer(given, steps=500)  # the user's own hint wins
    assert given.model._compiled_call_impl.code.config.steps == 500
