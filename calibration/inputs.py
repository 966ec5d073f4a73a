"""Reading judge predictions and human scores into aligned, per-criterion arrays.

Predictions: judge-score's records (`score`, `criteria`, `expected_score`, ...) or any JSON list with
`id` and flat criterion fields. Human scores: annotation records (`human_scores`, several annotators per
id allowed) or a flat `{id, overall, ...}` list. Several annotators of one id are averaged for the
reference value; their individual scores are kept for the human-human ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from judge.data import SCORE_FIELDS, InputError, Problem, load_annotations, read_records


@dataclass
class JudgeRecord:
    scores: dict[str, float]  # criterion -> score (overall included)
    expected_score: float | None
    model: str | None
    category: str | None
    n_images: int | None
    parse_failed: bool


@dataclass
class HumanRecord:
    ratings: dict[str, list[float]]  # criterion -> one score per annotator
    annotators: list[str | None]
    model: str | None = None
    category: str | None = None
    answer_chars: int | None = None
    n_images: int | None = None

    def mean(self, criterion: str) -> float | None:
        values = self.ratings.get(criterion)
        return sum(values) / len(values) if values else None


@dataclass
class Ratings:
    judges: dict[str, dict[str, JudgeRecord]]  # judge name -> id -> record
    human: dict[str, HumanRecord]
    notes: list[str] = field(default_factory=list)  # ids on one side only, parse failures, ...


def _number(value, path: str, index: int, record_id, name: str, scale, problems: list[Problem]) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(Problem(path, f"{value!r} is not a number", index, record_id, name))
        return None
    if not scale[0] <= value <= scale[1]:
        problems.append(Problem(path, f"{value:g} is outside the scale {scale[0]:g}-{scale[1]:g}", index, record_id, name))
        return None
    return float(value)


def read_predictions(path: str | Path, scale: tuple[float, float]) -> dict[str, JudgeRecord]:
    path, records, problems = str(path), read_records(path), []
    out: dict[str, JudgeRecord] = {}
    for index, r in enumerate(records):
        if not isinstance(r, dict) or "id" not in r:
            problems.append(Problem(path, "a record needs an 'id'", index))
            continue
        rid = str(r["id"])
        raw = {"overall": r.get("score", r.get("overall")), **(r.get("criteria") or {})}
        raw |= {k: r[k] for k in SCORE_FIELDS if k in r and k != "overall"}
        scores = {k: v for k in SCORE_FIELDS if (v := _number(raw.get(k), path, index, rid, k, scale, problems)) is not None}
        expected = r.get("expected_score")
        record = JudgeRecord(scores, float(expected) if isinstance(expected, (int, float)) else None, r.get("model"),
                             r.get("category"), r.get("n_images"), r.get("parse_error") is not None)
        if rid in out and out[rid].scores != record.scores:
            problems.append(Problem(path, "duplicate id with different scores", index, rid))
        out[rid] = record
    if problems:
        raise InputError(problems)
    return out


def read_human(path: str | Path, scale: tuple[float, float]) -> dict[str, HumanRecord]:
    records = read_records(path)
    if any(isinstance(r, dict) and "human_scores" in r for r in records):
        return _from_annotations(path, scale)
    return _from_flat(str(path), records, scale)


def _from_annotations(path, scale) -> dict[str, HumanRecord]:
    out: dict[str, HumanRecord] = {}
    for a in load_annotations(path, scale=scale):
        answer_chars = sum(len(s.text or "") for s in a.answer)
        n_images = sum(s.image is not None for s in a.answer)
        human = out.setdefault(a.id, HumanRecord({}, [], a.model, a.category, answer_chars, n_images))
        human.annotators.append(a.annotator)
        for name, value in a.human_scores.given().items():
            human.ratings.setdefault(name, []).append(value)
    return out


def _from_flat(path: str, records: list, scale) -> dict[str, HumanRecord]:
    out: dict[str, HumanRecord] = {}
    problems: list[Problem] = []
    seen: dict[tuple, int] = {}
    for index, r in enumerate(records):
        if not isinstance(r, dict) or "id" not in r:
            problems.append(Problem(path, "a record needs an 'id'", index))
            continue
        rid, annotator = str(r["id"]), r.get("annotator")
        if (rid, annotator) in seen:
            problems.append(Problem(path, f"duplicate id (same as record {seen[rid, annotator]}); give each annotator's rating an 'annotator'", index, rid))
            continue
        seen[rid, annotator] = index
        human = out.setdefault(rid, HumanRecord({}, [], r.get("model"), r.get("category")))
        human.annotators.append(annotator)
        for name in SCORE_FIELDS:
            if (value := _number(r.get(name), path, index, rid, name, scale, problems)) is not None:
                human.ratings.setdefault(name, []).append(value)
    if problems:
        raise InputError(problems)
    return out


def load_ratings(predictions: list[str], names: list[str], human_path: str, scale) -> Ratings:
    human = read_human(human_path, scale)
    judges = {name: read_predictions(path, scale) for name, path in zip(names, predictions)}
    notes = []
    for name, path in zip(names, predictions):
        ids = set(judges[name])
        only_judge, only_human = sorted(ids - set(human)), sorted(set(human) - ids)
        if not ids & set(human):
            raise InputError([Problem(path, f"no id in common with {human_path}")])
        for side, missing in ((f"only in {path}", only_judge), (f"only in {human_path} (not scored by {name})", only_human)):
            if missing:
                notes.append(f"{len(missing)} id(s) {side}, left out: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        if failed := sum(r.parse_failed for r in judges[name].values()):
            notes.append(f"{name}: {failed} parse failure(s) have no score and are left out")
    return Ratings(judges, human, notes)
