"""Reading judge predictions and human scores, and lining them up by id.

Predictions: judge-score's records (`score`, `criteria`, `expected_score`, ...) or any JSON list with
`id` and flat criterion fields (`overall`, `text_quality`, ...). Human scores: annotation records
(`human_scores`; several annotators per id allowed) or a flat `{id, overall, ..., annotator?}` list.

The human reference value of an id is the mean of its annotators' scores; the individual scores are
kept for the human-human ceiling. Every problem of every file is collected and raised as one
InputError; ids on one side only are not an error (they are counted in `Coverage`) unless no id is
shared at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel

from judge.data import (
    CRITERIA,
    SCORE_FIELDS,
    InputError,
    Problem,
    category_from_id,
    load_annotations,
    read_records,
)
from calibration.scale import Scale

SHOWN_IDS = 5  # ids listed by name when some are on one side only


@dataclass
class JudgeRecord:
    scores: dict[str, float]  # criterion -> score, "overall" included; a null score is absent
    expected_score: float | None
    model: str | None
    category: str | None
    n_images: int | None


@dataclass
class HumanRecord:
    ratings: dict[str, list[float]]  # criterion -> one score per annotator
    model: str | None
    category: str | None
    answer_chars: int | None = None
    n_images: int | None = None

    def mean(self, criterion: str) -> float | None:
        values = self.ratings.get(criterion)
        return sum(values) / len(values) if values else None


class Coverage(BaseModel):
    """How one predictions file lines up with the human file."""

    predictions: str
    records: int
    shared_ids: int
    only_in_predictions: int
    only_in_predictions_first: list[str]
    only_in_human: int
    only_in_human_first: list[str]
    parse_failures: int  # records with no overall score (judge-score writes null when it cannot parse)


@dataclass
class Ratings:
    judges: dict[str, dict[str, JudgeRecord]]  # judge name -> id -> record
    human: dict[str, HumanRecord]
    coverage: dict[str, Coverage]


class _Checker:
    """Collects problems of one file while its values are read."""

    def __init__(self, path: str, scale: Scale):
        self.path, self.scale, self.problems = path, scale, []

    def add(self, message: str, index: int | None = None, record_id: str | None = None, field: str | None = None) -> None:
        self.problems.append(Problem(self.path, message, index, record_id, field))

    def score(self, value, index: int, record_id: str, field: str) -> float | None:
        """A score on the scale, or None for null; anything else is a problem."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.add(f"{value!r} is not a number", index, record_id, field)
        elif not math.isfinite(value):
            self.add(f"{value} is not a finite number", index, record_id, field)
        elif not self.scale.low <= value <= self.scale.high:
            self.add(f"{value:g} is outside the scale {self.scale.low:g}-{self.scale.high:g}", index, record_id, field)
        else:
            return float(value)
        return None

    def record_id(self, record, index: int) -> str | None:
        if not isinstance(record, dict):
            self.add(f"a record must be an object, got {type(record).__name__}", index)
        elif isinstance(record.get("id"), (str, int)) and not isinstance(record.get("id"), bool):
            return str(record["id"])
        else:
            self.add("a record needs an 'id' (a string)", index)
        return None


def _raw_judge_scores(record: dict, check: _Checker, index: int, rid: str) -> dict[str, object]:
    """Criterion -> raw value, from judge-score's layout (`score`, `criteria`) or flat fields."""
    raw = {name: record[name] for name in SCORE_FIELDS if name in record}
    if "score" in record:
        raw["overall"] = record["score"]
    criteria = record.get("criteria")
    if isinstance(criteria, dict):
        raw |= {name: criteria[name] for name in CRITERIA if name in criteria}
    elif criteria is not None:
        check.add(f"'criteria' must be an object, got {type(criteria).__name__}", index, rid, "criteria")
    return raw


def read_predictions(path: str, scale: Scale) -> tuple[dict[str, JudgeRecord], int, list[Problem]]:
    """(records by id, parse failures, problems)."""
    check = _Checker(path, scale)
    records = read_records(path)
    out: dict[str, JudgeRecord] = {}
    first_index: dict[str, int] = {}
    any_score_field, failures = False, 0
    for index, r in enumerate(records):
        if (rid := check.record_id(r, index)) is None:
            continue
        raw = _raw_judge_scores(r, check, index, rid)
        any_score_field |= bool(raw)
        scores = {k: s for k, v in raw.items() if (s := check.score(v, index, rid, k)) is not None}
        failures += "overall" in raw and raw["overall"] is None
        n_images = r.get("n_images")
        record = JudgeRecord(
            scores=scores,
            expected_score=check.score(r.get("expected_score"), index, rid, "expected_score"),
            model=r.get("model") if isinstance(r.get("model"), str) else None,
            category=r.get("category") if isinstance(r.get("category"), str) else category_from_id(rid),
            n_images=n_images if isinstance(n_images, int) and not isinstance(n_images, bool) else None,
        )
        if rid in out and out[rid].scores != record.scores:
            check.add(f"duplicate id with different scores than record {first_index[rid]}", index, rid)
        first_index.setdefault(rid, index)
        out[rid] = record
    if not records:
        check.add("no records")
    elif not any_score_field:
        check.add(f"no scores found: expected judge-score's 'score'/'criteria' or flat fields {', '.join(SCORE_FIELDS)}")
    return out, failures, check.problems


def read_human(path: str, scale: Scale) -> tuple[dict[str, HumanRecord], list[Problem]]:
    records = read_records(path)
    if any(isinstance(r, dict) and "human_scores" in r for r in records):
        try:
            return _from_annotations(path, scale), []
        except InputError as err:
            return {}, err.problems
    return _from_flat(path, records, scale)


def _from_annotations(path: str, scale: Scale) -> dict[str, HumanRecord]:
    out: dict[str, HumanRecord] = {}
    for a in load_annotations(path, scale=scale.bounds):
        # Images the judge is shown (question and answer), counted as judge-score's n_images counts them.
        human = out.setdefault(a.id, HumanRecord({}, a.model, a.category, sum(len(s.text or "") for s in a.answer), len(a.images())))
        for name, value in a.human_scores.given().items():
            human.ratings.setdefault(name, []).append(value)
    return out


def _from_flat(path: str, records: list, scale: Scale) -> tuple[dict[str, HumanRecord], list[Problem]]:
    check = _Checker(path, scale)
    out: dict[str, HumanRecord] = {}
    seen: dict[tuple, tuple[int, dict]] = {}  # (id, annotator) -> (index, scores)
    for index, r in enumerate(records):
        if (rid := check.record_id(r, index)) is None:
            continue
        if not any(name in r for name in SCORE_FIELDS):
            check.add(f"no score: give at least one of {', '.join(SCORE_FIELDS)}", index, rid)
            continue
        scores = {name: v for name in SCORE_FIELDS if (v := check.score(r.get(name), index, rid, name)) is not None}
        key = (rid, r.get("annotator"))
        if key in seen:
            if seen[key][1] != scores:
                check.add(f"duplicate id with different scores than record {seen[key][0]}; "
                          "if these are two annotators, give each record an 'annotator'", index, rid)
            continue  # an identical repeat counts once
        seen[key] = (index, scores)
        category = r.get("category") if isinstance(r.get("category"), str) else category_from_id(rid)
        human = out.setdefault(rid, HumanRecord({}, r.get("model"), category))
        for name, value in scores.items():
            human.ratings.setdefault(name, []).append(value)
    if not records:
        check.add("no records")
    return out, check.problems


def _first(ids: set[str]) -> list[str]:
    return sorted(ids)[:SHOWN_IDS]


def load_ratings(predictions: list[str], names: list[str], human_path: str, scale: Scale) -> Ratings:
    """Every file read and checked; one InputError listing every problem of every file."""
    problems: list[Problem] = []
    try:
        human, found = read_human(human_path, scale)
        problems += found
    except InputError as err:
        human, problems = {}, problems + err.problems
    judges, coverage = {}, {}
    for name, path in zip(names, predictions):
        try:
            records, failures, found = read_predictions(path, scale)
        except InputError as err:
            problems += err.problems
            continue
        problems += found
        ids, human_ids = set(records), set(human)
        if human and records and not ids & human_ids:
            problems.append(Problem(path, f"no id in common with {human_path} (first ids here: {_first(ids)}; there: {_first(human_ids)})"))
        judges[name] = records
        coverage[name] = Coverage(
            predictions=path, records=len(records), shared_ids=len(ids & human_ids),
            only_in_predictions=len(ids - human_ids), only_in_predictions_first=_first(ids - human_ids),
            only_in_human=len(human_ids - ids), only_in_human_first=_first(human_ids - ids), parse_failures=failures,
        )
    if problems:
        raise InputError(problems)
    return Ratings(judges, human, coverage)


def coverage_notes(ratings: Ratings, human_path: str) -> list[str]:
    """What was left out, in words, for the report and the terminal."""
    notes = []
    for name, c in ratings.coverage.items():
        if c.only_in_predictions:
            more = " ..." if c.only_in_predictions > SHOWN_IDS else ""
            notes.append(f"{name}: {c.only_in_predictions} id(s) only in {c.predictions}, left out: {', '.join(c.only_in_predictions_first)}{more}")
        if c.only_in_human:
            more = " ..." if c.only_in_human > SHOWN_IDS else ""
            notes.append(f"{name}: {c.only_in_human} id(s) only in {human_path} (not scored), left out: {', '.join(c.only_in_human_first)}{more}")
        if c.parse_failures:
            notes.append(f"{name}: {c.parse_failures} parse failure(s) (null score) left out of the statistics")
    return notes
