"""hasten.compile's input checks and bookkeeping (no compiling: it happens at the first call)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hasten


def test_compile_is_lazy_and_in_place():
    model = nn.Linear(2, 2)
    keys = list(model.state_dict())
    assert hasten.compile(model, regions="whole") is model
    assert list(model.state_dict()) == keys
    rep = hasten.compiler.compile_report(model)
    assert rep.graph_count == 0 and rep.compile_seconds == 0


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (lambda x: x, "expects a torch.nn.Module"),
        (torch.compile(nn.Linear(2, 2)), "model._orig_mod"),
    ],
)
def test_compile_rejects_non_modules_with_the_fix(model, match):
    with pytest.raises(TypeError, match=match):
        hasten.compile(model, regions="whole")


def test_compile_rejects_bad_config_arguments():
    with pytest.raises(TypeError, match=r"hasten\.CompileConfig"):
        hasten.compile(nn.Linear(2, 2), config={"precision": "bf16"}, regions="whole")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'precison'"):
        hasten.compile(nn.Linear(2, 2), precison="bf16", regions="whole")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="mode='default'"):
        hasten.compile(nn.Linear(2, 2), mode="reduce-overhead", regions="whole")


def test_device_check_happens_before_the_model_is_touched():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=8)
    model = transformers.GPT2LMHeadModel(cfg)
    with pytest.raises(ValueError):
        hasten.compile(model, mode="reduce-overhead", regions="whole")
    assert model.loss_type is None  # not fixed: compile was refused


def test_report_and_scaler_of_an_uncompiled_model_say_what_to_do():
    with pytest.raises(ValueError, match=r"hasten\.compile"):
        hasten.compiler.compile_report(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="precision='fp16'"):
        hasten.compiler.grad_scaler(hasten.compile(nn.Linear(2, 2), regions="whole"))


def test_verify_rejects_bad_arguments():
    def loss(m, b):
        return m(b).sum()

    def opt(p):
        return torch.optim.SGD(p, lr=0.1)

    with pytest.raises(ValueError, match="steps"):
        hasten.verify(nn.Linear(2, 2), torch.randn(1, 2), loss, opt, steps=0)
    with pytest.raises(TypeError, match="callables"):
        hasten.verify(nn.Linear(2, 2), torch.randn(1, 2), "loss", opt)  # type: ignore[arg-type]


def test_compile_spells_out_every_config_field_as_a_keyword():
    import dataclasses
    import inspect

    params = inspect.signature(hasten.compile).parameters
    keywords = [n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keywords == [f.name for f in dataclasses.fields(hasten.CompileConfig)]
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def test_keywords_override_config_only_where_given():
    from hasten.compiler.api import _RECORDS

    cfg = hasten.CompileConfig(precision="fp32", fallback="raise", warn_recompiles=2)
    model = hasten.compile(
        nn.Linear(2, 2), cfg, warn_recompiles=0, precision=torch.float32, regions="whole"
    )
    used = model._compiled_call_impl.code.config
    assert (used.fallback, used.warn_recompiles, used.precision) == ("raise", 0, "fp32")
    assert model in _RECORDS
