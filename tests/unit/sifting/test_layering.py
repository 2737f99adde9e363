"""Sifting is layered one way: the rule registry at the bottom, the policies and configs above it.

Read from the source (an AST walk, every import statement, nested ones included, but those
under ``if TYPE_CHECKING:``), so the check does not depend on what an earlier test imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hasten.sifting

SIFTING = Path(hasten.sifting.__file__).parent


def _runtime_imports(path: Path) -> set[str]:
    """Modules ``path`` imports at run time (``from . import x`` resolved under hasten)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path.name}: relative import of {node.module}"
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _hasten_imports(path: Path) -> set[str]:
    return {m for m in _runtime_imports(path) if m.startswith("hasten")}


def test_the_rule_registry_imports_nothing_above_it():
    allowed = {
        "hasten.sifting.core.fields",
        "hasten.sifting.core.fields.from_mapping",
        "hasten.sifting.exceptions",
        "hasten.sifting.exceptions.SiftConfigValidationException",
    }
    assert _hasten_imports(SIFTING / "core" / "rules.py") <= allowed


def test_policies_do_not_import_the_configs():
    configs = {"hasten.sifting.config", "hasten.sifting.pruning_config"}
    for name in ("policy.py", "unbiased.py", "history.py", "core/fields.py"):
        imported = _hasten_imports(SIFTING / name)
        assert not {m for m in imported if any(m.startswith(c) for c in configs)}, name


def test_no_module_getattr_workaround_is_left():
    for path in [*SIFTING.glob("*.py"), *SIFTING.glob("core/*.py")]:
        tree = ast.parse(path.read_text(), str(path))
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert "__getattr__" not in names, path.name


def test_the_check_sees_an_upward_import(tmp_path):
    # the check itself can fail: an import of a config module is found, nested or not
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from hasten.sifting.policy import SiftPolicy\n"
        "def f():\n    from hasten.sifting.config import SIFT_CONFIGS\n"
    )
    assert _hasten_imports(bad) == {
        "hasten.sifting.config",
        "hasten.sifting.config.SIFT_CONFIGS",
    }


def test_the_config_modules_register_the_builtin_rules():
    from hasten.sifting import config, pruning_config
    from hasten.sifting.core import rules

    assert rules.RULES["relative_probabilistic"].config is config.RelativeProbabilisticSiftConfig
    assert rules.RULES["unbiased"].config is pruning_config.UnbiasedPruningConfig
    assert dict(config.SIFT_CONFIGS) == {
        "relative_probabilistic": config.RelativeProbabilisticSiftConfig
    }
    assert set(pruning_config.PRUNING_CONFIGS) == {"stale_relative", "unbiased"}
