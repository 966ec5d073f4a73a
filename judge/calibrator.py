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

It may also carry, fitted on held-out human scores from the judge's score distribution (the probability of
each score level, which judge-score writes on scales of whole numbers):
- `score_sets`: a conformal threshold. A record's set of levels grows from the judge's most probable level,
  each time by the more probable neighbour of the interval so far, while the probability already in the set
  is at most the threshold; so the set is an interval of levels, and it holds the human score with at least
  the fitted coverage (split conformal prediction, for a new record exchangeable with the fitted ones).
- `escalation`: the confidence at or above which the judge's written score agrees with people at the target
  rate, with probability 1 - error_rate over the fitted labels ("trust or escalate", Jung et al. 2025);
  a record below it is escalated to people.

A pairwise judge's calibrator (PairCalibrator, `"kind": "pairs"`) maps no score: it holds `selective`, the
confidence at or above which a pair's verdict is kept (else abstained), fitted so that, with probability
1 - error_rate over the labelled pairs, the verdicts kept disagree with people at most at max_error
(calibration/selective.py says how). A judge panel (Panel) combines several judges' verdict distributions
on the same pairs by stacked logistic weights (calibration/panel.py fits them).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mmjudge.judge.data import (CALIBRATOR_FIELDS, MAX_SETTINGS_BYTES, InputError, JudgeResult, UsageError, read_json, validation_problems,
                                write_text_atomically)
from mmjudge.judge.identity import rubric_fingerprint


# Every number a calibrator holds, in its range: read from a file anyone may have written, a negative
# threshold made judge-score's score sets empty ("internal failure: IndexError"), and a coverage of 2.0 was
# reported as fitted. NaN and infinity are refused with them (allow_inf_nan).
Share = Annotated[float, Field(ge=0, le=1)]
Probability = Annotated[float, Field(gt=0, lt=1)]  # asked for: neither certain nor impossible
Count = Annotated[int, Field(ge=0)]
NonNegative = Annotated[float, Field(ge=0)]
STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class FittedOn(BaseModel):
    """Where the map came from, so a calibrated score can be traced back."""

    model_config = STRICT
    judge: str | None = None
    predictions: str | None = None
    human: str | None = None
    n: Count
    folds: Annotated[int, Field(ge=2)] | None = None
    mse_before: NonNegative | None = None
    held_out_mse_after: NonNegative | None = None
    # The judge and the rubrics (category -> fingerprint, judge/identity.py) that scored the predictions it was
    # fitted on; None where the predictions did not say. judge-score --calibrator refuses another judge's map.
    judge_fingerprint: str | None = None
    rubric_fingerprints: dict[str, str] | None = None


class ScoreSets(BaseModel):
    model_config = STRICT
    coverage: Probability  # the asked-for probability that a record's set holds its human score
    threshold: Share  # levels join the set while the probability already in it is at most this (1: every level)
    n: Count  # human-scored records it was fitted on
    held_out_coverage: Share | None = None  # reached on cross-fitted folds
    held_out_mean_size: NonNegative | None = None  # mean number of levels in a set, on those folds


class Escalation(BaseModel):
    model_config = STRICT
    agreement: Literal["exact", "within_1"]  # agreeing is the same level, or at most one level apart
    target_agreement: Probability
    error_rate: Probability  # the guarantee holds with probability 1 - error_rate
    # The judge's probability of agreeing with its own written score (within the tolerance), at or above
    # which a record is left to the judge; None: no threshold met the target, every record is escalated.
    threshold: Share | None
    n: Count


def mass_before(probabilities: np.ndarray) -> np.ndarray:
    """For rows of level probabilities (records x levels), the probability already in each record's set
    when each level joins it. The set starts at the most probable level (the lowest on a tie) and grows by
    the more probable of the two neighbours of the interval so far (the lower on a tie): so the levels
    whose value is at most any threshold form an interval, and the sets of higher thresholds contain
    those of lower ones."""
    p = np.asarray(probabilities, dtype=float)
    rows, levels = np.arange(len(p)), p.shape[1]
    low = high = p.argmax(1)
    before = np.zeros_like(p)
    mass = p[rows, low]
    for _ in range(levels - 1):
        left = np.where(low > 0, p[rows, np.maximum(low - 1, 0)], -1.0)
        right = np.where(high < levels - 1, p[rows, np.minimum(high + 1, levels - 1)], -1.0)
        take_left = left >= right
        joining = np.where(take_left, low - 1, high + 1)
        before[rows, joining] = mass
        mass = mass + p[rows, joining]
        low, high = np.where(take_left, low - 1, low), np.where(take_left, high, high + 1)
    return before


def level_probabilities(distribution: dict[str, float], low: float, high: float) -> list[float]:
    """A score distribution as judge-score writes it ({"0": p, ..., "6": p}) as a row over the whole-number
    levels low..high, a level it does not name at 0; the numbers as written (not renormalised), so that
    judge-calibrate's fit and judge-score's sets read the same values."""
    return [distribution.get(str(level), 0.0) for level in range(int(low), int(high) + 1)]


def agreement_confidence(probabilities: np.ndarray, written: np.ndarray, within: int) -> np.ndarray:
    """The judge's probability that the score lies within `within` levels of the level it wrote."""
    p = np.asarray(probabilities, dtype=float)
    k = np.arange(p.shape[1])
    near = np.abs(k[None, :] - np.asarray(written)[:, None]) <= within
    return (p * near).sum(1)


class FittedFile(BaseModel):
    """A file judge-calibrate fits and judge-score applies: read and written whole, and refused for another judge's
    weights or rubrics than those it was fitted on (its `fitted_on`)."""

    model_config = STRICT
    fitted_on: FittedOn | None = None

    @classmethod
    def load(cls, path: str | Path):
        content = read_json(path, MAX_SETTINGS_BYTES)  # which names a missing, oversized, empty or broken file
        try:
            return cls.model_validate(content)
        except ValidationError as err:
            raise InputError(validation_problems(path, None, None, err)) from None

    def save(self, path: str | Path) -> None:
        write_text_atomically(Path(path), self.model_dump_json(indent=2) + "\n")

    def fitted_elsewhere(self, judge_fingerprint: str | None, rubric_fingerprints: dict[str, str]) -> tuple[list[str], list[str]]:
        """How a judge (its weights' fingerprint) and its rubrics (category -> fingerprint) differ from those the map
        was fitted on, and what cannot be checked, each in words: (mismatches, unchecked)."""
        fitted = self.fitted_on or FittedOn(n=0)
        mismatches, unchecked = [], []
        source = f" (the judge of {fitted.predictions})" if fitted.predictions else ""
        if fitted.judge_fingerprint is None:
            unchecked.append("it does not say which judge it was fitted on (its predictions carried no judge_fingerprint: an earlier "
                             "judge-score, or another tool's scores)")
        elif judge_fingerprint is None:
            unchecked.append(f"it was fitted on the judge with weights {fitted.judge_fingerprint}{source}, and this run's judge, behind a "
                             "server, shows no weights to compare")
        elif judge_fingerprint != fitted.judge_fingerprint:
            mismatches.append(f"it was fitted on another judge's scores: weights {fitted.judge_fingerprint}{source}, this judge's are "
                              f"{judge_fingerprint}")
        if fitted.rubric_fingerprints is not None:
            mismatches += [f"rubric {category!r} is not the one it was fitted on (fingerprint {fitted.rubric_fingerprints[category]}, "
                           f"this run's {fingerprint})" for category, fingerprint in sorted(rubric_fingerprints.items())
                           if fitted.rubric_fingerprints.get(category, fingerprint) != fingerprint]
        return mismatches, unchecked

    def check_fit(self, path: str | Path, judge: str, judge_fingerprint: str | None, rubrics: dict, allow_mismatch: bool = False) -> list[str]:
        """Refuses the map (UsageError) for a judge (named `judge` in the message; its weights' fingerprint) or rubrics
        (category -> judge.prompts.Rubric, those scored) other than it was fitted on, unless `allow_mismatch`: a map of
        one judge's scale applied to another's writes plausible numbers that mean nothing. The warnings for what is
        applied anyway, or cannot be checked."""
        mismatches, unchecked = self.fitted_elsewhere(judge_fingerprint, {c: rubric_fingerprint(r) for c, r in rubrics.items()})
        if mismatches and not allow_mismatch:
            raise UsageError(f"--calibrator {path} does not fit {judge}: {'; '.join(mismatches)}. A calibration map is one judge's and "
                             "one rubric's: fit one on this judge's scores (judge-calibrate --predictions <its eval_result.json>), or give "
                             "--allow_calibrator_mismatch to apply it anyway")
        return ([f"--calibrator {path} applied although {m} (--allow_calibrator_mismatch)" for m in mismatches]
                + [f"--calibrator {path} applied unchecked: {u}" for u in unchecked])


class Calibrator(FittedFile):
    """Maps the overall score: judge-calibrate fits no other criterion, so judge-score reads `source`
    (the record's score or expected_score) and writes calibrated_score."""

    model_config = STRICT
    method: Literal["isotonic", "linear"]
    source: Literal["score", "expected_score"]  # which field of a judge-score record it reads
    x: list[float]
    y: list[float]
    scale: tuple[float, float]
    score_sets: ScoreSets | None = None
    escalation: Escalation | None = None

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

    def apply(self, value: float | None) -> float | None:
        """The calibrated score; None (a parse failure) stays None."""
        if value is None:
            return None
        mapped = float(np.interp(value, self.x, self.y))
        return min(max(mapped, self.scale[0]), self.scale[1])

    def _probabilities(self, distribution: dict[str, float] | None) -> np.ndarray | None:
        """One row of level_probabilities; None without a distribution."""
        return np.array([level_probabilities(distribution, *self.scale)]) if distribution else None

    def score_set(self, distribution: dict[str, float] | None) -> list[int] | None:
        """[lowest, highest] level of the record's conformal set; None without score_sets or a distribution."""
        p = self._probabilities(distribution) if self.score_sets else None
        if p is None:
            return None
        if self.score_sets.threshold >= 1:  # too few labels for the coverage asked: every level
            return [int(self.scale[0]), int(self.scale[1])]
        inside = np.flatnonzero(mass_before(p)[0] <= self.score_sets.threshold)
        return [int(self.scale[0]) + int(inside[0]), int(self.scale[0]) + int(inside[-1])]

    def escalate(self, score: float | None, distribution: dict[str, float] | None) -> bool | None:
        """True: people should score this record (its written score is null, no threshold met the target,
        or the judge is less sure of its score than the threshold); False: the judge may; None without
        escalation, or without a distribution to read the judge's confidence from."""
        if self.escalation is None:
            return None
        if score is None or self.escalation.threshold is None:
            return True
        p = self._probabilities(distribution)
        if p is None:
            return None
        within = 1 if self.escalation.agreement == "within_1" else 0
        written = np.array([round(score - self.scale[0])])
        return bool(agreement_confidence(p, written, within)[0] < self.escalation.threshold)


def load_calibrator(path: str | Path | Calibrator | PairCalibrator, rubrics: list, pairs: bool = False) -> Calibrator | PairCalibrator:
    """The calibrator (a file, or one already loaded), refused where the rubrics (judge.prompts.Rubric) score on another
    scale: its map would read a 0-1 score as if on 0-6 and write calibrated scores that look plausible and mean nothing.
    For a run over `pairs`, a pairwise judge's (PairCalibrator), refused where it holds a panel: a panel reads several
    judges' verdicts, and one run has one judge's (apply it with Panel.verdicts, or judge-calibrate --panel)."""
    calibrator = path if isinstance(path, (Calibrator, PairCalibrator)) else PairCalibrator.load(path) if _kind(path) == "pairs" else Calibrator.load(path)
    if pairs != isinstance(calibrator, PairCalibrator):
        fitted, wanted = ("single answers' scores", "verdicts on pairs") if pairs else ("verdicts on pairs", "single answers' scores")
        raise UsageError(f"--calibrator {path if isinstance(path, (str, Path)) else '(given)'} was fitted on {fitted}, and this run has "
                         f"{wanted}: give the calibrator.json judge-calibrate fitted on this judge's {wanted}")
    if pairs:
        if calibrator.panel is not None:
            raise UsageError(f"--calibrator {path} is a panel of {', '.join(calibrator.panel.members)}: it needs every member's verdicts, and "
                             "this run has one judge's; judge-calibrate --panel writes the panel's verdicts (panel_verdicts.json), or apply "
                             "it from Python (mmjudge.judge.calibrator.Panel.verdicts)")
        return calibrator
    low, high = calibrator.scale
    for rubric in rubrics:
        scale = rubric.score_scale
        if scale.bounds != (low, high):
            raise UsageError(f"--calibrator {path} maps scores on the scale {low:g}-{high:g}, but rubric {rubric.category!r} "
                             f"scores {scale.low:g}-{scale.high:g}; fit a calibrator on this benchmark's scores with judge-calibrate --scale")
    return calibrator


def as_records(results: list, calibrator: Calibrator | PairCalibrator | None) -> list[dict]:
    """The records judge-score writes and Judge.score returns: with a calibrator, each result gets (in place)
    and shows its calibrated_score, score_set and escalate; without one, a record has exactly MMIE's keys.
    Pairs (PairResult) get their `abstained` and `uncertainty` from a PairCalibrator's selective threshold."""
    if isinstance(calibrator, PairCalibrator) or (results and not isinstance(results[0], JudgeResult)):
        return [calibrator.apply(r.model_dump()) if calibrator is not None else r.model_dump() for r in results]
    if calibrator is not None:
        for r in results:
            r.calibrated_score = calibrator.apply(getattr(r, calibrator.source))
            r.score_set = calibrator.score_set(r.score_distribution)
            r.escalate = calibrator.escalate(r.score, r.score_distribution)
    return [r.model_dump(exclude=CALIBRATOR_FIELDS if calibrator is None else None) for r in results]


# -- pairs ----------------------------------------------------------------------------------------------

# How a pair's confidence is read from its order-averaged verdict distribution (PairResult.verdict_distribution,
# the mean over both orders' judgements, so no order is favoured):
# - verdict_probability: the probability of the verdict the record gives, the judge's own chance of being right;
# - entropy: 1 - the distribution's entropy over log(number of verdicts), SCOPE's bidirectional preference
#   entropy (Badshah et al. 2026) as a confidence. With two verdicts both rank pairs alike; with a tie as a
#   third, the entropy can call a pair sure while its verdict (under the agree rule, a tie where the orders
#   differ) is not the likeliest one.
UNCERTAINTIES = ("verdict_probability", "entropy")


def pair_confidence(verdict: str | None, distribution: dict[str, float] | None, uncertainty: str) -> float | None:
    """A pair's confidence in [0, 1] (UNCERTAINTIES); None without a verdict or a distribution."""
    if verdict is None or not distribution or sum(distribution.values()) <= 0:
        return None
    p = np.array(list(distribution.values()), dtype=float)
    p = p / p.sum()
    if uncertainty == "verdict_probability":
        return float(p[list(distribution).index(verdict)]) if verdict in distribution else 0.0
    if uncertainty == "entropy":
        nonzero = p[p > 0]
        return float(min(max(1 + (nonzero * np.log(nonzero)).sum() / math.log(len(p)), 0.0), 1.0)) if len(p) > 1 else 1.0
    raise ValueError(f"unknown uncertainty {uncertainty!r}; they are {', '.join(UNCERTAINTIES)}")


class Selective(BaseModel):
    """Keep a pair's verdict when the judge's confidence in it is at or above the threshold; abstain otherwise."""

    model_config = STRICT
    uncertainty: Literal[UNCERTAINTIES]
    max_error: Probability  # alpha: the share of kept verdicts that may disagree with people
    error_rate: Probability  # delta: the guarantee holds with probability 1 - error_rate over the labelled pairs
    threshold: Share | None  # None: no threshold met max_error; every pair is abstained
    n: Count  # labelled pairs it was fitted on

    def abstains(self, verdict: str | None, distribution: dict[str, float] | None) -> tuple[bool, float | None]:
        """(abstained, uncertainty = 1 - confidence): a pair without a verdict or a distribution is abstained."""
        confidence = pair_confidence(verdict, distribution, self.uncertainty)
        if confidence is None:
            return True, None
        return self.threshold is None or confidence < self.threshold, 1 - confidence


LOG_ODDS_CLIP = 10.0  # a verdict distribution of 0 and 1 is not infinitely sure; the panel's inputs stay finite


def preference_log_odds(verdict: str | None, distribution: dict[str, float] | None) -> float | None:
    """A judge's lean towards answer A: log P(A) / P(B) of its verdict distribution, clipped to +-LOG_ODDS_CLIP;
    without a distribution its verdict (A: +1, B: -1, tie: 0); None without either."""
    if distribution and distribution.get("A", 0) + distribution.get("B", 0) > 0:
        a, b = distribution.get("A", 0.0), distribution.get("B", 0.0)
        odds = LOG_ODDS_CLIP if b <= 0 else -LOG_ODDS_CLIP if a <= 0 else math.log(a / b)
        return float(min(max(odds, -LOG_ODDS_CLIP), LOG_ODDS_CLIP))
    return {"A": 1.0, "B": -1.0, "tie": 0.0}.get(verdict) if verdict is not None else None


class Panel(BaseModel):
    """A stacked logistic model over several judges' log-odds for answer A: P(A) = sigmoid(intercept + sum of
    weight x log-odds), fitted on people's decisive preferences (calibration/panel.py)."""

    model_config = STRICT
    members: list[str] = Field(min_length=2)  # the judges' names, as judge-calibrate was given them
    weights: list[float]
    intercept: float
    n: Count

    @model_validator(mode="after")
    def _one_weight_each(self) -> Panel:
        if len(self.weights) != len(self.members) or len(set(self.members)) != len(self.members):
            raise ValueError(f"one weight per member, each member once (got {len(self.members)} members, {len(self.weights)} weights)")
        return self

    def probability_a(self, log_odds: np.ndarray) -> np.ndarray:
        """P(answer A is better) for rows of the members' log-odds (pairs x members)."""
        z = self.intercept + np.asarray(log_odds, dtype=float) @ np.asarray(self.weights)
        return 1 / (1 + np.exp(-z))

    def verdicts(self, members: dict[str, dict[str, tuple[str | None, dict | None]]]) -> dict[str, dict]:
        """The panel's verdict and distribution on every pair each member judged: `members` maps each member's name
        to {pair id: (verdict, verdict distribution)}."""
        if missing := [m for m in self.members if m not in members]:
            raise UsageError(f"the panel needs each member's verdicts; none given for {', '.join(missing)}")
        ids = [i for i in members[self.members[0]] if all(i in members[m] for m in self.members)]
        odds = {i: [preference_log_odds(*members[m][i]) for m in self.members] for i in ids}
        ids = [i for i in ids if None not in odds[i]]
        if not ids:
            return {}
        p = self.probability_a(np.array([odds[i] for i in ids]))
        return {i: {"verdict": "A" if pa >= 0.5 else "B", "verdict_distribution": {"A": float(pa), "B": float(1 - pa), "tie": 0.0}}
                for i, pa in zip(ids, p)}


class PairCalibrator(FittedFile):
    """What judge-score --calibrator applies to a pairwise run: the selective threshold (each record then says
    `abstained` and its `uncertainty`), fitted on one judge's verdicts; refused for another judge or rubric."""

    model_config = STRICT
    kind: Literal["pairs"] = "pairs"
    selective: Selective | None = None
    panel: Panel | None = None  # a panel's threshold: selective then reads the panel's distribution

    def apply(self, record: dict) -> dict:
        """A PairResult's record with `uncertainty` and `abstained` (in place, and returned)."""
        if self.selective is not None:
            record["abstained"], record["uncertainty"] = self.selective.abstains(record.get("verdict"), record.get("verdict_distribution"))
        return record


def _kind(path: str | Path) -> str | None:
    content = read_json(path, MAX_SETTINGS_BYTES)
    return content.get("kind") if isinstance(content, dict) else None
