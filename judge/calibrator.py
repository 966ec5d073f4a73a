"""A calibration map from the judge's scale to the human scale, as judge-calibrate writes it and
judge-score --calibrator applies it.

The map is monotone and piecewise linear through its knots (x, y), flat beyond the first and last knot,
and clipped to the human scale: an isotonic fit gives many knots, a linear fit two.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from judge.data import InputError, Problem


class Calibrator(BaseModel):
    model_config = ConfigDict(extra="forbid")
    method: Literal["isotonic", "linear"]
    source: Literal["score", "expected_score"]  # which field of a judge-score record it reads
    criterion: str = "overall"
    x: list[float]
    y: list[float]
    scale: tuple[float, float]
    fitted_on: dict = {}

    @model_validator(mode="after")
    def _monotone_knots(self) -> Calibrator:
        if len(self.x) != len(self.y) or len(self.x) < 2:
            raise ValueError("x and y need the same length, at least 2")
        if any(b < a for a, b in zip(self.x, self.x[1:])) or any(b < a for a, b in zip(self.y, self.y[1:])):
            raise ValueError("knots must be non-decreasing in x and in y")
        return self

    @classmethod
    def load(cls, path: str | Path) -> Calibrator:
        path = Path(path)
        if not path.is_file():
            raise InputError([Problem(str(path), "calibrator file not found")])
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except json.JSONDecodeError as err:
            raise InputError([Problem(str(path), f"invalid JSON: {err.msg}")]) from None
        except ValidationError as err:
            raise InputError([Problem(str(path), e["msg"], field=".".join(map(str, e["loc"])) or None) for e in err.errors()]) from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=2) + "\n")

    def apply(self, value: float | None) -> float | None:
        if value is None:
            return None
        mapped = float(np.interp(value, self.x, self.y))
        return min(max(mapped, self.scale[0]), self.scale[1])
