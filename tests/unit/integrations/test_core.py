"""The integration core (hasten.integrations.core), once, and through each adapter that uses it:
the run's length, the pruned passes (plan, feedback, resume), the LR catch-up, per-rank state."""

from __future__ import annotations

import types

import pytest
import torch
from torch.utils.data import DataLoader

from hasten.integrations.core import (
    PrunedPasses,
    RankState,
    catch_up,
    full_data_steps,
    training_calls,
)
from hasten.sifting import PruningSampler, StaleRelativePruningConfig
from tests._helpers import PlantedDataset, ids_of

N, BATCH = 96, 8  # 12 batches a full pass


def _config():
    return StaleRelativePruningConfig(beta_value=1.0, max_loss_age=None, guard=None)


def _passes(accumulation=1, by_steps=False, epochs=3, seed=0):
    sampler = PruningSampler(N, _config(), num_epochs=None if by_steps else epochs, seed=seed)
    loader = DataLoader(PlantedDataset(N), batch_size=BATCH, sampler=sampler)
    return PrunedPasses(loader, sampler, accumulation=accumulation, by_steps=by_steps)


def _train(stream, batches=None):
    """Feed back every batch of one ``for`` loop (planted losses); the batches' sample ids."""
    out = []
    for batch in stream:
        out.append(ids_of(batch))
        stream.feed_back(batch[0][:, 0].clone().requires_grad_())
        if batches is not None and len(out) == batches:
            break
    return out


# ---------------------------------------------------------------------------------- run length


def test_training_calls_count_micro_batches_or_stay_unknown():
    assert training_calls(15, 2) == 30
    assert training_calls(7.2) == 8  # fractional epochs round up
    for unknown in (None, float("inf"), 0, -1, True):
        assert training_calls(unknown, 4) is None


# ---------------------------------------------------------------------------------- passes


def test_one_loop_is_one_pruned_pass_trimmed_to_whole_steps():
    stream = _passes(accumulation=5)
    assert len(stream) == stream.planned == 12  # the first, full pass: what the trainer plans by
    first = _train(stream)
    assert len(first) == 12  # the full pass keeps its short last step (the trainer plans it)
    assert sorted(i for b in first for i in b) == list(range(N))
    second = _train(stream)
    assert stream.pass_index == 1 and len(second) % 5 == 0 and len(second) < 12
    assert stream.pass_length == len(second) == stream.fed_back
    ids = [i for b in second for i in b]
    assert len(ids) == len(set(ids))  # each kept sample once
    _train(stream)
    assert stream.done and _train(stream) == []  # after num_epochs passes: nothing


def test_by_steps_loops_are_blocks_of_whole_steps_across_passes():
    stream = _passes(accumulation=4, by_steps=True)
    assert len(stream) == stream.block == 12
    loops = [_train(stream) for _ in range(4)]
    assert all(len(loop) == 12 for loop in loops)
    assert stream.pass_index >= 4  # pruned passes are shorter than a block


def test_resume_mid_pass_yields_the_rest_of_the_pass():
    reference = _passes(seed=3)
    full = _train(reference) + _train(reference)
    first = _passes(seed=3)
    head = _train(first) + _train(first, batches=2)
    state = first.state_dict()
    resumed = _passes(seed=3)
    resumed.load_state_dict(state)
    assert head + _train(resumed) == full
    with pytest.raises(ValueError, match="by steps"):
        _passes(by_steps=True).load_state_dict(state)


# ---------------------------------------------------------------------------------- LR catch-up


def test_full_data_steps_is_the_share_of_a_full_pass():
    # a full-data pass (done of 12, planned 12) gives the step just taken
    assert [full_data_steps(0, d, 12, 12, 1) for d in (1, 6, 12)] == [1, 6, 12]
    # a pruned pass of 4 batches stands for the 3 steps of a full one (accumulation 4)
    assert full_data_steps(2, 2, 4, 12, 4) == 2 * 3 + 1
    assert full_data_steps(2, 9, 4, 12, 4) == 9  # never past the pass's end
    assert full_data_steps(3, 0, 0, 12, 4) == 9  # not started: its start


def _lambda_scheduler():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 10))


def test_catch_up_steps_to_the_target_capped_never_back():
    sched = _lambda_scheduler()
    catch_up([sched, None], 4)
    assert sched.last_epoch == 4
    catch_up([sched], 2)  # behind already: left
    assert sched.last_epoch == 4
    catch_up([sched], 50, cap=10)
    assert sched.last_epoch == 10 and sched.get_last_lr()[0] == 0.0
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    catch_up([plateau], 5)  # stepped by a metric, not by steps
    assert plateau.last_epoch == 0


def _stream_at(pass_index, fed_back, pass_length, planned=12):
    stream = _passes()
    stream.pass_index, stream.fed_back, stream.pass_length = pass_index, fed_back, pass_length
    stream.planned = planned
    return stream


def test_the_hf_adapter_catches_up_through_the_core():
    pytest.importorskip("transformers")
    from hasten.integrations.transformers import SiftingCallback

    stream = _stream_at(pass_index=1, fed_back=3, pass_length=6)  # half of pass 1: 12 + 6
    sched = _lambda_scheduler()
    state = types.SimpleNamespace(max_steps=100, epoch=0.0)
    control = types.SimpleNamespace(should_training_stop=False)
    SiftingCallback().on_step_end(None, state, control, train_dataloader=stream, lr_scheduler=sched)
    assert sched.last_epoch == full_data_steps(1, 3, 6, 12) == 18
    assert state.epoch == pytest.approx(1.5)


def test_the_lightning_adapter_catches_up_through_the_core():
    pytest.importorskip("lightning")
    from hasten.integrations.lightning import Sifting

    stream = _stream_at(pass_index=2, fed_back=4, pass_length=4)  # end of pruned pass 2
    sched = _lambda_scheduler()
    step = types.SimpleNamespace(scheduler=sched, interval="step", frequency=1)
    epoch = types.SimpleNamespace(scheduler=_lambda_scheduler(), interval="epoch", frequency=1)
    trainer = types.SimpleNamespace(
        accumulate_grad_batches=2,
        lr_scheduler_configs=[step, epoch],
        estimated_stepping_batches=100,
    )
    Sifting(_config())._catch_up_schedules(trainer, stream)
    assert sched.last_epoch == full_data_steps(2, 4, 4, 12, 2) == 18
    assert epoch.scheduler.last_epoch == 0  # epoch-interval schedulers are Lightning's
    trainer.estimated_stepping_batches = 10
    stream.pass_index = 5
    Sifting(_config())._catch_up_schedules(trainer, stream)
    assert sched.last_epoch == 18  # capped at the plan: never past it, never back


# ---------------------------------------------------------------------------------- rank state

_STATE = RankState("ranks", not_ours="not ours: fix it", other_world="{saved} vs {world}: fix")


def test_rank_state_gathered_into_one_checkpoint():
    saved = _STATE.gather({"a": 1})
    assert saved == {"world_size": 1, "ranks": [{"a": 1}]}
    assert _STATE.own(saved) == {"a": 1}
    with pytest.raises(ValueError, match="2 vs 1: fix"):
        _STATE.own({"world_size": 2, "ranks": [{"a": 1}, {"a": 2}]})
    with pytest.raises(ValueError, match="not ours"):
        _STATE.own({"loader": {}})


def test_rank_state_one_file_per_rank(tmp_path):
    path = _STATE.save_file(str(tmp_path / "checkpoint-3"), 0, {"t": torch.ones(2)})
    assert path.endswith("checkpoint-3/hasten_sifting_rank0.pt")
    assert torch.equal(_STATE.load_file(path)["t"], torch.ones(2))
    torch.save({"world_size": 2, "ranks": {}}, path)
    with pytest.raises(ValueError, match=r"2 vs 1: fix.*delete"):
        _STATE.load_file(path)
    torch.save({"loader": 1}, path)  # an earlier hasten's bare state
    assert _STATE.load_file(path) == {"loader": 1}
    torch.save({"x": StaleRelativePruningConfig()}, path)  # needs pickle
    with pytest.raises(RuntimeError, match="weights_only=True"):
        _STATE.load_file(path)


@pytest.mark.parametrize("adapter", ["hf", "lightning"])
def test_every_adapter_checkpoints_through_the_core(adapter):
    if adapter == "hf":
        pytest.importorskip("transformers")
        from hasten.integrations import transformers as mod

        assert isinstance(mod._RANK_STATE, RankState)
    else:
        pytest.importorskip("lightning")
        from hasten.integrations import lightning as mod

        assert isinstance(mod._STREAM_STATE, RankState)
        assert isinstance(mod._PRUNING_STATE, RankState)
        sampler = PruningSampler(N, _config())
        loader = mod._StatefulPrunedLoader(
            DataLoader(PlantedDataset(N), BATCH, sampler=sampler), sampler
        )
        assert isinstance(loader, PrunedPasses)
        state = loader.state_dict()
        assert state["world_size"] == 1 and "sampler" in state["pruning"][0]
        loader.load_state_dict(state)
        bare = {"world_size": 1, "pruning": [sampler.state_dict()]}  # an earlier hasten's
        loader.load_state_dict(bare)
        assert loader.pass_index == 0 and loader.fed_back == 0
