"""``hasten.keras.compile``: measure the backend's switches on a few real steps, keep the fastest
one that computes what Keras computes.

The pipeline, once, before ``fit``::

    model = build()  [under the mixed policy for precision="bf16": Keras decides a layer's dtypes
                      when it is built, so the model is built or cloned under the policy]
    snapshot weights and optimizer state
    for each candidate of the backend (TensorFlow: XLA or not; PyTorch: Keras eager, Keras's
                                       jit_compile=True (torch.compile) or hasten's compiler;
                                       JAX: XLA):
        configure the model, time the first step (compile) and a few steady steps
        check its numerics against the reference (Keras's default, uncompiled step)
        restore the snapshot
    configure the fastest candidate that passed (the run's length known, epochs x steps_per_epoch:
                 the shortest whole run, its first, compiling step included); log one line;
                 model.hasten_report says why

Failures never stop training: a candidate that raises or whose numerics differ is dropped with a
:class:`HastenKerasWarning` naming the cause, and Keras's default step remains.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "CandidateReport",
    "HastenKerasWarning",
    "KerasCompileReport",
    "candidates_for",
    "compile",
]

logger = logging.getLogger("hasten.keras")

PRECISIONS = ("fp32", "bf16", "fp16")
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
TOLERANCES = {"fp32": 2e-3, "bf16": 5e-2, "fp16": 2e-2}
"""Relative tolerance on the losses compared (fp32: reordered sums; bf16: 8-bit mantissa)."""


class HastenKerasWarning(UserWarning):
    """A candidate configuration failed or computed different numbers, and was left out."""


@dataclass
class CandidateReport:
    """One configuration tried: its timing and whether it passed the numerics check."""

    name: str
    settings: dict[str, Any]
    step_ms: float | None = None
    first_step_s: float | None = None
    verified: bool | None = None
    max_rel_diff: float | None = None
    error: str | None = None


@dataclass
class KerasCompileReport:
    """What :func:`compile` measured and chose. ``str(report)`` is the one-line summary."""

    backend: str
    precision: str
    policy: str
    chosen: str
    reason: str
    candidates: list[CandidateReport] = field(default_factory=list)
    checked: str = ""
    loss_scaling: bool = False
    built: str = "as given"
    run_steps: int | None = None
    """The run's training steps, when given (``epochs`` x ``steps_per_epoch``): the choice is
    then the shortest run, the first (compiling) step included; else the fastest steady step."""

    def candidate(self, name: str) -> CandidateReport:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        times = ", ".join(
            f"{c.name} {c.step_ms:.1f} ms" if c.step_ms is not None else f"{c.name} failed"
            for c in self.candidates
        )
        return (
            f"hasten.keras: {self.backend} {self.precision} ({self.policy}): chose {self.chosen}"
            f" — {self.reason} [{times}]"
        )


@dataclass(frozen=True)
class _Candidate:
    name: str
    jit_compile: bool
    hasten: bool = False


def candidates_for(backend: str) -> list[_Candidate]:
    """The configurations tried on ``backend``; the first is the reference (Keras's default).

    Every switch Keras itself offers on the backend is among them, so the choice is never slower
    in the trial than the best of Keras's own: on PyTorch that is ``jit_compile=True``
    (``"keras+jit"``: Keras wraps its train and test steps in ``torch.compile``), beside hasten's
    compiler of the model's forward.
    """
    if backend == "tensorflow":
        return [_Candidate("keras", False), _Candidate("keras+xla", True)]
    if backend == "torch":
        return [
            _Candidate("keras", False),
            _Candidate("keras+jit", True),
            _Candidate("hasten", False, hasten=True),
        ]
    if backend == "jax":
        return [_Candidate("keras+xla", True)]
    raise ValueError(f"hasten.keras supports the tensorflow, torch and jax backends, not {backend}")


KEEP_DEFAULT_MARGIN = 0.03
"""A candidate replaces Keras's default step only when its trial is this much faster."""


def compile(
    model: Any,
    data: Any,
    *,
    precision: str = "fp32",
    candidates: Sequence[str] | None = None,
    steps: int = 3,
    warmup: int = 2,
    check: bool = True,
    rtol: float | None = None,
    verbose: bool = True,
    epochs: int | None = None,
    steps_per_epoch: int | None = None,
) -> Any:
    """Pick and apply the fastest correct training configuration for a Keras 3 model.

    Call it after ``model.compile(optimizer, loss, ...)`` and before ``fit`` (or a custom loop
    of ``train_on_batch``). It runs a few steps of each candidate on ``data``, then restores the
    weights and optimizer state, so training starts from where the model was.

    Args:
        model: A compiled Keras 3 model, or a function with no arguments that builds and
            compiles one. For ``precision="bf16"`` the layers must be built under Keras's mixed
            policy: a function is called under it; a Functional or Sequential model is cloned
            under it (weights copied, compiled with the same arguments); a built subclassed
            model raises (pass a function instead).
        data: One training batch, ``(x, y)`` or ``(x, y, sample_weight)``, or a
            ``keras.utils.PyDataset`` / ``tf.data.Dataset`` whose first batch is used.
        precision: ``"fp32"``, ``"bf16"`` (Keras's ``mixed_bfloat16``: no loss scaling needed)
            or ``"fp16"`` (``mixed_float16``; Keras wraps the optimizer in a
            ``LossScaleOptimizer``).
        candidates: Names to try (default: all of the backend's, see :func:`candidates_for`).
        steps: Timed steps per candidate (median taken).
        warmup: Untimed steps after the first (compiling) one.
        check: Compare each candidate's losses with the reference step's.
        rtol: Relative tolerance of that check (default per precision, see ``TOLERANCES``).
        verbose: Print the one-line summary (it is always logged to ``hasten.keras``).
        epochs: The ``epochs`` you will give ``fit``: with ``steps_per_epoch``, the run's length,
            ``epochs * steps_per_epoch`` training steps. Known, it decides: each candidate's
            whole run is estimated as its first (compiling) step plus the rest at its steady
            step, and the shortest wins, so a run too short to pay back a compile keeps Keras's
            default step; hasten's compiler is told the length too (``CompileConfig.steps``).
            Unknown (``None``), the fastest steady step wins.
        steps_per_epoch: Training steps per epoch (``ceil(len(x) / batch_size)``, or what you
            give ``fit``); default ``len(data)`` when ``data`` is a ``keras.utils.PyDataset``.

    Returns:
        The model to train: ``model`` itself, configured, or its clone for bf16. Its
        ``hasten_report`` attribute is a :class:`KerasCompileReport`.

    Example::

        model = hasten.keras.compile(model, (x[:64], y[:64]), precision="bf16")
        model.fit(x, y, batch_size=64, epochs=3)
        print(model.hasten_report)
    """
    import keras

    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    for name, value in (("steps", steps), ("warmup", warmup)):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < (1 if name == "steps" else 0)
        ):
            raise ValueError(
                f"{name} must be an int >= {1 if name == 'steps' else 0}, got {value!r}"
            )
    run_steps = _run_steps(data, epochs, steps_per_epoch)
    backend = keras.backend.backend()
    if precision == "bf16" and _bf16_emulated(backend):
        _warn(
            "precision='bf16' on this CPU runs emulated: it lists no AVX512-BF16 or AMX unit "
            "('hasten doctor' shows what it has), so bf16 matmuls are usually slower than fp32's "
            "here; build the model in float32 and pass precision='fp32'"
        )
    model, built = _model_under_policy(model, POLICIES[precision])
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ValueError(
            "hasten.keras.compile needs a compiled model: call model.compile(optimizer=..., "
            "loss=...) first (or return a compiled model from the builder function)"
        )
    if getattr(model, "steps_per_execution", 1) != 1 and backend == "torch":
        raise ValueError("the PyTorch backend of Keras needs steps_per_execution=1")
    batch = _first_batch(data)
    pool = candidates_for(backend)
    if candidates is not None:
        known = {c.name for c in pool}
        unknown = [c for c in candidates if c not in known]
        if unknown:
            raise ValueError(
                f"unknown candidates {unknown} for the {backend} backend; choose from "
                f"{', '.join(sorted(known))}"
            )
        pool = [pool[0]] + [c for c in pool[1:] if c.name in candidates]
    tol = TOLERANCES[precision] if rtol is None else float(rtol)
    stochastic = _stochastic_layers(model)
    checked = (
        "the eval loss only (the model draws random numbers: " + ", ".join(stochastic[:3]) + ")"
        if stochastic
        else "the eval loss, and the training loss of two steps"
    )
    report = KerasCompileReport(
        backend=backend,
        precision=precision,
        policy=_policy_of(model),
        chosen=pool[0].name,
        reason="",
        checked=checked if check else "nothing (check=False)",
        loss_scaling=type(model.optimizer).__name__ == "LossScaleOptimizer",
        built=built,
        run_steps=run_steps,
    )
    state = _snapshot(model)
    reference: list[float] | None = None
    for cand in pool:
        entry = CandidateReport(cand.name, {"jit_compile": cand.jit_compile, "hasten": cand.hasten})
        report.candidates.append(entry)
        try:
            _configure(model, cand, steps=run_steps)
            losses, first_s, times = _trial(model, batch, steps, warmup, stochastic)
        except Exception as err:  # a candidate's failure is reported, not raised
            entry.error = _one_line(err)
            _restore(model, state)
            if cand is pool[0]:
                raise  # Keras's own default step fails: the model's or the data's error
            _warn(f"{cand.name} failed, so it is left out: {entry.error}")
            continue
        _restore(model, state)
        entry.first_step_s = first_s
        entry.step_ms = statistics.median(times) * 1e3
        if reference is None:
            reference = losses
            entry.verified = True
            entry.max_rel_diff = 0.0
        elif check:
            diff = max(_rel(a, b) for a, b in zip(losses, reference))
            entry.max_rel_diff = diff
            entry.verified = diff <= tol
            if not entry.verified:
                _warn(
                    f"{cand.name} computes different losses than Keras's default step (relative "
                    f"difference {diff:.2e} > {tol:.0e}), so it is left out"
                )
    ok = [c for c in report.candidates if c.step_ms is not None and (c.verified or not check)]

    def cost(c: CandidateReport) -> float:
        """Milliseconds: the steady step, or with the run's length known, the whole run."""
        if run_steps is None:
            return c.step_ms  # type: ignore[return-value]
        return (c.first_step_s or 0.0) * 1e3 + (run_steps - 1) * c.step_ms  # type: ignore[operator]

    best = min(ok, key=cost)
    ref = report.candidates[0]
    close = best is not ref and cost(best) > cost(ref) * (1 - KEEP_DEFAULT_MARGIN)
    over = (
        ""
        if run_steps is None
        else f" over the run's {run_steps} steps, the first (compiling) one included"
    )
    if close:
        # A few timed steps rank candidates within a few per cent by chance (measured: a torch
        # CNN's compiled graph won its trial and then ran 0.96x in the benchmark), so a gain
        # this small is not worth leaving Keras's own step for.
        best = ref
    report.chosen = best.name
    if best is ref and close:
        report.reason = (
            f"Keras's default step kept: no candidate was more than "
            f"{KEEP_DEFAULT_MARGIN:.0%} faster in the trial{over}"
        )
    elif best is ref:
        others = [c for c in report.candidates[1:]]
        why = "; ".join(
            f"{c.name} {'failed' if c.error else 'differs' if c.verified is False else 'slower'}"
            for c in others
        )
        report.reason = f"Keras's default step is fastest{over} ({why or 'no other candidate'})"
    else:
        report.reason = (
            f"{cost(ref) / cost(best):.2f}x Keras's default step{over}; numerics checked on "
            f"{report.checked} (max rel diff {best.max_rel_diff:.1e})"
            if check
            else f"{cost(ref) / cost(best):.2f}x Keras's default step{over} (not checked)"
        )
    _configure(model, next(c for c in pool if c.name == best.name), steps=run_steps)
    model.reset_metrics()
    object.__setattr__(model, "hasten_report", report)
    if verbose and not _logging_shows(logger, logging.INFO):
        print(report)  # the one line, where logging would not show it (a plain script)
    logger.info("%s", report)
    return model


def _logging_shows(log: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` on ``log`` reaches a handler that emits it.

    hasten's compiler gives the ``"hasten"`` logger a stderr handler in a script that set up no
    logging (``hasten.compiler.report.log_line``), and ``"hasten.keras"`` propagates to it: then
    printing the line too showed it twice.
    """
    if not log.isEnabledFor(level):
        return False
    current: logging.Logger | None = log
    while current is not None:
        if any(h.level <= level for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent  # type: ignore[assignment]
    return False


# ---------------------------------------------------------------------- building under a policy


def _model_under_policy(model: Any, policy: str) -> tuple[Any, str]:
    import keras

    if not isinstance(model, keras.Model):
        if not callable(model):
            raise TypeError(
                f"hasten.keras.compile takes a keras.Model or a function that builds one, got "
                f"{type(model).__name__}"
            )
        previous = keras.config.dtype_policy()
        keras.config.set_dtype_policy(policy)
        try:
            built = model()
        finally:
            keras.config.set_dtype_policy(previous)
        if not isinstance(built, keras.Model):
            raise TypeError(
                f"the builder function returned {type(built).__name__}, not a keras.Model"
            )
        return built, f"built by the function under {policy}"
    current = _policy_of(model)
    if current == policy:
        return model, "as given"
    if policy == "float32":
        raise ValueError(
            f"the model was built under the {current} policy but precision='fp32' was asked: "
            "pass the precision it was built for, or build it under float32"
        )
    if not _cloneable(model):
        raise ValueError(
            f"precision needs the {policy} policy, which Keras applies when layers are built; "
            f"{type(model).__name__} is a subclassed model hasten cannot rebuild. Pass a function "
            "that builds and compiles the model instead: hasten.keras.compile(lambda: "
            "make_model(), data, precision=...), or call "
            f"keras.config.set_dtype_policy('{policy}') before building it"
        )
    return _clone_under(model, policy), f"cloned under {policy} (weights copied)"


def _policy_of(model: Any) -> str:
    """The dtype policy of the model's layers that hold weights (the model's own otherwise)."""
    names = [
        layer.dtype_policy.name
        for layer in model._flatten_layers(include_self=False)
        if layer.weights and hasattr(layer, "dtype_policy")
    ]
    return max(set(names), key=names.count) if names else model.dtype_policy.name


def _cloneable(model: Any) -> bool:
    import keras

    return isinstance(model, keras.Sequential) or type(model).__name__ == "Functional"


def _clone_under(model: Any, policy: str) -> Any:
    import keras

    def clone(layer: Any) -> Any:
        config = layer.get_config()
        config["dtype"] = policy
        return layer.__class__.from_config(config)

    clone_model = keras.models.clone_model(model, clone_function=clone)
    clone_model.set_weights(model.get_weights())
    if getattr(model, "compiled", False):
        cfg = dict(model._compile_config.config)  # the arguments model.compile() was given
        opt = model.optimizer
        cfg["optimizer"] = type(opt).from_config(opt.get_config())  # fresh slots for new variables
        clone_model.compile(**cfg)
    return clone_model


# ---------------------------------------------------------------------- measuring


def _run_steps(data: Any, epochs: int | None, steps_per_epoch: int | None) -> int | None:
    """The run's training steps (``epochs * steps_per_epoch``), or ``None`` when not given."""
    import keras

    for name, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
    if epochs is None:
        if steps_per_epoch is not None:
            raise ValueError(
                "steps_per_epoch says how long an epoch is; pass epochs=<the epochs given to fit> "
                "too, so that the run's length is known"
            )
        return None
    if steps_per_epoch is None:
        if not isinstance(data, keras.utils.PyDataset):
            raise ValueError(
                f"epochs={epochs} needs the steps of an epoch, and data is one batch: pass "
                "steps_per_epoch=ceil(len(x) / batch_size) (or what you give fit), or data as the "
                "keras.utils.PyDataset you will fit on"
            )
        steps_per_epoch = len(data)
    return epochs * steps_per_epoch


def _first_batch(data: Any) -> tuple[Any, ...]:
    import keras

    if isinstance(data, keras.utils.PyDataset):
        data = data[0]
    elif type(data).__module__.startswith("tensorflow") and hasattr(data, "take"):
        data = next(iter(data.take(1).as_numpy_iterator()))
    if isinstance(data, dict) or not isinstance(data, (tuple, list)) or not 1 <= len(data) <= 3:
        raise TypeError(
            "data must be a batch (x, y) or (x, y, sample_weight), a keras.utils.PyDataset or a "
            f"tf.data.Dataset; got {type(data).__name__}"
        )
    return tuple(data)


def _stochastic_layers(model: Any) -> list[str]:
    out = []
    for layer in model._flatten_layers(include_self=False):
        amount = [getattr(layer, a, 0) for a in ("rate", "dropout", "stddev", "recurrent_dropout")]
        if any(isinstance(a, (int, float)) and not isinstance(a, bool) and a > 0 for a in amount):
            out.append(layer.name)  # Dropout, GaussianNoise, attention/RNN dropout ...
    return out


def _configure(model: Any, cand: _Candidate, *, steps: int | None = None) -> None:
    """Make ``cand`` the model's step; ``steps``, the run's length, goes to hasten's compiler."""
    import keras

    from hasten.keras import _torch_forward

    if keras.backend.backend() == "torch":
        _torch_forward.uninstall(model)
        if cand.hasten:  # the graphs captured in the trial are kept: nothing compiles twice
            fwd = model.__dict__.get("_hasten_keras_forward")
            if fwd is None:
                from hasten.compiler.config import CompileConfig

                fwd = _torch_forward.KerasForward(
                    model, CompileConfig(fallback="eager", steps=steps)
                )
                object.__setattr__(model, "_hasten_keras_forward", fwd)
            object.__setattr__(model, "call", fwd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras warns when it refuses jit_compile: said below
        model.jit_compile = cand.jit_compile
    if cand.jit_compile and not model.jit_compile:
        raise RuntimeError(
            f"Keras does not support jit_compile=True for {type(model).__name__} on the "
            f"{keras.backend.backend()} backend (it keeps jit_compile=False)"
        )
    model.train_function = model.test_function = model.predict_function = None


def _trial(
    model: Any, batch: tuple[Any, ...], steps: int, warmup: int, stochastic: list[str]
) -> tuple[list[float], float, list[float]]:
    x, y, sw = (*batch, None, None)[:3]
    losses = [_loss(model.test_on_batch(x, y, sample_weight=sw))]
    t0 = time.perf_counter()
    first = _loss(model.train_on_batch(x, y, sample_weight=sw))
    first_s = time.perf_counter() - t0
    second = _loss(model.train_on_batch(x, y, sample_weight=sw))
    if not stochastic:
        losses += [first, second]
    for _ in range(max(0, warmup - 1)):
        model.train_on_batch(x, y, sample_weight=sw)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        model.train_on_batch(x, y, sample_weight=sw)
        times.append(time.perf_counter() - t0)
    return losses, first_s, times


def _loss(out: Any) -> float:
    value = out[0] if isinstance(out, (list, tuple)) else out
    if isinstance(value, dict):
        value = value["loss"]
    return float(value)


def _snapshot(model: Any) -> dict[str, list[np.ndarray]]:
    import keras

    opt = model.optimizer
    if not opt.built:
        opt.build(model.trainable_variables)
    return {
        "model": [keras.ops.convert_to_numpy(v.value).copy() for v in model.variables],
        "optimizer": [keras.ops.convert_to_numpy(v.value).copy() for v in opt.variables],
    }


def _restore(model: Any, state: dict[str, list[np.ndarray]]) -> None:
    for v, value in zip(model.variables, state["model"]):
        v.assign(value)
    for v, value in zip(model.optimizer.variables, state["optimizer"]):
        v.assign(value)
    model.reset_metrics()


def _rel(a: float, b: float) -> float:
    if not (math.isfinite(a) and math.isfinite(b)):
        return 0.0 if a == b else math.inf
    return abs(a - b) / max(abs(b), 1e-6)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}"[:400]


def _bf16_emulated(backend: str) -> bool:
    """Whether ``backend`` would run bf16 on a CPU without bf16 units (no GPU in its sight)."""
    from hasten.compiler.hooks.aten import native_bf16_cpu

    if native_bf16_cpu() is not False:
        return False
    if backend == "torch":
        import torch

        return not torch.cuda.is_available()
    if backend == "tensorflow":
        import tensorflow as tf

        return not tf.config.list_physical_devices("GPU")
    if backend == "jax":
        import jax

        return bool(jax.default_backend() == "cpu")
    return False


def _warn(message: str) -> None:
    warnings.warn(f"hasten.keras.compile: {message}", HastenKerasWarning, stacklevel=3)


Builder = Callable[[], Any]
