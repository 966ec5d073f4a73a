"""The score scale judge-calibrate compares on: the levels LOW, LOW + STEP, ..., HIGH.

MMIE's judges score whole numbers 0-6 (step 1); Inst-It's GPT-4o judge scores 0-1 in steps of 0.1.
Everything that counts levels (exact and within-one-step agreement, quadratic kappa, histograms, the
confusion matrix, reliability levels, collapse) snaps each value to its nearest level first; the
statistics of values (correlations, errors, cosine, Krippendorff's interval alpha) never do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Float error of a step count (0.7 / 0.1 = 6.999999999999999) is far below this; a real half-step is not.
_DECIMALS = 9


@dataclass(frozen=True)
class Scale:
    """LOW, LOW + STEP, ..., HIGH; `Scale()` is MMIE's 0-6 in whole numbers, judge-calibrate's default."""

    low: float = 0
    high: float = 6
    step: float = 1

    def __post_init__(self):
        if not all(math.isfinite(v) for v in (self.low, self.high, self.step)):
            raise ValueError(f"LOW, HIGH and STEP must be finite numbers, got {self.low:g} {self.high:g} {self.step:g}")
        if not self.low < self.high:
            raise ValueError(f"the scale needs LOW < HIGH, got {self.low:g} {self.high:g}")
        if not self.step > 0:
            raise ValueError(f"the step must be positive, got {self.step:g}")
        steps = (self.high - self.low) / self.step
        if abs(steps - round(steps)) > 10**-_DECIMALS:
            raise ValueError(f"step {self.step:g} does not divide {self.low:g}-{self.high:g} into whole steps "
                             f"((HIGH - LOW) / STEP = {steps:.4g})")

    @property
    def bounds(self) -> tuple[float, float]:
        return float(self.low), float(self.high)

    @property
    def n_levels(self) -> int:
        return round((self.high - self.low) / self.step) + 1

    @property
    def levels(self) -> list[float]:
        # Rounded so that 7 steps of 0.1 read 0.7, not 0.7000000000000001, in the report and on the axes.
        return [round(self.low + k * self.step, _DECIMALS) for k in range(self.n_levels)]

    def index(self, values) -> np.ndarray:
        """The index of each value's nearest level, clipped to the scale."""
        steps = np.round((np.asarray(values, dtype=float) - self.low) / self.step, _DECIMALS)
        # A value half-way between two levels (a mean of two annotators) goes, as np.rint rounds, to an
        # even count of steps from 0 rather than from LOW: a whole-number scale that starts at 1 then
        # rounds its scores exactly as rounding the raw score did (2.5 to 2, not to 3).
        origin = round(self.low / self.step)
        return np.clip(np.rint(steps + origin) - origin, 0, self.n_levels - 1).astype(int)

    def snap(self, values) -> np.ndarray:
        """Each value's nearest level."""
        return np.asarray(self.levels)[self.index(values)]

    def __str__(self) -> str:
        return f"{self.low:g}-{self.high:g}" + ("" if self.step == 1 else f" in steps of {self.step:g}")


def as_scale(scale: Scale | tuple[float, float]) -> Scale:
    """A (low, high) pair, as callers without steps give it (train/recipe.py), is a scale of whole steps."""
    return scale if isinstance(scale, Scale) else Scale(*scale)
