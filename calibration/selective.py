"""Selective pairwise judging: keep a pair's verdict only where the judge is sure enough, with a finite-sample
guarantee on the error among the verdicts kept. Pure numpy/scipy; no torch.

Each labelled pair has a confidence (judge.calibrator.pair_confidence, read from the verdict distribution
averaged over both orders) and a loss: 1 where the judge's final verdict differs from people's (their
majority; a tie is a verdict of its own), else 0. For a threshold t, the selective risk R(t) is the chance that
a kept verdict (confidence >= t) is wrong. The labelled pairs at or above t are, given their number n_t, n_t
independent draws of pairs kept at t, so their errors are Binomial(n_t, R(t)) and the one-sided Clopper-Pearson
bound at level 1 - delta covers R(t). Thresholds are tested from the highest down on a grid fixed in advance
(fixed-sequence testing, as Learn-then-Test (Angelopoulos et al. 2021) tests a monotone family): each has its
hypothesis "R(t) > alpha" rejected while the bound stays at or under alpha, and the lowest threshold reached before
the first failure is kept (none when the first fails: every pair is abstained). This is
calibration.conformal.escalation_threshold, the mechanism of trust-or-escalate, with agreement = 1 - alpha.

What is guaranteed: with probability at least 1 - delta over the draw of the labelled pairs, the error rate among
the kept verdicts of new pairs drawn like them is at most alpha (a bound on the population's selective risk,
conditional on the calibration set being a good one). Conformal risk control (Angelopoulos et al. 2022) would
instead bound an expectation over calibration draws, and of a loss monotone in the threshold: the error among
kept pairs (a ratio) is neither, so it controls only error-and-kept, a joint rate that says less to a user who
reads kept verdicts. SCOPE's guarantee (Badshah et al. 2026) is in expectation; ours holds for all but a delta
share of calibration sets, so it keeps fewer pairs at the same alpha.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel
from sklearn.model_selection import KFold

from mmjudge.calibration.conformal import ESCALATION_ERROR_RATE, MIN_TRUSTED, EscalationFit, escalation_threshold

# The risk levels the report shows coverage and error at, beside the user's --max_error.
REPORTED_ALPHAS = (0.05, 0.1, 0.15, 0.2, 0.3)
SELECTIVE_ERROR_RATE = ESCALATION_ERROR_RATE  # delta: one kind of guarantee in every report
CURVE_POINTS = 50


def fit(confidence: np.ndarray, correct: np.ndarray, alpha: float, delta: float = SELECTIVE_ERROR_RATE) -> EscalationFit:
    """The lowest threshold whose kept verdicts' error rate is at most alpha with probability 1 - delta."""
    return escalation_threshold(np.asarray(confidence, dtype=float), np.asarray(correct, dtype=bool), 1 - alpha, delta)


def kept(confidence: np.ndarray, threshold: float | None) -> np.ndarray:
    return np.zeros(len(confidence), dtype=bool) if threshold is None else np.asarray(confidence) >= threshold


class AlphaPoint(BaseModel):
    """At one risk level alpha: the threshold fitted on every labelled pair, and the coverage (share kept) and
    error among kept pairs of thresholds fitted on K - 1 folds and applied to the held-out one, pooled."""

    alpha: float
    threshold: float | None
    kept: int  # labelled pairs at or above it
    error_kept: float | None  # their error rate (in-sample)
    error_upper_bound: float | None  # the Clopper-Pearson bound the threshold passed
    held_out_coverage: float | None
    held_out_error: float | None  # among the held-out pairs kept; None where none was kept


class SelectiveReport(BaseModel):
    uncertainty: str
    n: int  # labelled pairs with a verdict and a distribution
    delta: float
    min_kept: int
    folds: int
    max_error: float  # the user's alpha: the threshold calibrator.json holds
    points: list[AlphaPoint]  # REPORTED_ALPHAS and max_error, ascending
    curve: list[tuple[float, float]]  # (coverage, error among kept) of the most confident pairs, thresholds at every quantile
    error_all: float  # error if every pair were kept
    reason: str | None = None  # why no threshold can be tested


def held_out(confidence: np.ndarray, correct: np.ndarray, alpha: float, delta: float, folds: int, seed: int) -> tuple[float | None, float | None]:
    """(coverage, error among kept) of thresholds fitted out of fold, pooled over the folds."""
    if len(confidence) < 2 * folds:
        return None, None
    keep = np.zeros(len(confidence), dtype=bool)
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(confidence):
        keep[test] = kept(confidence[test], fit(confidence[train], correct[train], alpha, delta).threshold)
    return float(keep.mean()), (float(1 - correct[keep].mean()) if keep.any() else None)


def risk_coverage_curve(confidence: np.ndarray, correct: np.ndarray) -> list[tuple[float, float]]:
    """Coverage and error among kept pairs as the threshold falls from the most confident pair to the least."""
    order = np.argsort(-confidence, kind="stable")
    wrong = np.cumsum(~correct[order])
    counts = np.unique(np.linspace(1, len(order), min(CURVE_POINTS, len(order))).round().astype(int))
    return [(float(k / len(order)), float(wrong[k - 1] / k)) for k in counts]


def report(confidence: np.ndarray, correct: np.ndarray, uncertainty: str, max_error: float, folds: int, seed: int,
           delta: float = SELECTIVE_ERROR_RATE) -> SelectiveReport:
    confidence, correct = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=bool)
    points = []
    for alpha in sorted({*REPORTED_ALPHAS, max_error}):
        f = fit(confidence, correct, alpha, delta)
        coverage, error = held_out(confidence, correct, alpha, delta, folds, seed)
        points.append(AlphaPoint(alpha=alpha, threshold=f.threshold, kept=f.trusted,
                                 error_kept=None if f.trusted_agreement is None else 1 - f.trusted_agreement,
                                 error_upper_bound=None if f.agreement_lower_bound is None else 1 - f.agreement_lower_bound,
                                 held_out_coverage=coverage, held_out_error=error))
    reason = None if len(confidence) >= MIN_TRUSTED else (
        f"{len(confidence)} labelled pairs with a verdict distribution; a threshold is tested only with {MIN_TRUSTED} or more kept"
        + ("; no calibrator is written for this judge" if not len(confidence) else ""))
    return SelectiveReport(uncertainty=uncertainty, n=len(confidence), delta=delta, min_kept=MIN_TRUSTED, folds=folds, max_error=max_error,
                           points=points, curve=risk_coverage_curve(confidence, correct) if len(confidence) else [],
                           error_all=float(1 - correct.mean()) if len(correct) else 0.0, reason=reason)
