"""hasten's compiler under a Keras model on the PyTorch backend.

Keras runs a layer's call through Python bookkeeping (call context, autocast scope, attribute
tracking) that TorchDynamo cannot trace without graph breaks, and every break re-enters Keras's
shared functions, so a few layers are enough to hit torch's recompile limit. So hasten does not
let Dynamo trace Keras. It captures each *variant* of the model's call once with
``torch.export`` in non-strict mode, which runs Keras's Python as Python and records only the
torch operations, and compiles the captured graph with ``hasten.compile``::

    Layer.__call__(model, x, training=...)      # Keras's bookkeeping, eager, as always
      -> model.call  = KerasForward.__call__     # installed on the instance
           variant = (training, grad mode, input shapes and dtypes)
           first time: torch.export(call, strict=False) -> graph module -> hasten.compile
           then: the variant's compiled graph module (its own code object: no recompiles)

The graph modules hold the Keras variables' own tensors (``torch.export`` lifts the model's
parameters, which are the variables), so gradients land where Keras's optimizer reads them.
A variant that cannot be captured runs Keras's own call eagerly, with one warning naming why.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from torch import nn

from hasten.compiler.hooks import nn as pytree  # torch's pytree (tree_flatten, tree_unflatten)

__all__ = ["KerasForward", "install", "uninstall"]

MAX_VARIANTS = 8
RARE_CALLS = 8  # calls of a new variant (a short last batch, evaluation) before it is captured
"""Distinct captured variants per model (shapes of partial batches add some); beyond this a new
variant runs eagerly, with a warning."""


_TENSOR = object()  # marks where a tensor argument goes


class _Call(nn.Module):
    """What ``torch.export`` captures: the model's call with non-tensor arguments baked in."""

    def __init__(self, model: Any, spec: Any, leaves: list[Any]):
        super().__init__()
        self.model = model  # registers the Keras variables as this module's parameters
        self._spec = spec
        self._leaves = leaves  # non-tensor leaves; tensor slots hold _TENSOR

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        leaves = [next(it) if v is _TENSOR else v for v in self._leaves]
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        # Keras variables keep their own reference to their tensor, so reading them directly
        # would bake their values into the graph as constants. Read them from the module's
        # parameters instead (what torch.export swaps for its tracing tensors) and run Keras's
        # stateless call on them: the graph takes the parameters as parameters.
        model, params = self.model, self.model._torch_params
        trainable = [params[v.path] for v in model.trainable_variables]
        non_trainable = [params[v.path] for v in model.non_trainable_variables]
        return model.stateless_call(trainable, non_trainable, *args, **kwargs)


class KerasForward:
    """Installed as ``model.call``: dispatches each call variant to its compiled graph.

    Args:
        model: The Keras model (torch backend).
        config: The :class:`~hasten.compiler.config.CompileConfig` for ``hasten.compile``.
    """

    def __init__(self, model: Any, config: Any) -> None:
        self.model = model
        self.original = type(model).call.__get__(model)
        self.config = config
        self.graphs: dict[Any, Any] = {}  # variant key -> compiled module, or None (eager)
        self.failures: list[str] = []
        self.captures = 0
        self._seen: dict[Any, int] = {}  # calls of a variant not captured yet

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or _in_keras_scope():
            return self.original(*args, **kwargs)  # symbolic build, or inside another trace
        leaves, spec = pytree.tree_flatten((args, kwargs))
        # Functional models get their inputs as the user passed them (NumPy arrays): convert
        # them as Keras would, so the graph sees tensors
        leaves = [_as_tensor(v) if isinstance(v, np.ndarray) else v for v in leaves]
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        if not tensors or any(t.device.type == "meta" or _is_fake(t) for t in tensors):
            return self.original(*args, **kwargs)
        training = bool(kwargs.get("training", False))
        others = tuple(
            None if isinstance(v, torch.Tensor) else _key(v) for v in leaves
        )  # hashable stand-ins
        key = (
            training,
            torch.is_grad_enabled(),
            spec,
            tuple((tuple(t.shape), t.dtype) for t in tensors),
            others,
        )
        # a short last batch (a new leading size) runs eagerly until its size has come back
        # RARE_CALLS times: each new shape is a capture and a compile of its own, and a sifted
        # fit ends most epochs with one of another size, up to the variant limit
        if key not in self.graphs and self.graphs:
            seen = self._seen[key] = self._seen.get(key, 0) + 1
            if seen < RARE_CALLS:
                return self.original(*args, **kwargs)
        if key not in self.graphs:
            self.graphs[key] = self._capture(args, kwargs, leaves, spec, tensors, training)
        graph = self.graphs[key]
        if graph is None:
            return self.original(*args, **kwargs)
        out, updates = graph(*tensors)
        with torch.no_grad():  # moving statistics, seed states: what Keras's call would assign
            for variable, value in zip(self.model.non_trainable_variables, updates):
                variable.assign(value)
        return out

    def _capture(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        leaves: list[Any],
        spec: Any,
        tensors: list[torch.Tensor],
        training: bool,
    ) -> Any:
        from hasten.compiler.api import compile as hasten_compile

        if self.captures >= MAX_VARIANTS:
            self._fail(f"more than {MAX_VARIANTS} call variants (changing input shapes?)")
            return None
        self.captures += 1
        slots = [_TENSOR if isinstance(v, torch.Tensor) else v for v in leaves]
        try:
            module = _Call(self.model, spec, slots)
            exported = torch.export.export(module, tuple(tensors), strict=False)
            graph = exported.module()
        except Exception as err:
            self._fail(f"torch.export could not capture the call: {type(err).__name__}: {err}")
            return None
        # Keras's training flag is baked into it; hasten.keras.compile chooses by measuring
        # the candidates, so the graph compiles at once (not under the run-length plan)
        cfg = self.config.replace(regions="whole") if self.config.regions == "auto" else self.config
        return hasten_compile(graph, cfg)

    def _fail(self, cause: str) -> None:
        cause = " ".join(cause.split())[:400]
        self.failures.append(cause)
        warnings.warn(
            f"hasten.keras: one call variant of {self.model.name} runs eagerly (Keras's own "
            f"call): {cause}",
            RuntimeWarning,
            stacklevel=3,
        )


def _in_keras_scope() -> bool:
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope

    return in_stateless_scope() or in_symbolic_scope()


def _as_tensor(value: np.ndarray) -> torch.Tensor:
    import keras

    return keras.ops.convert_to_tensor(value)


def _is_fake(t: torch.Tensor) -> bool:
    from hasten.compiler.hooks.dynamo import is_fake_tensor

    return is_fake_tensor(t)


def _key(value: Any) -> Any:
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def install(model: Any, config: Any) -> KerasForward:
    """Put a :class:`KerasForward` on ``model.call``; Keras's train/test functions are rebuilt."""
    fwd = KerasForward(model, config)
    object.__setattr__(model, "call", fwd)
    return fwd


def uninstall(model: Any) -> None:
    """Remove what :func:`install` put on ``model`` (Keras's own call again)."""
    if isinstance(model.__dict__.get("call"), KerasForward):
        object.__delattr__(model, "call")
