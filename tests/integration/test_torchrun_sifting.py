"""``torchrun --nproc_per_node=2`` on CPU (gloo): sifting under DDP, FSDP2, the HF Trainer and
Lightning, each rank a real process launched by torchrun."""

from __future__ import annotations

import pytest

from tests._helpers import torchrun


@pytest.mark.slow
def test_torchrun_ranks_keeping_very_different_fractions_finish_every_epoch(tmp_path):
    ranks = torchrun("ddp_sift.py", tmp_path, timeout=180)
    r0, r1 = ranks

    # very different keep fractions: rank 0 about a quarter, rank 1 nearly everything
    keep = [r["stats"]["keep_rate"] for r in ranks]
    assert keep[0] < 0.4 and keep[1] > 0.9, keep

    # every epoch finished on both ranks with the same number of batches (the DDP backward
    # in each step would have hung otherwise), full batches but for the last
    for e in range(3):
        n0, n1 = (len(r["full"]["epochs"][e]["sizes"]) for r in ranks)
        assert n0 == n1 > 0, (e, n0, n1)
        for r in ranks:
            sizes, ids = r["full"]["epochs"][e]["sizes"], r["full"]["epochs"][e]["ids"]
            assert all(s == 8 for s in sizes[:-1])
            assert len(ids) == len(set(ids))  # nothing twice within an epoch
    # the ranks saw disjoint shards of the data (DistributedSampler)
    for e in range(3):
        assert not set(r0["full"]["epochs"][e]["ids"]) & set(r1["full"]["epochs"][e]["ids"])
    # the generous rank's rows above the common count were dropped and counted, never lost
    s1 = r1["stats"]
    assert s1["num_samples_dropped_at_epoch_end"] > 0
    assert s1["num_orig_samples_kept"] == (
        s1["num_samples_yielded"] + s1["num_samples_dropped_at_epoch_end"]
    )

    # set_epoch reached the DistributedSampler: each epoch ran with its own epoch (and order)
    for r in ranks:
        assert r["full"]["sampler_epochs"] == [[0, 0], [1, 1], [2, 2]]
        orders = [r["full"]["epochs"][e]["ids"][:8] for e in range(3)]
        assert orders[0] != orders[1] != orders[2]

    # a per-rank checkpoint mid-epoch resumes each rank exactly where it was (loaded with
    # weights_only=True; the generous rank's holds kept rows not yet yielded)
    assert r1["buffered_at_stop"] > 8
    for r in ranks:
        assert r["stopped"]
        assert r["resumed"]["epochs"] == r["full"]["epochs"]
        assert r["resumed"]["sampler_epochs"][-2:] == [[1, 1], [2, 2]]
        assert r["resumed_stats"]["num_orig_samples_kept"] == r["stats"]["num_orig_samples_kept"]

    # fixed-length epochs (the trainer integrations): every epoch its planned length on both
    # ranks, data passes crossed in step; the logged counts are the sum over ranks
    for r in ranks:
        assert r["stream_counts"] == [r["stream_length"]] * 4
        assert r["stream_data_epoch"] >= 2
    summed = [k for k in r0["metrics"] if not k.endswith("_share")]  # shares are per rank
    assert {k: r0["metrics"][k] for k in summed} == {k: r1["metrics"][k] for k in summed}
    seen = sum(r["own_stats"]["num_orig_samples_seen"] for r in ranks)
    assert r0["metrics"]["sift/samples_seen"] == seen
    scored = sum(r["own_stats"]["num_orig_samples_scored"] for r in ranks)
    sifted_out = sum(r["own_stats"]["num_orig_samples_sifted_out"] for r in ranks)
    assert r0["metrics"]["sift/keep_rate"] == pytest.approx((scored - sifted_out) / scored)


@pytest.mark.slow
def test_fsdp2_trains_on_sifted_batches_like_a_replica(tmp_path):
    ranks = torchrun("fsdp_sift.py", tmp_path, timeout=180)
    assert ranks[0]["counts"] == ranks[1]["counts"]
    assert all(n > 0 for n in ranks[0]["counts"])
    for r in ranks:
        assert r["stats"]["num_batches_scored"] > 0 and 0 < r["stats"]["keep_rate"] < 1
        # fp32, ~20 SGD steps of a 2-layer MLP: only summation order differs
        assert r["max_abs_diff"] < 1e-5, r["max_abs_diff"]


@pytest.mark.slow
def test_hf_trainer_with_sifting_under_torchrun(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    ranks = torchrun("ddp_hf_trainer.py", tmp_path, timeout=240)
    r0, r1 = ranks
    keep = [r["stats"]["keep_rate"] for r in ranks]
    assert keep[0] < 0.8 and keep[1] == 1.0, keep  # rank 1's planted losses keep everything
    for r in ranks:
        assert r["global_step"] == 6  # max_steps reached on both ranks: no hang
        assert len(r["trained"]) == 12  # 6 steps x 2 accumulated micro-batches, on each rank
        assert all(len(b) == 4 for b in r["trained"])
    assert r0["epoch_length"] == r1["epoch_length"]
    # Accelerate sharded the data before sifting: the ranks trained on different samples
    first = [{i for b in r["trained"][:4] for i in b} for r in ranks]
    assert not first[0] & first[1]
    # the logged statistics are global: counts summed over both ranks, the same on each
    counts = [k for k in r0["logged"] if k.startswith("sift/") and not k.endswith("_share")]
    assert {k: r0["logged"][k] for k in counts} == {k: r1["logged"][k] for k in counts}
    seen = sum(r["stats"]["num_orig_samples_seen"] for r in ranks)
    assert r0["logged"]["sift/samples_seen"] <= seen
    assert min(keep) < r0["logged"]["sift/keep_rate"] < max(keep)


@pytest.mark.slow
def test_lightning_ddp_resumes_each_rank_from_its_own_sifting_state(tmp_path):
    pytest.importorskip("lightning")
    ranks = torchrun("ddp_lightning_resume.py", tmp_path, timeout=240)
    keep = [r["keep_rate"] for r in ranks]
    assert keep[0] < 0.5 and keep[1] > 0.9, keep
    assert ranks[1]["buffered_at_stop"] > 0  # the generous rank had kept rows in flight
    for r in ranks:
        assert r["world_size_saved"] == 2  # rank 0's checkpoint holds both ranks' states
        assert len(r["reference"]) == 15 and r["global_step"] == 15
        # after the mid-epoch checkpoint (step 7), each rank trained on its own next batches
        assert r["resumed"] == r["reference"][7:]


@pytest.mark.slow
def test_hf_trainer_with_the_pruning_sampler_under_torchrun(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    ranks = torchrun("ddp_hf_pruning.py", tmp_path, timeout=240)
    r0, r1 = ranks
    # both ranks took the same pruning decisions and the same number of steps (no hang)
    assert r0["fractions"] == r1["fractions"]
    assert r0["fractions"][0] == 1.0 == r0["fractions"][-1]  # unseen / annealed epoch
    assert min(r0["fractions"]) < 0.9
    assert r0["global_step"] == r1["global_step"] > 0
    assert len(r0["trained"]) == len(r1["trained"])
    # the sampler sharded each epoch: the ranks' first epochs are disjoint halves of the data
    # (Accelerate did not shard it a second time, which would have left a quarter each)
    per_rank_epoch0 = -(-45 // 4)  # 45 samples per rank, batches of 4
    seen0 = [{i for b in r["trained"][:per_rank_epoch0] for i in b} for r in ranks]
    assert seen0[0] | seen0[1] == set(range(90)) and not seen0[0] & seen0[1]
    # every loss fed back landed on its sample, merged over the ranks
    assert r0["losses_match"] and r1["losses_match"]
    # the logged counts are global: the same on both ranks, feedback summed
    assert r0["logged"]["sift/samples_fed_back"] == r1["logged"]["sift/samples_fed_back"]
    assert r0["logged"]["sift/samples_fed_back"] <= r0["fed_back"] + r1["fed_back"]


@pytest.mark.slow
def test_lightning_ddp_with_the_pruning_callback(tmp_path):
    pytest.importorskip("lightning")
    ranks = torchrun("ddp_lightning_pruning.py", tmp_path, timeout=240)
    r0, r1 = ranks
    assert r0["fractions"] == r1["fractions"]  # the same decisions on both ranks
    assert r0["fractions"][0] == 1.0 == r0["fractions"][-1] and min(r0["fractions"]) < 0.9
    assert len(r0["trained"]) == len(r1["trained"]) and r0["global_step"] == r1["global_step"]
    # epoch 0: the sampler's disjoint halves (Lightning added no DistributedSampler on top)
    per_rank = -(-45 // 4)
    seen0 = [{i for b in r["trained"][:per_rank] for i in b} for r in ranks]
    assert seen0[0] | seen0[1] == set(range(90)) and not seen0[0] & seen0[1]
    assert r0["losses_match"] and r1["losses_match"]
    assert r0["logged_fed_back"] == r1["logged_fed_back"] == r0["fed_back"] + r1["fed_back"]
