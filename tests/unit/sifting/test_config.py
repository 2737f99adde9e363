import dataclasses
import math

import pytest

from hasten.sifting import (
    LossConfig,
    RelativeProbabilisticSiftConfig,
    SiftConfigValidationException,
    SiftingBaseConfig,
    coerce_sift_config,
)


def test_sagemaker_keywords_and_defaults():
    cfg = RelativeProbabilisticSiftConfig(
        beta_value=0.5,
        loss_history_length=500,
        loss_based_sift_config=LossConfig(sift_config=SiftingBaseConfig(sift_delay=0)),
    )
    assert cfg.sift_delay == 0 and cfg.repeat_delay_per_epoch is False
    assert math.isclose(cfg.expected_keep_rate, 2 / 3)
    default = RelativeProbabilisticSiftConfig(beta_value=1, loss_history_length=10)
    assert default.sift_delay == 1000  # SageMaker's default
    assert isinstance(default.beta_value, float)


def test_dicts_accepted_at_every_level_and_equal_to_objects():
    obj = RelativeProbabilisticSiftConfig(
        beta_value=2.0,
        loss_history_length=100,
        loss_based_sift_config=LossConfig(
            sift_config=SiftingBaseConfig(sift_delay=5, repeat_delay_per_epoch=True)
        ),
    )
    as_dict = {
        "beta_value": 2.0,
        "loss_history_length": 100,
        "loss_based_sift_config": {
            "sift_config": {"sift_delay": 5, "repeat_delay_per_epoch": True}
        },
    }
    assert coerce_sift_config(as_dict) == obj
    assert RelativeProbabilisticSiftConfig.from_dict(obj.to_dict()) == obj
    mixed = RelativeProbabilisticSiftConfig(
        beta_value=2.0,
        loss_history_length=100,
        loss_based_sift_config={"sift_config": SiftingBaseConfig(5, True)},
    )
    assert mixed == obj
    assert coerce_sift_config(obj) is obj


def test_frozen():
    cfg = RelativeProbabilisticSiftConfig(beta_value=1.0, loss_history_length=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.beta_value = 2.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"beta_value": 0, "loss_history_length": 10}, "positive"),
        ({"beta_value": -1.0, "loss_history_length": 10}, "positive"),
        ({"beta_value": float("nan"), "loss_history_length": 10}, "finite"),
        ({"beta_value": float("inf"), "loss_history_length": 10}, "finite"),
        ({"beta_value": "1", "loss_history_length": 10}, "number"),
        ({"beta_value": True, "loss_history_length": 10}, "number"),
        ({"beta_value": 1.0, "loss_history_length": 0}, ">= 1"),
        ({"beta_value": 1.0, "loss_history_length": 2.5}, "integer"),
        ({"beta_value": 1.0, "loss_history_length": 10, "loss_based_sift_config": 3}, "LossConfig"),
    ],
)
def test_bad_values_raise_with_field_name(kwargs, match):
    with pytest.raises(SiftConfigValidationException, match=match):
        RelativeProbabilisticSiftConfig(**kwargs)


def test_bad_base_config():
    with pytest.raises(SiftConfigValidationException, match="sift_delay must be >= 0"):
        SiftingBaseConfig(sift_delay=-1)
    with pytest.raises(SiftConfigValidationException, match="integer"):
        SiftingBaseConfig(sift_delay=1.5)
    with pytest.raises(SiftConfigValidationException, match="True or False"):
        SiftingBaseConfig(repeat_delay_per_epoch="yes")


@pytest.mark.parametrize(
    "data",
    [
        {"beta_value": 1.0, "loss_history_length": 10, "beta": 2},
        {"beta_value": 1.0, "loss_history_length": 10, "loss_based_sift_config": {"delay": 3}},
        {
            "beta_value": 1.0,
            "loss_history_length": 10,
            "loss_based_sift_config": {"sift_config": {"sift_dealy": 3}},
        },
    ],
)
def test_unknown_keys_raise_listing_allowed(data):
    with pytest.raises(SiftConfigValidationException, match=r"unknown key.*allowed keys"):
        coerce_sift_config(data)


def test_missing_key_and_wrong_type():
    with pytest.raises(SiftConfigValidationException, match=r"missing key.*beta_value"):
        coerce_sift_config({"loss_history_length": 10})
    with pytest.raises(SiftConfigValidationException, match="required"):
        coerce_sift_config(None)
    with pytest.raises(SiftConfigValidationException, match="dict"):
        coerce_sift_config(3)
    with pytest.raises(SiftConfigValidationException, match="unknown sifting policy"):
        coerce_sift_config({"policy": "nope"})


def test_exception_is_both_value_and_type_error():
    for base in (ValueError, TypeError):
        with pytest.raises(base):
            RelativeProbabilisticSiftConfig(beta_value=-1, loss_history_length=10)
