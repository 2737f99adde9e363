"""One training loop for every data-efficiency run, with exact compute accounting.

The loop, with the hook points a :class:`Policy` owns::

    model = task.build_model(seed) [-> prepare_model(model), e.g. hasten.compile]
    run = policy.start(ctx)                      # ctx: model, dataset, loader factory, seed, ...
    for epoch in range(task.epochs):             # or until a sample budget is spent
        for batch in run.batches(loader, epoch): # policy: full data, sifted, pruned, ...
            losses = per_sample_loss(model, batch)          # forward (1 unit per sample)
            run.loss(losses, batch).backward()              # policy: mean, reweighted ...
            optimizer.step()                                # backward (2 units per sample)
            [every 1/evals_per_epoch epoch (and once before training): test accuracy,
             clock paused; stop at the first evaluation during training that reaches target]
    compute = 3 * samples backpropagated + samples scored by the policy's extra forwards

Batches are ``(inputs, labels, indices)``: indices let a policy attribute losses to samples.
The learning rate follows linear warm-up then cosine decay over the run's *progress*: the fraction
of the planned passes over the data read so far, or, for a run with a sample budget, the fraction
of the budget spent — so a shortened run gets a schedule fitted to its own length.
"""

from __future__ import annotations

import functools
import inspect
import math
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, ParamSpec, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from hasten.bench import _hasten_api
from hasten.bench.datasets import SplitData
from hasten.bench.harness import count_flops, synchronize
from hasten.bench.tasks import Task, lr_at

__all__ = [
    "RS2",
    "Batch",
    "FullData",
    "IndexedDataset",
    "Policy",
    "PolicyContext",
    "PolicyRun",
    "RS2Sampler",
    "RunRecord",
    "evaluate",
    "forward_flops_per_sample",
    "per_sample_loss",
    "run_interleaved",
    "train_iter",
    "train_run",
]

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
P = ParamSpec("P")


class IndexedDataset(Dataset[Batch]):
    """``(x, y)`` tensors served as whole ``(x, y, index)`` batches, counting rows read.

    ``__getitems__`` lets a DataLoader fetch a batch with one tensor gather (no per-sample
    Python); pair it with ``collate_fn=as_batch``.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if len(x) != len(y):
            raise ValueError(f"inputs and labels differ in length: {len(x)} vs {len(y)}")
        self.x, self.y = x, y
        self.reads = 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> Batch:
        self.reads += 1
        return self.x[i], self.y[i], torch.tensor(i)

    def __getitems__(self, indices: list[int]) -> Batch:
        idx = torch.as_tensor(indices, dtype=torch.int64)
        self.reads += len(indices)
        return self.x[idx], self.y[idx], idx


def as_batch(batch: Batch) -> Batch:
    """Collate function for :class:`IndexedDataset`: the batch is already assembled."""
    return batch


@dataclass
class PolicyContext:
    """What a policy may use to set itself up for one run."""

    model: nn.Module
    dataset: IndexedDataset
    batch_size: int
    epochs: int
    seed: int
    device: torch.device
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor]
    make_loader: Callable[[Sampler[int] | None], DataLoader]
    count_scored: Callable[[int], None]


class PolicyRun(Protocol):
    """A policy's state during one run."""

    def batches(self, loader: DataLoader, epoch: int) -> Iterable[Batch]:
        """The batches to train on in ``epoch`` (the loader yields the full data, shuffled)."""
        ...

    def loss(self, losses: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The scalar to backpropagate from the step's per-sample ``losses`` (also a feedback
        point: a policy may record them)."""
        ...

    def epoch_reads(self, epoch: int, dataset_size: int) -> int:
        """Samples the policy will read from the data in ``epoch`` (for learning-rate progress).

        Called at the start of each epoch, on the run's clock: a policy may plan the epoch here
        (a pruning sampler does, and may run a scoring pass)."""
        ...


class Policy(Protocol):
    """A way of choosing what to train on. ``name`` labels results; ``describe`` records its
    settings; ``start`` sets up the state of one run."""

    name: str

    def describe(self) -> dict[str, Any]: ...

    def start(self, ctx: PolicyContext) -> PolicyRun: ...


class _FullDataRun:
    def batches(self, loader: DataLoader, epoch: int) -> Iterable[Batch]:
        return loader

    def loss(self, losses: torch.Tensor, batch: Batch) -> torch.Tensor:
        return losses.mean()

    def epoch_reads(self, epoch: int, dataset_size: int) -> int:
        return dataset_size


@dataclass(frozen=True)
class FullData:
    """Train on every sample, every epoch (the baseline)."""

    name: str = "full"

    def describe(self) -> dict[str, Any]:
        return {"policy": "full"}

    def start(self, ctx: PolicyContext) -> PolicyRun:
        return _FullDataRun()


class SeededShuffle(Sampler[int]):
    """Every index once per epoch, epoch ``e`` in the order of the ``e``-th
    ``torch.randperm(n, generator=torch.Generator().manual_seed(seed))``.

    The order a :class:`~hasten.sifting.PruningSampler` with the same seed yields while it
    prunes nothing, so a full-data run and a sifted one see the same batches until the first
    pruned epoch (a DataLoader's own ``shuffle=True`` also draws its workers' base seed from
    the generator, which shifts its stream).
    """

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self._gen = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        yield from torch.randperm(self.num_samples, generator=self._gen).tolist()


class RS2Sampler(Sampler[int]):
    """RS2 without replacement: each epoch a fresh random subset of ``subset_size`` samples.

    Okanovic et al., "Repeated Random Sampling for Minimizing the Time-to-Accuracy of Learning"
    (2023). The epochs walk through a random permutation of the data, ``subset_size`` samples at
    a time, so every sample is seen once before any is seen again; when fewer than
    ``subset_size`` samples are left, the epoch takes them and completes itself from the head of
    a new permutation (with those leftovers moved to its end, so no epoch holds a sample twice and
    every pass over the data still covers each sample exactly once). Call :meth:`set_epoch`
    with ``0, 1, 2, ...`` in order before iterating each epoch (epochs are drawn in sequence).

    Args:
        num_samples: Dataset size.
        subset_size: Samples per epoch, ``1 .. num_samples``.
        seed: Seeds the permutations (paired runs draw alike).
    """

    def __init__(self, num_samples: int, subset_size: int, seed: int) -> None:
        if not 1 <= subset_size <= num_samples:
            raise ValueError(
                f"subset_size must be in 1..{num_samples} (the dataset size), got {subset_size}"
            )
        self.num_samples, self.subset_size = num_samples, subset_size
        self._gen = torch.Generator().manual_seed(seed)
        self._order = torch.randperm(num_samples, generator=self._gen)
        self._pos = 0  # next unread position in _order
        self._epoch = -1
        self._subset = torch.empty(0, dtype=torch.int64)

    def set_epoch(self, epoch: int) -> None:
        """Draw ``epoch``'s subset (a no-op when it is drawn already)."""
        if epoch == self._epoch:
            return
        if epoch != self._epoch + 1:
            raise ValueError(
                f"RS2Sampler draws epochs in order: expected {self._epoch + 1}, got {epoch}"
            )
        self._epoch = epoch
        k, n = self.subset_size, self.num_samples
        take = self._order[self._pos : self._pos + k]
        self._pos += len(take)
        if len(take) < k:  # this pass is spent: start the next, leftovers last
            nxt = torch.randperm(n, generator=self._gen)
            is_left = torch.zeros(n, dtype=torch.bool)
            is_left[take] = True
            nxt = torch.cat([nxt[~is_left[nxt]], nxt[is_left[nxt]]])
            rest = k - len(take)
            take = torch.cat([take, nxt[:rest]])
            self._order, self._pos = nxt, rest
        self._subset = take

    def __len__(self) -> int:
        return self.subset_size

    def __iter__(self) -> Iterator[int]:
        if self._epoch < 0:
            self.set_epoch(0)
        return iter(self._subset.tolist())


class _RS2Run:
    def __init__(self, sampler: RS2Sampler, loader: DataLoader) -> None:
        self.sampler, self.loader = sampler, loader

    def batches(self, loader: DataLoader, epoch: int) -> DataLoader:
        self.sampler.set_epoch(epoch)
        return self.loader

    def loss(self, losses: torch.Tensor, batch: Batch) -> torch.Tensor:
        return losses.mean()

    def epoch_reads(self, epoch: int, dataset_size: int) -> int:
        self.sampler.set_epoch(epoch)
        return self.sampler.subset_size


@dataclass(frozen=True)
class RS2:
    """The RS2 baseline: ``task.epochs`` epochs, each on a fresh random subset (no replacement
    across epochs, see :class:`RS2Sampler`), the subset sized so the run backpropagates
    ``budget`` samples in all. Run it with ``train_iter(..., budget=budget)``, so the learning
    rate follows its own (shorter) schedule, exactly as the compute-matched full-data cut does.

    Attributes:
        budget: Samples to backpropagate over the whole run (the compute to match, divided by 3).
        name: The run's label in results (e.g. ``"rs2:stale-b1-fed"``).
    """

    budget: int
    name: str = "rs2"

    def describe(self) -> dict[str, Any]:
        return {"policy": "rs2", "budget": self.budget}

    def start(self, ctx: PolicyContext) -> _RS2Run:
        n = len(ctx.dataset)
        subset = min(n, max(1, math.ceil(self.budget / ctx.epochs)))
        sampler = RS2Sampler(n, subset, ctx.seed)
        return _RS2Run(sampler, ctx.make_loader(sampler))


@dataclass
class RunRecord:
    """One training run's outcome and its exact cost.

    ``compute`` counts forward = 1 and backward = 2 per sample: 3 per backpropagated sample plus
    1 per sample scored by an extra forward. ``flops`` is ``compute`` times the measured forward
    FLOPs of one sample. ``wall_s`` is training time (evaluation and compilation excluded; when a
    ``prepare_model`` compiles, compile time is ``compile_s``: the warm-up's, plus that of any
    recompile during the run, such as a short last batch under a new size guard). Each ``curve``
    point has the training seconds, samples and test accuracy at one evaluation, and, with a
    ``prepare_model``, the compile seconds spent by then (``compile_s``).
    """

    task: str
    policy: str
    seed: int
    test_acc: float
    samples_read: int
    samples_backprop: int
    samples_scored: int
    steps: int
    compute: int
    flops: float
    wall_s: float
    budget: int | None = None
    epochs_planned: int = 0
    reached_target_s: float | None = None
    compile_s: float | None = None
    curve: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def per_sample_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Cross-entropy of each sample in an ``(inputs, labels, ...)`` batch."""
    return F.cross_entropy(model(batch[0]), batch[1], reduction="none")


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024) -> float:
    """Accuracy of ``model`` on ``(x, y)`` in eval mode; the model's mode is restored."""
    was_training = model.training
    model.eval()
    correct = torch.zeros((), dtype=torch.int64, device=y.device)
    for i in range(0, len(y), batch_size):
        correct += (model(x[i : i + batch_size]).argmax(1) == y[i : i + batch_size]).sum()
    model.train(was_training)
    return correct.item() / max(1, len(y))  # intended host sync: one per evaluation


def forward_flops_per_sample(model: nn.Module, x: torch.Tensor) -> float:
    """Forward FLOPs of one sample (counted on the batch ``x``, divided by its size)."""
    was_training = model.training
    model.eval()
    with torch.no_grad():
        flops = count_flops(lambda: model(x))
    model.train(was_training)
    return flops / len(x)


def _to(batch: Batch, device: torch.device) -> Batch:
    if device.type == "cpu":
        return batch
    return tuple(t.to(device, non_blocking=True) for t in batch)  # type: ignore[return-value]


def _warm_up(
    model: nn.Module, data: SplitData, batch_size: int, device: torch.device, x_test: torch.Tensor
) -> None:  # the calls below mirror train_iter's and evaluate's exactly
    """Run every kind of call training will make once, then put the weights back.

    A lazily compiling model compiles here: a training step at the full and at an odd batch size
    (partial batches), an evaluation forward and an inference-mode forward (sifting's scoring).
    The weights and buffers are restored in place, so the run starts from the seed's
    initialisation and the compiled code stays valid; the clock for this is ``compile_s``.
    """
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = data.x_train[:batch_size].to(device), data.y_train[:batch_size].to(device)
    scratch = torch.optim.SGD(model.parameters(), lr=0.0)
    model.train()
    for n in (batch_size, max(1, batch_size - 1)):
        scratch.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[:n]), y[:n]).backward()
        scratch.step()
    evaluate(model, x_test, torch.zeros(len(x_test), dtype=torch.int64, device=device))
    model.eval()
    with torch.inference_mode():
        model(x)
    model.train()
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        model.load_state_dict(saved)


def _with_own_rng(
    fn: Callable[P, Generator[dict[str, float], None, RunRecord]],
) -> Callable[P, Generator[dict[str, float], None, RunRecord]]:
    """``fn``'s run driven by :func:`_own_rng`, with its ``seed`` and ``device`` arguments."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def start(*args: P.args, **kwargs: P.kwargs) -> Generator[dict[str, float], None, RunRecord]:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        seed, device = bound.arguments["seed"], torch.device(bound.arguments["device"])
        return _own_rng(fn(*args, **kwargs), seed, device)

    return start


def _own_rng(
    run: Generator[dict[str, float], None, RunRecord], seed: int, device: torch.device
) -> Generator[dict[str, float], None, RunRecord]:
    """``run`` driven with a global RNG stream of its own (CPU, and ``device``'s if CUDA),
    seeded by ``seed``; the caller's stream is restored whenever ``run`` is suspended."""
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()]
        if (device.type == "cuda")
        else []
    )
    with torch.random.fork_rng(devices=devices):
        torch.default_generator.manual_seed(seed)
        if devices:
            torch.cuda.manual_seed(seed)
        mine = _rng_state(devices)
    while True:
        with torch.random.fork_rng(devices=devices):
            _set_rng_state(mine, devices)
            try:
                point = next(run)
            except StopIteration as done:
                return done.value
            mine = _rng_state(devices)
        yield point


def _rng_state(devices: list[int]) -> list[torch.Tensor]:
    return [torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]


def _set_rng_state(state: list[torch.Tensor], devices: list[int]) -> None:
    torch.set_rng_state(state[0])
    for d, s in zip(devices, state[1:], strict=True):
        torch.cuda.set_rng_state(s, d)


@_with_own_rng
def train_iter(
    task: Task,
    policy: Policy,
    seed: int,
    *,
    data: SplitData | None = None,
    budget: int | None = None,
    device: str | torch.device = "cpu",
    prepare_model: Callable[[nn.Module], nn.Module] | None = None,
    evals_per_epoch: int = 0,
    target: float | None = None,
    flops_per_sample: float | None = None,
    warm_up: bool = True,
) -> Generator[dict[str, float], None, RunRecord]:
    """Train ``task``'s model with ``policy`` from seed ``seed``, yielding at every evaluation.

    A generator, so that several runs can be interleaved (each resumed in turn, the way the
    benchmark harness interleaves candidates, so machine drift hits them alike); its clock runs
    only while it is resumed. It yields each curve point and returns the :class:`RunRecord`;
    :func:`train_run` drives one to the end.

    Each run draws its random numbers (dropout; a compiled model's random seeds) from a stream
    of its own, seeded by ``seed`` and swapped in only while the run is resumed: interleaved
    runs with the same seed see the same dropout masks until their switches make them differ,
    and none perturbs another's, or the caller's, global RNG.

    Args:
        task: Dataset, model and recipe.
        policy: What to train on (:class:`FullData`, a sifting policy, ...).
        seed: Seeds the model's initial weights, the data order and the run's random stream;
            runs with the same seed are paired (same start, same shuffles, same dropout).
        data: The task's data, if already loaded.
        budget: Stop after this many backpropagated samples (the last batch is cut to fit) and
            fit the learning-rate schedule to that length. ``None``: ``task.epochs`` passes.
        device: Where to train.
        prepare_model: Applied to the fresh model before training (for example
            ``hasten.compile``). The model is then warmed up (see :func:`_warm_up`) and its
            weights restored; that time, and any compiling later in the run, is
            ``compile_s``, kept apart from ``wall_s``.
        evals_per_epoch: Test-accuracy evaluations per pass over the data (clock paused), for
            curves and ``target``; the final accuracy is always measured.
        target: Stop at the first evaluation whose test accuracy reaches this.
        flops_per_sample: Forward FLOPs per sample; measured on the model if ``None``.
        warm_up: With ``prepare_model``, warm the model up before the clock starts (steady-state
            figures). ``False`` runs it as a user's script does: the first calls compile (or
            the compile plan decides) on the clock, and the compiling seconds hasten reports
            go to ``compile_s``, the rest (eager steps the plan timed, the first call's check)
            to ``wall_s``.

    Raises:
        ValueError: for a non-positive budget or a negative ``evals_per_epoch``.
    """
    if budget is not None and budget < 1:
        raise ValueError(f"budget must be a positive number of samples, got {budget}")
    if evals_per_epoch < 0:
        raise ValueError(f"evals_per_epoch must be >= 0, got {evals_per_epoch}")
    device = torch.device(device)
    data = data or task.data()
    x_test, y_test = data.x_test.to(device), data.y_test.to(device)
    model = task.build_model(seed, data).to(device)
    if flops_per_sample is None:
        flops_per_sample = forward_flops_per_sample(model, x_test[: task.batch_size])
    compile_s = None
    if prepare_model is not None:
        t0 = time.perf_counter()
        model = prepare_model(model)
        if warm_up:
            _warm_up(model, data, task.batch_size, device, x_test)
        synchronize(device)
        compile_s = time.perf_counter() - t0
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=task.lr, weight_decay=task.weight_decay)
    dataset = IndexedDataset(data.x_train, data.y_train)
    n = len(dataset)

    def make_loader(sampler: Sampler[int] | None = None) -> DataLoader:
        # full data: shuffled as a pruning sampler with this seed shuffles (paired runs)
        return DataLoader(
            dataset,
            batch_size=task.batch_size,
            sampler=SeededShuffle(n, seed) if sampler is None else sampler,
            collate_fn=as_batch,
        )

    scored = [0]

    def count_scored(k: int) -> None:
        scored[0] += k

    ctx = PolicyContext(
        model=model,
        dataset=dataset,
        batch_size=task.batch_size,
        epochs=task.epochs,
        seed=seed,
        device=device,
        loss_fn=per_sample_loss,
        make_loader=make_loader,
        count_scored=count_scored,
    )
    run = policy.start(ctx)
    loader = make_loader()

    backprop = steps = 0
    clock = 0.0  # training seconds, evaluation and compilation excluded
    compiled_so_far = _hasten_api.compile_seconds(model) if prepare_model is not None else 0.0

    def lap(t0: float) -> float:
        # Seconds since t0 less any compiling in them (a recompile for an odd batch size in
        # mid-run), which goes to compile_s: steady-state time and compile time stay apart.
        nonlocal compile_s, compiled_so_far
        elapsed = time.perf_counter() - t0
        if prepare_model is None:
            return elapsed
        now = _hasten_api.compile_seconds(model)
        spent, compiled_so_far = now - compiled_so_far, now
        if spent > 0:
            compile_s = (compile_s or 0.0) + spent
        return max(0.0, elapsed - spent)

    curve: list[dict[str, float]] = []
    reached: float | None = None
    eval_every = n / evals_per_epoch if evals_per_epoch else math.inf
    next_eval = eval_every

    def record_eval(acc: float | None = None) -> dict[str, float]:
        acc = evaluate(model, x_test, y_test) if acc is None else acc
        point = {
            "wall_s": clock,
            "samples_read": dataset.reads,
            "samples_backprop": backprop,
            "compute": 3 * backprop + scored[0],
            "test_acc": acc,
        }
        if prepare_model is not None:  # compiling so far: a curve point's time incl. compile
            point["compile_s"] = compile_s or 0.0
        curve.append(point)
        return point

    if evals_per_epoch:
        yield record_eval()  # the starting point of the curve (not checked against the target)
    stop = False
    epoch = 0
    while not stop and (budget is not None or epoch < task.epochs):
        synchronize(device)
        # the policy's epoch planning (e.g. a scoring pass) is training time: on the clock
        t0 = time.perf_counter()
        epoch_reads = max(1, run.epoch_reads(epoch, n))
        reads_at_epoch_start = dataset.reads
        for batch in run.batches(loader, epoch):
            batch = _to(batch, device)
            if budget is not None:
                if len(batch[1]) > budget - backprop:  # cut the last batch to the budget
                    batch = tuple(t[: budget - backprop] for t in batch)  # type: ignore[assignment]
                progress = backprop / budget
            else:
                in_epoch = min(1.0, (dataset.reads - reads_at_epoch_start) / epoch_reads)
                progress = (epoch + in_epoch) / task.epochs
            for group in opt.param_groups:
                group["lr"] = lr_at(progress, task.lr, task.warmup)
            opt.zero_grad(set_to_none=True)
            losses = per_sample_loss(model, batch)
            run.loss(losses, batch).backward()
            opt.step()
            backprop += len(batch[1])
            steps += 1
            if budget is not None and backprop >= budget:
                stop = True
            if dataset.reads >= next_eval or stop:
                synchronize(device)
                clock += lap(t0)
                while next_eval <= dataset.reads:
                    next_eval += eval_every
                if evals_per_epoch:
                    point = record_eval()
                    if target is not None and point["test_acc"] >= target and reached is None:
                        reached, stop = clock, True
                    yield point
                t0 = time.perf_counter()
                if stop:
                    break
        else:
            synchronize(device)
            clock += lap(t0)
        epoch += 1
    final_acc = evaluate(model, x_test, y_test)
    if not curve or curve[-1]["samples_backprop"] != backprop:
        yield record_eval(final_acc)
    if target is not None and reached is None and final_acc >= target:
        reached = clock
    compute = 3 * backprop + scored[0]
    info: dict[str, Any] = dict(policy.describe())
    if prepare_model is not None:  # 0: the compile plan ran every call eagerly
        info["compiled_graphs"] = _hasten_api.graph_count(model)
    report = getattr(run, "report", None)
    if callable(report):  # what a sifting policy left out, in its own words
        info["sifting"] = report()
    return RunRecord(
        task=task.name,
        policy=policy.name,
        seed=seed,
        test_acc=final_acc,
        samples_read=dataset.reads,
        samples_backprop=backprop,
        samples_scored=scored[0],
        steps=steps,
        compute=compute,
        flops=compute * flops_per_sample,
        wall_s=clock,
        budget=budget,
        epochs_planned=task.epochs,
        reached_target_s=reached,
        compile_s=compile_s,
        curve=curve,
        info=info,
    )


def train_run(
    task: Task,
    policy: Policy,
    seed: int,
    *,
    on_eval: Callable[[dict[str, float]], None] | None = None,
    **kwargs: Any,
) -> RunRecord:
    """Run :func:`train_iter` to the end and return its :class:`RunRecord`.

    Args:
        task: Dataset, model and recipe.
        policy: What to train on.
        seed: Initial weights and data order.
        on_eval: Called with each curve point (progress display).
        **kwargs: The keyword arguments of :func:`train_iter`.
    """
    gen = train_iter(task, policy, seed, **kwargs)
    while True:
        try:
            point = next(gen)
        except StopIteration as done:
            return done.value
        if on_eval is not None:
            on_eval(point)


def run_interleaved(
    runs: dict[str, Generator[dict[str, float], None, RunRecord]],
    on_eval: Callable[[str, dict[str, float]], None] | None = None,
) -> dict[str, RunRecord]:
    """Drive several :func:`train_iter` runs to the end, one evaluation interval at a time.

    The order rotates every turn, so a change in machine load hits every run alike (each run's
    clock runs only while it trains). Returns the records under the same keys.
    """
    from hasten.bench.harness import rotated

    running = dict(runs)
    records: dict[str, RunRecord] = {}
    turn = 0
    while running:
        for name in rotated(list(running), turn):
            try:
                point = next(running[name])
            except StopIteration as done:
                records[name] = done.value
                del running[name]
                continue
            if on_eval is not None:
                on_eval(name, point)
        turn += 1
    return {name: records[name] for name in runs}
