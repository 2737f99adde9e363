"""hasten builds a compiled graph's CPU kernels as a few shared libraries, not one each."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("hasten.compiler")

from hasten.compiler import hooks
from hasten.compiler.hooks import kernels

pytestmark = pytest.mark.slow


class Net(nn.Module):
    """Enough elementwise and reduction work for several fused kernels, forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 24)
        self.norm = nn.LayerNorm(24)
        self.b = nn.Linear(24, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.norm(self.a(x))) * torch.sigmoid(x.sum(-1, keepdim=True))
        return torch.log_softmax(self.b(h), dim=-1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    from torch._inductor import config

    torch._dynamo.reset()
    with config.patch(compile_threads=2):  # the batched path (as on this project's 2 cores)
        yield tmp_path
    torch._dynamo.reset()


def _steps(model: nn.Module, n: int = 3) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    outs = []
    for _ in range(n):
        x = torch.randn(16, 12, generator=g)
        y = model(x)
        y[:, 0].sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        outs.append(y.detach())
    return outs, [p.detach().clone() for p in model.parameters()]


def _libraries(root) -> tuple[int, int]:
    """Batched libraries and one-kernel libraries Inductor-style, built under ``root``."""
    batched = single = 0
    for cpp in root.rglob("*.main.cpp"):
        text = cpp.read_text()
        if not cpp.with_suffix("").with_suffix(".main.so").exists():
            continue
        if "namespace hasten_k" in text:
            batched += 1
        elif 'extern "C"' in text and "kernel(" in text:
            single += 1
    return batched, single


@pytest.fixture(autouse=True)
def _fresh_probes():
    hooks.missing.cache_clear()
    if not hooks.usable("inductor.batched_kernels"):  # then hasten compiles Inductor's way
        pytest.skip(
            f"batched kernels are off on this torch: {hooks.missing('inductor.batched_kernels')}"
        )
    yield
    hooks.missing.cache_clear()


def _compiled(batch: bool, monkeypatch, cache_dir) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    import hasten

    # off: the hook's probe says no, as on a torch without Inductor's internals it patches
    name = "inductor.batched_kernels"
    real = hooks._HOOKS[name]
    probe = real.probe if batch else (lambda: "switched off by the test")
    monkeypatch.setitem(hooks._HOOKS, name, hooks.Hook(name, real.what, probe))
    hooks.missing.cache_clear()
    torch.manual_seed(0)
    model = hasten.compile(Net(), fallback="raise", cache_dir=cache_dir, regions="whole")
    return _steps(model)


def test_batched_kernels_compute_what_inductors_own_do(cache, monkeypatch):
    outs, params = _compiled(True, monkeypatch, cache / "on")
    batched, single = _libraries(cache / "on")
    assert batched >= 1 and single == 0  # forward and backward: one library per worker at most
    torch._dynamo.reset()
    outs2, params2 = _compiled(False, monkeypatch, cache / "off")
    off_batched, off_single = _libraries(cache / "off")
    assert off_batched == 0 and off_single > batched  # Inductor's way: a library per kernel
    # the same kernel code and compiler flags, packaged differently: identical results, fp32
    for a, b in zip(outs + params, outs2 + params2):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.manual_seed(0)
    want, _ = _steps(copy.deepcopy(Net()))  # and eager agrees (fused reductions: fp32 rounding)
    for a, b in zip(outs, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_library_that_fails_to_build_falls_back_to_one_per_kernel(cache, monkeypatch):
    class Broken:
        @staticmethod
        def load_async(*args, **kwargs):
            raise RuntimeError("compiler crashed")

    monkeypatch.setattr(kernels, "_kernel_library", lambda: Broken)
    outs, params = _compiled(True, monkeypatch, cache / "on")
    batched, single = _libraries(cache / "on")
    assert batched == 0 and single >= 2  # built Inductor's way after all
    torch._dynamo.reset()
    outs2, params2 = _compiled(False, monkeypatch, cache / "off")
    for a, b in zip(outs + params, outs2 + params2):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_patch_is_scoped_to_hastens_compiles():
    from torch._inductor.async_compile import AsyncCompile

    before = AsyncCompile.cpp_pybinding
    with kernels.batched_kernels():
        with kernels.batched_kernels():  # re-entrant: a split graph compiles parts inside
            assert AsyncCompile.cpp_pybinding is not before
        assert AsyncCompile.cpp_pybinding is not before
    assert AsyncCompile.cpp_pybinding is before
