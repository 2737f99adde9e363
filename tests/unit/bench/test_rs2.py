"""RS2 (a fresh random subset each epoch, no replacement across epochs) as a baseline."""

import math

import pytest
import torch

from hasten.bench.tasks import get_task
from hasten.bench.training import RS2, RS2Sampler, train_run

TINY = get_task("digits").with_(epochs=3)


def _epochs(sampler, count):
    out = []
    for epoch in range(count):
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


@pytest.mark.parametrize(("n", "k"), [(10, 3), (10, 5), (10, 10), (7, 1), (11, 4)])
def test_every_sample_is_seen_once_before_any_repeats(n, k):
    epochs = _epochs(RS2Sampler(n, k, seed=0), 4 * n)
    assert all(len(e) == k == len(set(e)) for e in epochs)  # size, and no repeat in an epoch
    stream = [i for e in epochs for i in e]
    for start in range(0, len(stream) - n + 1, n):  # each pass over n draws covers all n
        assert sorted(stream[start : start + n]) == list(range(n))


def test_subsets_are_fresh_random_and_paired_by_seed():
    a = _epochs(RS2Sampler(100, 20, seed=3), 10)
    assert a == _epochs(RS2Sampler(100, 20, seed=3), 10)
    assert a != _epochs(RS2Sampler(100, 20, seed=4), 10)
    assert len({tuple(sorted(e)) for e in a}) == 10  # a different subset every epoch
    assert a[0] != sorted(a[0])  # shuffled within the epoch too


def test_sampler_checks_its_arguments_and_epoch_order():
    with pytest.raises(ValueError, match="subset_size"):
        RS2Sampler(10, 0, seed=0)
    with pytest.raises(ValueError, match="subset_size"):
        RS2Sampler(10, 11, seed=0)
    s = RS2Sampler(10, 3, seed=0)
    s.set_epoch(0)
    s.set_epoch(0)  # the same epoch again: a no-op
    with pytest.raises(ValueError, match="in order"):
        s.set_epoch(2)
    assert len(s) == 3


def test_rs2_run_spends_its_budget_over_all_the_epochs():
    n = len(TINY.data().y_train)
    budget = n  # a third of the 3-epoch full run
    rec = train_run(TINY, RS2(budget, "rs2:x"), 0, budget=budget)
    assert rec.policy == "rs2:x" and rec.samples_backprop == budget
    assert rec.compute == 3 * budget and rec.samples_scored == 0
    per_epoch = math.ceil(budget / TINY.epochs)
    assert rec.samples_read == TINY.epochs * per_epoch  # only the subsets are loaded
    assert rec.steps == TINY.epochs * math.ceil(per_epoch / TINY.batch_size)
    assert rec.info == {"policy": "rs2", "budget": budget}


def test_rs2_subset_never_exceeds_the_data():
    n = len(TINY.data().y_train)
    rec = train_run(TINY.with_(epochs=1), RS2(2 * n), 0, budget=2 * n)
    assert rec.samples_backprop == 2 * n  # whole passes, as many epochs as the budget needs
    assert torch.isfinite(torch.tensor(rec.test_acc))
