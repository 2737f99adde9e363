"""The pruning policies in the sift experiment: exact compute accounting, only kept samples read."""

from __future__ import annotations

import dataclasses

import pytest

from hasten.bench import pruning_policies as pp
from hasten.bench import sift_experiment as se
from hasten.bench.tasks import get_task
from hasten.bench.training import FullData, train_run


def test_families_are_registered_and_named():
    config = se.SiftExperimentConfig(tasks=("digits",), seeds=1, betas=(1.0,))
    names = [p.name for p in se.POLICY_FAMILIES["unbiased"](config, 100)]
    assert names == [pp._label("unbiased", s) for s in pp.UNBIASED_SETTINGS]
    assert len(set(names)) == len(names)
    stale = se.POLICY_FAMILIES["stale"](config, 100)
    assert [p.name for p in stale] == ["stale-b1-fed", "stale-b1-age2-bf16", "stale-b0.5-fed"]
    assert stale[1].describe()["scorer"] == {"batch_size": 1024, "autocast_dtype": "bfloat16"}
    tuned = se.POLICY_FAMILIES["tuned"](config, 100)
    assert len(tuned) == len(pp.TUNED_SETTINGS) and tuned[0].name == "stale-b1-fed"
    for policy, settings in zip(tuned, pp.TUNED_SETTINGS):
        assert policy.scorer is None  # fed-back losses only: no scoring forward
        assert policy.config == {"policy": "stale_relative", **settings}
        a = settings["anneal_fraction"]
        assert policy.name.endswith(f"-a{a:g}") == bool(a)


@pytest.mark.slow
def test_unbiased_policy_reads_only_kept_samples_and_counts_compute():
    task = get_task("digits").with_(epochs=4)
    policy = pp.PrunePolicy(
        "u", {"policy": "unbiased", "prune_ratio": 0.9, "anneal_fraction": 0.25}
    )
    rec = train_run(task, policy, seed=0)
    full = train_run(task, FullData(), seed=0)
    assert rec.samples_scored == 0
    assert rec.compute == 3 * rec.samples_backprop
    assert rec.samples_backprop < full.samples_backprop
    assert rec.samples_read == rec.samples_backprop  # pruned before loading: never read
    assert rec.info["config"]["prune_ratio"] == 0.9
    sift = rec.info["sifting"]  # what the sampler left out, in its own words
    n = len(task.data().y_train)
    assert sift["samples_planned"] == 4 * n and sift["epochs_planned"] == 4
    assert sift["samples_kept"] == rec.samples_backprop  # audited samples count as trained
    assert sift["samples_left_out"] == 4 * n - rec.samples_backprop
    assert sift["summary"].startswith("hasten sifting: trained on")
    assert "sifting" not in full.info
    again = train_run(task, policy, seed=0)
    assert (again.test_acc, again.samples_backprop) == (rec.test_acc, rec.samples_backprop)


@pytest.mark.slow
def test_rescoring_counts_scoring_forwards_but_not_reads():
    task = get_task("digits").with_(epochs=3)
    policy = pp.PrunePolicy(
        "s",
        {"policy": "stale_relative", "beta_value": 1.0, "max_loss_age": 0},
        pp.ScorerSettings(batch_size=512, autocast_dtype=None),
    )
    rec = train_run(task, policy, seed=1)
    n = len(task.data().y_train)
    # epochs 1 and 2 rescore every sample seen (all of them, after epoch 0)
    assert rec.samples_scored == 2 * n
    assert rec.compute == 3 * rec.samples_backprop + 2 * n
    assert rec.samples_read == rec.samples_backprop  # the scorer's rows are not training reads


def test_epoch_planning_is_on_the_clock():
    import time

    class SlowPlanner(FullData):
        def start(self, ctx):
            run = super().start(ctx)
            slow = run.epoch_reads

            def epoch_reads(epoch, n):
                time.sleep(0.05)  # stands in for a scoring pass at the start of the epoch
                return slow(epoch, n)

            run.epoch_reads = epoch_reads
            return run

    task = get_task("digits").with_(epochs=2)
    data = task.data()
    small = dataclasses.replace(
        data,
        x_train=data.x_train[:64],
        y_train=data.y_train[:64],
        x_test=data.x_test[:64],
        y_test=data.y_test[:64],
    )
    rec = train_run(task, SlowPlanner(), seed=0, data=small)
    assert rec.wall_s >= 0.1


def test_per_task_epoch_budgets():
    config = se.SiftExperimentConfig(tasks=("digits", "mnist1d"), epochs={"mnist1d": 40})
    assert config.epochs_for("mnist1d") == 40 and config.epochs_for("digits") is None
    assert se.SiftExperimentConfig(epochs=7).epochs_for("text") == 7
    with pytest.raises(ValueError, match="unknown task"):
        se.SiftExperimentConfig(epochs={"cifar": 3})
    with pytest.raises(ValueError, match="epochs"):
        se.SiftExperimentConfig(epochs={"digits": 0})
    from hasten.cli import build_parser

    args = build_parser().parse_args(["bench", "sift", "--epochs", "mnist1d=40,text=6"])
    assert args.epochs == {"mnist1d": 40, "text": 6}
    assert build_parser().parse_args(["bench", "sift", "--epochs", "5"]).epochs == 5
