"""SiftedEpochs: exact epoch lengths over an endless stream of sifted data passes."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader

from hasten.integrations import SiftedEpochs, expected_batches, find_sifting_loader, sifting_metrics
from hasten.sifting import SiftingDataloader
from hasten.sifting.core import length as length_rule
from tests._helpers import (
    PlantedDataset,
    RecordingDataset,
    complete_passes,
    ids_of,
    planted_loss,
    sift_config,
    tiny_model,
)


def _sifted(n=96, bs=8, beta=1.0, delay=0, drop_last=False, seed=0, repeat=False):
    orig = DataLoader(
        PlantedDataset(n),
        batch_size=bs,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
        drop_last=drop_last,
    )
    cfg = sift_config(beta=beta, delay=delay, repeat=repeat)
    return SiftingDataloader(cfg, orig, model=tiny_model(), loss_impl=planted_loss, seed=seed)


def test_expected_batches_counts_delay_then_kept_rate():
    sifted = _sifted(n=96, bs=8, beta=1.0, delay=4)  # 12 batches a pass, keep 1/2
    # pass 0: 4 passed through + 0.5 * 64 / 8 = 4 -> 8; pass 1: 0.5 * 96 / 8 = 6
    assert expected_batches(sifted, 1) == 8
    assert expected_batches(sifted, 2) == 14
    assert expected_batches(sifted, 1, delay=False) == 6
    repeat = _sifted(n=96, bs=8, beta=1.0, delay=4, repeat=True)
    assert expected_batches(repeat, 2) == 16
    with pytest.raises(ValueError, match="passes"):
        expected_batches(sifted, 0)


def test_expected_batches_rounds_the_short_last_batch():
    # 100 samples, batch 8: 13 batches, the last of 4; beta 3 keeps 1/4 -> 25 samples
    assert expected_batches(_sifted(n=100, bs=8, beta=3.0)) == 4  # ceil(25 / 8)
    assert expected_batches(_sifted(n=100, bs=8, beta=3.0, drop_last=True)) == 3  # floor(24 / 8)


def test_epochs_have_exact_length_and_stream_every_kept_sample_once_per_pass():
    sifted = _sifted(n=96, bs=8, beta=1.0)
    stream = SiftedEpochs(sifted, epoch_length=5)
    seen_per_pass: dict[int, list[int]] = {}
    for _ in range(7):
        n = 0
        for batch in stream:
            n += 1
            seen_per_pass.setdefault(stream.data_epoch, []).extend(ids_of(batch))
        assert n == len(stream) == 5
    assert stream.data_epoch >= 4  # 35 batches of ~6 per pass
    for ids in list(seen_per_pass.values())[:-1]:  # finished passes
        assert len(ids) == len(set(ids))  # no sample twice within a pass
    # nothing lost at the epoch cuts: every kept sample of a finished pass was yielded
    assert sifted.stats.num_samples_dropped_at_epoch_end == 0
    s = sifted.stats
    assert s.num_orig_samples_kept == s.num_samples_yielded + sifted._buffer.count


def test_passes_are_seeded_by_the_stream_not_by_the_trainer_epoch():
    calls = []
    sifted = _sifted()
    orig_set_epoch = sifted._set_pass_epoch
    sifted._set_pass_epoch = lambda e: (calls.append(e), orig_set_epoch(e))  # type: ignore[method-assign]
    stream = SiftedEpochs(sifted, epoch_length=10)
    stream.set_epoch(7)  # what a trainer does; must not reorder the data pass in progress
    list(stream)
    stream.set_epoch(8)
    list(stream)
    assert stream.epoch == 8
    assert calls == list(range(len(calls))) and len(calls) >= 3


def test_default_length_averages_the_delay_over_passes():
    sifted = _sifted(n=96, bs=8, beta=1.0, delay=4)
    assert len(SiftedEpochs(sifted)) == 8
    assert len(SiftedEpochs(sifted, passes=2)) == 7


def test_resume_mid_epoch_continues_the_same_stream():
    def run(stop_after=None):
        sifted = _sifted(n=64, bs=8, beta=1.0, seed=3)
        stream = SiftedEpochs(sifted, epoch_length=3)
        out = []
        for epoch in range(4):
            for i, batch in enumerate(stream):
                out.append(ids_of(batch))
                if stop_after == (epoch, i):
                    return out, stream.state_dict()
        return out, None

    full, _ = run()
    head, state = run(stop_after=(1, 1))
    sifted = _sifted(n=64, bs=8, beta=1.0, seed=3)
    resumed = SiftedEpochs(sifted, epoch_length=3)
    resumed.load_state_dict(state)
    tail = []
    it = iter(resumed)
    tail.append(ids_of(next(it)))  # the rest of epoch 1
    for _epoch in range(2):
        tail.extend(ids_of(b) for b in resumed)
    assert head + tail == full


def test_bad_arguments_are_named():
    sifted = _sifted()
    with pytest.raises(TypeError, match="SiftingDataloader"):
        SiftedEpochs(DataLoader(PlantedDataset(8)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch_length"):
        SiftedEpochs(sifted, epoch_length=0)
    with pytest.raises(TypeError, match="epoch_length"):
        SiftedEpochs(sifted, epoch_length=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch_length=3"):
        SiftedEpochs(sifted, epoch_length=4).load_state_dict(
            SiftedEpochs(_sifted(), epoch_length=3).state_dict()
        )


def test_empty_data_raises_instead_of_spinning():
    orig = DataLoader(PlantedDataset(0), batch_size=4)
    sifted = SiftingDataloader(sift_config(), orig, model=tiny_model(), loss_impl=planted_loss)
    with pytest.raises(RuntimeError, match="no batch in two data passes"):
        list(SiftedEpochs(sifted, epoch_length=2))


def test_metrics_and_finder():
    sifted = _sifted(n=64, bs=8, beta=1.0)
    stream = SiftedEpochs(sifted, epoch_length=2)
    assert find_sifting_loader(stream) is sifted
    assert find_sifting_loader({"a": [DataLoader(PlantedDataset(4)), stream]}) is sifted
    assert find_sifting_loader([DataLoader(PlantedDataset(4))]) is None
    before = sifting_metrics(sifted)
    assert "sift/keep_rate" not in before and before["sift/samples_seen"] == 0
    list(stream)
    m = sifting_metrics(sifted, prefix="s.")
    s = sifted.stats
    assert m["s.samples_seen"] == s.num_orig_samples_seen > 0
    assert m["s.keep_rate"] == pytest.approx(s.keep_rate)
    assert m["s.data_epoch"] == 0


def _recorded(n, bs=8, beta=1.0, delay=4, seed=0):
    dataset = RecordingDataset(n)
    orig = DataLoader(
        dataset, batch_size=bs, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    cfg = sift_config(beta=beta, delay=delay)
    sifted = SiftingDataloader(
        cfg, orig, model=tiny_model(), loss_impl=planted_loss, seed=seed, log_interval=0
    )
    return dataset, sifted


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_fit_by_epochs_ends_with_its_last_whole_pass_within_5_percent_of_the_plan(seed):
    n, epochs = 1600, 3
    dataset, sifted = _recorded(n, bs=16, seed=seed)
    stream = SiftedEpochs(sifted, passes=epochs, finish_passes=True)
    planned = epochs * len(stream)
    assert planned > expected_batches(sifted, epochs)  # the headroom
    per_epoch = [sum(1 for _ in stream) for _ in range(epochs)]
    # every epoch but the last has its planned length; the last ends with the last pass
    assert per_epoch[:-1] == [len(stream)] * (epochs - 1) and per_epoch[-1] <= len(stream)
    assert stream.finished and sum(1 for _ in stream) == 0  # nothing after the fit's end
    # exactly `epochs` whole passes drawn, every kept sample trained on
    assert complete_passes(dataset.drawn, n) == epochs and len(dataset.drawn) == epochs * n
    s = sifted.stats
    assert s.num_orig_samples_kept == s.num_samples_yielded and sifted._buffer.count == 0
    assert 0.95 * planned <= sum(per_epoch) <= planned


def test_the_fits_end_completes_the_optimizer_step_from_the_next_pass():
    n, epochs, ga = 96, 2, 4
    for seed in range(6):
        dataset, sifted = _recorded(n, seed=seed)
        room = expected_batches(sifted, epochs) // epochs + 8  # no cut: the step's end is tested
        stream = SiftedEpochs(sifted, room, passes=epochs, finish_passes=True, step_multiple=ga)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            last = [sum(1 for _ in stream) for _ in range(epochs)][-1]
        assert last % ga == 0 or last == len(stream)
        passes = complete_passes(dataset.drawn, n)
        assert passes == epochs  # both passes whole; any extra batch comes from the third
        extra = len(dataset.drawn) - epochs * n
        # at most ga - 1 sifted batches of the next pass: about twice as many incoming at 1/2 kept
        assert 0 <= extra <= 2 * ga * 8 and (extra == 0) == (stream.data_epoch == epochs - 1)


def test_passes_that_keep_more_than_the_plan_are_cut_with_a_warning():
    dataset, sifted = _recorded(96, delay=0)
    stream = SiftedEpochs(sifted, epoch_length=3, passes=2, finish_passes=True)  # ~12 needed
    list(stream)  # epoch 0 of 2
    with pytest.warns(RuntimeWarning, match=r"ended inside data pass 0 of the 2.*not drawn"):
        list(stream)  # epoch 1: the plan's end
    assert not stream.finished and len(dataset.drawn) < 96


def test_a_finished_stream_resumes_finished():
    _, sifted = _recorded(320)
    stream = SiftedEpochs(sifted, passes=1, finish_passes=True)
    list(stream)
    list(stream)  # empty; the pass's end seen at the latest here
    assert stream.finished
    _, again = _recorded(320)
    resumed = SiftedEpochs(again, passes=1, finish_passes=True)
    resumed.load_state_dict(stream.state_dict())
    assert resumed.finished and list(resumed) == []
    with pytest.raises(ValueError, match="step_multiple"):
        SiftedEpochs(again, finish_passes=True, step_multiple=0)
    with pytest.raises(ValueError, match="passes"):
        SiftedEpochs(again, passes=0)


def test_fit_headroom_is_a_few_deviations_capped_at_its_share():
    shape = length_rule.PassShape(batches=1000, batch_size=32, samples=32000, drop_last=False)
    kw = {"sift_delay": 0, "repeat_delay_per_epoch": False, "passes": 2}
    expected = length_rule.expected_batches(shape, 0.5, **kw)  # 1000
    # sd = sqrt(64000 / 4) / 32 = 3.95 batches: 3 sd + 0.5 (the first batch, kept whole)
    assert length_rule.fit_headroom(shape, 0.5, **kw) == 13
    small = length_rule.PassShape(batches=10, batch_size=32, samples=320, drop_last=False)
    # capped: 2.5 % of 10 expected batches, + 0.5
    assert length_rule.fit_headroom(small, 0.5, **kw) == 1
    assert length_rule.fit_headroom(shape, 1.0, **kw) == 0  # keeps everything: no variation
    assert expected == 1000


def test_adapters_cut_epochs_through_the_epoch_module_not_the_loaders_internals():
    # SiftedEpochs reads the loader only through its PassSource (loader.passes), and Keras' planner
    # the sampler only through hasten.sifting.core.epochs.pruned_pass
    import ast
    from pathlib import Path

    import hasten

    root = Path(hasten.__file__).parent
    for path, names in (
        (root / "integrations" / "epochs.py", {"loader"}),
        (root / "keras" / "_plan.py", {"sampler"}),
    ):
        tree = ast.parse(path.read_text())
        private = {
            ast.unparse(n)
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and n.attr.startswith("_")
            and not n.attr.startswith("__")
            and isinstance(n.value, (ast.Name, ast.Attribute))
            and ast.unparse(n.value).split(".")[-1] in names
        }
        assert not private, (path.name, private)


def test_the_length_plan_is_the_length_rule():
    sifted = _sifted(n=96, bs=8, beta=1.0, delay=4)
    plan = sifted.passes.length_plan()
    assert plan.batches(2, delay_done=0) == expected_batches(sifted, 2) == 14
    shape = plan.shape
    kw = {"sift_delay": 4, "repeat_delay_per_epoch": False, "passes": 3}
    planned = length_rule.expected_batches(shape, 0.5, **kw) + length_rule.fit_headroom(
        shape, 0.5, **kw
    )
    assert plan.epoch_length(3, finish_passes=True) == -(-planned // 3)
    assert len(SiftedEpochs(sifted, passes=3, finish_passes=True)) == -(-planned // 3)


def test_pruned_passes_trim_to_whole_steps():
    from hasten.sifting.core.epochs import whole_steps

    assert whole_steps(10, 4, 0) == 8
    assert whole_steps(10, 4, 0, keep=True) == 10
    assert whole_steps(12, 4, 0) == 12 and whole_steps(7, 1, 0) == 7
    with pytest.raises(ValueError, match="gradient_accumulation_steps=4"):
        whole_steps(3, 4, 2)
