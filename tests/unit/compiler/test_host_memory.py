"""``reuse_host_memory``: large CPU buffers from freed process memory (``host_memory.py``).

The setting is process-wide, so what it does is measured in fresh processes: page faults of a
64 MiB buffer allocated, filled and freed again and again, before and after the switch.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest
import torch

import hasten
from hasten.compiler import api, host_memory

glibc = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)

_FAULTS_PER_STEP = """
import json, os, resource, sys
import torch
from hasten.compiler import host_memory

def faults(n):
    out = []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x = torch.empty(16 << 20)  # 64 MiB: above glibc's largest mmap threshold (32 MiB)
        x.fill_(1.0)
        del x
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return out
"""

_FAULTS = (
    _FAULTS_PER_STEP
    + """
before = faults(24)
state = host_memory.reuse_freed_memory()
after = faults(24)
rss_mib = int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
print(json.dumps({"before": before, "state": state, "after": after, "rss_mib": rss_mib}))
"""
)


def _run(env: dict[str, str] | None = None) -> dict:
    import os

    proc = subprocess.run(
        [sys.executable, "-c", _FAULTS],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@glibc
def test_a_freed_large_buffer_is_reused_instead_of_faulted_in_again():
    out = _run()
    pages = (64 << 20) // 4096  # 16384 pages of 4 KiB
    # glibc's default: every step maps the buffer afresh and faults in every page
    assert min(out["before"]) > pages // 2, out
    assert out["state"] == "on", out
    # after the switch the heap grows for a few steps (glibc's aligned allocations do not fit
    # the block of the same size just freed) and then serves the buffer without faults
    assert out["after"][-4:] == [0, 0, 0, 0], out
    assert out["rss_mib"] < 64 * 16, out  # fragmented, but bounded: ~670 MiB measured


@glibc
def test_left_alone_where_the_user_set_malloc_up():
    out = _run({"MALLOC_ARENA_MAX": "2", "MALLOC_TRIM_THRESHOLD_": "1000000"})
    assert out["state"] == "malloc is set by MALLOC_TRIM_THRESHOLD_", out
    assert min(out["after"]) > (64 << 20) // 4096 // 2, out  # malloc unchanged: faults as before


@pytest.mark.parametrize(
    ("env", "libc", "why"),
    [
        ({"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}, "glibc", "jemalloc is preloaded"),
        ({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}, "glibc", "tcmalloc is preloaded"),
        ({"MALLOC_MMAP_MAX_": "0"}, "glibc", "malloc is set by MALLOC_MMAP_MAX_"),
        ({}, "musl", "the C library is not glibc"),
    ],
)
def test_the_reasons_it_stays_off(monkeypatch, env, libc, why):
    for name in ("LD_PRELOAD", *host_memory._ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(platform, "system", lambda: "Linux")
    monkeypatch.setattr(platform, "libc_ver", lambda: (libc, "1.0"))
    assert host_memory._why_not() == why


_FORKED = (
    _FAULTS_PER_STEP
    + """
torch.set_num_threads(1)  # no OpenMP pool: a forked child cannot use its parent's
state = host_memory.reuse_freed_memory()
read, write = os.pipe()
pid = os.fork()  # before the heap grew: what the child does is its own settings' doing
if pid == 0:
    os.write(write, json.dumps(faults(12)).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"state": state, "child": json.loads(os.read(read, 1 << 16)), "parent": faults(24)}))
"""
)


@glibc
def test_a_forked_child_gets_glibcs_usual_thresholds_back():
    proc = subprocess.run(
        [sys.executable, "-c", _FORKED], capture_output=True, text=True, check=True, timeout=120
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["state"] == "on", out
    assert out["parent"][-4:] == [0] * 4, out  # the parent reuses its heap
    # a DataLoader worker maps a 64 MiB block afresh again, as glibc does by default (with the
    # parent's setting it would reuse its heap after a few steps, as the parent does)
    assert min(out["child"]) > (64 << 20) // 4096 // 2, out


def _embedding(mib: int) -> torch.nn.Module:
    return torch.nn.Embedding(mib * 256, 1024)  # 4 KiB a row


@pytest.mark.parametrize(
    ("flag", "model", "asked"),
    [
        (True, lambda: torch.nn.Linear(2, 2), True),
        (False, lambda: _embedding(64), False),
        # default: on only when a parameter reaches glibc's mmap ceiling (its gradient would be
        # mapped afresh every step)
        (None, lambda: torch.nn.Linear(2, 2), False),
        (None, lambda: _embedding(31), False),
        (None, lambda: _embedding(32), True),
    ],
)
def test_compile_asks_for_it_on_a_cpu_when_asked_or_a_parameter_reaches_the_ceiling(
    monkeypatch, flag, model, asked
):
    why = []
    monkeypatch.setattr(api, "reuse_freed_memory", lambda reason: why.append(reason) or "on")
    hasten.compile(model(), reuse_host_memory=flag, regions="whole")
    assert bool(why) == asked
    if asked and flag is None:
        assert why == [
            "the model's largest parameter (32 MiB) reaches glibc's 32 MiB mmap ceiling, so its "
            "gradient would be mapped afresh every step"
        ]


def test_the_default_is_decided_per_model():
    assert hasten.CompileConfig().reuse_host_memory is None


def test_a_non_bool_setting_is_refused():
    with pytest.raises(TypeError, match="reuse_host_memory must be None, True or False"):
        hasten.CompileConfig(reuse_host_memory="yes")
