"""Every statistic against an independent implementation, a published example, and a coverage simulation."""

import krippendorff
import numpy as np
import pytest
from scipy import stats as sps
from sklearn.metrics import cohen_kappa_score, mean_absolute_error, mean_squared_error

from calibration.fit import cross_fit
from calibration.stats import agreement_table, collapse_warning, krippendorff_alpha, pearson

NAN = np.nan
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability": 4 observers x 12 units, missing values.
KRIPPENDORFF_EXAMPLE = np.array([
    [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
    [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
    [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
    [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
])


@pytest.fixture
def scores():
    rng = np.random.default_rng(1)
    human = rng.integers(0, 7, 80).astype(float)
    judge = np.clip(np.rint(human + rng.normal(0, 1.2, 80)), 0, 6)
    return judge, human


def test_pairwise_statistics_match_scipy_and_sklearn(scores):
    judge, human = scores
    t = agreement_table(judge, human, (0, 6))
    assert t["n"].value == 80
    assert t["pearson"].value == pytest.approx(sps.pearsonr(judge, human).statistic)
    assert t["spearman"].value == pytest.approx(sps.spearmanr(judge, human).statistic)
    assert t["kendall_tau_b"].value == pytest.approx(sps.kendalltau(judge, human, variant="b").statistic)
    assert t["mse"].value == pytest.approx(mean_squared_error(human, judge))
    assert t["rmse"].value == pytest.approx(np.sqrt(mean_squared_error(human, judge)))
    assert t["mae"].value == pytest.approx(mean_absolute_error(human, judge))
    assert t["cosine"].value == pytest.approx(1 - __import__("scipy").spatial.distance.cosine(judge, human))
    assert t["quadratic_kappa"].value == pytest.approx(cohen_kappa_score(judge.astype(int), human.astype(int), weights="quadratic", labels=range(7)))
    assert t["exact_agreement"].value == pytest.approx(np.mean(judge == human))
    assert t["within_1_agreement"].value == pytest.approx(np.mean(np.abs(judge - human) <= 1))
    for level in ("interval", "ordinal"):
        expected = krippendorff.alpha(reliability_data=np.vstack([judge, human]), level_of_measurement=level)
        assert t[f"krippendorff_{level}"].value == pytest.approx(expected)


def test_fisher_interval_matches_scipy(scores):
    judge, human = scores
    ours = pearson(judge, human)
    theirs = sps.pearsonr(judge, human).confidence_interval(0.95)
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high))


def test_krippendorff_published_example():
    # Published: interval 0.849, ordinal 0.815 (nominal 0.743, which this toolkit does not report).
    assert krippendorff_alpha(KRIPPENDORFF_EXAMPLE, "interval").value == pytest.approx(0.849, abs=5e-4)
    assert krippendorff_alpha(KRIPPENDORFF_EXAMPLE, "ordinal").value == pytest.approx(0.815, abs=5e-4)
    for level in ("interval", "ordinal"):
        assert krippendorff_alpha(KRIPPENDORFF_EXAMPLE, level).value == pytest.approx(
            krippendorff.alpha(reliability_data=KRIPPENDORFF_EXAMPLE, level_of_measurement=level))


def test_bootstrap_interval_covers_the_true_correlation_at_about_the_nominal_rate():
    rng = np.random.default_rng(7)
    rho, n, trials, covered = 0.6, 60, 300, 0
    cov = [[1, rho], [rho, 1]]
    for t in range(trials):
        x, y = rng.multivariate_normal([0, 0], cov, n).T
        stat = pearson(x, y, bootstrap=400, seed=t)
        covered += stat.boot_low <= rho <= stat.boot_high
    assert 0.89 <= covered / trials <= 0.985  # nominal 0.95; percentile bootstrap runs a little narrow at n=60


@pytest.mark.parametrize(
    "judge, human, reason",
    [([3, 3, 3, 3], [1, 2, 3, 4], "the judge's scores are constant"), ([1, 2, 3, 4], [5, 5, 5, 5], "the human scores are constant"), ([1, 2], [1, 2], "n = 2 < 3")],
)
def test_undefined_statistics_say_why(judge, human, reason):
    t = agreement_table(judge, human, (0, 6), bootstrap=100)
    for name in ("pearson", "spearman", "kendall_tau_b"):
        assert t[name].value is None and t[name].reason == reason
    assert t["mse"].value is not None  # errors stay defined
    assert all(s.value is None or np.isfinite(s.value) for s in t.values())


def test_score_collapse_is_flagged():
    assert "standard deviation" in collapse_warning([4] * 50, (0, 6))
    assert "90% of scores are 5" in collapse_warning([5] * 45 + [1, 2, 3, 4, 6], (0, 6))
    assert collapse_warning(list(range(7)) * 5, (0, 6)) is None


def test_calibration_reduces_held_out_error_for_a_monotone_bias():
    rng = np.random.default_rng(3)
    human = rng.uniform(0, 6, 400)
    judge = np.clip(6 * (human / 6) ** 2.5 + rng.normal(0, 0.4, 400), 0, 6)  # harsh on everything but the best
    for method in ("isotonic", "linear"):
        result = cross_fit(judge, human, method, folds=5, seed=0, scale=(0, 6))
        assert result["mse_after"] < 0.6 * result["mse_before"], method
    assert "too small" in cross_fit(judge[:6], human[:6], "isotonic", folds=5, seed=0, scale=(0, 6))["undefined"]
