"""Monotone maps from the judge's scale to the human scale, and how much they help on held-out data.

Cross-fitting: the pairs are split into K folds; each fold is calibrated by a map fitted on the other
K-1, so the "after" errors are measured on data the map never saw. The map saved for judge-score is
then fitted on all pairs.
"""

from __future__ import annotations

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.model_selection import KFold

from judge.calibrator import Calibrator


def fit_map(x: np.ndarray, y: np.ndarray, method: str, scale: tuple[float, float]) -> tuple[list[float], list[float]]:
    """Knots (x, y) of a non-decreasing piecewise-linear map."""
    low, high = scale
    if method == "isotonic":
        iso = IsotonicRegression(y_min=low, y_max=high, out_of_bounds="clip").fit(x, y)
        xs, ys = list(map(float, iso.X_thresholds_)), list(map(float, iso.y_thresholds_))
        if len(xs) == 1:  # one distinct judge score: a flat map
            xs, ys = [xs[0], xs[0] + 1], [ys[0], ys[0]]
        return xs, ys
    if method == "linear":
        slope, intercept = np.polyfit(x, y, 1) if np.ptp(x) > 0 else (0.0, float(np.mean(y)))
        slope = max(float(slope), 0.0)  # a decreasing map would invert the judge: keep it monotone
        if slope == 0.0:
            intercept = float(np.mean(y))
        ends = [float(low), float(high)]
        return ends, [float(np.clip(intercept + slope * e, low, high)) for e in ends]
    raise ValueError(f"unknown fit {method!r}")


def apply_map(knots: tuple[list[float], list[float]], x: np.ndarray, scale) -> np.ndarray:
    return np.clip(np.interp(x, *knots), *scale)


def cross_fit(x: np.ndarray, y: np.ndarray, method: str, folds: int, seed: int, scale) -> dict:
    """Held-out MSE/MAE before and after calibration, and the held-out calibrated scores."""
    if len(x) < 2 * folds:
        return {"undefined": f"n = {len(x)} is too small for {folds} folds (need {2 * folds})"}
    calibrated = np.empty_like(y)
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(x):
        calibrated[test] = apply_map(fit_map(x[train], y[train], method, scale), x[test], scale)
    return {
        "method": method,
        "folds": folds,
        "mse_before": float(np.mean((x - y) ** 2)),
        "mae_before": float(np.mean(np.abs(x - y))),
        "mse_after": float(np.mean((calibrated - y) ** 2)),
        "mae_after": float(np.mean(np.abs(calibrated - y))),
        "calibrated": calibrated,
    }


def reliability(judge: np.ndarray, human: np.ndarray) -> list[dict]:
    """Mean human score at each (rounded) judge score level."""
    levels = np.rint(judge)
    return [{"judge_level": float(v), "n": int((levels == v).sum()), "mean_human": float(human[levels == v].mean())} for v in np.unique(levels)]


def calibrator(x: np.ndarray, y: np.ndarray, method: str, source: str, criterion: str, scale) -> Calibrator:
    xs, ys = fit_map(x, y, method, scale)
    return Calibrator(method=method, source=source, criterion=criterion, x=xs, y=ys, scale=tuple(scale), fitted_on={"n": int(len(x))})
