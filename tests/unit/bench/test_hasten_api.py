"""``hasten.bench._hasten_api`` is the only runner module that imports hasten's switches."""

import ast
from pathlib import Path

import hasten.bench

BENCH = Path(hasten.bench.__file__).parent
# Allowed to import hasten directly (its docstring says why): the adapter itself, the install
# checker and the machine stamp.
EXEMPT = {"_hasten_api.py", "doctor.py", "machine.py"}


def _hasten_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [
            n
            for n in names
            if n == "hasten" or (n.startswith("hasten.") and not n.startswith("hasten.bench"))
        ]
    return found


def test_runners_reach_hasten_only_through_the_adapter():
    offenders = {
        p.name: _hasten_imports(p)
        for p in sorted(BENCH.glob("*.py"))
        if p.name not in EXEMPT and _hasten_imports(p)
    }
    assert offenders == {}


def test_the_check_sees_an_import():
    assert _hasten_imports(BENCH / "_hasten_api.py")  # it does import hasten
