"""Compiling a graph a pass split into parts (``submod_*``), each part with Inductor on its own.

It re-implements what TorchDynamo's DDPOptimizer does with fake tensors and AOTAutograd's
tracing switches, all internals: on a torch without them (probe ``dynamo.split_compile``) the
split graph is compiled whole, as one Inductor graph (plain Inductor: the parts are inlined).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx

from hasten.compiler.hooks import register, usable
from hasten.compiler.hooks.inductor import compile_fx

__all__ = ["compile_parts"]


@register("dynamo.split_compile", "a split graph compiled part by part (AOTAutograd cache hits)")
def _probe() -> str | None:
    import torch._dynamo.utils as utils
    import torch._subclasses as subclasses

    for attr in (
        "_disable_saved_tensors_hooks_during_tracing",
        "deepcopy_to_fake_tensor",
        "detect_fake_mode",
        "to_fake_tensor",
    ):
        if not callable(getattr(utils, attr, None)):
            return f"no torch._dynamo.utils.{attr}"
    for attr in ("FakeTensor", "FakeTensorMode"):
        if not hasattr(subclasses, attr):
            return f"no torch._subclasses.{attr}"
    return None


def compile_parts(
    split: torch.fx.GraphModule, example_inputs: Sequence[Any], patches: Mapping[str, Any]
) -> Callable[..., Any]:
    """Compile each part of a graph a pass split (``submod_*``) with Inductor, on its own.

    The outer graph runs on fake tensors; each part is compiled, in order, with the inputs it
    receives, and the next part's inputs come from running the part's *uncompiled* graph on fake
    tensors (eager's shapes and strides; Inductor keeps graph outputs at eager strides, and its
    code checks every input's size and stride, so a mismatch raises instead of computing wrong).

    TorchDynamo's DDPOptimizer instead marks each part's first AOTAutograd call to return fake
    outputs (``fakify_first_call``), which AOTAutograd's cache refuses to store: with it a warm
    start re-traced and re-partitioned GPT-2 124M's joint graph (AOTAutogradCache bypassed twice).
    The backward is lowered eagerly (see :func:`hasten.compiler.hooks.inductor.scoped`), so no
    per-part metadata has to outlive the compile.
    """
    if not usable("dynamo.split_compile"):
        return compile_fx(split, example_inputs, patches)
    from unittest import mock

    from torch._dynamo.utils import (
        _disable_saved_tensors_hooks_during_tracing,
        deepcopy_to_fake_tensor,
        detect_fake_mode,
        to_fake_tensor,
    )
    from torch._subclasses import FakeTensor, FakeTensorMode

    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode()

    class _Part(torch.nn.Module):
        def __init__(self, fn: Callable[..., Any]) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, *args: Any) -> Any:
            return self.fn(*args)

    class _PartCompiler(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            args = tuple(
                to_fake_tensor(a, fake_mode)
                if isinstance(a, torch.Tensor) and not isinstance(a, FakeTensor)
                else a
                for a in args
            )
            if n.op != "call_module":
                return getattr(self, n.op)(n.target, args, kwargs)
            part = self.fetch_attr(str(n.target))
            fake_part = deepcopy_to_fake_tensor(part, fake_mode)  # before compile_fx rewrites it
            compiled = compile_fx(part, list(args), patches)
            self.module.delete_submodule(str(n.target))
            n.target = f"compiled_{n.target}"
            self.module.add_submodule(n.target, _Part(compiled))
            with fake_mode, mock.patch.object(fake_mode, "allow_non_fake_inputs", True):
                return fake_part(*args, **kwargs)

    with _disable_saved_tensors_hooks_during_tracing():
        _PartCompiler(split).run(*example_inputs)
    split.recompile()
    return split
