import importlib.metadata
import subprocess
import sys

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
