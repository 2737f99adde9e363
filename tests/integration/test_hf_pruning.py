"""The pruning front-end in the Hugging Face Trainer: ``enable_sifting(trainer, pruning_config)``
puts a PruningSampler under the Trainer and feeds it the training step's own per-sample losses,
no subclass. Epochs, steps, gradient accumulation, schedule, logs, resume, numerics."""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import hasten  # noqa: E402
from hasten.integrations.transformers import enable_sifting  # noqa: E402
from tests._models import tiny_bert_classifier  # noqa: E402

N, SEQ, BATCH = 100, 8, 8  # 13 batches per full epoch, the last one of 4 rows


class Tokens(torch.utils.data.Dataset):
    """Token rows whose label is learnable (first token above the vocabulary's middle); the
    sample's index sits in its last token so tests can see which samples were trained."""

    def __init__(self, n: int = N) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 32, (n, SEQ), generator=g)
        self.labels = (self.ids[:, 0] > 15).long()
        self.index = torch.arange(n)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i], "row": self.index[i]}


class Model(torch.nn.Module):
    """tiny BERT without dropout (deterministic), ignoring the ``row`` column."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.bert = tiny_bert_classifier(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

    def forward(self, input_ids, row=None, labels=None):
        out = self.bert(input_ids=input_ids)
        if labels is not None:  # what the plain Trainer trains on: the batch mean
            out.loss = torch.nn.functional.cross_entropy(out.logits, labels)
        return out


class Recording(transformers.Trainer):
    """Records the dataset rows of every micro-batch trained on."""

    def __init__(self, *args, sequential: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows: list[list[int]] = []
        self.sequential = sequential

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.rows.append(inputs["row"].tolist())
        return super().training_step(model, inputs, num_items_in_batch)

    def _get_train_sampler(self, train_dataset=None):
        if self.sequential:  # the plain reference, in the order of an unshuffled sampler
            return torch.utils.data.SequentialSampler(self.train_dataset)
        return super()._get_train_sampler(train_dataset)


def _args(out, **kw) -> transformers.TrainingArguments:
    base = {
        "output_dir": str(out),
        "per_device_train_batch_size": BATCH,
        "learning_rate": 0.05,
        "optim": "sgd",
        "lr_scheduler_type": "linear",
        "max_grad_norm": 0.0,
        "report_to": [],
        "use_cpu": True,
        "save_strategy": "no",
        "disable_tqdm": True,
        "logging_steps": 2,
        "seed": 0,
        "remove_unused_columns": False,
    }
    base.update(kw)
    return transformers.TrainingArguments(**base)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _stale() -> hasten.StaleRelativePruningConfig:
    # the rule alone: these tests pin the pruned epochs' mechanics (the guard: test_guard_*)
    return hasten.StaleRelativePruningConfig(beta_value=1.0, max_loss_age=None, guard=None)


@pytest.mark.slow
def test_pruning_by_epochs_takes_the_pruned_steps_and_ends_the_schedule(tmp_path):
    ga, epochs = 2, 4
    trainer = Recording(
        model=Model(),
        args=_args(tmp_path, num_train_epochs=epochs, gradient_accumulation_steps=ga),
        train_dataset=Tokens(),
    )
    enable_sifting(trainer, _stale())  # no loss=: per-sample cross-entropy of the step's logits
    out = trainer.train()
    sampler = trainer.hasten_pruning_sampler
    assert isinstance(sampler, hasten.PruningSampler)
    stats = sampler.stats

    # epoch 0 is all data (nothing seen yet), the others pruned
    fractions = stats.epoch_kept_fractions
    assert len(fractions) == epochs and fractions[0] == 1.0
    assert max(fractions[1:]) < 0.8
    # each pruned epoch ends at its last whole optimizer step; the full one is the Trainer's
    kept = [round(f * N) for f in fractions]
    batches = [math.ceil(k / BATCH) for k in kept]
    trained = [batches[0]] + [b // ga * ga for b in batches[1:]]
    steps = sum(math.ceil(t / ga) for t in trained)
    assert out.global_step == steps < epochs * math.ceil(13 / ga)  # fewer than full data's
    assert len(trainer.rows) == sum(trained)
    assert stats.samples_fed_back == sum(len(r) for r in trainer.rows)
    assert trainer.state.epoch == pytest.approx(epochs)
    # every epoch's samples are distinct; the first trained every sample once
    pos = 0
    for e, t in enumerate(trained):
        rows = [i for b in trainer.rows[pos : pos + t] for i in b]
        pos += t
        assert len(rows) == len(set(rows))
        if e == 0:
            assert sorted(rows) == list(range(N))
    # the linear schedule, sized by the Trainer for 4 full epochs, ended with the pruned run
    assert trainer.state.max_steps == epochs * math.ceil(13 / ga)
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)

    logged = [h for h in trainer.state.log_history if "sift/keep_rate" in h]
    last = logged[-1]
    assert last["sift/samples_kept"] < last["sift/samples_seen"] == epochs * N
    assert last["sift/keep_rate"] == pytest.approx(stats.kept_fraction)
    assert last["sift/data_epoch"] == epochs - 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [
        hasten.UnbiasedPruningConfig(prune_ratio=0.0, anneal_fraction=0.0),
        hasten.StaleRelativePruningConfig(beta_value=1e-9, max_loss_age=None),
    ],
    ids=["unbiased", "stale_relative"],
)
def test_a_rule_that_keeps_everything_trains_exactly_like_the_plain_trainer(tmp_path, config):
    """Same batches, same optimizer steps (13 micro-batches per epoch: the short last
    accumulation included), same linear schedule: the same weights."""
    ga, epochs = 2, 3
    model = Model()
    start = copy.deepcopy(model)
    args = {"num_train_epochs": epochs, "gradient_accumulation_steps": ga}
    pruned = Recording(model=model, args=_args(tmp_path / "a", **args), train_dataset=Tokens())
    enable_sifting(pruned, config, shuffle=False)
    pruned.train()
    plain = Recording(
        model=start, args=_args(tmp_path / "b", **args), train_dataset=Tokens(), sequential=True
    )
    plain.train()

    assert pruned.hasten_pruning_sampler.stats.epoch_kept_fractions == [1.0] * epochs
    assert pruned.rows == plain.rows
    assert pruned.state.global_step == plain.state.global_step == epochs * 7
    # fp32, 21 SGD steps of a one-layer BERT: the two losses differ only in summation order
    torch.testing.assert_close(_flat(pruned.model), _flat(plain.model), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_pruning_by_steps_takes_exactly_max_steps(tmp_path):
    ga, steps = 2, 15  # more steps than two full epochs hold: the pruned epochs follow on
    trainer = Recording(
        model=Model(),
        args=_args(tmp_path, max_steps=steps, gradient_accumulation_steps=ga),
        train_dataset=Tokens(),
    )
    enable_sifting(
        trainer, hasten.UnbiasedPruningConfig(prune_ratio=0.7, anneal_fraction=0.0, guard=None)
    )
    out = trainer.train()
    assert out.global_step == steps
    assert len(trainer.rows) == steps * ga  # every step has its ga micro-batches
    stats = trainer.hasten_pruning_sampler.stats
    assert stats.samples_fed_back == sum(len(r) for r in trainer.rows)
    assert len(stats.epoch_kept_fractions) >= 3 and min(stats.epoch_kept_fractions) < 0.9
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
def test_resume_mid_epoch_trains_what_the_uninterrupted_run_trained(tmp_path):
    def run(resume=None):
        trainer = Recording(
            model=Model(),
            args=_args(
                tmp_path / "run",
                num_train_epochs=3,
                save_strategy="steps",
                save_steps=16,  # mid-epoch 1 (epoch 0 has 13 steps)
            ),
            train_dataset=Tokens(),
        )
        enable_sifting(trainer, _stale())
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run()
    assert os.path.isfile(tmp_path / "run" / "checkpoint-16" / "hasten_sifting_rank0.pt")
    resumed = run(resume=str(tmp_path / "run" / "checkpoint-16"))
    assert resumed.rows == full.rows[16:]
    assert resumed.state.global_step == full.state.global_step
    torch.testing.assert_close(_flat(resumed.model), _flat(full.model), rtol=1e-5, atol=1e-6)


def test_setups_the_pruning_front_end_cannot_train_exactly_are_refused(tmp_path):
    def trainer(model=None, **kw):
        return transformers.Trainer(
            model=model or Model(), args=_args(tmp_path, **kw), train_dataset=Tokens(16)
        )

    smoothing = trainer(tiny_bert_classifier(), label_smoothing_factor=0.1)  # needs .config
    with pytest.raises(ValueError, match=r"label_smoothing_factor.*loss="):
        enable_sifting(smoothing, _stale())
    with pytest.raises(ValueError, match=r"anneal_fraction.*max_steps"):
        enable_sifting(trainer(max_steps=4), hasten.UnbiasedPruningConfig(anneal_fraction=0.1))
    with pytest.raises(TypeError, match=r"seed.*shuffle.*scorer"):
        enable_sifting(trainer(), _stale(), log_interval=5)

    class Custom(transformers.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    custom = Custom(model=Model(), args=_args(tmp_path), train_dataset=Tokens(16))
    with pytest.raises(ValueError, match=r"overrides compute_loss.*loss="):
        enable_sifting(custom, _stale())

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(Tokens(16))

    streaming = transformers.Trainer(
        model=Model(), args=_args(tmp_path, max_steps=2), train_dataset=Stream()
    )
    with pytest.raises(TypeError, match="map-style"):
        enable_sifting(streaming, _stale())
    # the loader front-end still needs its scoring loss, and says so
    config = hasten.RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=8)
    plain = trainer(max_steps=2)
    with pytest.raises(TypeError, match="loss=PerSampleCrossEntropy"):
        enable_sifting(plain, config)
    # a dict with a policy picks the pruning front-end
    t = enable_sifting(trainer(), {"policy": "stale_relative", "max_loss_age": None})
    assert isinstance(t.hasten_pruning_sampler.config, hasten.StaleRelativePruningConfig)


@pytest.mark.slow
def test_the_unbiased_rules_reweighted_loss_is_what_the_trainer_backpropagates(tmp_path):
    ga = 2
    trainer = Recording(
        model=Model(),
        args=_args(tmp_path, num_train_epochs=3, gradient_accumulation_steps=ga),
        train_dataset=Tokens(),
    )
    enable_sifting(
        trainer, hasten.UnbiasedPruningConfig(prune_ratio=0.5, anneal_fraction=0.0, guard=None)
    )
    sampler = trainer.hasten_pruning_sampler
    returned = []  # (plain mean, what update returned) per micro-batch
    update = sampler.update

    def recording_update(losses, indices=None):
        out = update(losses, indices)
        returned.append((losses.detach().mean().item(), out.detach().item()))
        return out

    sampler.update = recording_update
    stepped = []
    step = trainer.training_step

    def recording_step(*a, **kw):
        stepped.append(step(*a, **kw).item())  # the loss the Trainer backpropagated
        return stepped[-1] * torch.ones(())

    trainer.training_step = recording_step
    trainer.train()
    assert len(returned) == len(stepped) == len(trainer.rows)
    # the Trainer backpropagated update()'s weighted mean, divided by the step's micro-batches
    # (the full epoch's 13th batch is alone in its step)
    for (_, weighted), loss in zip(returned, stepped):
        assert loss * ga == pytest.approx(weighted, rel=1e-6) or loss == pytest.approx(weighted)
    # in the pruned epochs the kept low-loss samples weigh 2: the weighted mean is larger
    assert any(w > m * 1.01 for m, w in returned[13:])


@pytest.mark.slow
def test_guard_by_default_prunes_only_learned_rows_and_says_so(tmp_path, caplog):
    """The README's recipe with the default guard: rows are skipped only once learned (their
    loss well below the run's first), and the fit ends with one line saying what happened."""
    trainer = Recording(
        model=Model(),
        args=_args(tmp_path, num_train_epochs=6, learning_rate=0.5),
        train_dataset=Tokens(),
    )
    enable_sifting(trainer, hasten.StaleRelativePruningConfig(beta_value=1.0, max_loss_age=None))
    with caplog.at_level("INFO", logger="hasten"):
        trainer.train()
    sampler = trainer.hasten_pruning_sampler
    records = sampler.guard.state.epochs
    assert len(records) == 6 and records[0]["reason"] == "full data"
    first = sampler.guard.state.first_loss
    for r in records:  # whatever was skipped was learned: below 30 % of the first loss
        if r.get("pruned", 0) > 0:
            assert r["threshold"] == pytest.approx(0.3 * first)
    stats = sampler.stats
    assert stats.samples_fed_back == sum(len(r) for r in trainer.rows)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hasten sifting")]
    assert len(lines) == 1 and "guard" in lines[0]
    assert f"trained on {stats.samples_kept} of {6 * N}" in lines[0]
