"""Why the README's pruning recipe costs accuracy on a short Hugging Face fine-tune, and what the
guard does about it.

A ``Trainer`` run of a small BERT built from its config (random init; 2 layers x 128, word-level
vocabulary of 8k, sequences of 64) on BBC News (1,780 train / 445 test articles), 3 epochs,
batch 32, lr 5e-4, linear decay, as in the report that found it. Arms:

* ``full``: full data, 3 epochs; ``full2``: full data, 2 epochs (its own schedule: about the
  recipe's compute);
* ``recipe``: ``enable_sifting(trainer, StaleRelativePruningConfig(beta_value=1.0,
  max_loss_age=None, guard=None))``, the rule alone (no guard);
* ``nocatchup``: the same, but the learning-rate schedule is *not* advanced to the run's progress
  (it decays by the steps taken, so it ends a third of the way above zero);
* ``random``: the same epochs, but each epoch keeps a uniformly random half of the seen samples
  (the rule's keep rate, no loss ranking: RS2-like);
* ``reweight``: the rule, with each kept sample weighted ``1 / p ** beta`` (importance
  weights, capped at 10), so the expected gradient is full data's;
* ``late``: the rule, but pruning only from epoch 2 (a two-epoch warm-up);
* ``guarded``: the recipe with the default guard (``guard`` left at its default).

Prints one JSON line per run and writes ``benchmarks/results/sift-hf-short.json``::

    python benchmarks/sift_hf_short.py --seeds 0 1 2 --arms full recipe random
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

ARMS = ("full", "full2", "recipe", "nocatchup", "random", "reweight", "late", "guarded")


def _rows(x: torch.Tensor, y: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    mask = (x != 0).long()
    return [{"input_ids": x[i], "attention_mask": mask[i], "labels": y[i]} for i in range(len(y))]


def _register_extra_rules() -> None:
    """Two diagnostic rules for the sampler: uniform keep, and the relative rule reweighted."""
    import dataclasses

    from hasten.sifting.core.rules import RULES, SAMPLER, register_rule
    from hasten.sifting.history import percentile_of
    from hasten.sifting.policy import Selection

    if "uniform" in RULES:
        return

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class UniformPruning:
        keep: float = 0.5
        anneal_fraction: float = 0.0
        guard: None = None  # the diagnostic rules run alone (a rule without the field is guarded)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class ReweightedRelative:
        beta_value: float = 1.0
        cap: float = 10.0
        anneal_fraction: float = 0.0
        guard: None = None

    def uniform(cfg, losses, history, generator):
        u = torch.rand(losses.shape, generator=generator)
        return Selection(keep=u < cfg.keep)

    def reweighted(cfg, losses, history, generator):
        p = percentile_of(losses, history).pow_(cfg.beta_value)
        u = torch.rand(p.shape, generator=generator)
        keep = torch.where(torch.isfinite(losses), u < p, True)
        w = torch.where(torch.isfinite(losses), 1.0 / p.clamp(min=1.0 / cfg.cap), 1.0)
        return Selection(keep=keep, weights=w)

    register_rule(
        "uniform", UniformPruning, lambda c: functools.partial(uniform, c), frontends={SAMPLER}
    )
    register_rule(
        "reweighted_relative",
        ReweightedRelative,
        lambda c: functools.partial(reweighted, c),
        frontends={SAMPLER},
    )
    globals()["UniformPruning"], globals()["ReweightedRelative"] = (
        UniformPruning,
        ReweightedRelative,
    )


def run(arm: str, seed: int, *, epochs: int = 3, threads: int = 1) -> dict:
    import transformers
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    import hasten
    from hasten.bench.datasets import load_dataset
    from hasten.integrations import transformers as hf

    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    data = load_dataset("bbc_news", max_tokens=64, vocab_size=8000)
    train, test = _rows(data.x_train, data.y_train), _rows(data.x_test, data.y_test)
    torch.manual_seed(seed)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=8000,
            hidden_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=512,
            max_position_embeddings=64,
            num_labels=data.num_classes,
        )
    )
    args = TrainingArguments(
        f"out/sift-hf-short/{arm}-{seed}",
        num_train_epochs=2 if arm == "full2" else epochs,
        per_device_train_batch_size=32,
        learning_rate=5e-4,
        seed=seed,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        logging_strategy="no",
    )
    trainer = Trainer(model=model, train_dataset=train, args=args)
    planned: list[dict] = []
    orders: dict[int, torch.Tensor] = {}
    if arm not in ("full", "full2"):
        import dataclasses

        fields = {f.name for f in dataclasses.fields(hasten.StaleRelativePruningConfig)}
        guard = {} if arm == "guarded" or "guard" not in fields else {"guard": None}
        if arm == "random":
            _register_extra_rules()
            config = {"policy": "uniform", "keep": 0.5}
        elif arm == "reweight":
            _register_extra_rules()
            config = {"policy": "reweighted_relative", "beta_value": 1.0}
        else:
            config = hasten.StaleRelativePruningConfig(beta_value=1.0, max_loss_age=None, **guard)
        hf.enable_sifting(trainer, config)
        sampler = trainer.hasten_pruning_sampler
        if arm == "nocatchup":  # the scheduler steps by itself (restored after the run)
            catch_up = hf._PrunedPasses.steps_into_schedule
            hf._PrunedPasses.steps_into_schedule = lambda self: 0
        make_plan = sampler._make_plan

        def recording_plan(epoch: int):  # diagnostics: who is pruned, with which loss
            plan = make_plan(epoch)
            table = sampler.table
            losses, seen = table.losses.cpu(), table.seen.cpu()
            if arm == "late" and epoch < 2:
                plan.order = plan.order.new_tensor(
                    torch.randperm(sampler.size, generator=torch.Generator().manual_seed(epoch))
                )
                plan.weights = None
            kept = torch.zeros(sampler.size, dtype=torch.bool)
            kept[plan.order] = True
            row = {"epoch": epoch, "kept": int(kept.sum())}
            previous = orders.get(epoch - 1)
            if previous is not None and bool((~kept).any()):
                # where in the previous epoch the pruned samples were trained: 0.5 is "anywhere",
                # near 1 means "the ones seen last" (their stored losses are simply the newest)
                position = torch.full((sampler.size,), float("nan"))
                position[previous] = torch.arange(len(previous)) / max(1, len(previous) - 1)
                row["pruned_position_in_previous_epoch"] = float(position[~kept].nanmean())
                row["kept_position_in_previous_epoch"] = float(position[kept].nanmean())
            orders[epoch] = plan.order.clone()
            if bool(seen.all()):
                row["loss_kept"] = float(losses[kept].mean())
                row["loss_pruned"] = float(losses[~kept].mean()) if bool((~kept).any()) else None
                row["loss_all"] = float(losses.mean())
            planned.append(row)
            return plan

        sampler._make_plan = recording_plan
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    if arm == "nocatchup":
        hf._PrunedPasses.steps_into_schedule = catch_up
    test_out = trainer.predict(test)
    train_out = trainer.predict(train)
    accuracy = float((test_out.predictions.argmax(-1) == test_out.label_ids).mean())
    logits = torch.as_tensor(train_out.predictions)
    train_loss = float(
        torch.nn.functional.cross_entropy(logits, torch.as_tensor(train_out.label_ids))
    )
    out = {
        "arm": arm,
        "seed": seed,
        "test_accuracy": round(accuracy, 4),
        "final_train_loss": round(train_loss, 4),
        "steps": trainer.state.global_step,
        "seconds": round(seconds, 1),
        "epochs_planned": planned,
    }
    sampler = getattr(trainer, "hasten_pruning_sampler", None)
    if sampler is not None:
        out["kept_fraction"] = round(sampler.stats.kept_fraction, 4)
        summary = getattr(sampler, "summary", None)
        if callable(summary):
            out["summary"] = summary()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/sift-hf-short.json")
    a = ap.parse_args(argv)
    path = Path(a.out)
    results = json.loads(path.read_text())["runs"] if path.exists() else []
    for seed in a.seeds:
        for arm in a.arms:
            r = run(arm, seed, threads=a.threads)
            print(json.dumps(r), flush=True)
            results = [x for x in results if (x["arm"], x["seed"]) != (arm, seed)] + [r]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"runs": results, "summary": _summary(results)}, indent=1))
    print(json.dumps(_summary(results), indent=1))


def _summary(results: list[dict]) -> dict:
    out = {}
    for arm in ARMS:
        rs = [r for r in results if r["arm"] == arm]
        if not rs:
            continue
        acc = [r["test_accuracy"] for r in rs]
        out[arm] = {
            "seeds": sorted(r["seed"] for r in rs),
            "test_accuracy_mean": round(statistics.fmean(acc), 4),
            "test_accuracy_se": round(statistics.stdev(acc) / len(acc) ** 0.5, 4)
            if len(acc) > 1
            else None,
            "final_train_loss_mean": round(statistics.fmean(r["final_train_loss"] for r in rs), 4),
            "steps_mean": statistics.fmean(r["steps"] for r in rs),
            "kept_fraction_mean": round(
                statistics.fmean(r.get("kept_fraction", 1.0) for r in rs), 4
            ),
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
