import numpy as np
import pytest

from mmjudge.calibration.fit import apply_map, cross_fit, fit_map, reliability
from mmjudge.judge.parsing import ScoreScale


@pytest.fixture
def biased_judge():
    """A judge with a known monotone bias: harsh on everything but the best answers."""
    rng = np.random.default_rng(3)
    human = rng.uniform(0, 6, 400)
    judge = np.clip(6 * (human / 6) ** 2.5 + rng.normal(0, 0.4, 400), 0, 6)
    return judge, human


@pytest.mark.parametrize("method", ["isotonic", "linear"])
def test_calibration_reduces_held_out_error_for_a_monotone_bias(biased_judge, method):
    judge, human = biased_judge
    calibrated = cross_fit(judge, human, method, folds=5, seed=0, scale=(0, 6)).calibrated
    before, after = np.mean((judge - human) ** 2), np.mean((calibrated - human) ** 2)
    assert after < 0.6 * before
    assert calibrated.min() >= 0 and calibrated.max() <= 6


def test_isotonic_map_is_monotone_and_close_to_the_true_inverse(biased_judge):
    judge, human = biased_judge
    xs, ys = fit_map(judge, human, "isotonic", (0, 6))
    assert np.all(np.diff(xs) >= 0) and np.all(np.diff(ys) >= 0)
    grid = np.array([1.0, 2.0, 4.0])
    assert apply_map((xs, ys), grid, (0, 6)) == pytest.approx(6 * (grid / 6) ** (1 / 2.5), abs=0.6)


def test_linear_map_never_inverts_the_judge():
    judge = np.array([0, 1, 2, 3, 4, 5, 6], dtype=float)
    _xs, ys = fit_map(judge, 6 - judge, "linear", (0, 6))
    assert ys[0] == ys[1] == pytest.approx(3)  # best monotone line through a decreasing relation is flat


def test_one_distinct_judge_score_gives_a_flat_map():
    xs, ys = fit_map(np.full(10, 4.0), np.linspace(0, 6, 10), "isotonic", (0, 6))
    assert len(xs) == 2 and ys[0] == ys[1] == pytest.approx(3)


def test_too_few_pairs_for_the_folds_is_a_reason_not_a_crash(biased_judge):
    judge, human = biased_judge
    result = cross_fit(judge[:6], human[:6], "isotonic", folds=5, seed=0, scale=(0, 6))
    assert result.calibrated is None and "need 10" in result.reason


def test_reliability_is_the_mean_human_score_per_judge_level():
    levels = reliability(np.array([1, 1, 2, 2.2, 5]), np.array([0, 2, 3, 5, 6.0]))
    assert [(v.judge_level, v.n, v.mean_human) for v in levels] == [(1, 2, 1.0), (2, 2, 4.0), (5, 1, 6.0)]


def test_reliability_on_tenths_groups_by_nearest_level():
    judge = np.array([0.1 * 7, 0.7, 0.68, 0.1 * 3, 0.3, 0.96])  # 0.7000000000000001 and 0.7 are one level
    levels = reliability(judge, np.array([0.6, 0.8, 1.0, 0.2, 0.4, 0.9]), ScoreScale(0, 1, 0.1))
    assert [(v.judge_level, v.n) for v in levels] == [(0.3, 2), (0.7, 3), (1.0, 1)]
    assert [v.mean_human for v in levels] == pytest.approx([0.3, 0.8, 0.9])
