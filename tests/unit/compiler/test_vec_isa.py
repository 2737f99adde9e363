"""hasten probes Inductor's SIMD ISAs once per cache directory, not once per process."""

from __future__ import annotations

import json
import platform

import pytest

pytest.importorskip("hasten.compiler")

from torch._inductor import cpu_vec_isa

from hasten.compiler.backend import _vec_isa_patch, vec_isa_patch

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="the shortcut is x86-only"
)


def _claimed() -> list[str]:
    flags = set(cpu_vec_isa.x86_isa_checker())
    return [
        str(i)
        for i in cpu_vec_isa.supported_vec_isa_list
        if all(f in flags for f in str(i).split())
    ]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    _vec_isa_patch.cache_clear()
    yield tmp_path
    _vec_isa_patch.cache_clear()


def _new_process() -> None:
    """What a new process starts with: nothing remembered in memory, only the stored file."""
    _vec_isa_patch.cache_clear()


def test_the_probe_runs_once_per_cache_directory(cache, monkeypatch):
    if not _claimed():
        pytest.skip("this CPU claims no SIMD ISA Inductor knows")
    calls = []
    monkeypatch.setattr(
        cpu_vec_isa,
        "valid_vec_isa_list",
        lambda: calls.append(1) or cpu_vec_isa.supported_vec_isa_list,
    )
    monkeypatch.setattr(
        cpu_vec_isa,
        "supported_vec_isa_list",
        [i for i in cpu_vec_isa.supported_vec_isa_list if str(i) in _claimed()],
    )
    assert vec_isa_patch() == {"cpp.vec_isa_ok": True}
    _new_process()
    assert vec_isa_patch() == {"cpp.vec_isa_ok": True}
    assert len(calls) == 1  # the second process-equivalent read the stored outcome
    stored = json.loads((cache / "hasten" / "vec_isa.json").read_text())
    assert stored["all_valid"] is True and stored["key"]["claimed"] == _claimed()


def test_an_isa_that_failed_its_probe_leaves_inductor_probing(cache, monkeypatch):
    claimed = _claimed()
    if not claimed:
        pytest.skip("this CPU claims no SIMD ISA Inductor knows")
    failing = [i for i in cpu_vec_isa.supported_vec_isa_list if str(i) in claimed][1:]
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: failing)
    assert vec_isa_patch() == {}
    _new_process()
    assert vec_isa_patch() == {}  # stored as not all valid: still no shortcut


def test_a_stored_outcome_for_another_setup_is_probed_again(cache, monkeypatch):
    if not _claimed():
        pytest.skip("this CPU claims no SIMD ISA Inductor knows")
    path = cache / "hasten" / "vec_isa.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"key": {"torch": "0.0"}, "all_valid": True}))
    calls = []
    real = [i for i in cpu_vec_isa.supported_vec_isa_list if str(i) in _claimed()]
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: calls.append(1) or real[1:])
    assert vec_isa_patch() == {}  # probed afresh: one ISA failed on this setup
    assert calls == [1]
