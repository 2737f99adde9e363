"""The contract every sifting rule meets in every front-end that claims it.

Driven by the registry (:data:`hasten.sifting.core.rules.RULES`): registering a rule adds it
here. Each (rule, front-end) pair runs the rule's example config (``Rule.example``) on data whose
per-sample losses are planted, so the law the rule states (``Rule.keep_probability``) can be
replayed exactly, and checks:

- keep-rate law: the number of samples kept matches the sum of the keep probabilities the law
  gives, within 4 standard deviations of that sum of independent draws (+1 for rounding); where
  the rule states a nominal rate, the observed rate is within 0.03 of it (i.i.d. losses);
- accounting: no sample is yielded twice within a pass, none comes from outside the data, the
  counts add up, and every sample left out is one the law could drop (probability < 1);
- state: a ``state_dict`` taken mid-pass (saved and loaded with ``weights_only=True``) resumes
  into exactly the rest of the uninterrupted run;
- DDP equal counts (slow: 2 gloo processes): every rank yields the same number of batches.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from hasten.sifting import PruningSampler, SiftingDataloader
from hasten.sifting.core.rules import LOADER, RULES, SAMPLER, Rule
from hasten.sifting.history import LossHistory
from tests._helpers import PlantedDataset, ids_of, planted_loss, tiny_model

CASES = [
    pytest.param(rule, frontend, id=f"{rule.name}-{frontend}")
    for rule in RULES.values()
    for frontend in sorted(rule.frontends)
]
NOT_RUN = [
    pytest.param(rule, frontend, id=f"{rule.name}-not-{frontend}")
    for rule in RULES.values()
    for frontend in (LOADER, SAMPLER)
    if frontend not in rule.frontends
]
BATCH = 32
N_LOADER = 4096  # samples per pass through the loader
N_SAMPLER = 2000  # dataset size for the sampler
SAMPLER_EPOCHS = 5  # pruned epochs checked (after the first, which sees everything)
RATE_TOLERANCE = 0.03


def _within_law(kept: int, probs: list[torch.Tensor]) -> tuple[bool, str]:
    p = torch.cat(probs).double()
    mean, sd = float(p.sum()), float((p * (1 - p)).sum().sqrt())
    ok = abs(kept - mean) <= 4 * sd + 1
    return ok, f"kept {kept}, law expects {mean:.1f} +- {sd:.1f}"


def _saved(state: dict[str, Any]) -> dict[str, Any]:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# --------------------------------------------------------------------------- loader front-end


def _orig_loader(n: int = N_LOADER, **kw: Any) -> DataLoader:
    g = torch.Generator().manual_seed(5)
    return DataLoader(PlantedDataset(n, "tuple"), batch_size=BATCH, shuffle=True, generator=g, **kw)


def _sifting_loader(rule: Rule, orig: DataLoader | None = None) -> SiftingDataloader:
    return SiftingDataloader(
        rule.make_example(),
        orig if orig is not None else _orig_loader(),
        model=tiny_model(),
        loss_impl=planted_loss,
        seed=7,
        log_interval=None,
    )


def _replay_loader_law(rule: Rule, cfg: Any) -> tuple[list[torch.Tensor], dict[int, float]]:
    """The law's keep probability for every scored sample of one pass, replaying the loader's
    history (the same incoming batches, in the same order: the same seeded shuffle)."""
    history = LossHistory(cfg.loss_history_length)
    probs, by_id = [], {}
    for b, (x, _) in enumerate(_orig_loader()):
        if b < cfg.sift_delay:
            continue
        losses = x[:, 0]
        p = rule.keep_probability(cfg, losses, history.values())
        history.add(losses)
        probs.append(p)
        by_id.update(zip(x[:, 1].long().tolist(), p.tolist()))
    return probs, by_id


def _loader_pass(rule: Rule) -> None:
    sifted = _sifting_loader(rule)
    cfg = sifted.sift_config
    batches = [ids_of(b) for b in sifted]
    ids = [i for b in batches for i in b]
    s = sifted.stats

    # keep-rate law
    probs, p_of = _replay_loader_law(rule, cfg)
    kept = s.num_orig_samples_scored - s.num_orig_samples_sifted_out
    ok, detail = _within_law(kept, probs)
    assert ok, detail
    if rule.nominal_keep_rate is not None:
        nominal = rule.nominal_keep_rate(cfg)
        assert abs(s.keep_rate - nominal) <= RATE_TOLERANCE, (s.keep_rate, nominal)

    # accounting: each sample at most once, all from the data, counts add up, drops are legal
    assert len(ids) == len(set(ids)) and set(ids) <= set(range(N_LOADER))
    assert all(len(b) == BATCH for b in batches[:-1])
    assert len(ids) + s.num_orig_samples_sifted_out + s.num_samples_dropped_at_epoch_end == N_LOADER
    assert s.num_samples_dropped_at_epoch_end == 0  # drop_last=False: the short batch is yielded
    left_out = set(range(N_LOADER)) - set(ids)
    assert all(p_of[i] < 1.0 for i in left_out), "a sample the law always keeps was left out"


def _loader_state(rule: Rule) -> None:
    uninterrupted = _sifting_loader(rule)
    reference = [ids_of(b) for _ in range(2) for b in uninterrupted]  # two passes
    sifted = _sifting_loader(rule)
    it = iter(sifted)
    head = [ids_of(next(it)) for _ in range(7)]
    state = _saved(sifted.state_dict())
    resumed = _sifting_loader(rule)
    resumed.load_state_dict(state)
    rest = [ids_of(b) for b in resumed] + [ids_of(b) for b in resumed]
    assert head + rest == reference


# --------------------------------------------------------------------------- sampler front-end


class _Planted(Dataset):
    """Sample i = (its planted loss, i); distinct losses in (0, 1]."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(1)
        self.losses = (torch.randperm(n, generator=g).float() + 1) / n

    def __len__(self) -> int:
        return len(self.losses)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.losses[i], i


def _sampler(rule: Rule, n: int = N_SAMPLER) -> PruningSampler:
    return PruningSampler(n, rule.make_example(), num_epochs=100, seed=3, batch_size=BATCH)


def _train_epoch(
    sampler: PruningSampler, ds: Dataset, epoch: int, stop_after: int | None = None
) -> list[int]:
    sampler.set_epoch(epoch)
    drawn: list[int] = []
    for k, (losses, idx) in enumerate(DataLoader(ds, batch_size=BATCH, sampler=sampler)):
        if stop_after is not None and k == stop_after:
            break
        sampler.update(losses)
        drawn += idx.tolist()
    return drawn


def _sampler_pass(rule: Rule) -> None:
    ds = _Planted(N_SAMPLER)
    sampler = _sampler(rule)
    first = _train_epoch(sampler, ds, 0)
    assert sorted(first) == list(range(N_SAMPLER)), "the first epoch must see every sample once"
    cfg = sampler.config
    losses = ds.losses
    # every sample's stored loss is its planted one, from the first epoch on
    p = rule.keep_probability(cfg, losses, losses)
    kept, probs = 0, []
    for epoch in range(1, 1 + SAMPLER_EPOCHS):
        drawn = _train_epoch(sampler, ds, epoch)
        assert len(drawn) == len(set(drawn)) and set(drawn) <= set(range(N_SAMPLER))
        left_out = torch.ones(N_SAMPLER, dtype=torch.bool)
        left_out[drawn] = False
        assert bool((p[left_out] < 1.0).all()), "a sample the law always keeps was left out"
        kept += len(drawn)
        probs.append(p)
    ok, detail = _within_law(kept, probs)
    assert ok, detail
    s = sampler.stats
    assert s.samples_kept == N_SAMPLER + kept and s.samples_not_fed_back == 0
    if rule.nominal_keep_rate is not None:
        rate = kept / (SAMPLER_EPOCHS * N_SAMPLER)
        assert abs(rate - rule.nominal_keep_rate(cfg)) <= RATE_TOLERANCE


def _sampler_state(rule: Rule) -> None:
    ds = _Planted(N_SAMPLER)
    ref = _sampler(rule)
    reference = [_train_epoch(ref, ds, e) for e in range(3)]
    sampler = _sampler(rule)
    _train_epoch(sampler, ds, 0)
    head = _train_epoch(sampler, ds, 1, stop_after=9)
    state = _saved(sampler.state_dict())
    resumed = _sampler(rule)
    resumed.load_state_dict(state)
    rest = _train_epoch(resumed, ds, 1)
    assert head + rest == reference[1]
    assert _train_epoch(resumed, ds, 2) == reference[2]


# --------------------------------------------------------------------------- the contract


def test_every_rule_runs_in_a_front_end_and_has_an_example():
    assert {LOADER, SAMPLER} <= {f for r in RULES.values() for f in r.frontends}
    for rule in RULES.values():
        assert rule.keep_probability is not None, f"{rule.name} states no keep law"
        assert isinstance(rule.make_example(), rule.config)


@pytest.mark.parametrize(("rule", "frontend"), CASES)
def test_keep_rate_law_and_accounting(rule: Rule, frontend: str):
    (_loader_pass if frontend == LOADER else _sampler_pass)(rule)


@pytest.mark.parametrize(("rule", "frontend"), CASES)
def test_state_round_trip_mid_pass(rule: Rule, frontend: str):
    (_loader_state if frontend == LOADER else _sampler_state)(rule)


@pytest.mark.parametrize(
    ("rule", "frontend"), NOT_RUN or [pytest.param(None, None, marks=pytest.mark.skip)]
)
def test_front_ends_that_do_not_run_a_rule_say_which_does(rule: Rule, frontend: str):
    runs_in = {LOADER: "SiftingDataloader", SAMPLER: "PruningSampler"}
    build = _sifting_loader if frontend == LOADER else _sampler
    with pytest.raises(ValueError, match="|".join(runs_in[f] for f in rule.frontends)):
        build(rule)


# --------------------------------------------------------------------------- DDP equal counts

WORLD = 2
DDP_EPOCHS = 3


def _ddp_counts(rule: Rule, frontend: str, rank: int) -> list[int]:
    """Batches this rank yields per epoch; a DDP-like all_reduce per step hangs on a mismatch."""
    counts = []
    if frontend == LOADER:
        ds = PlantedDataset(1000, "tuple")  # the same data on every rank, sharded
        shard = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=0)
        sifted = SiftingDataloader(
            rule.make_example(),
            DataLoader(ds, batch_size=16, sampler=shard),
            model=tiny_model(),
            loss_impl=planted_loss,
            seed=rank,  # different draws per rank: different keep counts to balance
            log_interval=None,
        )
        for epoch in range(DDP_EPOCHS):
            sifted.set_epoch(epoch)
            counts.append(_steps(sifted))
    else:
        ds = _Planted(1001)
        sampler = PruningSampler(len(ds), rule.make_example(), num_epochs=100, seed=0)
        loader = DataLoader(ds, batch_size=16, sampler=sampler)
        for epoch in range(DDP_EPOCHS):
            sampler.set_epoch(epoch)
            n = 0
            for losses, _ in loader:
                sampler.update(losses + 0.1 * rank)  # ranks see different losses
                _step()
                n += 1
            counts.append(n)
    return counts


def _step() -> None:
    flag = torch.ones(1)
    dist.all_reduce(flag)


def _steps(batches: Any) -> int:
    n = 0
    for _ in batches:
        _step()
        n += 1
    return n


def _ddp_worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        out = {
            f"{rule.name}-{frontend}": _ddp_counts(rule, frontend, rank)
            for rule in RULES.values()
            for frontend in sorted(rule.frontends)
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ddp_ranks_yield_equal_batch_counts(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the spawned ranks'; not left to later tests
    mp.spawn(_ddp_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    assert set(ranks[0]) == {f"{r.name}-{f}" for r in RULES.values() for f in r.frontends}
    for case, counts in ranks[0].items():
        assert counts == ranks[1][case], (case, counts, ranks[1][case])
        assert all(c > 0 for c in counts), (case, counts)
