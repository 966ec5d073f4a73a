"""Guarantees from held-out human scores on the judge's score distribution. Pure numpy/scipy; no torch.

Conformal score sets (split conformal prediction): each labelled record's nonconformity is the judge's
probability already in its set when the human level joins it (mmjudge.judge.calibrator.mass_before, the order
judge-score applies). With n such values, the ceil((n + 1) * coverage)-th smallest is the threshold: a new
record, exchangeable with the labelled ones, has its human level in its set with probability at least
`coverage` (Vovk et al. 2005; Angelopoulos & Bates 2021, "A gentle introduction to conformal prediction").

Escalation ("trust or escalate", Jung et al., ICLR 2025): the judge's confidence in a record is its
probability of the levels that agree with its written score (that level, or it and its neighbours). Among
the labelled records at or above a confidence threshold, the disagreement rate has a one-sided
Clopper-Pearson upper bound at level 1 - error_rate. Thresholds are tested from the highest down (fixed-
sequence testing), each that has at least MIN_TRUSTED labelled records at or above it, as the authors' code
does; the lowest threshold reached before the first whose bound exceeds 1 - target_agreement is kept, and
none when the first fails (their code then keeps the first, without the guarantee). With
probability at least 1 - error_rate over the labels, the judge agrees with people at least at the target
rate on the records it keeps.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel
from scipy import stats as sps
from sklearn.model_selection import KFold

from mmjudge.judge.calibrator import agreement_confidence, mass_before

# The guarantee holds with probability 1 - this over the human labels: Jung et al.'s choice, and a constant
# rather than a flag, so that every report states the same kind of guarantee.
ESCALATION_ERROR_RATE = 0.1
MIN_TRUSTED = 30  # labelled records above a threshold before it is tested (Jung et al.'s code uses 30)
# The thresholds tested, from the highest down: a grid of [0, 1] fixed in advance, as fine as the authors'. A
# sequence through every distinct confidence would start on the 30 records the judge is surest of, and a
# judge overconfident there (their Mistral-7B) would stop at once where the grid reaches 57 and passes.
THRESHOLDS = np.linspace(1, 0, 5000)
AGREEMENT_WITHIN = {"exact": 0, "within_1": 1}  # levels apart that still agree


def conformal_threshold(nonconformity: np.ndarray, coverage: float) -> float:
    """The ceil((n + 1) * coverage)-th smallest value; 1 (every level) when n is too small for it."""
    n = len(nonconformity)
    rank = math.ceil((n + 1) * coverage)
    return 1.0 if rank > n else float(np.sort(nonconformity)[rank - 1])


def set_sizes(before: np.ndarray, threshold: float) -> np.ndarray:
    return np.full(len(before), before.shape[1]) if threshold >= 1 else (before <= threshold).sum(1)


class HeldOutSets(BaseModel):
    """Score sets fitted on K - 1 folds and measured on the remaining one, pooled over the folds."""

    n: int
    folds: int
    coverage: float  # share of records whose human level is in their set
    mean_size: float  # mean number of levels in a set


def held_out_sets(probabilities: np.ndarray, human_levels: np.ndarray, coverage: float, folds: int, seed: int) -> HeldOutSets | None:
    """None when there are too few records for the folds (as the calibration map's cross-fit)."""
    if len(human_levels) < 2 * folds:
        return None
    before = mass_before(probabilities)
    nonconformity = before[np.arange(len(before)), human_levels]
    covered, sizes = np.empty(len(before), dtype=bool), np.empty(len(before))
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(before):
        threshold = conformal_threshold(nonconformity[train], coverage)
        covered[test] = nonconformity[test] <= threshold
        sizes[test] = set_sizes(before[test], threshold)
    return HeldOutSets(n=len(before), folds=folds, coverage=float(covered.mean()), mean_size=float(sizes.mean()))


def fitted_threshold(probabilities: np.ndarray, human_levels: np.ndarray, coverage: float) -> float:
    before = mass_before(probabilities)
    return conformal_threshold(before[np.arange(len(before)), human_levels], coverage)


def disagreement_upper_bound(disagreements, n, error_rate: float):
    """One-sided Clopper-Pearson upper bound of a binomial rate, at level 1 - error_rate (elementwise)."""
    wrong, n = np.asarray(disagreements), np.asarray(n)
    with np.errstate(invalid="ignore"):  # every one wrong: beta(n + 1, 0) is undefined; the bound is 1
        return np.where(wrong >= n, 1.0, sps.beta.ppf(1 - error_rate, wrong + 1, np.maximum(n - wrong, 1)))


class EscalationFit(BaseModel):
    threshold: float | None  # None: no threshold met the target; every record goes to people
    n: int
    trusted: int  # labelled records at or above the threshold
    trusted_agreement: float | None  # their agreement with people
    agreement_lower_bound: float | None  # 1 - the Clopper-Pearson bound of their disagreement


def escalation_threshold(confidence: np.ndarray, agrees: np.ndarray, target_agreement: float, error_rate: float) -> EscalationFit:
    """Fixed-sequence testing down THRESHOLDS (module docstring)."""
    order = np.argsort(-confidence, kind="stable")
    descending, wrong = confidence[order], np.cumsum(~agrees[order])
    trusted = len(confidence) - np.searchsorted(descending[::-1], THRESHOLDS, side="left")  # records at or above each
    tested = trusted >= MIN_TRUSTED
    thresholds, trusted = THRESHOLDS[tested], trusted[tested]
    bounds = disagreement_upper_bound(wrong[trusted - 1], trusted, error_rate)
    passed = np.cumprod(bounds <= 1 - target_agreement).astype(bool)  # stop at the first that fails
    if not passed.any():
        return EscalationFit(threshold=None, n=len(confidence), trusted=0, trusted_agreement=None, agreement_lower_bound=None)
    k = np.flatnonzero(passed)[-1]
    return EscalationFit(threshold=float(thresholds[k]), n=len(confidence), trusted=int(trusted[k]),
                         trusted_agreement=float(1 - wrong[trusted[k] - 1] / trusted[k]), agreement_lower_bound=float(1 - bounds[k]))


def written_agreement(probabilities: np.ndarray, written_levels: np.ndarray, human_levels: np.ndarray, agreement: str) -> tuple[np.ndarray, np.ndarray]:
    """Each record's confidence in its written level, and whether that level agrees with the human one."""
    within = AGREEMENT_WITHIN[agreement]
    return agreement_confidence(probabilities, written_levels, within), np.abs(written_levels - human_levels) <= within
