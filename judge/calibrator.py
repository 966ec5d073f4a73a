"""A calibration map from the judge's scale to the human scale, as judge-calibrate writes it and
judge-score --calibrator applies it. Torch-free, and independent of the `calibration` package.

The map is monotone and piecewise linear through its knots (x, y), flat beyond the first and last knot,
and clipped to the human scale: an isotonic fit gives many knots, a linear fit two.

    human
      ^            y[-1] ______
      |               /
      |     ________/
      |  __/
      +---x[0]------------x[-1]---> judge score (or expected score)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from judge.data import InputError, read_json, validation_problems, write_text_atomically


class FittedOn(BaseModel):
    """Where the map came from, so a calibrated score can be traced back."""

    model_config = ConfigDict(extra="forbid")
    judge: str | None = None
    predictions: str | None = None
    human: str | None = None
    n: int
    folds: int | None = None
    mse_before: float | None = None
    held_out_mse_after: float | None = None


class Calibrator(BaseModel):
    """Maps the overall score: judge-calibrate fits no other criterion, so judge-score reads `source`
    (the record's score or expected_score) and writes calibrated_score."""

    model_config = ConfigDict(extra="forbid")
    method: Literal["isotonic", "linear"]
    source: Literal["score", "expected_score"]  # which field of a judge-score record it reads
    x: list[float]
    y: list[float]
    scale: tuple[float, float]
    fitted_on: FittedOn | None = None

    @model_validator(mode="before")
    @classmethod
    def _overall_only(cls, data: object) -> object:
        # Files written before the field was dropped say "criterion": "overall", which is what judge-score
        # applies; a map of another criterion cannot be honoured: it would be applied to the overall score.
        if isinstance(data, dict) and "criterion" in data:
            if data["criterion"] != "overall":
                raise ValueError(f"a map of criterion {data['criterion']!r}: judge-score calibrates the overall score only "
                                 "(the record's score or expected_score)")
            data = {k: v for k, v in data.items() if k != "criterion"}
        return data

    @model_validator(mode="after")
    def _monotone_knots(self) -> Calibrator:
        low, high = self.scale
        if not low < high:
            raise ValueError(f"scale must be [low, high] with low < high, got {list(self.scale)}")
        if len(self.x) != len(self.y) or len(self.x) < 2:
            raise ValueError(f"x and y need the same length, at least 2 (got {len(self.x)} and {len(self.y)})")
        if not all(math.isfinite(v) for v in self.x + self.y):
            raise ValueError("knots must be finite numbers")
        if any(b < a for a, b in zip(self.x, self.x[1:])) or any(b < a for a, b in zip(self.y, self.y[1:])):
            raise ValueError("knots must be non-decreasing in x and in y")
        if not (low <= self.y[0] and self.y[-1] <= high):
            raise ValueError(f"y must lie within the scale {low:g}-{high:g}")
        return self

    @classmethod
    def load(cls, path: str | Path) -> Calibrator:
        content = read_json(path)  # which names a missing, empty or broken file
        try:
            return cls.model_validate(content)
        except ValidationError as err:
            raise InputError(validation_problems(path, None, None, err)) from None

    def save(self, path: str | Path) -> None:
        write_text_atomically(Path(path), self.model_dump_json(indent=2) + "\n")

    def apply(self, value: float | None) -> float | None:
        """The calibrated score; None (a parse failure) stays None."""
        if value is None:
            return None
        mapped = float(np.interp(value, self.x, self.y))
        return min(max(mapped, self.scale[0]), self.scale[1])
