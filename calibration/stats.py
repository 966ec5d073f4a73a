"""Agreement statistics between a judge and people. Pure numpy/scipy; no torch.

Every statistic is a `Stat`: a value, or no value and the reason it is undefined (too few pairs, a
constant side), so reports never carry a silent NaN and a degenerate judge never crashes a run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

Z95 = 1.959963984540054  # two-sided 95% normal quantile


@dataclass(frozen=True)
class Stat:
    value: float | None
    reason: str | None = None  # why value is None
    low: float | None = None  # 95% interval, where one is computed
    high: float | None = None
    boot_low: float | None = None
    boot_high: float | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k == "value"}


def undefined(reason: str) -> Stat:
    return Stat(None, reason)


def _degenerate(x: np.ndarray, y: np.ndarray, min_n: int = 3) -> str | None:
    if len(x) < min_n:
        return f"n = {len(x)} < {min_n}"
    if np.ptp(x) == 0:
        return "the judge's scores are constant"
    if np.ptp(y) == 0:
        return "the human scores are constant"
    return None


def pearson(x: np.ndarray, y: np.ndarray, bootstrap: int = 0, seed: int = 0) -> Stat:
    """Pearson r with a Fisher-z 95% interval and, if asked, a percentile bootstrap interval."""
    if reason := _degenerate(x, y):
        return undefined(reason)
    r = float(np.corrcoef(x, y)[0, 1])
    low = high = None
    if len(x) > 3:
        z, se = np.arctanh(np.clip(r, -0.999999, 0.999999)), 1 / np.sqrt(len(x) - 3)
        low, high = float(np.tanh(z - Z95 * se)), float(np.tanh(z + Z95 * se))
    boot_low, boot_high = bootstrap_pearson(x, y, bootstrap, seed) if bootstrap else (None, None)
    return Stat(r, None, low, high, boot_low, boot_high)


def bootstrap_pearson(x: np.ndarray, y: np.ndarray, resamples: int, seed: int) -> tuple[float | None, float | None]:
    """Percentile interval of r over resampled pairs, all resamples at once (vectorised)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(resamples, len(x)))
    xs, ys = x[idx], y[idx]
    xc, yc = xs - xs.mean(1, keepdims=True), ys - ys.mean(1, keepdims=True)
    denom = np.sqrt((xc**2).sum(1) * (yc**2).sum(1))
    valid = denom > 0  # a resample can draw one value only
    if valid.sum() < resamples / 2:
        return None, None
    r = (xc * yc).sum(1)[valid] / denom[valid]
    return float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def spearman(x, y) -> Stat:
    if reason := _degenerate(x, y):
        return undefined(reason)
    return Stat(float(sps.spearmanr(x, y).statistic))


def kendall(x, y) -> Stat:
    """Kendall's tau-b (corrects for ties, which integer scales have many of)."""
    if reason := _degenerate(x, y):
        return undefined(reason)
    return Stat(float(sps.kendalltau(x, y, variant="b").statistic))


def cosine(x, y) -> Stat:
    """As MMIE reports it: the cosine of the raw score vectors. Note that it is not a correlation: it is
    high whenever both sides are positive numbers of similar size, and a constant offset barely moves it."""
    norm = np.linalg.norm(x) * np.linalg.norm(y)
    if len(x) == 0 or norm == 0:
        return undefined("a zero score vector")
    return Stat(float(np.dot(x, y) / norm))


def quadratic_kappa(x, y, scale: tuple[int, int]) -> Stat:
    """Cohen's kappa with quadratic weights on the integer scale (scores rounded)."""
    if len(x) < 3:
        return undefined(f"n = {len(x)} < 3")
    low, high = scale
    k = high - low + 1
    a, b = np.clip(np.rint(x), low, high).astype(int) - low, np.clip(np.rint(y), low, high).astype(int) - low
    observed = np.zeros((k, k))
    np.add.at(observed, (a, b), 1)
    expected = np.outer(observed.sum(1), observed.sum(0)) / len(a)
    weights = (np.arange(k)[:, None] - np.arange(k)[None, :]) ** 2 / (k - 1) ** 2
    denom = (weights * expected).sum()
    if denom == 0:
        return undefined("no disagreement is possible (one value on each side)")
    return Stat(float(1 - (weights * observed).sum() / denom))


def krippendorff_alpha(reliability: np.ndarray, level: str) -> Stat:
    """Krippendorff's alpha for a coders x units matrix (NaN = missing), interval or ordinal metric.

    Built from the coincidence matrix of pairable values, as in Krippendorff (2011)."""
    values = np.unique(reliability[~np.isnan(reliability)])
    if len(values) < 2:
        return undefined("fewer than two distinct values")
    index = {v: i for i, v in enumerate(values)}
    coincidence = np.zeros((len(values), len(values)))
    for unit in reliability.T:
        present = unit[~np.isnan(unit)]
        if len(present) < 2:
            continue
        codes = np.array([index[v] for v in present])
        counts = np.bincount(codes, minlength=len(values))
        coincidence += (np.outer(counts, counts) - np.diag(counts)) / (len(present) - 1)
    totals = coincidence.sum(1)
    n = totals.sum()
    if n == 0:
        return undefined("no unit has two ratings")
    if level == "interval":
        delta = (values[:, None] - values[None, :]) ** 2
    elif level == "ordinal":
        cum = np.cumsum(totals)
        between = cum[None, :] - cum[:, None] + totals[:, None] / 2 - totals[None, :] / 2  # sum from c..k minus halves
        delta = np.where(np.arange(len(values))[:, None] <= np.arange(len(values))[None, :], between, between.T) ** 2
    else:
        raise ValueError(f"unknown level {level!r}")
    observed = (coincidence * delta).sum()
    expected = (np.outer(totals, totals) * delta).sum() / (n - 1)
    if expected == 0:
        return undefined("no expected disagreement")
    return Stat(float(1 - observed / expected))


def agreement_table(judge, human, scale: tuple[int, int] = (0, 6), bootstrap: int = 0, seed: int = 0) -> dict[str, Stat]:
    """Every pairwise statistic for one judge x criterion x group."""
    x, y = np.asarray(judge, dtype=float), np.asarray(human, dtype=float)
    n = len(x)
    error = x - y
    table = {
        "n": Stat(float(n)),
        "pearson": pearson(x, y, bootstrap, seed),
        "spearman": spearman(x, y),
        "kendall_tau_b": kendall(x, y),
        "mse": Stat(float(np.mean(error**2))) if n else undefined("n = 0"),
        "rmse": Stat(float(np.sqrt(np.mean(error**2)))) if n else undefined("n = 0"),
        "mae": Stat(float(np.mean(np.abs(error)))) if n else undefined("n = 0"),
        "cosine": cosine(x, y),
        "exact_agreement": Stat(float(np.mean(np.rint(x) == np.rint(y)))) if n else undefined("n = 0"),
        "within_1_agreement": Stat(float(np.mean(np.abs(np.rint(x) - np.rint(y)) <= 1))) if n else undefined("n = 0"),
        "quadratic_kappa": quadratic_kappa(x, y, scale),
    }
    pairs = np.vstack([x, y])
    for level in ("interval", "ordinal"):
        table[f"krippendorff_{level}"] = krippendorff_alpha(pairs, level) if n >= 3 else undefined(f"n = {n} < 3")
    return table


def collapse_warning(scores, scale: tuple[int, int], min_std: float = 0.1, max_share: float = 0.8) -> str | None:
    """A judge that gives (nearly) everyone the same score measures nothing: say so."""
    x = np.asarray(scores, dtype=float)
    if len(x) == 0:
        return None
    if x.std() < min_std:
        return f"score collapse: standard deviation {x.std():.3f} < {min_std}"
    values, counts = np.unique(np.rint(x), return_counts=True)
    share = counts.max() / len(x)
    if share > max_share:
        return f"score collapse: {share:.0%} of scores are {values[counts.argmax()]:g}"
    return None
