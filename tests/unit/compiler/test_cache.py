"""The compile cache: corrupt entries found and removed, export/import, unusable directories.

No compilation here (a real shared library stands in for a compiled kernel); that a truncated
kernel is rebuilt by a later run is pinned in tests/integration/test_compile_traps.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile

import pytest
import torch

from hasten.cli import main
from hasten.compiler import cache


@pytest.fixture
def fake_cache(tmp_path):
    """A cache directory laid out as Inductor's: a kernel .so (real ELF), its source, a graph."""
    root = tmp_path / "cache"
    (root / "ab").mkdir(parents=True)
    (root / "fxgraph" / "x1").mkdir(parents=True)
    (root / "locks").mkdir()
    shutil.copy(torch._C.__file__, root / "ab" / "cabc.main.so")  # a small, complete ELF .so
    (root / "ab" / "cabc.main.cpp").write_text("// kernel source\n")
    (root / "fxgraph" / "x1" / "entry").write_bytes(b"pickled graph")
    (root / "locks" / "cabc.lock").write_bytes(b"")  # empty by design: not corrupt
    return root


def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def test_intact_cache_scans_clean(fake_cache):
    found = cache.scan(fake_cache)
    assert found.exists and found.corrupt == ()
    assert (found.files, found.kernels, found.graphs) == (3, 1, 1)


@pytest.mark.parametrize("size", [0, 10, 100, 4096])
def test_truncated_kernel_is_found_and_removed(fake_cache, size):
    so = fake_cache / "ab" / "cabc.main.so"
    assert os.path.getsize(so) > 4096
    truncate(so, size)
    found = cache.scan(fake_cache)
    assert [c.path for c in found.corrupt] == [str(so)]
    assert "truncated" in found.corrupt[0].reason
    with pytest.warns(cache.CacheWarning, match=r"1 corrupt entry \(ab/cabc\.main\.so.*killed"):
        removed = cache.ensure_intact(fake_cache)
    assert len(removed) == 1 and not so.exists()
    assert (fake_cache / "ab" / "cabc.main.cpp").exists()  # the source stays: Inductor rebuilds
    assert cache.ensure_intact(fake_cache) == []  # once per process and directory


def test_a_kernel_being_written_under_its_lock_is_not_corrupt(fake_cache):
    from filelock import FileLock

    so = fake_cache / "ab" / "cabc.main.so"
    truncate(so, 100)  # as it looks while the C++ compiler writes it
    with FileLock(str(fake_cache / "locks" / "cabc.lock")):  # another rank's compile
        assert cache.scan(fake_cache).corrupt == ()
        assert cache.repair(fake_cache) == [] and so.exists()
    assert len(cache.scan(fake_cache).corrupt) == 1  # lock released: a killed compile's leftover


def test_empty_graph_entry_is_corrupt(fake_cache):
    entry = fake_cache / "fxgraph" / "x1" / "entry"
    entry.write_bytes(b"")
    assert [c.reason for c in cache.scan(fake_cache).corrupt] == ["empty file"]


def test_an_empty_load_ok_marker_is_not_corrupt(fake_cache):
    # torch 2.15 marks the vectorisation probe library that loaded with an empty file
    (fake_cache / "ab" / "cabc.main.so.load_ok").write_bytes(b"")
    assert cache.scan(fake_cache).corrupt == ()


def test_export_import_round_trip_leaves_out_corrupt_entries(fake_cache, tmp_path):
    (fake_cache / "cd").mkdir()
    shutil.copy(fake_cache / "ab" / "cabc.main.so", fake_cache / "cd" / "ccd.so")
    truncate(fake_cache / "cd" / "ccd.so", 100)
    archive = tmp_path / "out" / "cache.tar.gz"
    manifest = cache.export_cache(archive, fake_cache)
    assert manifest["torch"] == torch.__version__ and manifest["skipped_corrupt"] == 1
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"hasten-cache.json", "ab/cabc.main.so", "fxgraph/x1/entry"} <= names
    assert "cd/ccd.so" not in names and not any(n.startswith("locks") for n in names)
    target = tmp_path / "other"
    got = cache.import_cache(archive, target)
    assert got["imported"] == 3
    assert (target / "ab" / "cabc.main.so").read_bytes() == (
        fake_cache / "ab" / "cabc.main.so"
    ).read_bytes()
    assert cache.scan(target).corrupt == ()


def test_import_refuses_foreign_and_unsafe_archives(tmp_path):
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as tar:
        tar.add(__file__, arcname="x.py")
    with pytest.raises(ValueError, match="not a hasten compile-cache archive"):
        cache.import_cache(plain, tmp_path / "c")
    evil = tmp_path / "evil.tar.gz"
    manifest = tmp_path / cache.MANIFEST
    manifest.write_text(json.dumps({"kind": "hasten.compile-cache", "torch": torch.__version__}))
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(manifest, arcname=cache.MANIFEST)
        tar.add(__file__, arcname="../escaped.py")
    with pytest.raises(ValueError, match=r"unsafe member '\.\./escaped\.py'"):
        cache.import_cache(evil, tmp_path / "c")
    assert not (tmp_path / "escaped.py").exists()


def test_cli_cache_show_clear_export_import(fake_cache, tmp_path, capsys):
    assert main(["cache", "show", "--dir", str(fake_cache)]) == 0
    out = capsys.readouterr().out
    assert str(fake_cache) in out and "3 files" in out and "CORRUPT" not in out
    archive = tmp_path / "c.tar.gz"
    assert main(["cache", "export", str(archive), "--dir", str(fake_cache)]) == 0
    truncate(fake_cache / "ab" / "cabc.main.so", 0)
    assert main(["cache", "show", "--dir", str(fake_cache)]) == 1  # corrupt: non-zero status
    out = capsys.readouterr().out
    assert "CORRUPT" in out and "hasten cache clear --corrupt" in out
    assert main(["cache", "clear", "--corrupt", "--dir", str(fake_cache)]) == 0
    assert "removed 1 corrupt file" in capsys.readouterr().out
    assert main(["cache", "clear", "--dir", str(fake_cache)]) == 0
    assert cache.scan(fake_cache).files == 0
    assert main(["cache", "import", str(archive), "--dir", str(fake_cache)]) == 0
    assert "imported 3 file(s)" in capsys.readouterr().out
    assert cache.scan(fake_cache).files == 3 and cache.scan(fake_cache).corrupt == ()
    assert main(["cache", "export", str(archive), "--dir", str(tmp_path / "none")]) == 1
    assert "no compile cache to export" in capsys.readouterr().err


def test_doctor_reports_a_truncated_kernel(fake_cache, monkeypatch):
    from hasten import doctor

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(fake_cache))
    assert doctor._cache().status == "ok"
    truncate(fake_cache / "ab" / "cabc.main.so", 10)
    check = doctor._cache()
    assert check.status == "warn" and "1 corrupt entry" in check.detail
    assert "hasten cache clear --corrupt" in check.fix


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["/proc/hasten-cannot-create/cache", "/tmp/with space/cache"])
def test_unusable_env_cache_dir_falls_back_with_a_warning_naming_it(bad):
    code = (
        "import os, warnings\n"
        "warnings.simplefilter('always')\n"
        "import hasten.compiler.api, torch._dynamo\n"  # crashed inside torch's import before
        "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
    )
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": bad}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert f"TORCHINDUCTOR_CACHE_DIR={bad!r} cannot be used" in proc.stderr
    assert "Compiled kernels are cached in" in proc.stderr
    used = proc.stdout.strip().splitlines()[-1]
    assert used != bad and os.path.isdir(used)
