"""Known traps are found, fixed when the fix is exact, and named (no compiling here)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from hasten.compiler.traps import apply_fixes, unwrap_data_parallel
from tests._models import tiny_bert_classifier

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


def _gpt2() -> nn.Module:
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32, n_positions=8)
    return transformers.GPT2LMHeadModel(cfg)


def test_gpt2_loss_type_is_set_to_the_default_it_falls_back_to():
    model = _gpt2()
    assert model.loss_type is None  # the trap: unset, so forward logs a warning (graph break)
    ids = torch.randint(0, 32, (2, 8))
    torch.manual_seed(0)
    before = model(input_ids=ids, labels=ids).loss
    notes = apply_fixes(model)
    assert model.loss_type == "ForCausalLM"
    assert any("loss_type" in n for n in notes)
    torch.manual_seed(0)
    after = model(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(after, before, rtol=0, atol=0)  # exactly the same loss
    assert set(model.state_dict()) == set(_gpt2().state_dict())


def test_trap_is_only_named_when_fixing_is_off():
    model = _gpt2()
    notes = apply_fixes(model, fix=False)
    assert model.loss_type is None
    assert any("set model.loss_type='ForCausalLM'" in n for n in notes)


def test_kv_cache_in_training_is_named_not_changed():
    model = _gpt2().train()
    notes = apply_fixes(model)
    assert any("use_cache" in n for n in notes)
    assert model.config.use_cache is True


def test_recognised_loss_type_and_plain_modules_are_left_alone():
    bert = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            num_hidden_layers=1,
            hidden_size=16,
            num_attention_heads=2,
            intermediate_size=32,
            vocab_size=32,
        )
    )
    assert apply_fixes(bert) == []
    assert apply_fixes(nn.Sequential(nn.Linear(2, 2))) == []


def test_nested_transformers_model_reported_once():
    outer = nn.Sequential(_gpt2())
    notes = [n for n in apply_fixes(outer) if "loss_type" in n]
    assert len(notes) == 1 and notes[0].startswith("0 (GPT2LMHeadModel)")


def test_ddp_wrapped_module_is_unwrapped_for_compiling(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        inner = nn.Sequential(nn.Linear(4, 4))
        target, note = unwrap_data_parallel(DDP(inner))
        assert target is inner
        assert note is not None and "nn.Sequential" in note
        assert unwrap_data_parallel(inner) == (inner, None)
    finally:
        dist.destroy_process_group()


def _bert_classifier(num_labels: int = 2) -> nn.Module:
    return tiny_bert_classifier(num_labels=num_labels)


@pytest.mark.parametrize(
    ("num_labels", "labels", "expected"),
    [
        (2, torch.tensor([0, 1]), "single_label_classification"),
        (1, torch.tensor([0.5, 1.0]), "regression"),
        (3, torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]), "multi_label_classification"),
    ],
)
def test_problem_type_is_set_before_the_first_call_as_the_model_would(num_labels, labels, expected):
    from hasten.compiler.traps import call_fixes

    eager = _bert_classifier(num_labels)
    ids = torch.randint(0, 32, (2, 8))
    eager(input_ids=ids, labels=labels)
    assert eager.config.problem_type == expected  # what the model sets itself
    model = _bert_classifier(num_labels)
    fixes, notes = call_fixes(model)
    assert len(fixes) == 1 and notes == []
    assert fixes[0](model, (), {"input_ids": ids}) is False  # no labels: wait for a call with them
    assert model.config.problem_type is None
    assert fixes[0](model, (), {"input_ids": ids, "labels": labels}) is True
    assert model.config.problem_type == expected


def test_problem_type_trap_is_named_when_fixing_is_off_and_absent_when_set():
    from hasten.compiler.traps import call_fixes

    fixes, notes = call_fixes(_bert_classifier(), fix=False)
    assert fixes == [] and "config.problem_type is None" in notes[0]
    model = _bert_classifier()
    model.config.problem_type = "single_label_classification"
    assert call_fixes(model) == ([], [])
    assert call_fixes(_gpt2()) == ([], [])  # its forward never reads problem_type


def test_batch_size_is_the_common_dim0_size():
    from hasten.compiler.traps import batch_size

    ids, mask, labels = torch.zeros(4, 8), torch.ones(4, 8), torch.zeros(4)
    assert batch_size((ids,), {"mask": mask, "labels": labels, "table": torch.zeros(3, 5)}) == 4
    assert batch_size((), {"x": 3, "s": torch.tensor(1.0)}) is None


def test_a_rare_other_batch_size_runs_eagerly_until_they_are_not_rare():
    from hasten.compiler.traps import OddBatches

    odd = OddBatches()
    # an epoch of 8 full batches and a short last one, twice: only the short ones go eager
    sizes = [16] * 8 + [15] + [16] * 8 + [15]
    assert [odd.run_eagerly(s) for s in sizes] == [s == 15 for s in sizes]
    assert odd.size == 16 and odd.odd == 2 and odd.active
    # a short batch as early as the second call (a short epoch) still runs eagerly, once
    early = OddBatches()
    assert [early.run_eagerly(s) for s in (32, 31, 32, 32)] == [False, True, False, False]
    # batch sizes that keep changing: the first other one runs eagerly, then TorchDynamo gets
    # them all from the first that is not rare
    changing = OddBatches()
    got = [changing.run_eagerly(s) for s in (16, 16, 9, 10, 11)]
    assert got == [False, False, True, False, False] and not changing.active
    assert OddBatches().run_eagerly(None) is False
