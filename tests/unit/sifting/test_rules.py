"""The rule registry: registration, lookup, coercion per front-end, and the deprecated halves."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from hasten.sifting import (
    RelativeProbabilisticSiftConfig,
    SiftConfigValidationException,
    StaleRelativePruningConfig,
    UnbiasedPruningConfig,
    coerce_pruning_config,
    coerce_sift_config,
    policy_for,
    relative_probabilistic_select,
)
from hasten.sifting.core import rules


@dataclasses.dataclass(frozen=True)
class _Mine:
    beta_value: float = 1.0


@pytest.fixture
def scratch_registry():
    before = dict(rules._RULES)
    yield
    rules._RULES.clear()
    rules._RULES.update(before)
    rules._PENDING_NAMES.clear()
    rules._PENDING_POLICIES.clear()


def test_builtin_rules_and_their_front_ends():
    assert {r.name: set(r.frontends) for r in rules.RULES.values()} == {
        "relative_probabilistic": {"loader"},
        "stale_relative": {"sampler"},
        "unbiased": {"sampler"},
    }
    assert rules.rule_of(UnbiasedPruningConfig()).name == "unbiased"
    with pytest.raises(TypeError):
        rules.RULES["x"] = None  # read-only view


def test_each_front_end_refuses_the_other_ones_rules_naming_what_to_use():
    with pytest.raises(SiftConfigValidationException, match=r"PruningSampler\(dataset"):
        coerce_sift_config(UnbiasedPruningConfig())
    with pytest.raises(SiftConfigValidationException, match="RelativeProbabilisticSiftConfig"):
        coerce_sift_config({"policy": "stale_relative"})
    with pytest.raises(SiftConfigValidationException, match="StaleRelativePruningConfig"):
        coerce_pruning_config(RelativeProbabilisticSiftConfig(1.0, 10))
    assert isinstance(
        coerce_pruning_config({"policy": "stale_relative"}), StaleRelativePruningConfig
    )


def test_register_rule_checks_its_arguments(scratch_registry):
    policy = lambda cfg: functools.partial(relative_probabilistic_select, beta_value=1.0)  # noqa: E731
    with pytest.raises(ValueError, match="nominal_keep_rate"):
        rules.register_rule("mine", _Mine, policy, frontends={"loader"})
    with pytest.raises(ValueError, match="subset"):
        rules.register_rule("mine", _Mine, policy, frontends={"trainer"})
    with pytest.raises(ValueError, match="already registered"):
        rules.register_rule("unbiased", _Mine, policy, frontends={"sampler"})
    with pytest.raises(ValueError, match="already selects"):
        rules.register_rule("other", UnbiasedPruningConfig, policy, frontends={"sampler"})
    rule = rules.register_rule("mine", _Mine, policy, frontends={"sampler"})
    assert coerce_pruning_config({"policy": "mine", "beta_value": 2.0}) == _Mine(2.0)
    assert rules.policy_for(_Mine()) is not None and rule.make_example() == _Mine()


def test_deprecated_two_step_registration_still_works(scratch_registry):
    from hasten.sifting.config import register_sift_config
    from hasten.sifting.policy import register_policy

    factory = lambda cfg: functools.partial(relative_probabilistic_select, beta_value=1.0)  # noqa: E731
    with pytest.warns(DeprecationWarning, match="register_rule"):
        register_policy(_Mine, factory)
    with pytest.warns(DeprecationWarning, match="deprecated"):
        register_sift_config("mine_old", _Mine)
    assert rules.RULES["mine_old"].frontends == {"loader"}
    assert callable(policy_for(_Mine()))
    assert rules.RULES["mine_old"].nominal_keep_rate(_Mine()) == 1.0
