"""The judge's output format, both ways: `format_judgement` writes it (training targets) and
`parse_judgement` reads it (scoring). Keeping both here is what guarantees that a trained judge's output
parses.

    <feedback text>
    Text quality: 4
    Image quality: 3
    Text-image coherence: 5
    Stylistic consistency: 4
    ### Score
    4

The prompt already ends with `### Feedback\\n`, so the judge's text starts with the critique. The overall
score follows MMIE's rule: the first number after `### Score`, rounded, valid only inside the scale.
A scale may have fractional steps (Inst-It's 0-1 in steps of 0.1): "rounded" then means "to the nearest
step".
Only the judge's own output is searched, never the prompt, so a rubric that quotes the format cannot be
mistaken for an answer.
"""

from __future__ import annotations

import math
import reprlib
import re
from dataclasses import dataclass, field

import numpy as np

SCORE_HEADING = "### Score"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


# Float error of a step count (0.7 / 0.1 = 6.999999999999999) is far below this; a real half step is not.
_DECIMALS = 9
MAX_STEPS = 1000  # a 0-100 scale in steps of 0.1; no rating scale has more


# Over 4 in 5 scores on one level is collapse: at most a fifth of the answers are told apart from the rest
# (MMIE issue #3: a judge gave every sample the same score). judge-score's summary and judge-calibrate's
# report both warn at this share.
COLLAPSE_SHARE = 0.8


@dataclass(frozen=True)
class ScoreScale:
    """The scores a judge may give and people rate on: low, low + step, ..., high. The default is MMIE's,
    whole numbers 0-6; Inst-It's judge scores 0-1 in steps of 0.1."""

    low: float = 0
    high: float = 6
    step: float = 1

    def __post_init__(self):
        if not all(math.isfinite(v) for v in (self.low, self.high, self.step)):
            raise ValueError(f"a scale needs finite numbers, got {self.low:g}-{self.high:g} step {self.step:g}")
        if not self.low < self.high or not self.step > 0:
            raise ValueError(f"a scale needs low < high and step > 0, got {self.low:g}-{self.high:g} step {self.step:g}")
        steps = (self.high - self.low) / self.step
        if abs(steps - round(steps)) > 10**-_DECIMALS:
            raise ValueError(f"step {self.step:g} does not divide the scale {self.low:g}-{self.high:g} into whole steps "
                             f"((high - low) / step = {steps:.4g})")
        if steps > MAX_STEPS:  # statistics over levels hold a count per pair of levels: 26.8 GiB at 60,000 steps
            raise ValueError(f"{self.low:g}-{self.high:g} in steps of {self.step:g} is {steps:,.0f} steps; a scale has at most {MAX_STEPS:,}")

    @property
    def n_levels(self) -> int:
        return round((self.high - self.low) / self.step) + 1

    @property
    def integral(self) -> bool:
        """Whole numbers only: each score is one token, so the judge's score distribution can be read."""
        return self.step == 1 and float(self.low).is_integer()

    @property
    def bounds(self) -> tuple[float, float]:
        return float(self.low), float(self.high)

    def problem(self, value: object) -> str | None:
        """Why a value read from a file is not a score on this scale, or None when it is one."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{value!r} is not a number"
        if isinstance(value, float) and not math.isfinite(value):  # an int is finite, however long (no float holds 10**400)
            return f"{value} is not a finite number"
        if not self.low <= value <= self.high:
            return f"{reprlib.repr(value) if isinstance(value, int) else format(value, 'g')} is outside the scale {self.low:g}-{self.high:g}"
        return None

    def share(self, value: float) -> float:
        """Where a score lies on the scale: 0 at low, 1 at high (MMIE's percentages, MileBench's and
        MEGA-Bench's 0-1 figures)."""
        return (value - self.low) / (self.high - self.low)

    def level(self, k: int) -> int | float:
        value = self.low + k * self.step
        # Whole numbers stay ints (MMIE's scores are written 4, not 4.0); rounding off float error makes
        # 7 steps of 0.1 read 0.7, not 0.7000000000000001.
        return int(value) if self.integral else round(value, _DECIMALS)

    @property
    def levels(self) -> list[int | float]:
        return [self.level(k) for k in range(self.n_levels)]

    def _nearest(self, values) -> np.ndarray:
        """Steps from low to each value's nearest level, unclipped. A value half way between two levels
        goes where Python's round sends the raw score (to an even count of steps from 0, not from low),
        so on a whole-number scale snapping is exactly MMIE's rounding, whatever low is."""
        steps = np.round((np.asarray(values, dtype=float) - self.low) / self.step, _DECIMALS)
        origin = round(self.low / self.step)
        return (np.rint(steps + origin) - origin).astype(int)

    def index(self, values) -> np.ndarray:
        """Each value's level index, clipped to the scale: for statistics over levels."""
        return np.clip(self._nearest(values), 0, self.n_levels - 1)

    def snap(self, value: float) -> int | float | None:
        """The nearest level, or None when the value lies outside the scale once rounded: for parsing."""
        k = int(self._nearest([value])[0])
        return self.level(k) if 0 <= k < self.n_levels else None

    def __str__(self) -> str:
        return f"{self.low:g}-{self.high:g}" + ("" if self.step == 1 else f" in steps of {self.step:g}")


@dataclass(frozen=True)
class Judgement:
    feedback: str
    score: int | float | None
    criteria: dict[str, int | float | None] = field(default_factory=dict)
    error: str | None = None


def format_judgement(
    score: float | None, criteria: dict[str, float], labels: dict[str, str], feedback: str | None = None,
    scale: ScoreScale = ScoreScale(),
) -> str:
    """The text a judge should produce for these scores; `labels` maps criterion -> line label.

    Scores are rounded to the scale's steps the judge speaks (MMIE's: whole numbers 0-6). Without an
    overall score (an annotation of criteria only) the score heading is left out."""
    lines = [feedback.strip()] if feedback else []
    lines += [f"{labels[name]}: {scale.snap(value)}" for name, value in criteria.items()]
    if score is not None:
        lines += [SCORE_HEADING, str(scale.snap(score))]
    return "\n".join(lines)


def parse_judgement(output: str, labels: dict[str, str], scale: ScoreScale = ScoreScale()) -> Judgement:
    """Read the overall score and the per-criterion lines from a judge's generated text.

    Never raises on odd text: a missing or out-of-range score gives `score=None` and the reason in
    `error`, so the sample is reported rather than dropped."""
    head, found, tail = output.partition(SCORE_HEADING)
    score, error = None, None
    if not found:
        error = f"no '{SCORE_HEADING}' heading in the judge's output"
    elif (number := _NUMBER.search(tail)) is None:
        error = f"no number after '{SCORE_HEADING}'"
    elif (score := scale.snap(float(number.group()))) is None:
        error = f"score {number.group()} is outside the scale {scale}"
    criteria = {name: _criterion(head, label, scale) for name, label in labels.items()}
    return Judgement(feedback=_feedback(head, labels), score=score, criteria=criteria, error=error)


def _criterion_line(label: str) -> re.Pattern:
    # Tolerates the markdown judges like to add: "- **Text quality**: 4".
    return re.compile(rf"^[\s*#-]*{re.escape(label)}\**\s*[:：]\s*\**\s*(-?\d+(?:\.\d+)?)?", re.IGNORECASE | re.MULTILINE)


def _criterion(text: str, label: str, scale: ScoreScale) -> int | float | None:
    # The last matching line wins: a judge that restates a criterion corrects itself.
    numbers = [m.group(1) for m in _criterion_line(label).finditer(text) if m.group(1)]
    return scale.snap(float(numbers[-1])) if numbers else None


def _feedback(text: str, labels: dict[str, str]) -> str:
    """The critique: the output before the criterion lines and the score heading."""
    starts = [m.start() for label in labels.values() for m in _criterion_line(label).finditer(text)]
    return text[: min(starts)].strip() if starts else text.strip()
