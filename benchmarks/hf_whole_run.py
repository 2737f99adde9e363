"""A Hugging Face ``Trainer`` fine-tune end to end: plain, ``compile_trainer``, ``torch_compile``,
regional ``torch.compile``.

What a user of the Trainer waits for: from building the ``Trainer`` (and, for hasten, calling
``compile_trainer(trainer)``) to the end of ``trainer.train()``, evaluations included
(``eval_strategy="epoch"``). A BERT classifier built from its config (random init; BERT-base
sizes by default: 12 layers x 768), BBC News articles cut to ``--seq`` word-level tokens (the
bench's offline dataset), ``--epochs`` epochs, batch 32, AdamW at ``--lr`` (5e-5, the
Transformers default; records before 2026-12-06 used 5e-4, at which BERT-base from random init
ended every arm at the majority class) with a linear warm-up over the first ``--warmup`` of the
steps (0.1) and linear decay. Each
arm runs in a new process with a new, empty ``TORCHINDUCTOR_CACHE_DIR`` (cold: Inductor's cache
and hasten's plan history both start empty), arms interleaved per round. With ``--warm`` each
arm then runs again in its own cache (warm: what a second run on the machine gets, hasten's plan
planning with what the first run measured).

Arms (the label says what runs):

* ``plain``: the ``Trainer`` as made (PyTorch's default AdamW, ``adamw_torch``).
* ``hasten``: the same, then ``compile_trainer(trainer)`` (the plan is told the run's training
  calls; the Trainer's AdamW made the fused one).
* ``torch_compile``: ``TrainingArguments(torch_compile=True)`` (Accelerate's ``torch.compile``).
* ``torch_compile_fused``: the same with ``optim="adamw_torch_fused"`` (the informed user's
  Trainer: ``torch.compile`` and PyTorch's fused AdamW kernel).
* ``regional_fused``: ``layer.compile()`` on each of the encoder's blocks before the ``Trainer``
  is built (PyTorch's regional compilation recipe: one block's code compiled once and reused by
  all, so it starts sooner than the whole model's) and ``optim="adamw_torch_fused"``. The
  ``Trainer`` has no switch for it; this is what a user writes.

Usage::

    python benchmarks/hf_whole_run.py --rounds 1 --out benchmarks/results/compile-hf-whole-run.json
    python benchmarks/hf_whole_run.py --layers 2 --hidden 128 --train 256   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ARMS = ("plain", "hasten", "torch_compile", "torch_compile_fused", "regional_fused")


def child(a: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    from hasten.bench.datasets import load_dataset

    transformers.logging.set_verbosity_error()
    data = load_dataset("bbc_news", max_tokens=a.seq, vocab_size=a.vocab)

    def rows(x: torch.Tensor, y: torch.Tensor, n: int) -> list[dict[str, torch.Tensor]]:
        mask = (x != 0).long()
        n = min(n, len(y)) if n else len(y)
        return [{"input_ids": x[i], "attention_mask": mask[i], "labels": y[i]} for i in range(n)]

    train = rows(data.x_train, data.y_train, a.train)
    test = rows(data.x_test, data.y_test, 0)
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=a.vocab,
            hidden_size=a.hidden,
            num_hidden_layers=a.layers,
            num_attention_heads=max(1, a.hidden // 64),
            intermediate_size=4 * a.hidden,
            max_position_embeddings=max(64, a.seq),
            num_labels=data.num_classes,
        )
    )
    t0 = time.perf_counter()
    if a.child == "regional_fused":
        for layer in model.bert.encoder.layer:
            layer.compile()
    fused = a.child in ("torch_compile_fused", "regional_fused")
    args = TrainingArguments(
        "out/hf-whole-run",
        num_train_epochs=a.epochs,
        per_device_train_batch_size=32,
        per_device_eval_batch_size=64,
        learning_rate=a.lr,
        warmup_steps=a.warmup,  # a float in [0, 1): a share of the steps
        eval_strategy="epoch",
        seed=0,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_strategy="no",
        torch_compile=a.child in ("torch_compile", "torch_compile_fused"),
        optim="adamw_torch_fused" if fused else "adamw_torch",
    )
    trainer = Trainer(model=model, train_dataset=train, eval_dataset=test, args=args)
    if a.child == "hasten":
        from hasten.integrations.transformers import compile_trainer

        compile_trainer(trainer)
    trainer.train()
    seconds = time.perf_counter() - t0
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    out: dict[str, Any] = {
        "arm": a.child,
        "seconds": seconds,
        "steps": trainer.state.global_step,
        "eval_loss": [h["eval_loss"] for h in evals],
        "eval_runtime_s": [h.get("eval_runtime") for h in evals],
    }
    pred = trainer.predict(test)
    out["test_accuracy"] = float((pred.predictions.argmax(-1) == pred.label_ids).mean())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--warmup", type=float, default=0.1, help="warm-up share of the steps")
    p.add_argument("--train", type=int, default=0, help="training articles (0: all 1,780)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--warm", action="store_true", help="each arm again, in its own cache")
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a)))
        return 0
    from hasten.bench.machine import machine_stamp

    stamp = machine_stamp()
    runs: list[dict[str, Any]] = []
    flags = ["--layers", a.layers, "--hidden", a.hidden, "--vocab", a.vocab, "--seq", a.seq]
    flags += ["--epochs", a.epochs, "--train", a.train, "--lr", a.lr, "--warmup", a.warmup]
    for rnd in range(a.rounds):
        for arm in a.arms.split(","):
            cache = tempfile.mkdtemp(prefix="hasten-hf-whole-run-")
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            cmd = [sys.executable, __file__, "--child", arm, *map(str, flags)]
            for state in ("cold", "warm") if a.warm else ("cold",):
                t0 = time.perf_counter()
                proc = subprocess.run(
                    cmd, env=env, capture_output=True, text=True, timeout=a.timeout
                )
                if proc.returncode != 0:
                    rec: dict[str, Any] = {"arm": arm, "error": proc.stderr[-3000:]}
                else:
                    rec = json.loads(proc.stdout.strip().splitlines()[-1])
                    rec["log_tail"] = proc.stderr[-2500:]
                rec.update(round=rnd, cache=state, process_s=time.perf_counter() - t0)
                runs.append(rec)
                got = rec.get("seconds", rec.get("error", "")[-200:])
                print(f"round {rnd} {arm:14} {state} {got}", flush=True)
    result = {
        "kind": "hasten.hf_whole_run",
        "config": {k: v for k, v in vars(a).items() if k not in ("child", "out")},
        "runs": runs,
        "machine": stamp,
        "load_after": os.getloadavg(),
    }
    if a.out:
        from hasten.bench.demo import save_json

        print(f"wrote {save_json(result, a.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
