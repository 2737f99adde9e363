"""Trainer traps, end to end (Inductor included, so slow; every compiled model is tiny).

problem_type and a short last batch do not recompile (in the Trainer too), a first call that
raised still compiles, each compile logs one line, a truncated kernel in the cache is rebuilt.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import hasten
from tests._models import tiny_bert_classifier

pytestmark = pytest.mark.slow
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# fp32, Inductor vs eager on tiny models: reordered reductions only
RTOL, ATOL = 1e-5, 1e-5


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _bert_classifier():
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    return tiny_bert_classifier(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def test_hf_classifier_compiles_once_through_problem_type_and_a_short_batch(caplog):
    model = _bert_classifier()
    reference = _bert_classifier()
    hasten.compile(model, fallback="raise", regions="whole")
    g = torch.Generator().manual_seed(0)
    with caplog.at_level(logging.INFO, logger="hasten"):
        for batch in [4] * 8 + [3, 4]:  # 3: the short last batch of an epoch
            ids = torch.randint(0, 32, (batch, 8), generator=g)
            labels = torch.randint(0, 2, (batch,), generator=g)
            out = model(input_ids=ids, labels=labels)
            torch.testing.assert_close(
                out.loss, reference(input_ids=ids, labels=labels).loss, rtol=RTOL, atol=ATOL
            )
            out.loss.backward()
    report = hasten.compiler.compile_report(model)
    assert report.recompiles == (), str(report)
    assert report.graph_count == 1, str(report)
    assert model.config.problem_type == "single_label_classification"
    assert any("problem_type was None" in f for f in report.fixes)
    lines = [r.getMessage() for r in caplog.records if r.name == "hasten"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("hasten: compiled BertForSequenceClassification: 1 graph, ")
    assert "a batch of 3 (compiled for 4) runs eagerly instead of recompiling" in lines[1]


def test_trainer_with_a_short_last_batch_compiles_once(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hasten.integrations.transformers import compile_trainer

    g = torch.Generator().manual_seed(0)
    rows = [
        {"input_ids": torch.randint(0, 32, (8,), generator=g), "labels": torch.tensor(i % 2)}
        for i in range(35)  # 8 batches of 4 and one of 3 per epoch
    ]
    trainer = transformers.Trainer(
        model=_bert_classifier(),
        train_dataset=rows,
        args=transformers.TrainingArguments(
            str(tmp_path),
            max_steps=5,
            per_device_train_batch_size=4,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
            optim="adamw_torch",
        ),
    )
    compile_trainer(trainer, fallback="raise", regions="whole")
    trainer.train()
    report = hasten.compiler.compile_report(trainer.model)
    assert report.recompiles == () and report.graph_count == 1, str(report)
    assert trainer.optimizer.defaults.get("fused") is True


class Picky(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != 4:
            raise ValueError("expected 4 features")  # the user's own error
        return self.lin(x).relu()


def test_a_first_call_that_raised_still_compiles_on_the_next():
    model = hasten.compile(Picky(), fallback="raise", regions="whole")
    with pytest.raises(ValueError, match="expected 4 features"):
        model(torch.randn(2, 5))
    x = torch.randn(2, 4)
    torch.testing.assert_close(model(x), model.lin(x).relu(), rtol=RTOL, atol=ATOL)
    report = hasten.compiler.compile_report(model)
    assert report.graph_count == 1 and report.fallback is None, str(report)


_RUN = textwrap.dedent(
    """
    import sys, warnings, torch, hasten
    from torch import nn
    warnings.simplefilter("always")
    torch.manual_seed(0)
    m = hasten.compile(nn.Sequential(nn.Linear(4, 8), nn.ReLU()), cache_dir=sys.argv[1], regions="whole")
    m(torch.randn(3, 4)).sum().backward()
    r = hasten.compiler.compile_report(m)
    print("RESULT", r.graph_count, r.fallback)
    """
)


def _run(cache_dir):
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(cache_dir)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1], proc.stderr


@pytest.mark.parametrize("size", [0, 2000])  # "file too short" / a SIGBUS when mapped
def test_a_truncated_kernel_in_the_cache_is_rebuilt_not_an_eager_fallback(tmp_path, size):
    cache_dir = tmp_path / "cache"
    assert _run(cache_dir)[0] == "RESULT 1 None"  # cold: compiles, fills the cache
    kernels = sorted(cache_dir.glob("*/*.main.so"))
    assert kernels, sorted(str(p) for p in cache_dir.rglob("*"))
    for so in kernels:  # as a compile killed while writing them leaves them
        with open(so, "r+b") as f:
            f.truncate(size)
    result, stderr = _run(cache_dir)
    assert result == "RESULT 1 None", stderr[-3000:]  # compiled, no fallback to eager
    assert "corrupt entr" in stderr and "rebuilt" in stderr
    assert all(os.path.getsize(so) > 4096 for so in kernels)  # rebuilt whole
    assert _run(cache_dir)[0] == "RESULT 1 None"  # and the next run is fine too
