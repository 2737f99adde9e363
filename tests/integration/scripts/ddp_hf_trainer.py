"""Run under ``torchrun --nproc_per_node=2``: the Hugging Face Trainer with ``enable_sifting`` on
two CPU ranks keeping very different fractions. Writes ``rank{r}.json`` into argv[1]."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.distributed as dist
import transformers
from _leave import leave

from hasten.bench.models import get_model_spec
from hasten.integrations.transformers import enable_sifting
from hasten.sifting import RelativeProbabilisticSiftConfig
from hasten.sifting.loss import per_sample_cross_entropy


class Rows(torch.utils.data.Dataset):
    """Sample i's id sits in its first two tokens."""

    def __init__(self, n: int = 96) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 128, (n, 16), generator=g)
        self.ids[:, 0], self.ids[:, 1] = torch.arange(n) % 128, torch.arange(n) // 128
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class Recording(transformers.Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trained: list[list[int]] = []

    def training_step(self, model, inputs, num_items_in_batch=None):
        ids = inputs["input_ids"]
        self.trained.append((ids[:, 0] + 128 * ids[:, 1]).tolist())
        return super().training_step(model, inputs, num_items_in_batch)


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    model = get_model_spec("bert", "tiny").build(seed=0)
    model.accepts_loss_kwargs = False
    args = transformers.TrainingArguments(
        str(out / "trainer"),
        max_steps=6,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        logging_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        ddp_backend="gloo",
    )
    trainer = Recording(model=model, args=args, train_dataset=Rows())
    scored = {"n": 0}

    def loss(model, batch):
        # rank 1's losses rise with every batch it scores (it keeps nearly all); rank 0's are
        # the model's own (it keeps about half)
        losses = per_sample_cross_entropy(
            model(input_ids=batch["input_ids"]).logits, batch["labels"]
        )
        if rank == 1:
            scored["n"] += 1
            losses = losses + 100.0 * scored["n"]
        return losses

    config = RelativeProbabilisticSiftConfig(
        beta_value=1.0,
        loss_history_length=32,
        loss_based_sift_config={"sift_config": {"sift_delay": 2}},
    )
    enable_sifting(trainer, config, loss=loss)
    result = trainer.train()
    stream = trainer.callback_handler.train_dataloader
    logged = [h for h in trainer.state.log_history if "sift/keep_rate" in h]
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "global_step": result.global_step,
                "trained": trainer.trained,
                "epoch_length": len(stream),
                "stats": stream.stats.as_dict(),
                "logged": logged[-1] if logged else None,
            }
        )
    )
    if dist.is_initialized():
        leave()  # see _leave.py: gloo's teardown at exit aborted this script once in CI


if __name__ == "__main__":
    main()
