"""The boundary around torch's internals: probes, skipped hooks, version differences."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from hasten.compiler import hooks
from hasten.compiler.config import CompileConfig
from hasten.compiler.hooks import dynamo as dynamo_hooks
from hasten.compiler.report import CompileRecord
from hasten.compiler.runtime import CompiledCode, RecompileWarning


def test_recompile_limit_reads_either_name_and_none_when_neither():
    ns = types.SimpleNamespace
    assert dynamo_hooks.recompile_limit(ns(recompile_limit=5, cache_size_limit=9)) == 5
    assert dynamo_hooks.recompile_limit(ns(cache_size_limit=9)) == 9  # torch < 2.7
    assert dynamo_hooks.recompile_limit(ns()) is None
    assert dynamo_hooks.recompile_limit(ns(recompile_limit=True)) is None  # not a number
    assert isinstance(dynamo_hooks.recompile_limit(), int)  # this torch has one


def test_recompile_limit_patch_sets_the_limit_hasten_reads():
    before = dynamo_hooks.recompile_limit()
    with dynamo_hooks.recompile_limit_patch(3):
        assert dynamo_hooks.recompile_limit() == 3
    assert dynamo_hooks.recompile_limit() == before


def _code_with_pending(*guards: str) -> CompiledCode:
    code = CompiledCode("Net", "call", CompileConfig(warn_recompiles=0), CompileRecord(), "cpu")
    code._pending = [("fn", g) for g in guards]
    return code


@pytest.mark.parametrize("limit", [None, 2])
def test_recompiles_are_recorded_whether_or_not_the_limit_is_known(monkeypatch, limit):
    # torch before 2.7 has no recompile_limit: reading it in the step's ``finally`` crashed the
    # user's step at the first recompile
    monkeypatch.setattr(dynamo_hooks, "recompile_limit", lambda config=None: limit)
    code = _code_with_pending("x == 1", "x == 2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert code._flush_recompiles() == "x == 1"
    assert [r.guard for r in code.record.recompiles] == ["x == 1"]
    msgs = [str(w.message) for w in caught if issubclass(w.category, RecompileWarning)]
    if limit is None:
        assert msgs == []  # no number to compare against: no limit warning, no crash
    else:
        assert len(msgs) == 1 and "recompile limit (2)" in msgs[0]


def test_every_hook_has_a_probe_that_answers_on_this_torch():
    names = [h.name for h in hooks.hooks()]
    assert len(names) == len(set(names))
    for h in hooks.hooks():
        why = hooks.missing(h.name)
        assert why is None or isinstance(why, str)
    required = [h.name for h in hooks.hooks() if h.required]
    assert required and all(hooks.usable(n) for n in required), hooks.table()


def test_an_unknown_hook_is_a_key_error_naming_the_known_ones():
    with pytest.raises(KeyError, match=r"dynamo\.recompile_limit"):
        hooks.missing("no.such.hook")


def test_a_probe_that_raises_counts_as_missing_and_is_listed_as_skipped(monkeypatch):
    def boom() -> str | None:
        raise AttributeError("module 'torch._inductor' has no attribute 'moved'")

    monkeypatch.setitem(hooks._HOOKS, "test.boom", hooks.Hook("test.boom", "a test hook", boom))
    hooks.missing.cache_clear()
    try:
        assert "AttributeError" in (hooks.missing("test.boom") or "")
        assert any(line.startswith("test.boom (a test hook)") for line in hooks.skipped())
        assert "skipped  optional test.boom" in hooks.table()
    finally:
        hooks.missing.cache_clear()


def test_a_missing_required_hook_raises_naming_the_supported_range(monkeypatch):
    hook = hooks.Hook("test.req", "something vital", lambda: "gone in this torch", required=True)
    monkeypatch.setitem(hooks._HOOKS, "test.req", hook)
    hooks.missing.cache_clear()
    try:
        with pytest.raises(hooks.HookUnavailableError, match=r"something vital .*torch>="):
            hooks.require("test.req")
        assert not any(line.startswith("test.req") for line in hooks.skipped())
    finally:
        hooks.missing.cache_clear()


def test_torch_version_is_in_the_declared_range():
    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    floor = hooks.SUPPORTED_TORCH.removeprefix(">=").split(".")
    assert (major, minor) >= (int(floor[0]), int(floor[1]))


def _force_missing(monkeypatch, name: str, why: str) -> None:
    hook = hooks._HOOKS[name]
    monkeypatch.setitem(hooks._HOOKS, name, hooks.Hook(name, hook.what, lambda: why, hook.required))
    hooks.missing.cache_clear()


@pytest.fixture
def fresh_probes():
    hooks.missing.cache_clear()
    yield
    hooks.missing.cache_clear()


def _force_present(monkeypatch, name: str) -> None:
    hook = hooks._HOOKS[name]
    monkeypatch.setitem(
        hooks._HOOKS, name, hooks.Hook(name, hook.what, lambda: None, hook.required)
    )
    hooks.missing.cache_clear()


def test_hastens_inductor_keys_this_torch_lacks_are_dropped(monkeypatch, fresh_probes):
    from hasten.compiler.hooks import inductor

    patches = {
        inductor.FALLBACK_RANDOM: True,
        inductor.CACHEABLE_FUNCTIONS: {},
        "max_fusion_size": 8,
    }
    _force_present(monkeypatch, "inductor.fallback_random")
    _force_present(monkeypatch, "inductor.cacheable_functions")
    assert inductor.supported_patches(patches) == patches
    _force_missing(monkeypatch, "inductor.cacheable_functions", "renamed")
    kept = inductor.supported_patches(patches)
    assert kept == {inductor.FALLBACK_RANDOM: True, "max_fusion_size": 8}  # users' keys stay


def test_skipped_hooks_are_named_in_the_compile_report(monkeypatch, fresh_probes):
    from hasten.compiler.backend import HastenBackend

    _force_missing(monkeypatch, "inductor.batched_kernels", "no AsyncCompile.cpp_pybinding")
    backend = HastenBackend(CompileConfig())
    backend._note_skipped_hooks()
    backend._note_skipped_hooks()  # once per record
    report = backend.record.report()
    assert len(report.hooks_skipped) == len(set(report.hooks_skipped)) == len(hooks.skipped())
    ours = [line for line in report.hooks_skipped if line.startswith("inductor.batched_kernels (")]
    assert len(ours) == 1 and ours[0].endswith(": no AsyncCompile.cpp_pybinding")
    assert "torch hook skipped: inductor.batched_kernels" in str(report)


def test_a_skipped_hook_does_nothing_instead_of_patching(monkeypatch, fresh_probes):
    from torch._inductor.async_compile import AsyncCompile

    from hasten.compiler.hooks import inductor, kernels, vec_isa

    _force_missing(monkeypatch, "inductor.batched_kernels", "gone")
    before = AsyncCompile.cpp_pybinding
    with kernels.batched_kernels():
        assert AsyncCompile.cpp_pybinding is before  # Inductor's own, unpatched
    _force_missing(monkeypatch, "inductor.vec_isa", "gone")
    assert vec_isa.vec_isa_patch("/nonexistent") == {}
    _force_missing(monkeypatch, "inductor.post_grad_pass", "gone")
    assert inductor.post_grad_pass(lambda g: None, lambda: "x") is None
    _force_missing(monkeypatch, "inductor.is_pointwise_use", "gone")
    assert inductor.is_pointwise_use(object()) is False


def test_fake_tensors_are_told_apart_with_the_hook_and_conservatively_without(
    monkeypatch, fresh_probes
):
    from torch import nn
    from torch._subclasses.fake_tensor import FakeTensorMode

    from hasten.compiler.hooks.dynamo import is_fake_tensor

    class Marked(torch.Tensor):  # a subclass that is not fake
        pass

    real, param = torch.ones(2), nn.Parameter(torch.ones(2))
    marked = torch.ones(2).as_subclass(Marked)
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(torch.ones(2))
    assert hooks.usable("dynamo.fake_tensor"), hooks.table()
    assert is_fake_tensor(fake)
    assert not any(is_fake_tensor(t) for t in (real, param, marked, 1.0))
    # a torch that moved FakeTensor: every subclass but Parameter counts (its caller then runs
    # the plain code), so a fake one is never taken for real
    _force_missing(monkeypatch, "dynamo.fake_tensor", "moved")
    assert is_fake_tensor(fake) and is_fake_tensor(marked)
    assert not any(is_fake_tensor(t) for t in (real, param, 1.0))


def test_aten_hooks_answer_alike_without_their_private_names(monkeypatch, fresh_probes):
    from hasten.compiler.hooks import aten

    scores = torch.tensor([[0.5, -1.0, 2.0], [float("-inf")] * 3])
    assert hooks.usable("aten.safe_softmax")
    want = aten.safe_softmax(scores, -1)
    assert torch.equal(want[1], torch.zeros(3))  # a fully masked row: 0, not NaN
    _force_missing(monkeypatch, "aten.safe_softmax", "gone")
    torch.testing.assert_close(aten.safe_softmax(scores, -1), want, rtol=0, atol=0)  # fp32
    assert isinstance(aten.native_bf16_cpu(), bool)
    from hasten import machine

    # no x86 flags to read (the flags decide where there are): oneDNN's answer, or unknown
    monkeypatch.setattr(machine, "_cpuinfo_field", lambda field: None)
    assert isinstance(aten.native_bf16_cpu(), bool)
    _force_missing(monkeypatch, "aten.mkldnn_bf16", "gone")
    assert aten.native_bf16_cpu() is None  # unknown: precision="bf16" is not refused for it
    if torch.backends.mkldnn.is_available():
        CompileConfig(precision="bf16").check_device(torch.device("cpu"))


def test_the_first_call_checks_retries_use_only_the_inductor_switches_this_torch_has(
    monkeypatch, fresh_probes
):
    from hasten.compiler.check import safer_settings

    cfg = CompileConfig()
    rungs = dict(safer_settings(cfg))
    assert "Inductor layout_optimization=False" in rungs
    assert rungs[
        "hasten's passes off, Inductor layout_optimization=False, pattern_matcher=False"
    ].inductor_options == {"layout_optimization": False, "pattern_matcher": False}
    _force_missing(monkeypatch, "inductor.layout_optimization", "renamed")
    rungs = dict(safer_settings(cfg))
    assert list(rungs) == [
        "hasten's graph passes off",
        "hasten's passes off, Inductor pattern_matcher=False",
    ]
    assert rungs["hasten's passes off, Inductor pattern_matcher=False"].inductor_options == {
        "pattern_matcher": False
    }


def test_the_fused_loss_pass_is_skipped_where_autocast_cannot_be_found(monkeypatch, fresh_probes):
    from hasten.compiler.passes import linear_ce

    class Head(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 8)

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.lin(x), y)

    looked = []
    monkeypatch.setattr(linear_ce, "_match", lambda ce: looked.append(ce) and None)
    gm = torch.fx.symbolic_trace(Head())
    assert linear_ce.fused_linear_cross_entropy(gm, []) is gm
    assert len(looked) == 1  # with the hook, the pass looks at the loss
    _force_missing(monkeypatch, "nn.autocast_target", "moved")
    assert linear_ce.fused_linear_cross_entropy(gm, []) is gm
    assert len(looked) == 1  # without it, the pass leaves the graph alone, as under autocast


def _docstring_lines(source: str) -> set[int]:
    import ast

    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        value = getattr(node, "value", None) if isinstance(node, ast.Expr) else None
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def test_no_private_torch_api_outside_the_boundary():
    """``torch._*``, ``torch.utils._*`` and nn.Module's private slots in code (not prose) only in
    compiler/hooks/; the exceptions are named here with why."""
    import pathlib
    import re

    import hasten

    root = pathlib.Path(hasten.__file__).parent
    # a private name anywhere under torch (torch._dynamo, torch.ops.aten._op, torch.amp.x._f),
    # imported from it (from torch.utils import _pytree), or nn.Module's private call slots
    pattern = re.compile(
        r"torch(\.[A-Za-z]\w*)*\._[A-Za-z]|from torch(\.\w+)* import \(?\s*_[A-Za-z]"
        r"|\._call_impl\b|_compiled_call_impl"
    )
    allowed = {
        # checks whether torch._dynamo is imported yet, without importing it: importing it
        # creates $TORCHINDUCTOR_CACHE_DIR, which cache.py must vet first (a string, not a use)
        "compiler/cache.py": ['"torch._dynamo" in sys.modules'],
        # advice to the user, in a message: the config switch they can set
        "compiler/report.py": ["torch._dynamo.config.capture_scalar_outputs=True"],
        # an error message naming the user's own switch that disabled Dynamo (text, not a use)
        "compiler/runtime.py": ["or torch._dynamo.config.disable)"],
        # torch's pytree for a batch's structure, in the sifting package, whose owner can take it
        # from hooks.nn as the compiler and Keras do (stable across the tested range)
        "sifting/batch.py": ["from torch.utils import _pytree as pytree"],
    }
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("compiler/hooks/"):
            continue
        source = path.read_text()
        prose = _docstring_lines(source)
        for n, line in enumerate(source.splitlines(), 1):
            code = line.split("#", 1)[0]
            if n in prose or not pattern.search(code):
                continue
            if any(a in code for a in allowed.get(rel, [])):
                continue
            found.append(f"{rel}:{n}: {code.strip()}")
    assert not found, "private torch API outside hasten/compiler/hooks:\n" + "\n".join(found)


def test_the_declared_floor_is_the_one_pyproject_declares():
    import pathlib
    import re

    pyproject = pathlib.Path(__file__).resolve().parents[3] / "pyproject.toml"
    found = re.search(r'"torch(>=[0-9.]+)"', pyproject.read_text("utf-8"))
    assert found is not None and found.group(1) == hooks.SUPPORTED_TORCH
