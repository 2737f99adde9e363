from hasten.bench.report import compile_table, demo_table, format_table


def test_format_table_aligns_and_renders_markdown():
    text = format_table(["a", "bb"], [[1, None], ["long", 2]])
    lines = text.splitlines()
    assert lines[0].startswith("a     bb") and lines[1].startswith("----  --")
    assert lines[2].rstrip() == "1" and lines[3] == "long  2"
    md = format_table(["a", "bb"], [[1, 2]], markdown=True)
    assert md.splitlines() == ["| a | bb |", "|---|---|", "| 1 | 2 |"]


def test_compile_table_shows_errors_and_speedups():
    step = {"median": 0.01, "p20": 0.009, "p80": 0.012}
    result = {
        "baseline": "eager",
        "candidates": [
            {
                "name": "eager",
                "error": None,
                "step_s": step,
                "compile_s": 0.0,
                "samples_per_s": 100.0,
                "peak_mem_bytes": 2**20,
                "fraction_of_matmul_peak": 0.1,
                "speedup_vs_eager": {"median": 1.0},
            },
            {
                "name": "hasten",
                "error": "RuntimeError: hasten.compiler is not available\nmore",
                "step_s": None,
            },
        ],
    }
    text = compile_table(result)
    assert "10.00 [9.00, 12.00]" in text and "1.00×" in text and "10.0%" in text
    assert "RuntimeError: hasten.compiler is not available" in text and "more" not in text


def _demo_row(run, **changes):
    row = {
        "run": run,
        "whole_run_s": 20.0,
        "compile_s": None,
        "final_test_acc": 0.9,
        "time_to_target_s": 10.0,
        "time_to_target_incl_compile_s": 10.0,
        "speedup_whole_run": 1.0,
        "speedup_time_to_target_incl_compile": 1.0,
        "samples_backprop": 1000,
        "compute_vs_eager": 1.0,
    }
    return {**row, **changes}


def test_demo_table_marks_skipped_and_unreached():
    result = {
        "config": {"target": 0.9},
        "rows": [
            _demo_row(
                "eager",
                time_to_target_s=None,
                time_to_target_incl_compile_s=None,
                final_test_acc=0.5,
                speedup_time_to_target_incl_compile=None,
            ),
            {"run": "sifting", "skipped": "hasten.sifting is not available"},
            _demo_row(
                "compile + sifting",
                whole_run_s=16.0,
                compile_s=0.5,
                time_to_target_incl_compile_s=2.5,
                speedup_whole_run=1.25,
                compute_vs_eager=0.8,
                sifting={"samples_planned": 2000, "samples_left_out": 500, "epochs_planned": 2},
            ),
        ],
    }
    text = demo_table(result)
    assert "not reached" in text and "skipped: hasten.sifting is not available" in text
    assert "to 90 % s" in text and "speedup whole run" in text  # both verdicts, named
    lines = {line.split()[0]: line for line in text.splitlines()[2:]}
    assert (
        "16.0" in lines["compile"] and "1.25×" in lines["compile"] and "0.80×" in lines["compile"]
    )
    assert "500 of 2,000 samples (25%) in 2 epochs" in text  # what the sifting left out
    assert "one seed" in text  # a single run per variant says so


def test_demo_table_says_when_a_compiled_row_ran_eagerly():
    result = {
        "config": {"seed": 3, "target": 0.9},
        "rows": [
            _demo_row("eager"),
            _demo_row("hasten.compile", compile_s=0.0, compiled_graphs=0),
            _demo_row("compile + sifting", compile_s=4.0, compiled_graphs=2),
        ],
    }
    lines = {line.split()[0]: line for line in demo_table(result).splitlines()[2:]}
    said = "ran eagerly: the compile plan found no compile that pays over this run"
    assert said in lines["hasten.compile"] and "one seed (3)" in lines["hasten.compile"]
    assert said not in lines["compile"] and said not in lines["eager"]


def _cand(name, cold, warm, step, speed=None, **extra):
    return {
        "name": name,
        "error": None,
        "info": {"first_call": {"cold": {"first_call_s": cold}, "warm": {"first_call_s": warm}}},
        "step_s": {"median": step, "p20": step, "p80": step},
        "speedup_vs_eager": speed and {"median": speed},
        "peak_mem_bytes": 2**20,
        "fraction_of_matmul_peak": 0.5,
        **extra,
    }


def test_first_call_table_has_time_to_step_100_and_break_even():
    result = {
        "baseline": "eager",
        "candidates": [
            _cand("eager", 3.0, 3.0, 4.0, 1.0),
            _cand("torch.compile", 53.0, 11.0, 3.0, 1.33),
            _cand("slower", 50.0, 10.0, 5.0, 0.8),
        ],
    }
    text = compile_table(result)  # picks the first-call table
    assert "cold first call s (own process, empty cache)" in text
    lines = {line.split()[0]: line for line in text.splitlines()[2:]}
    # 53 + 99 * 3 = 350; break-even: 53 + (n-1) 3 <= 3 + (n-1) 4  <=>  n - 1 >= 50
    assert " 350 " in lines["torch.compile"] and " 51 " in lines["torch.compile"]
    assert "never" in lines["slower"]


def test_legacy_hasten_name_is_shown_as_what_ran():
    step = {"median": 0.01, "p20": 0.01, "p80": 0.01}
    c = {"name": "hasten", "error": None, "step_s": step, "compile_s": 1.0, "samples_per_s": 1.0,
         "peak_mem_bytes": None, "fraction_of_matmul_peak": None, "speedup_vs_eager": None}  # fmt: skip
    assert "hasten.compile+compile_step" in compile_table({"candidates": [c]})
