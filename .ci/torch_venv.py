#!/usr/bin/env python3
"""Build a venv holding one torch release over the project's own venv (make test-torch-*).

    python3 .ci/torch_venv.py SPEC VENV [--base .venv]

SPEC is ``newest`` (the newest final torch release the package index lists) or a pip version
spec (``2.13.*``). VENV is an *overlay*: its site-packages holds torch and what that torch needs
beyond the base venv (its CUDA libraries, triton), and a ``.pth`` that appends the base venv's
site-packages (hasten's editable install, transformers, pytest, ...) after it. So only torch is
downloaded, and the tests import the same versions of everything else as ``make test``.

Exit status: 0 when VENV holds the torch asked for; 3 when it cannot be had here (the package
index cannot be reached, or lists no such release): one line ``<what> torch not tested: <why>``
on stdout, so CI can say so instead of failing; 1 for any other failure (e.g. pip cannot
resolve torch's own requirements against the base venv): a real failure.

Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

UNAVAILABLE = 3
# What pip prints when it cannot reach an index (DNS, refused, timed out, proxy).
_NETWORK = re.compile(
    r"NewConnectionError|Name or service not known|Temporary failure in name resolution|"
    r"Failed to establish a new connection|Network is unreachable|ConnectTimeoutError|"
    r"ReadTimeoutError|Connection refused|ProxyError|Max retries exceeded",
)
_FINAL = re.compile(r"^\d+(\.\d+)*$")  # no local (+cpu) or pre-release versions


def _pip_env() -> dict[str, str]:
    # The machine may cap torch (a pip constraint file); these venvs are for other releases.
    # Few retries: an index that cannot be reached should say so in seconds, not minutes.
    return dict(os.environ, PIP_CONSTRAINT="/dev/null", PIP_RETRIES="1", PIP_TIMEOUT="30")


def _pip(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [python, "-m", "pip", "--disable-pip-version-check", *args]
    return subprocess.run(cmd, env=_pip_env(), capture_output=True, text=True)


def _network_error(text: str) -> str | None:
    """The network error pip met, in a few words (``None`` if it met none)."""
    found = _NETWORK.search(text)
    if found is None:
        return None
    errno = re.search(r"\[Errno [^\]]+\] [^'\")]+", text)
    return f"{found.group(0)}: {errno.group(0)}" if errno else found.group(0)


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def resolve(spec: str, python: str) -> tuple[str | None, str]:
    """``(version, "")`` for ``spec``, or ``(None, why)`` when the index cannot give one."""
    if spec != "newest":
        return spec, ""
    out = _pip(python, "index", "versions", "torch")
    down = _network_error(out.stderr + out.stdout)
    if down is not None:
        return None, f"the package index could not be reached ({down})"
    found = re.search(r"Available versions: (.*)", out.stdout)
    if out.returncode != 0 or found is None:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"pip index versions torch failed ({tail[0][:200]})"
    finals = [v.strip() for v in found.group(1).split(",") if _FINAL.match(v.strip())]
    if not finals:
        return None, f"the package index lists no final torch release ({found.group(1)[:200]})"
    return max(finals, key=_version_key), ""


def _stamp(venv: Path) -> dict[str, str]:
    try:
        return json.loads((venv / ".installed").read_text())
    except (OSError, ValueError):
        return {}


def build(spec: str, venv: Path, base: Path) -> int:
    label = "newest" if spec == "newest" else spec
    base_site = next(base.glob("lib/python*/site-packages"), None)
    if base_site is None:
        print(f"{base} is not a venv: run `make venv` first", file=sys.stderr)
        return 1
    version, why = resolve(spec, str(base / "bin" / "python"))
    if version is None:
        print(f"{label} torch not tested: {why}")
        return UNAVAILABLE
    # the base's packages are read live: only another torch or another base means a rebuild
    want = {"torch": version, "base": str(base.resolve())}
    if _stamp(venv) == want:
        return 0
    start = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    # Appended after the overlay's own site-packages, with its .pth files (the editable install)
    (site / "zz_hasten_base_venv.pth").write_text(
        f"import site; site.addsitedir({str(base_site.resolve())!r})\n"
    )
    # pip comes from the base venv (through the .pth) and installs into the overlay, which is
    # sys.prefix; it leaves the base's torch alone ("outside environment") and shadows it
    out = _pip(str(venv / "bin" / "python"), "install", "--quiet", f"torch=={version}")
    if out.returncode != 0:
        text = out.stderr + out.stdout
        down = _network_error(text)
        shutil.rmtree(venv, ignore_errors=True)
        if down is not None:
            print(f"{label} torch not tested: downloading torch {version} failed ({down})")
            return UNAVAILABLE
        if "No matching distribution" in text or "Could not find a version" in text:
            print(f"{label} torch not tested: the package index has no torch=={version}")
            return UNAVAILABLE
        print(f"installing torch {version} over {base} failed:\n{text[-3000:]}", file=sys.stderr)
        return 1
    (venv / ".installed").write_text(json.dumps(want) + "\n")
    size = subprocess.run(["du", "-sh", str(venv)], capture_output=True, text=True).stdout.split()
    print(
        f"{venv}: torch {version} installed over {base} in {time.monotonic() - start:.0f} s "
        f"({size[0] if size else '?'})"
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="'newest' or a pip version spec, e.g. 2.13.*")
    p.add_argument("venv", type=Path)
    p.add_argument("--base", type=Path, default=Path(".venv"))
    a = p.parse_args()
    return build(a.spec, a.venv, a.base)


if __name__ == "__main__":
    sys.exit(main())
