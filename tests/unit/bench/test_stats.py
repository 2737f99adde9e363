import math

import numpy as np
import pytest

from hasten.bench.stats import mean_std, percentile, summarize


@pytest.mark.parametrize("q", [0, 20, 50, 80, 100, 33.3])
def test_percentile_matches_numpy_linear(q):
    xs = np.random.default_rng(0).normal(size=17).tolist()
    assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-12)


def test_summarize_orders_and_counts():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.n, s.median, s.min, s.max, s.mean) == (5, 3.0, 1.0, 5.0, 3.0)
    assert s.p20 == pytest.approx(1.8) and s.p80 == pytest.approx(4.2)


def test_mean_std_known_values():
    m = mean_std([1, 2, 3, 4])
    assert m.mean == 2.5
    assert m.std == pytest.approx(math.sqrt(5 / 3))  # sample std, ddof=1
    assert m.sem == pytest.approx(math.sqrt(5 / 3) / 2)
    assert mean_std([7.0]).std == 0.0 and mean_std([7.0]).sem == 0.0


@pytest.mark.parametrize("fn", [summarize, mean_std, lambda xs: percentile(xs, 50)])
def test_empty_input_raises(fn):
    with pytest.raises(ValueError, match="empty"):
        fn([])


def test_percentile_out_of_range():
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_break_even_step():
    from hasten.bench.stats import break_even_step

    assert break_even_step(53.0, 3.0, 3.0, 4.0) == 51  # 53 + 50*3 = 203 = 3 + 50*4
    assert break_even_step(2.0, 3.0, 3.0, 4.0) == 1
    assert break_even_step(50.0, 4.0, 3.0, 4.0) is None  # never catches up
    assert break_even_step(50.0, 5.0, 3.0, 4.0) is None
