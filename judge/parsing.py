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
Only the judge's own output is searched, never the prompt, so a rubric that quotes the format cannot be
mistaken for an answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SCORE_HEADING = "### Score"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Judgement:
    feedback: str
    score: int | None
    criteria: dict[str, int | None] = field(default_factory=dict)
    error: str | None = None


def format_judgement(
    score: float | None, criteria: dict[str, float], labels: dict[str, str], feedback: str | None = None
) -> str:
    """The text a judge should produce for these scores; `labels` maps criterion -> line label.

    Scores are rounded to the integer scale the judge speaks (MMIE's is 0-6). Without an overall
    score (an annotation of criteria only) the score heading is left out."""
    lines = [feedback.strip()] if feedback else []
    lines += [f"{labels[name]}: {round(value)}" for name, value in criteria.items()]
    if score is not None:
        lines += [SCORE_HEADING, str(round(score))]
    return "\n".join(lines)


def _in_scale(text: str, low: int, high: int) -> int | None:
    value = round(float(text))
    return value if low <= value <= high else None


def parse_judgement(output: str, labels: dict[str, str], scale: tuple[int, int] = (0, 6)) -> Judgement:
    """Read the overall score and the per-criterion lines from a judge's generated text.

    Never raises on odd text: a missing or out-of-range score gives `score=None` and the reason in
    `error`, so the sample is reported rather than dropped."""
    low, high = scale
    head, found, tail = output.partition(SCORE_HEADING)
    score, error = None, None
    if not found:
        error = f"no '{SCORE_HEADING}' heading in the judge's output"
    elif (number := _NUMBER.search(tail)) is None:
        error = f"no number after '{SCORE_HEADING}'"
    elif (score := _in_scale(number.group(), low, high)) is None:
        error = f"score {number.group()} is outside the scale {low}-{high}"
    criteria = {name: _criterion(head, label, low, high) for name, label in labels.items()}
    return Judgement(feedback=_feedback(head, labels), score=score, criteria=criteria, error=error)


def _criterion_line(label: str) -> re.Pattern:
    # Tolerates the markdown judges like to add: "- **Text quality**: 4".
    return re.compile(rf"^[\s*#-]*{re.escape(label)}\**\s*[:：]\s*\**\s*(-?\d+(?:\.\d+)?)?", re.IGNORECASE | re.MULTILINE)


def _criterion(text: str, label: str, low: int, high: int) -> int | None:
    # The last matching line wins: a judge that restates a criterion corrects itself.
    numbers = [m.group(1) for m in _criterion_line(label).finditer(text) if m.group(1)]
    return _in_scale(numbers[-1], low, high) if numbers else None


def _feedback(text: str, labels: dict[str, str]) -> str:
    """The critique: the output before the criterion lines and the score heading."""
    starts = [m.start() for label in labels.values() for m in _criterion_line(label).finditer(text)]
    return text[: min(starts)].strip() if starts else text.strip()
