"""Conformal score sets and the escalation threshold, checked on simulations where the truth is known:
a judge whose score distribution is (mis)calibrated in a set way, and human levels drawn from the truth."""

import numpy as np
import pytest
from scipy.stats import binom

from mmjudge.calibration.conformal import (
    MIN_TRUSTED,
    conformal_threshold,
    disagreement_upper_bound,
    escalation_threshold,
    fitted_threshold,
    held_out_sets,
    set_sizes,
    written_agreement,
)
from mmjudge.judge.calibrator import Calibrator, mass_before

LEVELS = 7


def simulate(rng, n: int, sharpness: float, shift: int = 0):
    """Per record, a judge distribution around a latent level; the human level is drawn from that
    distribution moved by `shift` levels (a biased judge) and the judge writes its most probable level."""
    centre = rng.uniform(0, LEVELS - 1, n)
    logits = -sharpness * (np.arange(LEVELS)[None, :] - centre[:, None]) ** 2
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    drawn = (p.cumsum(1) < rng.uniform(size=(n, 1))).sum(1)
    human = np.clip(drawn + shift, 0, LEVELS - 1)
    return p, human, p.argmax(1)


@pytest.mark.parametrize("coverage, sharpness, shift", [(0.9, 1.0, 0), (0.8, 0.3, 1), (0.95, 3.0, -1)])
def test_sets_cover_held_out_draws_at_their_nominal_rate(coverage, sharpness, shift):
    """Over many calibration / test draws, the average coverage is at least the target and, with continuous
    nonconformity, at most target + 1 / (n + 1) plus the ties a discrete scale makes."""
    rng = np.random.default_rng([int(coverage * 100), shift + 5])
    rates = []
    for _ in range(200):
        p, human, _ = simulate(rng, 300, sharpness, shift)
        threshold = fitted_threshold(p[:200], human[:200], coverage)
        before = mass_before(p[200:])
        rates.append((before[np.arange(100), human[200:]] <= threshold).mean())
    assert coverage - 0.01 <= np.mean(rates) <= coverage + 0.04, np.mean(rates)


def test_the_calibrator_applies_the_same_sets_as_the_fit_measured():
    p, human, _ = simulate(np.random.default_rng(1), 400, 0.8)
    threshold = fitted_threshold(p, human, 0.9)
    c = Calibrator(method="linear", source="score", x=[0, 6], y=[0, 6], scale=(0, 6), score_sets={"coverage": 0.9, "threshold": threshold, "n": 400})
    sets = [c.score_set({str(k): float(v) for k, v in enumerate(row)}) for row in p]
    inside = np.array([low <= h <= high for (low, high), h in zip(sets, human)])
    before = mass_before(p)
    assert (inside == (before[np.arange(400), human] <= threshold)).all()
    assert [high - low + 1 for low, high in sets] == set_sizes(before, threshold).tolist()
    assert inside.mean() >= 0.9 - 1e-9  # in-sample, the quantile covers at least its share


def test_threshold_is_the_conformal_quantile_and_every_level_when_too_few_records():
    scores = np.array([0.5, 0.1, 0.3, 0.2, 0.4, 0.0, 0.6, 0.7, 0.8, 0.9])
    assert conformal_threshold(scores, 0.5) == 0.5  # ceil(11 * 0.5) = 6th smallest
    assert conformal_threshold(scores, 0.9) == 0.9  # ceil(11 * 0.9) = 10th smallest
    assert conformal_threshold(scores[:8], 0.9) == 1.0  # ceil(9 * 0.9) = 9 > 8: every level
    assert set_sizes(np.zeros((3, LEVELS)), 1.0).tolist() == [LEVELS] * 3


def test_held_out_sets_reach_the_coverage_and_a_sharper_judge_gives_smaller_sets():
    rng = np.random.default_rng(2)
    blunt, sharp = (held_out_sets(*simulate(rng, 1500, s)[:2], 0.9, 5, 0) for s in (0.3, 2.0))
    assert blunt.coverage == pytest.approx(0.9, abs=0.025) and sharp.coverage == pytest.approx(0.9, abs=0.025)
    assert sharp.mean_size < blunt.mean_size
    assert held_out_sets(*simulate(rng, 9, 1.0)[:2], 0.9, 5, 0) is None  # fewer than 2 per fold


def test_clopper_pearson_bound_is_where_the_binomial_tail_reaches_the_error_rate():
    for wrong, n in [(0, 30), (3, 40), (17, 100)]:
        bound = disagreement_upper_bound(wrong, n, 0.1)
        assert binom.cdf(wrong, n, bound) == pytest.approx(0.1, abs=1e-9)
    assert disagreement_upper_bound(5, 5, 0.1) == 1.0


def test_escalation_keeps_the_guarantee_over_many_draws():
    """With probability at least 1 - error_rate, the agreement on the kept records of new draws (the
    population rate, estimated on a large test sample) is at least the target."""
    rng = np.random.default_rng(4)
    target, error_rate, failures, kept_any = 0.8, 0.1, 0, 0
    test_p, test_human, test_written = simulate(rng, 20000, 3.0)
    test_conf, test_agrees = written_agreement(test_p, test_written, test_human, "exact")
    for _ in range(200):
        p, human, written = simulate(rng, 500, 3.0)
        fit = escalation_threshold(*written_agreement(p, written, human, "exact"), target, error_rate)
        if fit.threshold is None:
            continue
        kept_any += 1
        failures += test_agrees[test_conf >= fit.threshold].mean() < target
    assert kept_any > 100  # the judge is sure enough of some records for a threshold to exist
    # a draw with no threshold trusts nothing, which is no failure: the guarantee is over every draw
    assert failures / 200 <= error_rate


def test_escalation_threshold_by_hand():
    """Confidences 1.0 .. 0.01 (100 records, 0.01 apart: the grid of thresholds reaches every count); the top
    60 agree, the rest disagree: the threshold stops where the Clopper-Pearson bound of the disagreements
    first exceeds 1 - target."""
    confidence = np.linspace(1, 0.01, 100)
    agrees = np.arange(100) < 60
    fit = escalation_threshold(confidence, agrees, 0.9, 0.1)
    expected = max(k for k in range(MIN_TRUSTED, 101)
                   if all(disagreement_upper_bound(max(0, j - 60), j, 0.1) <= 0.1 for j in range(MIN_TRUSTED, k + 1)))
    assert fit.trusted == expected == (confidence >= fit.threshold).sum()
    assert 60 <= fit.trusted < 70 and fit.agreement_lower_bound >= 0.9


def test_escalation_tests_no_threshold_with_fewer_than_min_trusted_records_and_keeps_ties_together():
    few = escalation_threshold(np.linspace(1, 0.5, MIN_TRUSTED - 1), np.ones(MIN_TRUSTED - 1, dtype=bool), 0.8, 0.1)
    assert few.threshold is None and few.trusted == 0
    tied = escalation_threshold(np.array([0.9] * 50 + [0.5] * 50), np.array([True] * 50 + [False] * 50), 0.8, 0.1)
    assert 0.5 < tied.threshold <= 0.9 and tied.trusted == 50


def test_within_one_level_agreement_counts_neighbours():
    p = np.array([[0, 0, 0.5, 0.3, 0.2, 0, 0]])
    confidence, agrees = written_agreement(p, np.array([2]), np.array([3]), "within_1")
    assert confidence[0] == pytest.approx(0.8) and agrees[0]
    confidence, agrees = written_agreement(p, np.array([2]), np.array([3]), "exact")
    assert confidence[0] == pytest.approx(0.5) and not agrees[0]
