"""hasten probes Inductor's best SIMD ISA once per cache directory, in the background."""

from __future__ import annotations

import json
import platform
import threading

import pytest

pytest.importorskip("hasten.compiler")

from hasten.compiler.hooks import vec_isa
from hasten.compiler.hooks.vec_isa import start_vec_isa_probe, vec_isa_patch

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="the shortcut is x86-only"
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    vec_isa._forget()
    yield tmp_path
    vec_isa._forget()


@pytest.fixture
def claimed():
    isas = vec_isa._claimed()
    if not isas:
        pytest.skip("this CPU claims no SIMD ISA Inductor knows")
    return isas


def _new_process() -> None:
    """What a new process starts with: nothing remembered in memory, only the stored file."""
    vec_isa._forget()


def test_the_best_isa_alone_is_probed_once_per_cache_directory(cache, claimed, monkeypatch):
    probed = []
    monkeypatch.setattr(vec_isa, "_probe", lambda isa: probed.append(str(isa)) or True)
    assert vec_isa_patch() == {"cpp.vec_isa_ok": True}
    _new_process()
    assert vec_isa_patch() == {"cpp.vec_isa_ok": True}
    assert probed == [str(claimed[0])]  # one ISA, one process; the second read the file
    stored = json.loads((cache / "hasten" / "vec_isa.json").read_text())
    assert stored["best_valid"] is True
    assert stored["key"]["claimed"] == [str(i) for i in claimed]


def test_the_real_probe_passes_on_this_machine(cache, claimed):
    # Inductor's own checks for the best ISA (a header build and a load in a child Python)
    assert vec_isa_patch() == {"cpp.vec_isa_ok": True}


def test_a_failed_best_isa_leaves_inductor_probing(cache, claimed, monkeypatch):
    monkeypatch.setattr(vec_isa, "_probe", lambda isa: False)
    assert vec_isa_patch() == {}
    _new_process()
    assert vec_isa_patch() == {}  # stored as failed: still no shortcut


def test_a_probe_that_raises_gives_no_shortcut(cache, claimed, monkeypatch):
    def boom(isa):
        raise RuntimeError("compiler crashed")

    monkeypatch.setattr(vec_isa, "_probe", boom)
    assert vec_isa_patch() == {}


def test_a_stored_outcome_for_another_setup_is_probed_again(cache, claimed, monkeypatch):
    path = cache / "hasten" / "vec_isa.json"
    path.parent.mkdir(parents=True)
    # the all-ISA probe's record (no "probed" field): probed again, not trusted
    path.write_text(json.dumps({"key": {"torch": "0.0"}, "all_valid": True}))
    probed = []
    monkeypatch.setattr(vec_isa, "_probe", lambda isa: probed.append(1) or False)
    assert vec_isa_patch() == {}
    assert probed == [1]


def test_a_background_probe_is_waited_for_not_repeated(cache, claimed, monkeypatch):
    release = threading.Event()
    probed = []

    def slow(isa):
        probed.append(threading.current_thread().name)
        release.wait(10)
        return True

    monkeypatch.setattr(vec_isa, "_probe", slow)
    start_vec_isa_probe(str(cache))
    start_vec_isa_probe(str(cache))  # a second model compiled: no second probe
    waiter = threading.Thread(target=lambda: probed.append(vec_isa_patch()))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # the backend waits for the background probe...
    release.set()
    waiter.join(10)
    assert probed == ["hasten-vec-isa", {"cpp.vec_isa_ok": True}]  # ...and uses its outcome


def test_hasten_compile_starts_the_probe_for_a_cpu_model(cache, claimed, monkeypatch):
    import torch

    import hasten

    started = []
    monkeypatch.setattr("hasten.compiler.api.start_vec_isa_probe", started.append)
    hasten.compile(torch.nn.Linear(2, 2), cache_dir=cache / "own", regions="whole")
    assert started == [str(cache / "own")]
    hasten.compile(
        torch.nn.Linear(2, 2), inductor_options={"cpp.vec_isa_ok": False}, regions="whole"
    )
    assert started == [str(cache / "own")]  # the user's own setting: nothing to probe


def test_small_checks_built_ahead_are_the_ones_inductor_looks_up(cache, claimed):
    from torch._inductor import config

    lower = claimed[1:]
    vec_isa._build_small_checks([type(i)() for i in lower])  # fresh: nothing remembered
    built = sorted(cache.rglob("*.so"))
    if not built:
        pytest.skip("this CPU's lower ISAs have no small checks (AVX2 only)")
    with config.patch({"cpp.vec_isa_ok": True}):
        outcomes = [bool(type(i)()) for i in lower]  # what Inductor does under the shortcut
    assert sorted(cache.rglob("*.so")) == built  # found built, only loaded
    assert all(outcomes)


_HEADER_SCRIPT = """
import glob, json, os
import torch
from torch._inductor import codecache, config
from hasten.compiler.hooks import vec_isa

best = vec_isa._claimed()[0]
assert bool(best)
vec_isa._build_kernel_header(best)
before = sorted(glob.glob(os.path.join(codecache._HEADER_DIR, "*.gch")))
with config.patch({"cpp.vec_isa_ok": True}):  # as hasten compiles
    f = torch.compile(lambda x: (x.sin() * 2).sum(), backend="inductor")
    f(torch.randn(64))
after = sorted(glob.glob(os.path.join(codecache._HEADER_DIR, "*.gch")))
print(json.dumps({"before": before, "after": after}))
"""


@pytest.mark.slow
def test_the_kernel_header_built_ahead_is_the_one_inductor_uses(tmp_path, claimed):
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),  # a machine that never precompiled the header
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
    }
    env.pop("ATEN_CPU_CAPABILITY", None)
    done = subprocess.run(
        [sys.executable, "-c", _HEADER_SCRIPT], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] and all(p.startswith(str(tmp_path)) for p in seen["before"])
    assert seen["after"] == seen["before"]  # Inductor's first kernel found it built


_IMPORTS_SCRIPT = """
import sys, threading
seen = []
sys.addaudithook(
    lambda event, args: seen.append(args[0])
    if event == "import" and threading.current_thread().name == "hasten-vec-isa"
    else None
)
import torch, hasten
hasten.compile(torch.nn.Linear(2, 2), regions="whole")
for t in threading.enumerate():
    if t.name == "hasten-vec-isa":
        t.join()
print(sorted(set(seen)))
"""


@pytest.mark.slow
def test_the_probe_thread_imports_nothing_itself(tmp_path, claimed):
    # torch's imports are not safe from two threads at once: the caller imports for the thread
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "TMPDIR": str(tmp_path),  # everything cold: probe, small checks, header
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_SCRIPT], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
