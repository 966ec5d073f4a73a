"""Agreement statistics between a judge and people. Pure numpy/scipy; no torch.

Every statistic is a `Stat`: a value, or no value and the reason it is undefined (too few pairs, a
constant side), so reports never carry a silent NaN and a degenerate judge never crashes a run.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator
from scipy import stats as sps

from mmjudge.judge.parsing import COLLAPSE_SHARE, ScoreScale

Z95 = 1.959963984540054  # two-sided 95% normal quantile
# Score collapse, a warning in the report that changes no statistic. Constants rather than flags: they
# mark a judge that cannot rank answers on any data, and a reader who doubts a verdict has the histogram.
COLLAPSE_MIN_STD_STEPS = 0.1  # standard deviation under a tenth of a step: the scores barely leave one level
# Resamples drawn per numpy call: bounds memory at about 2M drawn ids whatever n is (MMIE has 20k samples).
BOOTSTRAP_CELLS = 2_000_000


class Interval(BaseModel):
    """A 95% interval, or none and the reason."""

    model_config = ConfigDict(frozen=True)
    low: float | None
    high: float | None
    reason: str | None = None


class Stat(BaseModel):
    model_config = ConfigDict(frozen=True)
    value: float | None
    reason: str | None = None  # why value is None
    fisher_95: Interval | None = None  # Pearson only
    bootstrap_95: Interval | None = None  # Pearson only, when --bootstrap > 0

    @model_validator(mode="after")
    def _finite_or_explained(self) -> Stat:
        # A NaN reaching here is a bug in a statistic's degeneracy checks: fail loudly, never write it.
        if self.value is not None and not math.isfinite(self.value):
            raise ValueError(f"non-finite statistic {self.value}")
        if self.value is None and not self.reason:
            raise ValueError("an undefined statistic needs a reason")
        return self


def undefined(reason: str) -> Stat:
    return Stat(value=None, reason=reason)


# What a correlation's two sides are, for the reason it is undefined: a judge's scores against people's, unless
# its caller says otherwise (the bias diagnostics correlate a feature of the answers with the residual).
SCORES = ("the judge's scores", "the human scores")


def _degenerate(x: np.ndarray, y: np.ndarray, sides: tuple[str, str], min_n: int = 3) -> str | None:
    if len(x) < min_n:
        return f"n = {len(x)} < {min_n}"
    for values, side in zip((x, y), sides):
        if np.ptp(values) == 0:
            return f"{side} are constant"
    return None


def fisher_interval(r: float, n: int) -> Interval:
    if n <= 3:
        return Interval(low=None, high=None, reason=f"Fisher z needs n > 3, got {n}")
    if abs(r) == 1:  # arctanh is infinite: a perfect correlation has a point interval
        return Interval(low=r, high=r)
    z, se = math.atanh(r), 1 / math.sqrt(n - 3)
    return Interval(low=math.tanh(z - Z95 * se), high=math.tanh(z + Z95 * se))


def bootstrap_interval(x: np.ndarray, y: np.ndarray, resamples: int, seed: int) -> Interval:
    """Percentile interval of r over resampled pairs; resamples are drawn as whole matrices (vectorised)."""
    rng = np.random.default_rng(seed)
    n = len(x)
    chunk = max(1, BOOTSTRAP_CELLS // n)
    rs = []
    for start in range(0, resamples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        xs, ys = x[idx], y[idx]
        xc, yc = xs - xs.mean(1, keepdims=True), ys - ys.mean(1, keepdims=True)
        denom = np.sqrt((xc**2).sum(1) * (yc**2).sum(1))
        valid = denom > 0  # a resample of few distinct pairs can have a constant side: r is undefined there
        rs.append((xc * yc).sum(1)[valid] / denom[valid])
    r = np.concatenate(rs)
    if len(r) < resamples / 2:
        return Interval(low=None, high=None, reason=f"only {len(r)} of {resamples} resamples had both sides non-constant")
    return Interval(low=float(np.percentile(r, 2.5)), high=float(np.percentile(r, 97.5)))


def pearson(x: np.ndarray, y: np.ndarray, bootstrap: int = 0, seed: int = 0, sides: tuple[str, str] = SCORES) -> Stat:
    """Pearson r with a Fisher-z 95% interval and, when asked, a percentile bootstrap interval."""
    if reason := _degenerate(x, y, sides):
        return undefined(reason)
    r = float(np.clip(np.corrcoef(x, y)[0, 1], -1, 1))
    boot = bootstrap_interval(x, y, bootstrap, seed) if bootstrap else None
    return Stat(value=r, fisher_95=fisher_interval(r, len(x)), bootstrap_95=boot)


def spearman(x: np.ndarray, y: np.ndarray, sides: tuple[str, str] = SCORES) -> Stat:
    if reason := _degenerate(x, y, sides):
        return undefined(reason)
    return Stat(value=float(sps.spearmanr(x, y).statistic))


def kendall(x: np.ndarray, y: np.ndarray, sides: tuple[str, str] = SCORES) -> Stat:
    """Kendall's tau-b, which corrects for ties (an integer scale has many)."""
    if reason := _degenerate(x, y, sides):
        return undefined(reason)
    return Stat(value=float(sps.kendalltau(x, y, variant="b").statistic))


def cosine(x: np.ndarray, y: np.ndarray) -> Stat:
    """As MMIE reports it: the cosine of the raw score vectors. It is not a correlation: vectors of
    positive scores point roughly the same way whatever their agreement (scores drawn at random on 0-6
    give about 0.7; MMIE quotes 0.733 for GPT-4o at Pearson 0.042), and a judge one point too harsh on
    every sample still scores about 0.99, so it barely sees a constant offset."""
    norm = float(np.linalg.norm(x) * np.linalg.norm(y))
    if len(x) == 0:
        return undefined("no pairs")
    if norm == 0:
        return undefined("a side is all zeros")
    return Stat(value=float(np.dot(x, y) / norm))


def mean_error(x: np.ndarray, y: np.ndarray, kind: str) -> Stat:
    if len(x) == 0:
        return undefined("no pairs")
    error = x - y
    value = {"mse": np.mean(error**2), "rmse": np.sqrt(np.mean(error**2)), "mae": np.mean(np.abs(error))}[kind]
    return Stat(value=float(value))


def agreement_rate(x: np.ndarray, y: np.ndarray, scale: ScoreScale, within: int) -> Stat:
    """Share of pairs whose nearest levels are at most `within` steps apart."""
    if len(x) == 0:
        return undefined("no pairs")
    return Stat(value=float(np.mean(np.abs(scale.index(x) - scale.index(y)) <= within)))


def quadratic_kappa(x: np.ndarray, y: np.ndarray, scale: ScoreScale) -> Stat:
    """Cohen's kappa with quadratic weights over every level of the scale (each score at its nearest level)."""
    if len(x) < 3:
        return undefined(f"n = {len(x)} < 3")
    k = scale.n_levels
    a, b = scale.index(x), scale.index(y)
    observed = np.zeros((k, k))
    np.add.at(observed, (a, b), 1)
    expected = np.outer(observed.sum(1), observed.sum(0)) / len(a)
    weights = (np.arange(k)[:, None] - np.arange(k)[None, :]) ** 2 / (k - 1) ** 2
    denom = (weights * expected).sum()
    if denom == 0:
        return undefined("no disagreement is expected by chance (a side uses one level only)")
    return Stat(value=float(1 - (weights * observed).sum() / denom))


def krippendorff_alpha(reliability: np.ndarray, level: str) -> Stat:
    """Krippendorff's alpha of a coders x units matrix (NaN = not rated), interval or ordinal metric
    (Krippendorff 2011, "Computing Krippendorff's Alpha-Reliability").

    Computed from sums over the pairable values (those of units rated at least twice), not from a
    values x values coincidence matrix: that matrix has a row per distinct value, and continuous scores
    (expected scores, a judge's 0.33) have nearly as many distinct values as pairs, which made 2,000
    pairs take half a minute and 20,000 need gigabytes. The ordinal metric's distance between values c
    and k, (n_c/2 + n_(c+1) + ... + n_(k-1) + n_k/2)^2, is the squared difference of their mid-ranks
    among the pairable values, so ordinal alpha is interval alpha on mid-ranks."""
    if level not in ("interval", "ordinal"):
        raise ValueError(f"unknown level {level!r}")
    rated = ~np.isnan(reliability)
    pairable = reliability[:, rated.sum(0) >= 2]  # a value nobody else rated in its unit cannot be paired
    if pairable.shape[1] == 0:
        return undefined("no unit was rated twice")
    present = ~np.isnan(pairable)
    if len(np.unique(pairable[present])) < 2:
        return undefined("fewer than two distinct values in the units rated twice or more")
    if level == "ordinal":
        pairable = pairable.copy()
        pairable[present] = sps.rankdata(pairable[present])  # average ranks: mid-ranks of tied values
    m = present.sum(0)
    n = m.sum()
    # Observed: per unit, the squared differences of its ordered pairs, 2 m sum((v - unit mean)^2), over m - 1.
    within = np.nansum((pairable - np.nanmean(pairable, 0)) ** 2, 0)
    observed = (2 * m * within / (m - 1)).sum() / n
    # Expected: the same over every ordered pair of pairable values, whatever their unit.
    values = pairable[present]
    expected = 2 * ((values - values.mean()) ** 2).sum() / (n - 1)
    return Stat(value=float(1 - observed / expected))


Agreement = dict[str, Stat]  # statistic name -> Stat, in agreement_table's order


def agreement_table(judge, human, scale: ScoreScale, bootstrap: int = 0, seed: int = 0) -> Agreement:
    """Every pairwise statistic of one judge x criterion x group (or of one annotator vs the others)."""
    x, y = np.asarray(judge, dtype=float), np.asarray(human, dtype=float)
    pairs = np.vstack([x, y])  # two "coders" for Krippendorff: the judge and the human reference
    return {
        "n": Stat(value=len(x)),
        "pearson": pearson(x, y, bootstrap, seed),
        "spearman": spearman(x, y),
        "kendall_tau_b": kendall(x, y),
        "mse": mean_error(x, y, "mse"),
        "rmse": mean_error(x, y, "rmse"),
        "mae": mean_error(x, y, "mae"),
        "cosine": cosine(x, y),
        "exact_agreement": agreement_rate(x, y, scale, 0),
        "within_1_agreement": agreement_rate(x, y, scale, 1),  # one step
        "quadratic_kappa": quadratic_kappa(x, y, scale),
        "krippendorff_interval": krippendorff_alpha(pairs, "interval") if len(x) >= 3 else undefined(f"n = {len(x)} < 3"),
        "krippendorff_ordinal": krippendorff_alpha(pairs, "ordinal") if len(x) >= 3 else undefined(f"n = {len(x)} < 3"),
    }


def correlation_ratio(values: np.ndarray, groups: list[str]) -> Stat:
    """Eta: how much of a numeric variable's spread the groups explain (0 = none, 1 = all); the
    correlation of a number with a category."""
    labels = sorted(set(groups))
    if len(labels) < 2:
        return undefined(f"{len(labels)} group(s); need 2")
    total = ((values - values.mean()) ** 2).sum()
    if total == 0:
        return undefined("the values are constant")
    members = np.array(groups)
    between = sum((members == g).sum() * (values[members == g].mean() - values.mean()) ** 2 for g in labels)
    return Stat(value=float(math.sqrt(between / total)))


def collapse_warning(scores, scale: ScoreScale = ScoreScale()) -> str | None:
    """A judge that gives (nearly) everyone the same score measures nothing: say so, by the thresholds
    COLLAPSE_MIN_STD_STEPS and COLLAPSE_SHARE."""
    x = np.asarray(scores, dtype=float)
    if len(x) == 0:
        return None
    min_std = COLLAPSE_MIN_STD_STEPS * scale.step
    if x.std() < min_std:
        return f"score collapse: standard deviation {x.std():.3f} < {min_std:g}"
    indices, counts = np.unique(scale.index(x), return_counts=True)
    share = counts.max() / len(x)
    if share > COLLAPSE_SHARE:
        return f"score collapse: {share:.0%} of scores are {scale.levels[indices[counts.argmax()]]:g}"
    return None
