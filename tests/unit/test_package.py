import importlib.metadata
import subprocess
import sys
from pathlib import Path

import hasten


def test_version_matches_metadata():
    assert hasten.__version__ == importlib.metadata.version("hasten")


def test_unknown_attribute_raises():
    import pytest

    with pytest.raises(AttributeError, match="no_such_name"):
        hasten.no_such_name


def test_import_does_not_pull_heavy_optional_packages():
    code = (
        "import sys, hasten; "
        "bad = [m for m in ('transformers', 'lightning', 'matplotlib', 'sklearn') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_all_lists_exactly_the_lazy_names():
    assert set(hasten.__all__) - {"__version__"} == set(hasten._LAZY)


def test_both_sifting_front_ends_are_reachable_from_the_top_level():
    """What the two-line paths need, the same objects as hasten.sifting's."""
    import hasten.sifting

    for name in (
        "PruningSampler",
        "UnbiasedPruningConfig",
        "StaleRelativePruningConfig",
        "PerSampleCrossEntropy",
        "Scorer",
        "SiftingDataloader",
        "RelativeProbabilisticSiftConfig",
        "Loss",
    ):
        assert getattr(hasten, name) is getattr(hasten.sifting, name), name
        assert name in dir(hasten)


# --------------------------------------------------------------------------- metadata, README

_ROOT = Path(__file__).resolve().parents[2]
_REPO = "https://github.com/hasten-ml/hasten"


def _pyproject() -> dict:
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    return tomllib.loads((_ROOT / "pyproject.toml").read_text("utf-8"))


def _readme_links() -> list[str]:
    import re

    text = (_ROOT / "README.md").read_text("utf-8")
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_project_urls_name_the_repository():
    urls = _pyproject()["project"]["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues"}
    assert urls["Source"] == urls["Homepage"] == _REPO
    assert urls["Issues"] == f"{_REPO}/issues"
    assert urls["Documentation"].startswith(f"{_REPO}/")


def test_readme_links_are_absolute_so_they_work_on_the_package_index():
    """The wheel ships README.md as its description but not docs/ or benchmarks/: every link
    points into the repository named in [project.urls], at a file and heading that exist."""
    import re

    links = _readme_links()
    assert links
    base = f"{_pyproject()['project']['urls']['Source']}/blob/main/"
    for link in links:
        assert link.startswith(base), link
        path, _, anchor = link[len(base) :].partition("#")
        target = _ROOT / path
        assert target.is_file(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text("utf-8"), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}
            assert anchor in slugs, link


def test_extras_cover_what_the_readme_tells_to_install():
    import re

    extras = set(_pyproject()["project"]["optional-dependencies"])
    text = (_ROOT / "README.md").read_text("utf-8")
    named = set(re.findall(r"hasten\[([\w-]+)\]", text))
    assert named and named <= extras, named - extras
    assert {"bench", "keras", "tensorflow", "hf", "lightning"} <= named
