"""The Hugging Face Trainer with sifting: exact steps, gradient-accumulation normalisation, logs."""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from hasten.bench.models import get_model_spec  # noqa: E402
from hasten.integrations.epochs import SiftedEpochs  # noqa: E402
from hasten.integrations.transformers import SiftingCallback, enable_sifting  # noqa: E402
from hasten.sifting import (  # noqa: E402
    PerSampleCrossEntropy,
    RelativeProbabilisticSiftConfig,
    SiftConfigValidationException,
)
from hasten.smart_sifting.integrations.trainer import enable_sifting as sagemaker_enable  # noqa: E402

SEQ = 16
VOCAB = 128


class TokenDataset(torch.utils.data.Dataset):
    """Fixed-length token ids with a binary label, as a tokenizer with padding="max_length" makes."""

    def __init__(self, n: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.ids[i],
            "attention_mask": torch.ones(SEQ, dtype=torch.long),
            "labels": self.labels[i],
        }


def _model() -> torch.nn.Module:
    model = get_model_spec("bert", "tiny").build(seed=0)
    for m in model.modules():  # deterministic, so a replay can match the Trainer's updates
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    # BertForSequenceClassification's loss is a per-batch mean, not normalised by
    # num_items_in_batch; its forward(**kwargs) makes transformers 5 assume it is. Say so.
    model.accepts_loss_kwargs = False
    # set on the first forward otherwise: a compiled model would recompile once for it
    model.config.problem_type = "single_label_classification"
    return model


def _config(delay: int = 2, beta: float = 1.0) -> RelativeProbabilisticSiftConfig:
    return RelativeProbabilisticSiftConfig(
        beta_value=beta,
        loss_history_length=64,
        loss_based_sift_config={"sift_config": {"sift_delay": delay}},
    )


class RecordingTrainer(transformers.Trainer):
    """Records each micro-batch the Trainer trains on and each optimizer step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.micro: list[dict[str, torch.Tensor]] = []
        self.items: list[object] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.micro.append({k: v.detach().clone() for k, v in inputs.items()})
        self.items.append(num_items_in_batch)
        return super().training_step(model, inputs, num_items_in_batch)


def _args(tmp_path, **kw) -> transformers.TrainingArguments:
    base = {
        "output_dir": str(tmp_path),
        "per_device_train_batch_size": 4,
        "learning_rate": 0.05,
        "optim": "sgd",
        "lr_scheduler_type": "constant",
        "max_grad_norm": 0.0,
        "report_to": [],
        "use_cpu": True,
        "save_strategy": "no",
        "disable_tqdm": True,
        "logging_steps": 2,
        "seed": 0,
        "data_seed": 0,
    }
    base.update(kw)
    return transformers.TrainingArguments(**base)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.slow
def test_trainer_sifts_with_exact_steps_and_accumulation(tmp_path):
    model = _model()
    start = copy.deepcopy(model)
    ga, steps = 2, 5
    trainer = RecordingTrainer(
        model=model,
        args=_args(tmp_path, gradient_accumulation_steps=ga, max_steps=steps),
        train_dataset=TokenDataset(64),
    )
    enable_sifting(trainer, _config(delay=2, beta=1.0), loss=PerSampleCrossEntropy())
    out = trainer.train()

    # exactly max_steps optimizer steps, each over exactly `ga` full micro-batches
    assert out.global_step == steps
    assert len(trainer.micro) == steps * ga
    assert all(len(b["labels"]) == 4 for b in trainer.micro)
    loader = trainer.callback_handler.train_dataloader
    assert isinstance(loader, SiftedEpochs)
    stats = loader.stats
    assert stats.num_batches_scored > 0 and 0 < stats.keep_rate < 1
    assert stats.num_samples_yielded == 4 * steps * ga  # everything yielded was trained on

    # the Trainer's update is the mean loss over the accumulated sifted samples: replay it
    replay = start
    opt = torch.optim.SGD(replay.parameters(), lr=0.05)
    for s in range(steps):
        opt.zero_grad()
        group = trainer.micro[s * ga : (s + 1) * ga]
        total = sum(len(b["labels"]) for b in group)
        for b in group:
            logits = replay(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            torch.nn.functional.cross_entropy(logits, b["labels"], reduction="sum").div(
                total
            ).backward()
        opt.step()
    # fp32, 5 SGD steps on a 2-layer model: rounding differs only by summation order
    torch.testing.assert_close(_flat(replay), _flat(model), rtol=1e-4, atol=1e-5)

    # the sifting statistics reached the Trainer's logs
    logged = [h for h in trainer.state.log_history if "sift/keep_rate" in h]
    assert logged, trainer.state.log_history
    assert logged[-1]["sift/samples_seen"] >= stats.num_orig_samples_seen - 8
    assert 0 < logged[-1]["sift/keep_rate"] < 1


@pytest.mark.slow
def test_trainer_set_epochs_trains_the_planned_fixed_length_epochs(tmp_path):
    ga, epochs = 2, 2
    trainer = RecordingTrainer(
        model=_model(),
        args=_args(tmp_path, gradient_accumulation_steps=ga, num_train_epochs=epochs),
        train_dataset=TokenDataset(48),  # 12 batches of 4 per data pass
    )
    sagemaker_enable(
        trainer, _config(delay=4, beta=1.0), loss=PerSampleCrossEntropy(), set_epochs=True
    )
    out = trainer.train()
    loader = trainer.callback_handler.train_dataloader
    # pass 0: 4 delayed + 8 * 4 / 2 / 4 = 4 -> 8; pass 1: 6 -> 14, + 1 headroom over 2 epochs
    assert len(loader) == 8 and trainer.state.max_steps == epochs * 4
    assert loader.finished or loader.stats.num_batches_out == epochs * 8
    # the last epoch ends with the second pass, at a whole optimizer step (of ga micro-batches,
    # the next pass completing it), within the plan
    assert len(trainer.micro) == loader.stats.num_batches_out <= epochs * 8
    assert len(trainer.micro) % ga == 0 and out.global_step == len(trainer.micro) // ga
    assert trainer.state.epoch == pytest.approx(epochs)
    assert loader.data_epoch >= 1  # the second data pass ran


class RowDataset(torch.utils.data.Dataset):
    """Rows {"x", "labels"} that record the index of every row loaded, in order."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 4, generator=g)
        self.drawn: list[int] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.drawn.append(int(i))
        return {"x": self.x[i], "labels": torch.tensor(i % 3)}


class RowModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 3)

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = None if labels is None else torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


def _row_loss(model, batch):
    return torch.nn.functional.cross_entropy(
        model(batch["x"])["logits"], batch["labels"], reduction="none"
    )


@pytest.mark.slow
def test_a_fit_by_epochs_ends_on_its_last_pass_boundary_within_5_percent_of_the_plan(tmp_path):
    # issue 19: fixed-length epochs used to cut the last pass (1152 + 1168 of 2 x 1200 drawn)
    n, epochs = 1200, 2
    dataset = RowDataset(n)
    trainer = transformers.Trainer(
        model=RowModel(),
        args=_args(tmp_path, per_device_train_batch_size=16, num_train_epochs=epochs),
        train_dataset=dataset,
    )
    enable_sifting(trainer, _config(delay=4, beta=1.0), loss=_row_loss, set_epochs=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the plan did not cut the last pass
        out = trainer.train()
    loader = trainer.callback_handler.train_dataloader
    assert loader.finished
    assert len(dataset.drawn) == epochs * n  # two whole passes, nothing of a third
    for p in range(epochs):
        assert sorted(dataset.drawn[p * n : (p + 1) * n]) == list(range(n))
    s = loader.stats
    assert s.num_orig_samples_kept == s.num_samples_yielded  # every kept sample trained on
    assert 0.95 * trainer.state.max_steps <= out.global_step <= trainer.state.max_steps
    assert trainer.state.epoch == pytest.approx(epochs)


def test_enable_sifting_rejects_bad_setups(tmp_path):
    def trainer(**kw):
        return transformers.Trainer(
            model=_model(), args=_args(tmp_path, **kw), train_dataset=TokenDataset(8)
        )

    with pytest.raises(ValueError, match="max_steps"):
        enable_sifting(trainer(), _config(), loss=PerSampleCrossEntropy())
    with pytest.raises(TypeError, match="set_epochs"):
        enable_sifting(trainer(max_steps=2), _config(), PerSampleCrossEntropy(), set_epochs=1)
    with pytest.raises(TypeError, match=r"transformers\.Trainer"):
        enable_sifting(object(), _config(), loss=PerSampleCrossEntropy())
    t = enable_sifting(trainer(max_steps=2), _config(), loss=PerSampleCrossEntropy())
    assert isinstance(t.callback_handler.callbacks[0], SiftingCallback)
    with pytest.raises(ValueError, match="already enabled"):
        enable_sifting(t, _config(), loss=PerSampleCrossEntropy())
    bad = {"beta_value": -1, "loss_history_length": 8}
    with pytest.raises(SiftConfigValidationException, match="beta"):
        enable_sifting(trainer(max_steps=2), bad, loss=PerSampleCrossEntropy())


@pytest.mark.slow
def test_resume_from_a_checkpoint_continues_the_sifted_stream(tmp_path):
    def run(out, resume=None):
        trainer = RecordingTrainer(
            model=_model(),
            args=_args(out, max_steps=7, save_strategy="steps", save_steps=5, logging_steps=2),
            train_dataset=TokenDataset(48),
        )
        enable_sifting(trainer, _config(delay=2, beta=3.0), loss=PerSampleCrossEntropy(), seed=0)
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run(tmp_path / "a")
    saved = torch.load(
        tmp_path / "a" / "checkpoint-5" / "hasten_sifting_rank0.pt", weights_only=True
    )
    assert saved["world_size"] == 1  # the run's process count, checked on resume
    saved = saved["state"]
    assert saved["in_pass"] and saved["loader"]["buffer"]["count"] > 0  # kept rows in flight
    resumed = run(tmp_path / "a", resume=str(tmp_path / "a" / "checkpoint-5"))
    # steps 6 and 7 trained on exactly the batches of the uninterrupted run
    assert len(resumed.micro) == 2
    for a, b in zip(full.micro[5:], resumed.micro):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(_flat(resumed.model), _flat(full.model), rtol=1e-5, atol=1e-6)
    assert not resumed.args.ignore_data_skip  # the flag is the user's again


@pytest.mark.slow
def test_trainer_with_sifting_and_a_compiled_model(tmp_path):
    pytest.importorskip("hasten.compiler")  # the compiler lands in its own branch
    import hasten
    from hasten.compiler.api import compile_report

    def run(out, compiled):
        model = _model()
        if compiled:
            model = hasten.compile(model, regions="whole")  # in place, before the Trainer wraps it
        trainer = LossRecordingTrainer(
            model=model, args=_args(out, max_steps=4), train_dataset=TokenDataset(48)
        )
        enable_sifting(trainer, _config(delay=2, beta=1.0), loss=PerSampleCrossEntropy(), seed=0)
        trainer.train()
        return trainer

    eager = run(tmp_path / "eager", compiled=False)
    comp = run(tmp_path / "compiled", compiled=True)
    report = compile_report(comp.model)
    assert report.fallback is None
    assert report.graph_count >= 2  # the training forward, and the scorer's (eval, no autograd)
    assert not report.graph_breaks
    assert len(report.recompiles) <= 1  # only the scorer's graph (no autograd), nothing else
    # the two delay steps train on the same unscored batches: same losses in fp32
    assert comp.losses[:2] == pytest.approx(eager.losses[:2], rel=1e-4)
    stream = comp.callback_handler.train_dataloader
    assert stream.stats.num_batches_scored > 0
    assert any("sift/keep_rate" in h for h in comp.state.log_history)
    assert list(comp.model.state_dict()) == list(eager.model.state_dict())


class LossRecordingTrainer(transformers.Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.losses: list[float] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        self.losses.append(loss.item())
        return loss


def test_accelerate_refuses_the_hasten_backend_name(tmp_path):
    """Canary for the documented limitation: Accelerate (<= 1.15) accepts only its own backend
    names. When this fails, `torch_compile_backend="hasten"` may work: update docs/integrations.md."""
    pytest.importorskip("hasten.compiler")
    import torch._dynamo

    assert "hasten" in torch._dynamo.list_backends(exclude_tags=())  # Dynamo knows it
    args = _args(tmp_path, max_steps=1, torch_compile=True, torch_compile_backend="hasten")
    with pytest.raises(ValueError, match="DynamoBackend"):
        transformers.Trainer(model=_model(), args=args, train_dataset=TokenDataset(8))


def test_a_sifting_state_file_that_needs_pickle_is_refused_with_the_fix(tmp_path):
    from hasten.integrations.transformers import _load_stream_state
    from hasten.sifting import SiftingDataloader

    sifted = SiftingDataloader(
        _config(), [{"x": torch.ones(2, 3)}], model=torch.nn.Linear(3, 1), loss_impl=lambda m, b: b
    )
    stream = SiftedEpochs(sifted, epoch_length=1)
    path = tmp_path / "hasten_sifting_rank0.pt"
    torch.save({"loader": {"buffer": {"chunks": [PerSampleCrossEntropy()]}}}, path)  # an object
    with pytest.raises(RuntimeError, match=r"weights_only=True.*delete"):
        _load_stream_state(stream, str(path))
    old = stream.state_dict()
    old["loader"]["version"] = 1
    torch.save(old, path)
    with pytest.raises(ValueError, match=r"earlier hasten.*delete"):
        _load_stream_state(stream, str(path))
    # a state file records the run's process count: another one is refused, naming both
    torch.save({"world_size": 2, "state": stream.state_dict()}, path)
    with pytest.raises(ValueError, match=r"from 2 process\(es\), this run has 1.*delete"):
        _load_stream_state(stream, str(path))
    # an earlier hasten's bare state (no process count) still loads
    torch.save(stream.state_dict(), path)
    _load_stream_state(stream, str(path))


def _tokenizer():
    """A word-level tokenizer built offline, with RoBERTa's pad id (1, not 0)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<s>", "<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(100)]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>"
    )
    tok.model_input_names = ["input_ids", "attention_mask"]
    return tok


class TextDataset(torch.utils.data.Dataset):
    """Sentences of 1 to 14 words, tokenized without padding (the collator pads each batch)."""

    def __init__(self, tok, n: int = 48) -> None:
        g = torch.Generator().manual_seed(1)
        lengths = torch.randint(1, 15, (n,), generator=g).tolist()
        words = torch.randint(0, 100, (n, 14), generator=g).tolist()
        self.items = []
        for i in range(n):
            item = tok(" ".join(f"w{w}" for w in words[i][: lengths[i]]))
            item["labels"] = i % 2
            self.items.append(dict(item))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


def test_padding_values_come_from_the_trainers_tokenizer_and_collator(tmp_path):
    from hasten.integrations.transformers import _padding_from

    tok = _tokenizer()
    tok.padding_side = "left"
    trainer = transformers.Trainer(
        model=_model(),
        args=_args(tmp_path, max_steps=1),
        processing_class=tok,
        data_collator=transformers.DataCollatorForTokenClassification(tok, label_pad_token_id=-7),
    )
    assert _padding_from(trainer) == {
        "pad_values": {"input_ids": 1, "token_type_ids": 0, "labels": -7},
        "padding_side": "left",
    }
    # no processing_class: the collator's tokenizer
    trainer.processing_class = None
    assert _padding_from(trainer)["pad_values"]["input_ids"] == 1
    trainer.data_collator = transformers.default_data_collator
    assert _padding_from(trainer) == {}


@pytest.mark.slow
def test_trainer_with_dynamic_padding_sifts_a_roberta_with_its_pad_id(tmp_path, monkeypatch):
    import hasten.sifting.batch as batch_mod

    merged = []  # fields the sifting loader had to pad when merging rows
    real = batch_mod.pad_concat
    monkeypatch.setattr(batch_mod, "pad_concat", lambda *a: merged.append(a[-1]) or real(*a))

    tok = _tokenizer()
    model = get_model_spec("roberta", "tiny").build(seed=0)  # pad_token_id 1, as the tokenizer
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model.accepts_loss_kwargs = False
    model.config.problem_type = "single_label_classification"
    assert model.config.pad_token_id == tok.pad_token_id == 1
    data = TextDataset(tok)
    trainer = RecordingTrainer(
        model=model,
        args=_args(tmp_path, max_steps=6),
        train_dataset=data,
        processing_class=tok,  # the Trainer pads with DataCollatorWithPadding(tok)
    )
    # pad_values={"input_ids": 1} comes from trainer.processing_class
    enable_sifting(trainer, _config(delay=1, beta=1.0), loss=PerSampleCrossEntropy(), seed=0)
    trainer.train()

    stats = trainer.callback_handler.train_dataloader.stats
    assert stats.num_batches_scored > 0 and 0 < stats.keep_rate < 1
    assert ("input_ids",) in merged  # rows of batches of different widths were merged
    sources = {tuple(item["input_ids"]) for item in data.items}
    widths = set()
    model.eval()
    for batch in trainer.micro:
        ids, mask = batch["input_ids"], batch["attention_mask"]
        widths.add(ids.shape[1])
        assert len(ids) == 4
        assert ids[mask == 0].eq(1).all()  # padded with the tokenizer's pad id
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        for r in range(len(ids)):
            n = int(mask[r].sum())
            assert mask[r, :n].all() and tuple(ids[r, :n].tolist()) in sources  # intact
            with torch.no_grad():  # the padding does not change what the model computes
                alone = model(input_ids=ids[r : r + 1, :n]).logits[0]
            torch.testing.assert_close(logits[r], alone, rtol=1e-4, atol=1e-5)  # fp32
    assert len(widths) > 1
