"""The integration core (hasten.integrations.core), once, and the same tests through every adapter
that uses it (Hugging Face, Lightning, Keras): plan an epoch, feed back per-sample losses, the
run's length, the LR catch-up, resume mid-run, per-rank state and shards. Where Keras has no such
capability the parametrization is skipped with why (NO_KERAS_RESUME, NO_KERAS_RANKS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

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
from hasten.sifting import PruningSampler, StaleRelativePruningConfig, UnbiasedPruningConfig
from tests._helpers import PlantedDataset, ids_of, planted_x, tiny_model

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


# ---------------------------------------------------------------------------------- every adapter
#
# One scenario through each adapter as its trainer drives it: the planted dataset (sample i's
# loss is x[i, 0]), batches of 8 (12 a full-data epoch), EPOCHS epochs, seed SEED, the planted
# losses fed back. The Hugging Face adapter runs in a real Trainer (get_train_dataloader,
# training_step -> compute_loss, SiftingCallback.on_step_end / on_save); Lightning's callback
# builds its loader and wraps training_step as Lightning calls them; Keras runs a real
# model.fit in a subprocess (keras_core_checks.py: Keras fixes its backend at import).

EPOCHS, SEED, FULL = 3, 5, N // BATCH
CONFIGS = {
    "unbiased": UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.0, guard=None),
    "stale": StaleRelativePruningConfig(beta_value=1.0, max_loss_age=None, guard=None),
}
# Keras through a real fit on each backend it supports (a fresh interpreter each: Keras fixes its
# backend at import)
KERAS_BACKENDS = ("torch", "tensorflow")
ADAPTERS = ["hf", "lightning"] + [
    pytest.param(f"keras-{b}", marks=pytest.mark.slow) for b in KERAS_BACKENDS
]
NO_KERAS_RESUME = (
    "Keras fit has no data-position resume to adapt: BackupAndRestore saves the weights, the "
    "optimizer and the epoch number and restarts that epoch from its start, and a PyDataset's "
    "state is in no Keras checkpoint; a resumed fit re-plans from a fresh SiftingPyDataset"
)
NO_KERAS_RANKS = (
    "the Keras adapter is single-process: its planner is a PruningSampler with num_replicas=1, "
    "and Keras fit has no multi-process data parallelism on the torch or TensorFlow backends "
    "(MirroredStrategy is one process), so there are no per-rank states or shards"
)


def _flat(batches):
    return [i for b in batches for i in b]


def _planted(batch):
    return planted_x(batch)[:, 0]


class _Reference:
    """The PruningSampler driven directly: what every adapter's epochs must be."""

    def __init__(self, config):
        self.sampler = PruningSampler(N, config, num_epochs=EPOCHS, seed=SEED)
        self.loader = DataLoader(PlantedDataset(N), batch_size=BATCH, sampler=self.sampler)

    def run(self):
        batches, losses, lengths = [], [], []
        for epoch in range(EPOCHS):
            self.sampler.set_epoch(epoch)
            lengths.append(len(self.loader))
            for batch in self.loader:
                batches.append(ids_of(batch))
                losses.append(float(self.sampler.update(_planted(batch))))
        return batches, losses, lengths


class _HF:
    """A Hugging Face Trainer with enable_sifting, stepped as Trainer.train steps it."""

    def __init__(self, config, tmp_path, **args):
        transformers = pytest.importorskip("transformers")
        pytest.importorskip("accelerate")
        from hasten.integrations import transformers as adapter

        self.adapter = adapter
        targs = transformers.TrainingArguments(
            str(tmp_path),
            per_device_train_batch_size=BATCH,
            num_train_epochs=EPOCHS,
            report_to=[],
            use_cpu=True,
            remove_unused_columns=False,  # the planted samples' x: no model signature to fit
            **args,
        )
        model = tiny_model()
        self.trainer = transformers.Trainer(
            model=model, args=targs, train_dataset=PlantedDataset(N, fmt="dict")
        )
        adapter.enable_sifting(
            self.trainer,
            config,
            loss=lambda m, b: _planted(b) + 0.0 * m(b["x"]).sum(-1),
            seed=SEED,
        )
        self.trainer.current_gradient_accumulation_steps = 1  # what Trainer.train sets per step
        self.callback = next(
            c
            for c in self.trainer.callback_handler.callbacks
            if isinstance(c, adapter.SiftingCallback)
        )
        self.scheduler = _lambda_scheduler()
        self.state = types.SimpleNamespace(max_steps=EPOCHS * FULL, epoch=0.0, global_step=0)
        self.control = types.SimpleNamespace(should_training_stop=False)
        self.stream = None

    def loader(self):
        self.stream = self.trainer.get_train_dataloader()
        return self.stream

    def step(self, batch):
        loss = self.trainer.training_step(self.trainer.model, batch)
        self.scheduler.optimizer.step()  # (no gradients: nothing moves)
        self.scheduler.step()  # the Trainer steps its scheduler, then the callbacks run
        self.state.global_step += 1
        self.callback.on_step_end(
            self.trainer.args,
            self.state,
            self.control,
            train_dataloader=self.stream,
            lr_scheduler=self.scheduler,
        )
        return float(loss), self.scheduler.last_epoch

    def save(self):
        self.callback.on_save(
            self.trainer.args, self.state, self.control, train_dataloader=self.stream
        )
        folder = f"{self.trainer.args.output_dir}/checkpoint-{self.state.global_step}"
        return self.adapter._state_file(folder, 0)

    def resume(self, saved):  # what trainer.train(resume_from_checkpoint=...) sets up
        setattr(self.trainer, self.adapter._RESUME, saved)
        try:
            return self.loader()
        finally:
            setattr(self.trainer, self.adapter._RESUME, None)


class _Module:
    def training_step(self, batch, batch_idx):
        losses = _planted(batch)
        return {"loss": losses.mean(), "per_sample_loss": losses}


class _Lightning:
    """Lightning's Sifting callback: the loader it gives Lightning, its wrapped training_step,
    its step-end catch-up, as a Lightning fit by max_epochs calls them."""

    def __init__(self, config, tmp_path=None, world=1, rank=0):
        pytest.importorskip("lightning")
        from hasten.integrations.lightning import Sifting

        self.callback = Sifting(config, seed=SEED)
        self.scheduler = _lambda_scheduler()
        step = types.SimpleNamespace(scheduler=self.scheduler, interval="step", frequency=1)
        self.trainer = types.SimpleNamespace(
            max_epochs=EPOCHS,
            max_steps=-1,
            world_size=world,
            global_rank=rank,
            accumulate_grad_batches=1,
            lr_scheduler_configs=[step],
            estimated_stepping_batches=EPOCHS * FULL,
        )
        self.module = _Module()
        self.callback._patch_training_step(self.module)
        self.stream = None
        self.epoch = -1

    def loader(self):
        data = DataLoader(PlantedDataset(N), batch_size=BATCH, shuffle=True)
        self.stream = self.callback._pruned_loader(self.trainer, data)
        return self

    def __iter__(self):  # Lightning's fit loop: set_epoch on the loader's sampler, then iter
        self.epoch += 1
        self.stream.sampler.set_epoch(self.epoch)
        return iter(self.stream)

    def step(self, batch):
        out = self.module.training_step(batch, 0)
        self.scheduler.optimizer.step()
        self.scheduler.step()
        self.callback._catch_up_schedules(self.trainer, self.stream)
        return float(out["loss"]), self.scheduler.last_epoch

    def save(self):  # Lightning's checkpoint: the loader's state and the epoch in progress
        return self.stream.state_dict(), self.epoch

    def resume(self, saved):
        self.loader()
        state, self.epoch = saved
        self.epoch -= 1  # the restored fit loop calls set_epoch(epoch in progress) again
        self.stream.load_state_dict(state)
        return self


_MAKERS = {"hf": _HF, "lightning": _Lightning}


def _drive(adapter, loader, epochs=EPOCHS, stop_after=None):
    """Train ``epochs`` for-loops of ``loader`` through ``adapter`` (at most ``stop_after``
    batches): the batches' ids, the losses trained on, the schedule after each step."""
    batches, losses, positions = [], [], []
    for _ in range(epochs):
        for batch in loader:
            batches.append(ids_of(batch))
            loss, position = adapter.step(batch)
            losses.append(loss)
            positions.append(position)
            if stop_after is not None and len(batches) == stop_after:
                return batches, losses, positions
    return batches, losses, positions


_KERAS_RUNS: dict[str, dict] = {}


def _keras_run(adapter):
    """keras_core_checks.py's results on the backend ``adapter`` names, run once per backend."""
    backend = adapter.removeprefix("keras-")
    pytest.importorskip("keras")
    if backend == "tensorflow":
        pytest.importorskip("tensorflow")
    if backend not in _KERAS_RUNS:
        _KERAS_RUNS[backend] = _keras_subprocess(backend)
    assert _KERAS_RUNS[backend]["backend"] == backend
    return _KERAS_RUNS[backend]


def _keras_subprocess(backend):
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    env["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("keras_core_checks.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise AssertionError(f"Keras checks failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def _run(adapter, config_name, tmp_path):
    """The scenario through ``adapter``: batches, losses, schedule positions, the sampler."""
    if adapter.startswith("keras"):
        k = _keras_run(adapter)[config_name]
        assert k["misattributed"] == 0.0  # every stored loss is its own sample's
        assert k["fed_back"] == k["kept"] and k["not_fed_back"] == 0
        return k["batches"], k["losses"], k["positions"], k
    run = _MAKERS[adapter](CONFIGS[config_name], tmp_path)
    batches, losses, positions = _drive(run, run.loader())
    stats = run.stream.sampler.stats
    assert stats.samples_fed_back == stats.samples_kept and stats.samples_not_fed_back == 0
    assert torch.equal(run.stream.sampler.table.losses, PlantedDataset(N).x[:, 0])
    return batches, losses, positions, run


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_adapter_trains_the_samplers_pruned_epochs(adapter, config_name, tmp_path):
    # plan + feedback: each trainer epoch is the sampler's pruned epoch, batch for batch, and
    # the loss trained on is the sampler's weighted mean of the planted losses
    ref_batches, ref_losses, lengths = _Reference(CONFIGS[config_name]).run()
    batches, losses, _, _ = _run(adapter, config_name, tmp_path)
    assert batches == ref_batches
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert lengths[0] == FULL and sorted(_flat(ref_batches[:FULL])) == list(range(N))
    assert all(n < FULL for n in lengths[1:])  # pruned: shorter epochs, each kept sample once
    for e in range(1, EPOCHS):
        start = sum(lengths[:e])
        ids = _flat(ref_batches[start : start + lengths[e]])
        assert len(ids) == len(set(ids))


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_adapter_indexes_the_lr_schedule_by_full_data_steps(adapter, tmp_path):
    # after each step of pruned epoch p (k of its L batches done) the schedule stands where a
    # full-data run would: full_data_steps(p, k, L, 12); the run ends at the schedule's end
    _, _, lengths = _Reference(CONFIGS["unbiased"]).run()
    expected = [
        full_data_steps(p, k, n, FULL) for p, n in enumerate(lengths) for k in range(1, n + 1)
    ]
    _, _, positions, run = _run(adapter, "unbiased", tmp_path)
    assert positions == expected
    assert positions[-1] == EPOCHS * FULL > sum(lengths)  # the end, with fewer steps taken
    if adapter.startswith("keras"):  # the fit put the user's schedule back: by iterations again
        assert run["schedule_after"] == "StepAsRate" and run["lr_after"] == run["iterations"]
        # a checkpoint written during the fit loads with the user's schedule, not the wrapper
        assert run["reloaded_schedule"] == "StepAsRate"
        # Keras's TensorFlow backend counts one optimizer iteration more per epoch that ends
        # before its planned steps, with no training step for it (measured on a plain fit of a
        # PyDataset that shrinks, without hasten: train_step ran once a batch); torch counts
        # the steps taken
        ended_early = sum(n < FULL for n in lengths) if adapter == "keras-tensorflow" else 0
        assert run["iterations"] == sum(lengths) + ended_early


@pytest.mark.parametrize("adapter", ["hf", "lightning"])
def test_the_catch_up_is_capped_at_the_runs_planned_steps(adapter, tmp_path):
    # the catch-up never takes a schedule past the steps the trainer planned (the trainer's own
    # stepping may); Keras caps at its fit's epochs x a full epoch, which is the last target
    _, _, lengths = _Reference(CONFIGS["unbiased"]).run()
    run = _MAKERS[adapter](CONFIGS["unbiased"], tmp_path)
    if adapter == "hf":
        run.state.max_steps = 20
    else:
        run.trainer.estimated_stepping_batches = 20
    _, _, positions = _drive(run, run.loader())
    targets = [
        full_data_steps(p, k, n, FULL) for p, n in enumerate(lengths) for k in range(1, n + 1)
    ]
    expected, position = [], 0
    for target in targets:  # the trainer's own step, then the catch-up: never back, capped
        position = max(position + 1, min(target, 20))
        expected.append(position)
    assert positions == expected and 20 in positions and max(targets) > 20


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_adapter_tells_the_compile_plan_the_runs_training_calls(adapter, tmp_path):
    # EPOCHS epochs of 12 batches: 36 training calls (micro-batches), however they are grouped
    # into optimizer steps; unknown stays unknown (the plan learns it as the run goes)
    if adapter == "hf":
        from hasten.integrations.transformers import _training_calls

        trainer = _HF(CONFIGS["stale"], tmp_path, gradient_accumulation_steps=2).trainer
        known = _training_calls(trainer)
        trainer.train_dataset = iter(range(N))  # no len(): an iterable dataset
        unknown = _training_calls(trainer)
    elif adapter == "lightning":
        pytest.importorskip("lightning")
        from hasten.integrations.lightning import fit_training_calls

        fit = types.SimpleNamespace(estimated_stepping_batches=EPOCHS * FULL // 2)
        fit.accumulate_grad_batches = 2
        known = fit_training_calls(fit)
        fit.estimated_stepping_batches = float("inf")  # an endless fit
        unknown = fit_training_calls(fit)
    else:
        k = _keras_run(adapter)["unbiased"]
        known, unknown = k["run_length"], k["run_length_unknown"]
    assert known == training_calls(EPOCHS * FULL) == 36
    assert unknown is None


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_adapter_resumes_mid_run_exactly(adapter, tmp_path):
    if adapter.startswith("keras"):
        pytest.skip(NO_KERAS_RESUME)
    config = CONFIGS["unbiased"]
    make = _MAKERS[adapter]
    whole = make(config, tmp_path / "whole")
    reference = _drive(whole, whole.loader())[0]
    cut = FULL + 3  # 3 batches into the first pruned epoch
    first = make(config, tmp_path / "first")
    head = _drive(first, first.loader(), stop_after=cut)[0]
    saved = first.save()
    second = make(config, tmp_path / "second")
    rest = _drive(second, second.resume(saved), epochs=EPOCHS - 1)[0]
    assert head + rest == reference


def _two_ranks(monkeypatch, rank):
    from hasten.sifting.core import dist

    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "rank", lambda: rank)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_adapter_shards_by_rank_and_keeps_each_ranks_state(adapter, tmp_path, monkeypatch):
    if adapter.startswith("keras"):
        pytest.skip(NO_KERAS_RANKS)
    config = CONFIGS["unbiased"]
    runs = []
    for rank in (0, 1):
        if adapter == "hf":
            import transformers

            monkeypatch.setattr(transformers.TrainingArguments, "world_size", property(lambda a: 2))
            monkeypatch.setattr(
                transformers.TrainingArguments, "process_index", property(lambda a, r=rank: r)
            )
            run = _HF(config, tmp_path / f"rank{rank}")
            monkeypatch.undo()
        else:
            run = _Lightning(config, world=2, rank=rank)
        run.loader()
        sampler = run.stream.sampler
        assert (sampler.num_replicas, sampler.rank) == (2, rank)
        runs.append(run)
    shards = [_flat(ids_of(b) for b in r.stream) for r in runs]
    assert len(shards[0]) == len(shards[1]) == N // 2  # equal counts, all data between them
    assert sorted(shards[0] + shards[1]) == list(range(N))
    # each rank's state is saved with the world size and comes back to that rank only
    # (Lightning's loader gathers every rank's state: each rank's own is the core's, beneath it)
    own = [PrunedPasses.state_dict(r.stream) for r in runs]
    if adapter == "hf":
        _two_ranks(monkeypatch, 1)
        path = runs[1].adapter._RANK_STATE.save_file(str(tmp_path / "ckpt"), 1, own[1])
        assert runs[1].adapter._RANK_STATE.load_file(path)["pass_index"] == 0
        monkeypatch.undo()
        with pytest.raises(ValueError, match="2 process"):
            runs[1].adapter._load_stream_state(runs[1].stream, path)
    else:
        from hasten.integrations import lightning

        _two_ranks(monkeypatch, 1)
        monkeypatch.setattr(
            lightning._PRUNING_STATE, "gather", lambda s: {"world_size": 2, "pruning": own}
        )
        saved = runs[1].stream.state_dict()
        assert lightning._PRUNING_STATE.own(saved) is own[1]
        runs[1].stream.load_state_dict(saved)
        monkeypatch.undo()
        with pytest.raises(ValueError, match="2 process"):
            runs[1].stream.load_state_dict(saved)


def test_lightning_resumes_an_earlier_hastens_bare_sampler_state():
    # a Lightning checkpoint written before the pruned passes had state: the sampler's alone
    pytest.importorskip("lightning")
    from hasten.integrations import lightning

    assert isinstance(lightning._STREAM_STATE, RankState)
    run = _Lightning(CONFIGS["stale"]).loader()
    bare = {"world_size": 1, "pruning": [run.stream.sampler.state_dict()]}
    run.stream.load_state_dict(bare)
    assert run.stream.pass_index == 0 and run.stream.fed_back == 0
