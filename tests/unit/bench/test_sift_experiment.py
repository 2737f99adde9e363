import math

import pytest

from hasten.bench import sift_experiment as se
from hasten.bench.tasks import get_task

from .test_tasks_training import HalfKeeper


@pytest.fixture
def half_family():
    se.register_policy_family("half-test", lambda config, steps: [HalfKeeper()])
    yield "half-test"
    del se.POLICY_FAMILIES["half-test"]


def test_experiment_pairs_runs_and_matches_compute(half_family):
    config = se.SiftExperimentConfig(tasks=("digits",), seeds=2, families=(half_family,), epochs=1)
    result = se.run_sift_experiment(config)
    runs = result["runs"]
    assert [(r["policy"], r["seed"]) for r in runs] == [
        ("full", 0),
        ("half", 0),
        ("matched:half", 0),
        ("rs2:half", 0),
        ("full", 1),
        ("half", 1),
        ("matched:half", 1),
        ("rs2:half", 1),
    ]
    for seed in (0, 1):
        _, half, matched, rs2 = (r for r in runs if r["seed"] == seed)
        assert half["compute"] == 3 * half["samples_backprop"] + half["samples_scored"]
        budget = math.ceil(half["compute"] / 3)
        for base in (matched, rs2):  # both baselines: the policy's compute, no scoring
            assert base["budget"] == budget and base["samples_backprop"] == budget
            assert base["samples_scored"] == 0 and base["compute"] == 3 * budget
            assert base["compute"] - half["compute"] in (0, 1, 2)  # rounded up to whole samples
        assert rs2["info"] == {"policy": "rs2", "budget": budget}
    rows = {r["run"]: r for r in result["summary"]["digits"]["rows"]}
    assert set(rows) == {"full", "half", "matched:half", "rs2:half"}
    assert "acc_minus_rs2" in rows["half"]
    fulls = [r for r in runs if r["policy"] == "full"]
    halves = [r for r in runs if r["policy"] == "half"]
    diffs = [h["test_acc"] - f["test_acc"] for h, f in zip(halves, fulls)]
    assert rows["half"]["acc_minus_full"]["mean"] == pytest.approx(sum(diffs) / 2)
    ratios = [h["compute"] / f["compute"] for h, f in zip(halves, fulls)]
    assert rows["half"]["compute_vs_full"]["mean"] == pytest.approx(sum(ratios) / 2)
    assert "acc_minus_matched" in rows["half"]
    assert result["machine"]["versions"]["torch"]


def test_full_only_family_runs_the_baseline():
    result = se.run_sift_experiment(
        se.SiftExperimentConfig(tasks=("digits",), seeds=1, families=("none",), epochs=1)
    )
    assert [r["policy"] for r in result["runs"]] == ["full"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tasks": ("imagenet",)}, "unknown task"),
        ({"tasks": ()}, "empty"),
        ({"seeds": 0}, "seeds"),
        ({"families": ("magic",)}, "unknown policy family"),
        ({"betas": (0.0,)}, "beta"),
        ({"betas": (float("nan"),)}, "beta"),
        ({"loss_history_length": 0}, "loss_history_length"),
        ({"sift_delay_fraction": 1.0}, "sift_delay_fraction"),
        ({"epochs": 0}, "epochs"),
    ],
)
def test_config_rejects_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        se.SiftExperimentConfig(**kwargs)


def test_family_names_cannot_be_taken_twice():
    with pytest.raises(ValueError, match="already registered"):
        se.register_policy_family("sagemaker", lambda c, s: [])


def test_sagemaker_family_says_what_is_missing():
    from hasten.bench import _hasten_api

    config = se.SiftExperimentConfig(tasks=("digits",), seeds=1)
    if _hasten_api.sifting_unavailable():
        with pytest.raises(RuntimeError, match=r"hasten\.sifting"):
            se.POLICY_FAMILIES["sagemaker"](config, 100)
    else:
        policies = se.POLICY_FAMILIES["sagemaker"](config, 100)
        assert [p.name for p in policies] == ["sift-b0.5", "sift-b1"]
        assert all(p.sift_delay == 10 for p in policies)


@pytest.mark.slow
def test_sagemaker_sifting_runs_for_real():
    pytest.importorskip("hasten.sifting")
    task = get_task("digits").with_(epochs=2)
    config = se.SiftExperimentConfig(tasks=("digits",), seeds=1, betas=(1.0,), epochs=2)
    result = se.run_sift_experiment(config, tasks={"digits": task})
    full, sifted, matched, rs2 = result["runs"]
    assert rs2["samples_backprop"] == matched["samples_backprop"]
    assert sifted["samples_scored"] > 0
    assert sifted["samples_backprop"] < full["samples_backprop"]
    assert sifted["compute"] == 3 * sifted["samples_backprop"] + sifted["samples_scored"]
    assert matched["samples_backprop"] == math.ceil(sifted["compute"] / 3)


def test_baselines_can_be_switched_off(half_family):
    config = se.SiftExperimentConfig(
        tasks=("digits",), seeds=1, families=(half_family,), epochs=1, rs2=False
    )
    runs = se.run_sift_experiment(config)["runs"]
    assert [r["policy"] for r in runs] == ["full", "half", "matched:half"]
    config = se.SiftExperimentConfig(
        tasks=("digits",), seeds=1, families=(half_family,), epochs=1, compute_matched=False
    )
    runs = se.run_sift_experiment(config)["runs"]
    assert [r["policy"] for r in runs] == ["full", "half", "rs2:half"]


def test_results_of_two_processes_merge_into_one(half_family):
    def part(task, **kw):
        config = se.SiftExperimentConfig(
            tasks=(task,), seeds=2, families=(half_family,), epochs=1, rs2=False, **kw
        )
        tiny = get_task("mnist1d").with_(dataset_kwargs={"num_samples": 500})
        return se.run_sift_experiment(config, tasks={"mnist1d": tiny})

    a, b = part("digits"), part("mnist1d")
    merged = se.merge_results([a, b])
    assert merged["config"]["tasks"] == ["digits", "mnist1d"]
    assert merged["config"]["epochs"] == {"digits": 1, "mnist1d": 1}
    assert merged["runs"] == a["runs"] + b["runs"]
    assert merged["summary"] == {**a["summary"], **b["summary"]}
    assert merged["machines"] == [a["machine"], b["machine"]]
    assert len(merged["load_average_end"]) == 2
    with pytest.raises(ValueError, match="two of the results"):
        se.merge_results([a, a])
    other = part("mnist1d", first_seed=5)
    with pytest.raises(ValueError, match="first_seed"):
        se.merge_results([a, other])
    with pytest.raises(ValueError, match="at least one"):
        se.merge_results([])
