import random

import numpy as np
import pytest
import torch

from hasten.bench.datasets import load_dataset


def test_digits_split_and_types():
    d = load_dataset("digits")
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert len(d.y_train) + len(d.y_test) == 1797
    assert d.feature_shape == (64,)
    assert float(d.x_train.max()) <= 1.0
    assert set(d.y_test.tolist()) == set(range(10))


def test_mnist1d_is_generated_and_leaves_global_rngs_alone():
    np_before = np.random.get_state()[1].copy()
    py_before = random.getstate()
    d = load_dataset("mnist1d", num_samples=500)
    assert np.array_equal(np.random.get_state()[1], np_before)
    assert random.getstate() == py_before
    assert d.x_train.shape == (400, 40) and d.x_test.shape == (100, 40)
    again = load_dataset("mnist1d", num_samples=500)
    assert torch.equal(d.x_train, again.x_train)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="choose one of"):
        load_dataset("imagenet")
