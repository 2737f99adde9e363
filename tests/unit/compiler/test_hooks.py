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
