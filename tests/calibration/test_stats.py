"""Every statistic against an independent implementation, a published example, and a coverage simulation."""

import json
import tracemalloc

import krippendorff
import numpy as np
import pytest
from scipy import stats as sps
from scipy.spatial.distance import cosine as cosine_distance
from sklearn.metrics import cohen_kappa_score, mean_absolute_error, mean_squared_error

from mmjudge.calibration import stats
from mmjudge.calibration.stats import (
    Stat,
    agreement_table,
    collapse_warning,
    correlation_ratio,
    krippendorff_alpha,
    pearson,
)
from mmjudge.judge.parsing import ScoreScale

NAN = np.nan
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers x 12 units,
# with missing values. Published: nominal 0.743, ordinal 0.815, interval 0.849.
KRIPPENDORFF_EXAMPLE = np.array([
    [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
    [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
])


@pytest.fixture(params=[0, 1, 2])
def scores(request):
    rng = np.random.default_rng(request.param)
    human = rng.integers(0, 7, 80).astype(float)
    judge = np.clip(np.rint(human + rng.normal(-0.5, 1.2, 80)), 0, 6)
    if request.param == 2:  # a non-integer human reference (mean of two annotators) and an expected score
        human = human + rng.choice([0, 0.5], 80) * (human < 6)
        judge = np.clip(judge + rng.uniform(-0.4, 0.4, 80), 0, 6)
    return judge, human


def test_pairwise_statistics_match_scipy_sklearn_and_krippendorff(scores):
    judge, human = scores
    t = agreement_table(judge, human, ScoreScale(0, 6))
    assert t["n"].value == 80
    assert t["pearson"].value == pytest.approx(sps.pearsonr(judge, human).statistic)
    assert t["spearman"].value == pytest.approx(sps.spearmanr(judge, human).statistic)
    assert t["kendall_tau_b"].value == pytest.approx(sps.kendalltau(judge, human, variant="b").statistic)
    assert t["mse"].value == pytest.approx(mean_squared_error(human, judge))
    assert t["rmse"].value == pytest.approx(np.sqrt(mean_squared_error(human, judge)))
    assert t["mae"].value == pytest.approx(mean_absolute_error(human, judge))
    assert t["cosine"].value == pytest.approx(1 - cosine_distance(judge, human))
    rounded_j, rounded_h = np.rint(judge).astype(int), np.rint(human).astype(int)
    assert t["quadratic_kappa"].value == pytest.approx(cohen_kappa_score(rounded_j, rounded_h, weights="quadratic", labels=range(7)))
    assert t["exact_agreement"].value == pytest.approx(np.mean(rounded_j == rounded_h))
    assert t["within_1_agreement"].value == pytest.approx(np.mean(np.abs(rounded_j - rounded_h) <= 1))
    for level in ("interval", "ordinal"):
        expected = krippendorff.alpha(reliability_data=np.vstack([judge, human]), level_of_measurement=level)
        assert t[f"krippendorff_{level}"].value == pytest.approx(expected)


def test_kappa_counts_unused_levels_of_the_scale():
    # sklearn with labels=range(7) weights by the whole scale, not only the levels that occur
    judge, human = np.array([1, 2, 3, 3, 2]), np.array([1, 3, 3, 2, 2])
    t = agreement_table(judge, human, ScoreScale(0, 6))
    assert t["quadratic_kappa"].value == pytest.approx(cohen_kappa_score(judge, human, weights="quadratic", labels=range(7)))


def test_fisher_interval_matches_scipy(scores):
    judge, human = scores
    ours = pearson(judge, human).fisher_95
    theirs = sps.pearsonr(judge, human).confidence_interval(0.95)
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high))


def test_krippendorff_published_example():
    assert krippendorff_alpha(KRIPPENDORFF_EXAMPLE, "interval").value == pytest.approx(0.849, abs=5e-4)
    assert krippendorff_alpha(KRIPPENDORFF_EXAMPLE, "ordinal").value == pytest.approx(0.815, abs=5e-4)
    for level in ("interval", "ordinal"):
        assert krippendorff_alpha(KRIPPENDORFF_EXAMPLE, level).value == pytest.approx(
            krippendorff.alpha(reliability_data=KRIPPENDORFF_EXAMPLE, level_of_measurement=level))


@pytest.mark.parametrize("level", ["interval", "ordinal"])
def test_krippendorff_on_continuous_scores_with_missing_values_matches_the_package(level):
    # three coders, scores with (nearly) as many distinct values as ratings, a fifth of them missing
    rng = np.random.default_rng(4)
    truth = rng.uniform(0, 6, 150)
    data = np.clip(truth + rng.normal(0, 0.8, (3, 150)), 0, 6)
    data[rng.random((3, 150)) < 0.2] = NAN
    expected = krippendorff.alpha(reliability_data=data, level_of_measurement=level)
    assert krippendorff_alpha(data, level).value == pytest.approx(expected)


def test_krippendorff_on_twenty_thousand_continuous_pairs_builds_no_values_by_values_matrix():
    """A values x values coincidence matrix took 30 s at 2,000 distinct values; at 20,000 it would be 3.2 GB.
    Its memory, not its time, is checked: a busy machine changes the one and not the other."""
    rng = np.random.default_rng(0)
    human = rng.integers(0, 7, 20_000).astype(float)
    judge = np.clip(human + rng.normal(0, 1, 20_000), 0, 6)  # 20,000 distinct values
    tracemalloc.start()
    try:
        for level in ("interval", "ordinal"):
            assert 0 < krippendorff_alpha(np.vstack([judge, human]), level).value < 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20  # a few arrays of the 40,000 values; the matrix alone would be 3.2 GB


def test_krippendorff_undefined_cases():
    assert krippendorff_alpha(np.array([[1.0, 2, NAN], [NAN, NAN, 3]]), "interval").reason == "no unit was rated twice"
    same = krippendorff_alpha(np.array([[2.0, 2, 5], [2, 2, NAN]]), "ordinal")
    assert same.reason == "fewer than two distinct values in the units rated twice or more"  # 5 has no partner


def test_correlation_ratio_is_the_root_of_anova_r_squared():
    rng = np.random.default_rng(0)
    groups = list(rng.choice(["SA", "PBL", "MSR"], 90))
    values = rng.normal(0, 1, 90) + np.array([{"SA": 0.5, "PBL": 0, "MSR": -0.5}[g] for g in groups])
    dummies = np.array([[g == c for c in ("SA", "PBL")] for g in groups], dtype=float)
    design = np.column_stack([np.ones(90), dummies])
    fitted = design @ np.linalg.lstsq(design, values, rcond=None)[0]
    r_squared = 1 - ((values - fitted) ** 2).sum() / ((values - values.mean()) ** 2).sum()
    assert correlation_ratio(values, groups).value == pytest.approx(np.sqrt(r_squared))
    assert correlation_ratio(values, ["SA"] * 90).reason == "1 group(s); need 2"


def _coverage(trials: int, n: int, rho: float, bootstrap: int) -> tuple[float, float]:
    rng = np.random.default_rng(7)
    fisher = boot = 0
    for t in range(trials):
        x, y = rng.multivariate_normal([0, 0], [[1, rho], [rho, 1]], n).T
        stat = pearson(x, y, bootstrap=bootstrap, seed=t)
        fisher += stat.fisher_95.low <= rho <= stat.fisher_95.high
        boot += stat.bootstrap_95.low <= rho <= stat.bootstrap_95.high
    return fisher / trials, boot / trials


def test_intervals_cover_the_true_correlation_at_about_the_nominal_rate():
    fisher, boot = _coverage(trials=400, n=60, rho=0.6, bootstrap=500)
    # nominal 0.95; with 400 trials the binomial sd is 0.011; the percentile bootstrap runs a bit narrow at n=60
    assert 0.92 <= fisher <= 0.98
    assert 0.90 <= boot <= 0.98


def test_bootstrap_is_reproducible_and_bounded_for_large_n():
    rng = np.random.default_rng(0)
    x = rng.normal(size=20_000)
    y = x + rng.normal(size=20_000)
    a, b = pearson(x, y, bootstrap=1000, seed=3), pearson(x, y, bootstrap=1000, seed=3)
    assert a.bootstrap_95 == b.bootstrap_95 and a.bootstrap_95.low < a.value < a.bootstrap_95.high


@pytest.mark.parametrize(
    "judge, human, reason",
    [([3, 3, 3, 3], [1, 2, 3, 4], "the judge's scores are constant"),
     ([1, 2, 3, 4], [5, 5, 5, 5], "the human scores are constant"),
     ([1, 2], [1, 2], "n = 2 < 3")],
)
def test_undefined_statistics_say_why_and_never_carry_nan(judge, human, reason):
    t = agreement_table(judge, human, ScoreScale(0, 6), bootstrap=100)
    for name in ("pearson", "spearman", "kendall_tau_b"):
        assert t[name].value is None and t[name].reason == reason
    assert t["mse"].value is not None  # the errors stay defined
    json.dumps({k: v.model_dump(mode="json") for k, v in t.items()}, allow_nan=False)
    assert all(s.value is None or np.isfinite(s.value) for s in t.values())


def test_empty_input_is_undefined_everywhere():
    t = agreement_table([], [], ScoreScale(0, 6), bootstrap=10)
    assert t["n"].value == 0
    assert all(s.value is None and s.reason for name, s in t.items() if name != "n")


def test_fisher_interval_needs_four_pairs_and_handles_perfect_correlation():
    assert pearson(np.array([1.0, 2, 3]), np.array([1.0, 2, 4])).fisher_95.reason == "Fisher z needs n > 3, got 3"
    perfect = pearson(np.arange(10.0), np.arange(10.0) * 2, bootstrap=50)
    assert perfect.value == pytest.approx(1) and perfect.fisher_95.low == pytest.approx(1)


def test_a_nan_cannot_become_a_statistic():
    with pytest.raises(ValueError, match="non-finite"):
        Stat(value=float("nan"))
    with pytest.raises(ValueError, match="needs a reason"):
        Stat(value=None)


def test_score_collapse_is_flagged():
    assert "standard deviation" in collapse_warning([4] * 50)
    assert "90% of scores are 5" in collapse_warning([5] * 45 + [1, 2, 3, 4, 6])
    assert collapse_warning(list(range(7)) * 5) is None


def test_score_collapse_thresholds_are_the_named_constants(monkeypatch):
    four_in_five = [5] * 40 + [1, 2, 3, 4, 6] * 2
    assert stats.COLLAPSE_SHARE == 0.8 and collapse_warning(four_in_five) is None  # 80% is not more than 80%
    assert collapse_warning(four_in_five + [5] * 5) == "score collapse: 82% of scores are 5"
    monkeypatch.setattr(stats, "COLLAPSE_SHARE", 0.85)
    assert collapse_warning(four_in_five + [5] * 5) is None
    spread = [3.0, 3.05] * 20  # standard deviation 0.025
    monkeypatch.setattr(stats, "COLLAPSE_MIN_STD_STEPS", 0.02)
    assert collapse_warning(spread) == "score collapse: 100% of scores are 3"
    monkeypatch.setattr(stats, "COLLAPSE_MIN_STD_STEPS", 0.03)
    assert collapse_warning(spread) == "score collapse: standard deviation 0.025 < 0.03"


TENTHS = ScoreScale(0, 1, 0.1)


@pytest.fixture(params=[0, 1])
def tenths(request):
    """Level indices 0-10 of a judge and of two annotators; scores are the indices times 0.1, with float
    error (0.1 * 3 = 0.30000000000000004); the human reference is the annotators' mean, often half-way."""
    rng = np.random.default_rng(request.param)
    a, b = rng.integers(0, 11, 120), rng.integers(0, 11, 120)
    k_judge = np.clip(a + rng.integers(-2, 3, 120), 0, 10)
    k_human = np.array([round((i + j) / 2) for i, j in zip(a, b)])  # halves to even, in whole numbers
    return k_judge, k_judge * 0.1, k_human, (a * 0.1 + b * 0.1) / 2


def test_level_statistics_on_tenths_match_sklearn_on_level_indices(tenths):
    k_judge, judge, k_human, human = tenths
    t = agreement_table(judge, human, TENTHS)
    kappa = cohen_kappa_score(k_judge, k_human, weights="quadratic", labels=range(11))
    assert t["quadratic_kappa"].value == pytest.approx(kappa)
    assert t["exact_agreement"].value == pytest.approx(np.mean(k_judge == k_human))
    assert t["within_1_agreement"].value == pytest.approx(np.mean(np.abs(k_judge - k_human) <= 1))  # one step: 0.1
    # the same judgements on a whole-number 0-10 scale give the same level statistics
    whole = agreement_table(k_judge, k_human, ScoreScale(0, 10))
    for name in ("quadratic_kappa", "exact_agreement", "within_1_agreement"):
        assert t[name].value == pytest.approx(whole[name].value)


def test_value_statistics_on_tenths_use_the_raw_values(tenths):
    _, judge, _, human = tenths
    t = agreement_table(judge, human, TENTHS)
    assert t["pearson"].value == pytest.approx(sps.pearsonr(judge, human).statistic)
    assert t["kendall_tau_b"].value == pytest.approx(sps.kendalltau(judge, human, variant="b").statistic)
    assert t["mae"].value == pytest.approx(mean_absolute_error(human, judge))
    expected = krippendorff.alpha(reliability_data=np.vstack([judge, human]), level_of_measurement="interval")
    assert t["krippendorff_interval"].value == pytest.approx(expected)


def test_score_collapse_on_tenths_counts_levels_and_a_tenth_of_a_step():
    assert collapse_warning([0.5] * 40, TENTHS) == "score collapse: standard deviation 0.000 < 0.01"
    assert collapse_warning([0.1 * 7] * 45 + [0, 0.2, 0.4, 0.9, 1], TENTHS) == "score collapse: 90% of scores are 0.7"
    # a judge that uses the levels 0.6-1 evenly has not collapsed; rounded to whole numbers, every score is 1
    upper = np.repeat(np.arange(6, 11) * 0.1, 8)
    assert collapse_warning(upper, TENTHS) is None
    assert collapse_warning(upper, ScoreScale()) == "score collapse: 100% of scores are 1"
