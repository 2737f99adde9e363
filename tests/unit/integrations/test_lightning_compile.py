"""Lightning's Compile callback: the LightningModule compiled in place when the fit starts, the
compile plan told the fit's length (training calls: optimizer steps x accumulation).

hasten.compile is lazy and the plan keeps a run this short eager, so nothing compiles here."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

L = pytest.importorskip("lightning.pytorch")

import hasten  # noqa: E402
from hasten.integrations.lightning import Compile, fit_training_calls  # noqa: E402
from tests._helpers import PlantedDataset, tiny_model  # noqa: E402


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = tiny_model()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(callback: Compile, **kw) -> tuple[Module, L.Trainer]:
    module = Module()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        **kw,
    )
    trainer.fit(module, DataLoader(PlantedDataset(80), batch_size=8))  # 10 batches an epoch
    return module, trainer


def _planned_steps(module: torch.nn.Module) -> int | None:
    return module._compiled_call_impl.code.config.steps


def test_the_fits_length_reaches_the_compile_plan():
    callback = Compile()
    module, trainer = _fit(callback, max_epochs=3, accumulate_grad_batches=2)
    # 3 epochs of 10 batches: 15 optimizer steps of 2 training calls each
    assert trainer.estimated_stepping_batches == 15
    assert callback.steps == fit_training_calls(trainer) == 30 == _planned_steps(module)
    hasten.compiler.compile_report(module)  # compiled in place (raises if not)
    by_steps = Compile()
    module, _ = _fit(by_steps, max_steps=4)
    assert by_steps.steps == 4 == _planned_steps(module)


def test_a_given_length_wins_and_bad_settings_are_named():
    given = Compile(steps=500)
    module, _ = _fit(given, max_steps=2)
    assert given.steps == 500 == _planned_steps(module)
    config = Compile(hasten.CompileConfig(steps=77))
    module, _ = _fit(config, max_steps=2)
    assert config.steps == 77 == _planned_steps(module)
    with pytest.raises(TypeError, match="CompileConfig"):
        Compile({"steps": 3})


def test_a_module_compiled_already_is_left_alone():
    module = Module()
    hasten.compile(module, steps=9)
    impl = module._compiled_call_impl
    callback = Compile()
    trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        max_steps=2,
    )
    trainer.fit(module, DataLoader(PlantedDataset(32), batch_size=8))
    assert module._compiled_call_impl is impl and callback.steps is None
    assert _planned_steps(module) == 9
