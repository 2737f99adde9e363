"""The shared core's small helpers: state from dataclasses, the length rule, dist outside DDP."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from hasten.sifting.core import dist
from hasten.sifting.core.forward import check_per_sample_losses, eval_modules
from hasten.sifting.core.length import PassShape, expected_batches, pass_batches, pass_shape
from hasten.sifting.core.state import TRANSIENT, from_state, load_state, to_state
from hasten.sifting.exceptions import LossImplementationNotProvidedException


@dataclass
class _S:
    n: int
    ids: list[int] = field(default_factory=list)
    t: torch.Tensor | None = None
    cache: dict = field(default_factory=dict, metadata=TRANSIENT)


def test_state_round_trips_persisted_fields_as_copies():
    s = _S(3, [1, 2], torch.arange(3), {"x": 1})
    state = to_state(s)
    assert set(state) == {"n", "ids", "t"}  # the transient cache is left out
    s.ids.append(9)
    s.t.add_(1)
    assert state["ids"] == [1, 2] and state["t"].tolist() == [0, 1, 2]  # no aliasing
    back = from_state(_S, {**state, "unrelated": 0})
    assert back.n == 3 and back.ids == [1, 2] and back.cache == {}
    load_state(back, {"n": 5})
    assert back.n == 5 and back.ids == [1, 2]
    with pytest.raises(ValueError, match="lacks"):
        from_state(_S, {"ids": []})


def test_length_rule_counts_delay_then_kept_samples():
    loader = DataLoader(range(100), batch_size=8)  # 13 batches, the last of 4
    shape = pass_shape(loader)
    assert shape == PassShape(batches=13, batch_size=8, samples=100, drop_last=False)
    assert pass_batches(shape, 0.5) == 7  # ceil(50 / 8)
    assert pass_batches(shape, 0.5, delay_batches=2) == 2 + 6  # ceil(0.5 * 84 / 8)
    dropping = pass_shape(DataLoader(range(100), batch_size=8, drop_last=True))
    assert dropping.samples == 96 and pass_batches(dropping, 0.5) == 6
    # the delay is spent once (or every pass with repeat_delay_per_epoch)
    assert expected_batches(shape, 0.5, sift_delay=2, repeat_delay_per_epoch=False, passes=2) == 15
    assert expected_batches(shape, 0.5, sift_delay=2, repeat_delay_per_epoch=True, passes=2) == 16
    custom = DataLoader(range(100), batch_sampler=_Batches())
    with pytest.raises(TypeError, match="batch_size=N"):
        pass_shape(custom, no_batch_size_fix="pass batch_size=N")
    assert pass_shape(custom, 8).samples == 13 * 8  # a custom sampler: full batches assumed


class _Batches:
    def __iter__(self):
        return iter(BatchSampler(SequentialSampler(range(100)), 8, False))

    def __len__(self):
        return 13


def test_dist_answers_for_one_process_outside_torch_distributed():
    assert not dist.is_distributed() and dist.world_size() == 1 and dist.rank() == 0
    assert dist.gather_counts(torch.tensor([3, 4])) == [[3, 4]]
    assert dist.all_gather_ints(7) == [7] and dist.all_gather_objects("s") == ["s"]
    assert dist.comm_device() == torch.device("cpu")


def test_eval_modules_restores_mixed_modes_and_the_loss_check_names_the_fix():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout())
    model[1].eval()
    with eval_modules(list(model.modules())):
        assert not any(m.training for m in model.modules())
        assert torch.is_inference_mode_enabled()
    assert [m.training for m in model.modules()] == [True, True, False]
    with pytest.raises(LossImplementationNotProvidedException, match="reduction='none'"):
        check_per_sample_losses(torch.tensor(1.0), 4, "f")
    with pytest.raises(LossImplementationNotProvidedException, match="floating point"):
        check_per_sample_losses(torch.arange(4), 4, "f")
