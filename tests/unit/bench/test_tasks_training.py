import itertools
import math
from dataclasses import replace

import pytest
import torch
from torch.utils.data import DataLoader

from hasten.bench.tasks import TASK_NAMES, get_task, lr_at
from hasten.bench.training import (
    FullData,
    IndexedDataset,
    as_batch,
    evaluate,
    train_run,
)

TINY = get_task("digits").with_(epochs=1)


class HalfKeeper:
    """Test policy: scores every batch with an extra forward, trains on its even rows."""

    name = "half"

    def describe(self):
        return {"policy": "half"}

    def start(self, ctx):
        outer = self

        class Run:
            def batches(self, loader, epoch):
                for batch in loader:
                    with torch.no_grad():
                        ctx.loss_fn(ctx.model, batch)
                    ctx.count_scored(len(batch[1]))
                    yield tuple(t[::2] for t in batch)

            def loss(self, losses, batch):
                return losses.mean()

            def epoch_reads(self, epoch, n):
                return n

        outer.run = Run()
        return outer.run


def test_lr_schedule_warms_up_then_decays_to_zero():
    assert lr_at(0.0, 1.0, 0.1) == 0.0
    assert lr_at(0.1, 1.0, 0.1) == pytest.approx(1.0)
    assert lr_at(1.0, 1.0, 0.1) == pytest.approx(0.0, abs=1e-12)
    xs = [lr_at(p / 100, 1.0, 0.1) for p in range(10, 101)]
    assert all(a >= b for a, b in itertools.pairwise(xs))


def test_indexed_dataset_serves_whole_batches_and_counts_reads():
    x, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    ds = IndexedDataset(x, y)
    loader = DataLoader(
        ds,
        batch_size=4,
        shuffle=True,
        collate_fn=as_batch,
        generator=torch.Generator().manual_seed(0),
    )
    seen = []
    for bx, by, idx in loader:
        assert torch.equal(bx, x[idx]) and torch.equal(by, y[idx])
        seen += idx.tolist()
    assert sorted(seen) == list(range(10)) and ds.reads == 10
    with pytest.raises(ValueError, match="differ in length"):
        IndexedDataset(x, y[:3])


def test_full_run_compute_is_three_units_per_sample_and_paired_by_seed():
    data = TINY.data()
    a = train_run(TINY, FullData(), seed=3, data=data)
    b = train_run(TINY, FullData(), seed=3, data=data)
    c = train_run(TINY, FullData(), seed=4, data=data)
    n = len(data.y_train)
    assert a.samples_backprop == n == a.samples_read
    assert a.samples_scored == 0 and a.compute == 3 * n
    assert a.steps == math.ceil(n / TINY.batch_size)
    assert a.flops == pytest.approx(a.compute * 2 * (64 * 128 + 128 * 10))  # MLP forward FLOPs
    assert a.test_acc == b.test_acc  # same seed: same weights, same data order
    assert a.test_acc != c.test_acc or a.curve != c.curve


def test_policy_compute_counts_scoring_forwards():
    data = TINY.data()
    rec = train_run(TINY, HalfKeeper(), seed=0, data=data)
    n = len(data.y_train)
    kept = sum(math.ceil(len(b) / 2) for b in torch.arange(n).split(TINY.batch_size))
    assert rec.samples_scored == n
    assert rec.samples_backprop == kept
    assert rec.compute == 3 * kept + n


@pytest.mark.parametrize("budget", [1, 100, 1000])
def test_budget_is_spent_exactly(budget):
    rec = train_run(TINY, FullData(), seed=0, budget=budget)
    assert rec.samples_backprop == budget and rec.compute == 3 * budget
    assert rec.budget == budget


def test_budget_longer_than_one_epoch_runs_on():
    data = TINY.data()
    n = len(data.y_train)
    rec = train_run(TINY, FullData(), seed=0, data=data, budget=n + 50)
    assert rec.samples_backprop == n + 50


def test_target_stops_at_first_evaluation_that_reaches_it():
    rec = train_run(TINY, FullData(), seed=0, evals_per_epoch=4, target=0.0)
    assert rec.reached_target_s is not None
    assert rec.curve[0]["samples_backprop"] == 0  # the untrained starting point
    assert len(rec.curve) == 2 and rec.samples_backprop < len(TINY.data().y_train)


def test_curve_points_and_bad_arguments():
    rec = train_run(TINY, FullData(), seed=0, evals_per_epoch=3)
    assert len(rec.curve) == 4  # the starting point and three evaluations
    assert rec.curve[-1]["samples_backprop"] == rec.samples_backprop
    walls = [p["wall_s"] for p in rec.curve]
    assert walls == sorted(walls)
    with pytest.raises(ValueError, match="budget"):
        train_run(TINY, FullData(), seed=0, budget=0)
    with pytest.raises(ValueError, match="evals_per_epoch"):
        train_run(TINY, FullData(), seed=0, evals_per_epoch=-1)


def test_evaluate_restores_mode():
    model = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Dropout(0.5))
    model.train()
    acc = evaluate(model, torch.randn(10, 4), torch.zeros(10, dtype=torch.int64))
    assert 0.0 <= acc <= 1.0 and model.training


def test_prepare_model_time_is_kept_apart_and_weights_restored():
    seen = {}

    def prepare(model):
        seen["before"] = {k: v.clone() for k, v in model.state_dict().items()}
        return model

    rec = train_run(TINY.with_(epochs=1), FullData(), seed=0, budget=1, prepare_model=prepare)
    plain = train_run(TINY.with_(epochs=1), FullData(), seed=0, budget=1)
    assert rec.compile_s is not None and rec.compile_s >= 0
    assert rec.test_acc == plain.test_acc  # warm-up steps were undone


def _tiny_pretraining(task):
    """The task's pretraining recipe cut to one epoch on little data (the real one takes
    minutes): what a test of the model build needs is a checkpoint, not a good one."""
    spec = task.pretrain
    if spec.objective == "classify":
        return replace(spec, epochs=1, dataset_kwargs={**spec.dataset_kwargs, "num_samples": 500})
    return replace(
        spec, epochs=1, batch_size=4096, targets=200, dataset_kwargs={"corpus_tokens": 64}
    )


@pytest.mark.parametrize("name", TASK_NAMES)
def test_task_models_build_and_score(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HASTEN_PRETRAINED_DIR", str(tmp_path))
    task = get_task(name)
    if name.startswith("mnist1d"):  # the real tasks generate 10,000-62,500 signals (seconds)
        task = task.with_(dataset_kwargs={"num_samples": 500})
    if name == "finetune-mnist1d":
        task = task.with_(dataset_kwargs={**task.dataset_kwargs, "num_samples": 500})
    if task.pretrain is not None:
        task = task.with_(pretrain=_tiny_pretraining(task))
    data = task.data()
    model = task.build_model(0, data)
    out = model(data.x_test[:3])
    assert out.shape == (3, data.num_classes)
    again = task.build_model(0, data)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), again.parameters()))
    with pytest.raises(ValueError, match="choose one of"):
        get_task("imagenet")


def test_pretrained_checkpoint_is_built_once_then_read_from_its_cache(tmp_path, monkeypatch):
    from hasten.bench import tasks

    monkeypatch.setenv("HASTEN_PRETRAINED_DIR", str(tmp_path))
    monkeypatch.setattr(tasks, "_LOADED", {})
    base = get_task("finetune-mnist1d")
    spec = _tiny_pretraining(base)
    built = tasks.pretrained_checkpoint(spec)
    files = list(tmp_path.glob(f"{spec.name}-{spec.key()}.pt"))
    assert len(files) == 1 and built["info"]["saved_to"] == str(files[0])
    monkeypatch.setattr(tasks, "_LOADED", {})  # a new process: read from disk, not rebuilt
    monkeypatch.setattr(tasks, "_pretrain", lambda s: pytest.fail("rebuilt a cached checkpoint"))
    read = tasks.pretrained_checkpoint(spec)
    assert read["info"]["loaded_from"] == str(files[0])
    assert read["info"]["sha256"] == built["info"]["sha256"]
    assert all(torch.equal(read["state"][k], built["state"][k]) for k in built["state"])
    # the fine-tune's body is the checkpoint's; its head is fresh (drawn from the seed)
    task = base.with_(pretrain=spec, dataset_kwargs={**base.dataset_kwargs, "num_samples": 500})
    model = task.build_model(0, task.data())
    for k, v in read["state"].items():
        assert torch.equal(model.state_dict()[k], v)
    # another recipe, or another data revision, is another checkpoint
    key = spec.key()
    assert replace(spec, epochs=2).key() != key
    monkeypatch.setitem(tasks.PRETRAINING_DATA_REVISIONS, spec.dataset, 2)
    assert spec.key() != key


def test_interleaved_runs_match_separate_runs_and_clocks_pause():
    import time

    from hasten.bench.training import train_iter

    data = TINY.data()
    gens = [train_iter(TINY, FullData(), seed=s, data=data, evals_per_epoch=3) for s in (0, 1)]
    records = {}
    t0 = time.perf_counter()
    slept = 0.0
    while gens:
        for g in list(gens):
            try:
                next(g)
            except StopIteration as done:
                records[done.value.seed] = done.value
                gens.remove(g)
            time.sleep(0.05)
            slept += 0.05
    elapsed = time.perf_counter() - t0
    for seed, rec in records.items():
        alone = train_run(TINY, FullData(), seed=seed, data=data, evals_per_epoch=3)
        assert rec.test_acc == alone.test_acc
        assert [p["test_acc"] for p in rec.curve] == [p["test_acc"] for p in alone.curve]
    # each run's clock ran only while it trained: never through the other run or the sleeps
    assert records[0].wall_s + records[1].wall_s < elapsed - slept + 0.05


def test_compiling_during_a_run_goes_to_compile_s_not_to_the_step_clock(monkeypatch):
    import time

    from hasten.bench import _hasten_api, training

    # A stand-in for a recompile in mid-run: each training forward "compiles" for 20 ms,
    # which the model's compile record reports.
    state = {"compiled": 0.0, "training": False}

    class SlowFirstCalls(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            if state["training"] and self.training:
                time.sleep(0.02)
                state["compiled"] += 0.02
            return self.inner(x)

    def prepare(model):
        return SlowFirstCalls(model)

    monkeypatch.setattr(_hasten_api, "compile_seconds", lambda m: state["compiled"])
    real_warm_up = training._warm_up

    def warm_up(*args, **kwargs):
        real_warm_up(*args, **kwargs)
        state["training"] = True  # from here on, the clock runs

    monkeypatch.setattr(training, "_warm_up", warm_up)
    rec = train_run(TINY.with_(epochs=1), FullData(), seed=0, prepare_model=prepare)
    assert state["compiled"] >= 0.02 * rec.steps > 0
    assert rec.compile_s >= state["compiled"]  # warm-up plus the mid-run compiling
    assert rec.wall_s < state["compiled"]  # a clock that included the sleeps would exceed it


def test_without_warm_up_the_compiling_is_on_the_run_and_counted_apart(monkeypatch):
    # The demo's compiled runs go as a user's script does: no warm-up before the clock; the
    # seconds the compile record reports still go to compile_s, not to the training clock.
    import time

    from hasten.bench import _hasten_api, training

    state = {"compiled": 0.0}

    class CompilesAtFirstCall(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            if self.training and state["compiled"] == 0.0:
                time.sleep(0.05)
                state["compiled"] = 0.05
            return self.inner(x)

    def no_warm_up(*args, **kwargs):
        raise AssertionError("warm_up=False must not warm the model up")

    monkeypatch.setattr(_hasten_api, "compile_seconds", lambda m: state["compiled"])
    monkeypatch.setattr(training, "_warm_up", no_warm_up)
    rec = train_run(
        TINY.with_(epochs=1), FullData(), seed=0, prepare_model=CompilesAtFirstCall, warm_up=False
    )
    assert rec.compile_s >= 0.05
    plain = train_run(TINY.with_(epochs=1), FullData(), seed=0)
    assert rec.test_acc == plain.test_acc  # same training: the wrapper changed no numbers


def test_mnist1d_large_is_the_same_recipe_on_at_least_50k_training_samples():
    large, small = get_task("mnist1d-large"), get_task("mnist1d")
    n = large.dataset_kwargs["num_samples"]
    assert large.dataset == small.dataset == "mnist1d"
    assert round(0.8 * n) >= 50_000  # make_dataset holds out 20 % as the test set
    for field in ("batch_size", "lr", "weight_decay", "warmup"):
        assert getattr(large, field) == getattr(small, field)
    tiny = large.with_(dataset_kwargs={"num_samples": 500})
    data = tiny.data()
    assert (len(data.y_train), len(data.y_test)) == (400, 100)
    model = tiny.build_model(0, data)
    assert type(model) is type(small.build_model(0, data))


def test_interleaved_runs_draw_dropout_from_streams_of_their_own():
    """Two paired runs of a model with dropout, interleaved, stay identical (each draws from
    its own seeded stream) and leave the caller's global RNG where it was; before, they shared
    the global stream, so the second run's masks differed from the first's."""
    from hasten.bench.training import run_interleaved, train_iter

    def build(d):
        return torch.nn.Sequential(
            torch.nn.Flatten(),
            torch.nn.Linear(d.x_train[0].numel(), 64),
            torch.nn.ReLU(),
            torch.nn.Dropout(0.5),
            torch.nn.Linear(64, d.num_classes),
        )

    task = TINY.with_(name="digits-dropout", _build=build)
    data = task.data()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    gens = {k: train_iter(task, FullData(), seed=0, data=data, evals_per_epoch=4) for k in "ab"}
    records = run_interleaved(gens)
    assert torch.equal(torch.get_rng_state(), before)
    curves = {k: [p["test_acc"] for p in r.curve] for k, r in records.items()}
    assert curves["a"] == curves["b"]
    assert len(curves["a"]) >= 4
    # and the stream is the seed's: another seed's run differs
    other = train_run(task, FullData(), seed=1, data=data, evals_per_epoch=4)
    assert [p["test_acc"] for p in other.curve] != curves["a"]
