"""What a reward is: one number in [0, 1] for a policy's response, computed from the judge's own
distributions, declared once by judge-serve's `--reward` and named in every record. Free of torch: the
server (serve/rewards.py) and the package's adapters (mmjudge/rewards.py) read rewards the same way.

    --reward                       what the judge is asked            the reward
    score:CATEGORY                 the pointwise rubric's score       its expected score mapped from the rubric's scale to
                                   of the response                    [0, 1]: (E[score] - low) / (high - low); the written
                                                                      score where the scale has no distribution
    score:CATEGORY:CALIBRATOR      the same                           the expected score through a judge-calibrate
                                                                      calibrator.json, then mapped from its scale to [0, 1]
    preference:CATEGORY            the pairwise rubric's verdict on   the probability that the response wins, from the
                                   (response, reference), both        verdict distribution averaged over both orders, a tie
                                   orders                             counting half: P(A) + P(tie) / 2
    verdict:CATEGORY               nothing: the response is a judge   1 where the verdict the response writes (read by the
                                   being trained, writing a verdict   rubric's verdict format) is the label, else 0
                                   in the rubric's format

A judgement that gives no number (no distribution and no parsed score) is no reward: None, never a made-up
value, so that each framework's adapter can skip it (TRL's None) and count it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mmjudge.judge.calibrator import Calibrator, load_calibrator
from mmjudge.judge.data import JudgeResult, PairResult, UsageError, verdict_of
from mmjudge.judge.prompts import Rubric
from mmjudge.judge.verdicts import VERDICT_FORMATS

Kind = Literal["score", "preference", "verdict"]
KINDS: tuple[str, ...] = ("score", "preference", "verdict")
RUBRIC_KIND = {"score": "pointwise", "preference": "pairwise", "verdict": "pairwise"}  # the rubric each reward reads


@dataclass(frozen=True)
class RewardSpec:
    """A parsed `--reward`: the kind, the rubric's category, and for a score an optional calibrator."""

    kind: Kind
    category: str
    calibrator: Calibrator | None = None

    @property
    def name(self) -> str:
        """The reward as records name it, e.g. `score:SA` (a calibrated one: `score:SA:calibrated`)."""
        return f"{self.kind}:{self.category}" + (":calibrated" if self.calibrator else "")

    @property
    def needs_reference(self) -> bool:
        """Whether each response comes with a reference answer (preference) or a label (verdict)."""
        return self.kind != "score"


def parse_reward(text: str, rubrics: dict[str, Rubric]) -> RewardSpec:
    """`--reward` as given, checked against the server's rubrics (and the calibrator's scale against the
    rubric's) before any model loads; a UsageError saying what would work."""
    kind, _, rest = text.partition(":")
    category, _, calibrator = rest.partition(":")  # a calibrator's path may itself hold colons
    if kind not in KINDS or not category:
        raise UsageError(f"--reward {text}: give KIND:CATEGORY with KIND one of {', '.join(KINDS)} (score:CATEGORY:CALIBRATOR.json "
                         "for a calibrated score), e.g. score:SA or preference:general")
    rubric = rubrics.get(category)
    wanted = RUBRIC_KIND[kind]
    if rubric is None or rubric.kind != wanted:
        fitting = sorted(c for c, r in rubrics.items() if r.kind == wanted)
        raise UsageError(f"--reward {text}: a {kind} reward reads a {wanted} rubric, and category {category!r} has "
                         f"{'none' if rubric is None else 'a ' + rubric.kind + ' one'}; the {wanted} rubrics here are {fitting or 'none'}")
    if calibrator and kind != "score":
        raise UsageError(f"--reward {text}: only a score reward goes through a calibrator")
    return RewardSpec(kind, category, load_calibrator(Path(calibrator), [rubric]) if calibrator else None)


def score_reward(result: JudgeResult, rubric: Rubric, calibrator: Calibrator | None = None) -> float | None:
    """A pointwise judgement's reward (module docstring); None where it gives no score."""
    value = result.expected_score if result.expected_score is not None else result.score
    if value is None:
        return None
    low, high = rubric.score_scale.bounds
    if calibrator is not None:
        value = calibrator.apply(value)
        low, high = calibrator.scale
    return min(max((value - low) / (high - low), 0.0), 1.0)


def preference_reward(result: PairResult) -> float | None:
    """The probability that answer A (the response) beats answer B (the reference), both orders averaged,
    a tie counting half; None where the judge gave no verdict distribution."""
    distribution = result.verdict_distribution
    if not distribution:
        return None
    total = sum(distribution.values())
    if total <= 0:
        return None
    return (distribution.get("A", 0.0) + distribution.get("tie", 0.0) / 2) / total


def verdict_reward(response: str, label: str, rubric: Rubric) -> float:
    """1.0 where the verdict written in `response` (the judge being trained) is `label`, else 0.0: a
    verdict that does not parse is a wrong one, the trained judge's own failure."""
    reading = VERDICT_FORMATS[rubric.verdict_format].read(response, rubric.criteria)
    return 1.0 if reading.verdict is not None and reading.verdict == verdict_of(label) else 0.0


def label_problem(label: object) -> str | None:
    """Why a verdict-correctness label is not one (A, B or tie), or None."""
    return None if verdict_of(label) in ("A", "B", "tie") else f"a verdict label must be A, B or tie, got {str(label)[:40]!r}"

