"""Monotone maps from the judge's scale to the human scale, and how much they help on held-out data.

Cross-fitting: the pairs are split into K folds; each fold is calibrated by a map fitted on the other
K-1, so the "after" errors are measured on pairs the map never saw. The map saved for judge-score is
then fitted on all pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel
from sklearn.isotonic import IsotonicRegression
from sklearn.model_selection import KFold

from mmjudge.judge.parsing import ScoreScale

Knots = tuple[list[float], list[float]]


def fit_map(x: np.ndarray, y: np.ndarray, method: str, scale: tuple[float, float]) -> Knots:
    """Knots (x, y) of a non-decreasing piecewise-linear map, flat beyond its ends."""
    low, high = scale
    if method == "isotonic":
        iso = IsotonicRegression(y_min=low, y_max=high, out_of_bounds="clip").fit(x, y)
        xs, ys = [float(v) for v in iso.X_thresholds_], [float(v) for v in iso.y_thresholds_]
        if len(xs) == 1:  # one distinct judge score: a flat map
            xs, ys = [xs[0], xs[0] + 1], [ys[0], ys[0]]
        return xs, ys
    if method == "linear":
        slope, intercept = np.polyfit(x, y, 1) if np.ptp(x) > 0 else (0.0, float(np.mean(y)))
        if slope < 0:  # a decreasing map would invert the judge's order: the best monotone line is flat
            slope, intercept = 0.0, float(np.mean(y))
        ends = [float(low), float(high)]
        return ends, [float(np.clip(intercept + slope * e, low, high)) for e in ends]
    raise ValueError(f"unknown fit {method!r}")


def apply_map(knots: Knots, x: np.ndarray, scale: tuple[float, float]) -> np.ndarray:
    return np.clip(np.interp(x, *knots), *scale)


@dataclass
class CrossFit:
    calibrated: np.ndarray | None  # each pair's score mapped by the map fitted without its fold
    reason: str | None = None  # why there is none


def cross_fit(x: np.ndarray, y: np.ndarray, method: str, folds: int, seed: int, scale) -> CrossFit:
    if len(x) < 2 * folds:
        return CrossFit(None, f"n = {len(x)} is too small for {folds} folds (need {2 * folds})")
    calibrated = np.empty_like(y)
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(x):
        calibrated[test] = apply_map(fit_map(x[train], y[train], method, scale), x[test], scale)
    return CrossFit(calibrated)


class Level(BaseModel):
    judge_level: float
    n: int
    mean_human: float


def reliability(judge: np.ndarray, human: np.ndarray, scale: ScoreScale = ScoreScale()) -> list[Level]:
    """Mean human score at each level of the judge's scores (each at its nearest level)."""
    indices = scale.index(judge)
    return [Level(judge_level=scale.levels[k], n=int((indices == k).sum()), mean_human=float(human[indices == k].mean()))
            for k in np.unique(indices)]
