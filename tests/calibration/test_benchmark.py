"""PPI++ per model, checked where the truth is known: simulated human and judge scores whose true mean is
set, and an estimator worked out by hand for the degenerate cases."""

import numpy as np
import pytest
from scipy.stats import norm

from mmjudge.calibration.benchmark import benchmark_scores, model_score, ppi_mean, summary_lines

DRAWS = 4000


def simulate(rng, draws: int, n: int, big_n: int, bias: float, noise: float):
    """Human scores on 0-6 around a known mean, and a biased, noisy judge; rows are independent draws."""
    levels = np.arange(7)
    weights = np.array([1, 2, 4, 6, 5, 3, 1], dtype=float)
    weights /= weights.sum()
    human = rng.choice(levels, size=(draws, n + big_n), p=weights).astype(float)
    judge = np.clip(np.round(human + bias + rng.normal(0, noise, human.shape)), 0, 6)
    return float(levels @ weights), human[:, :n], judge[:, :n], judge[:, n:]


# floor: the normal interval is asymptotic; with 30 human scores per model it covers about 93% (measured
# over seeds: 0.926-0.932), which docs/trust.md says; from 50 on, within a binomial error of 95%.
@pytest.mark.parametrize("n, big_n, bias, noise, floor", [(50, 1000, 1.0, 0.8, 0.93), (30, 300, -0.7, 2.5, 0.915), (200, 2000, 0.0, 0.5, 0.935)])
def test_ppi_intervals_cover_the_true_mean_at_their_nominal_rate_whatever_the_judges_bias(n, big_n, bias, noise, floor):
    truth, human, judged, judge_only = simulate(np.random.default_rng([n, big_n]), DRAWS, n, big_n, bias, noise)
    value, se, lam = ppi_mean(human, judged, judge_only)
    covered = np.abs(value - truth) <= 1.959964 * se
    assert floor <= covered.mean() <= 0.965, covered.mean()  # 95% nominal; the binomial error over 4000 draws is 0.34 points
    # the judge-only mean is off by about the judge's bias: its interval would not cover
    if abs(bias) >= 0.7:
        judge_mean = np.concatenate([judged, judge_only], 1).mean(1)
        judge_se = np.concatenate([judged, judge_only], 1).std(1) / np.sqrt(n + big_n)
        assert (np.abs(judge_mean - truth) <= 1.959964 * judge_se).mean() < 0.05
    # and PPI++ is narrower than the human labels alone when the judge is informative
    if noise < 1:
        assert np.median(se) < np.median(human.std(1) / np.sqrt(n))
    assert ((0 <= lam) & (lam <= 1)).all()


def test_ppi_with_a_perfect_judge_is_the_mean_of_all_ids_and_with_no_judge_only_ids_the_human_mean():
    human = np.array([1.0, 2, 3, 4, 5, 6])
    s = model_score(human[:3], human[:3], human[3:])
    # lam = 1 / (1 + n / N) = 0.5: the rectifier mean(Y - f / 2) plus half the judge-only mean
    assert s.lam == pytest.approx(1 / (1 + 3 / 3) * np.var(human[:3]) / np.var(human, ddof=1))
    alone = model_score(human, human + 1, np.array([]))
    assert alone.lam == 0 and alone.ppi.value == pytest.approx(human.mean()) and alone.ppi.low == pytest.approx(alone.human_only.low)


def test_a_constant_judge_adds_nothing_and_too_few_human_scores_are_undefined_with_a_reason():
    s = model_score(np.array([1.0, 3, 5]), np.full(3, 4.0), np.full(50, 4.0))
    assert s.lam == 0 and s.ppi.value == pytest.approx(3)
    one = model_score(np.array([2.0]), np.array([2.0]), np.full(9, 3.0))
    assert one.ppi.value is None and "1 human-scored id(s)" in one.ppi.reason and one.judge_only.value == pytest.approx(2.9)


def _model(rng, mean: float, n: int, big_n: int):
    human = np.clip(np.round(rng.normal(mean, 1.0, n + big_n)), 0, 6)
    judge = np.clip(np.round(human + 0.5 + rng.normal(0, 0.5, n + big_n)), 0, 6)
    return human[:n], judge[:n], judge[n:]


def test_ranking_holds_for_far_apart_models_and_for_close_ones_as_often_as_their_intervals_say():
    rng = np.random.default_rng(3)
    far = benchmark_scores({"a": _model(rng, 1.5, 60, 600), "b": _model(rng, 3.0, 60, 600), "c": _model(rng, 4.5, 60, 600)}, "overall", 500, 0)
    assert far.ranking.order == ["c", "b", "a"] and far.ranking.holds > 0.99 and min(far.ranking.above_next) > 0.99
    close = benchmark_scores({"a": _model(rng, 3.0, 60, 600), "b": _model(rng, 3.0, 60, 600)}, "overall", 2000, 0)
    first, second = (close.models[m].ppi for m in close.ranking.order)
    # the bootstrap's share against the normal approximation of the two estimates' difference
    z = (first.value - second.value) / np.hypot(first.high - first.value, second.high - second.value) * 1.959964
    assert close.ranking.holds == pytest.approx(norm.cdf(z), abs=0.05)
    again = benchmark_scores({"a": _model(np.random.default_rng(3), 3.0, 60, 600), "b": _model(np.random.default_rng(4), 3.05, 60, 600)}, "overall", 300, 1)
    assert again == benchmark_scores({"a": _model(np.random.default_rng(3), 3.0, 60, 600), "b": _model(np.random.default_rng(4), 3.05, 60, 600)}, "overall", 300, 1)


def test_ranking_needs_two_estimates_and_a_bootstrap():
    rng = np.random.default_rng(0)
    one = benchmark_scores({"a": _model(rng, 3, 20, 50), "b": (np.array([3.0]), np.array([3.0]), np.full(5, 3.0))}, "overall", 100, 0)
    assert one.ranking.order == ["a"] and one.ranking.holds is None and "1 model(s)" in one.ranking.reason
    none = benchmark_scores({"a": _model(rng, 3, 20, 50), "b": _model(rng, 4, 20, 50)}, "overall", 0, 0)
    assert none.ranking.order == ["b", "a"] and none.ranking.holds is None and "--bootstrap 0" in none.ranking.reason


def test_summary_lines_read_the_report_json_shape():
    scores = benchmark_scores({"m": _model(np.random.default_rng(1), 3, 20, 80)}, "overall", 0, 0)
    report = {"judges": {"after": {"benchmark": scores.model_dump(mode="json")}, "before": {"benchmark": None}}}
    [line] = summary_lines(report)
    assert line.startswith("after m: PPI++ ") and "judge only" in line and "(n 20 human + 80 judge only)" in line
