"""Reading judge predictions and human scores, and lining them up by id.

Predictions: judge-score's records (`score`, `criteria`, `expected_score`, ...) or any JSON list with
`id` and flat criterion fields (`overall`, `text_quality`, ...). Human scores: annotation records
(`human_scores`; several annotators per id allowed), with their sample or without it (`{id, human_scores,
annotator?}`), or a flat `{id, overall, ..., annotator?}` list.
Either side may be a benchmark's scored file, read by its format's owner in `judge/formats/`: an Inst-It
Bench evaluate log (an item per record: id = question_id, overall = score, category = split) or a
MEGA-Bench scored file, GPT-4o's or judge-score's data_with_scores_open.json (a query per record: id
`<task_name>/<k>` as judge-score names it, overall = the judge's N of 0-10, so compare with --scale 0 10,
category = the task). An item the file marks unscored (Inst-It's `valid: false`; MEGA-Bench's -1 or
"Score is NULL") stays an id without a score, so that it is counted and named in the notes but never
compared.

The human reference value of an id is the mean of its annotators' scores; the individual scores are
kept for the human-human ceiling.

One rule for repeated records, in every file: a record is keyed by its id (in a human file, by id and
`annotator`); the same key with the same scores again counts once (a file concatenated twice), the same
key with other scores is an error. Two annotators of one id are two records with different `annotator`s.

Every problem of every file is collected and raised as one InputError; ids on one side only are not an
error (they are counted in `Coverage`) unless no id is shared at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import BaseModel, ValidationError

from mmjudge.judge.data import (
    CRITERIA,
    SCORE_FIELDS,
    Annotation,
    NAME_ANNOTATORS,
    InputError,
    Problem,
    category_from_id,
    read_json,
    record_id_of,
    validation_problems,
)
from mmjudge.judge.formats import scored_format
from mmjudge.judge.formats.base import ScoredFile
from mmjudge.judge.parsing import ScoreScale

SHOWN_IDS = 5  # ids listed by name when some are on one side only
# Score distributions are accepted with their probabilities rounded to this many decimals or more (files people
# write round to 4-6), and renormalised: each level's rounding moves the sum by at most half a unit of its last
# decimal. At 1e-6, 247 of 600 records rounded to 6 decimals were refused.
DISTRIBUTION_DECIMALS = 4


@dataclass
class JudgeRecord:
    scores: dict[str, float]  # criterion -> score, "overall" included; a null score is absent
    expected_score: float | None
    model: str | None
    category: str | None
    n_images: int | None
    score_distribution: dict[str, float] | None = None  # level -> probability, as judge-score writes it (checked, renormalised)
    written_score: float | None = None  # the overall score as written, whichever value --overall compares
    judge_fingerprint: str | None = None  # which judge and rubric scored it, as judge-score writes them (judge/identity.py)
    rubric_fingerprint: str | None = None


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
    overall_field: str = "score"  # what the overall score is read from: judge-score's score, or expected_score (--overall)
    invalid: int = 0  # items of a benchmark's scored file that it marks unscored
    invalid_first: list[str] = []
    invalid_means: str = ""  # how that benchmark marks them, in words


@dataclass
class Ratings:
    judges: dict[str, dict[str, JudgeRecord]]  # judge name -> id -> record
    human: dict[str, HumanRecord]
    coverage: dict[str, Coverage]
    human_invalid: list[str] = field(default_factory=list)  # ids the human file (a benchmark's scored file) marks unscored
    human_invalid_means: str = ""


@dataclass
class PredictionsFile:
    records: dict[str, JudgeRecord]
    parse_failures: int
    invalid: list[str]  # ids a benchmark's scored file marks unscored
    problems: list[Problem]
    invalid_means: str = ""


@dataclass
class HumanFile:
    records: dict[str, HumanRecord]
    invalid: list[str]  # ids a benchmark's scored file marks unscored
    problems: list[Problem]
    invalid_means: str = ""


class _Checker:
    """Collects problems of one file while its values are read."""

    def __init__(self, path: str, scale: ScoreScale):
        self.path, self.scale, self.problems = path, scale, []
        self.first: dict[tuple, tuple[int, object]] = {}  # key of a record -> (index, its scores)

    def add(self, message: str, index: int | None = None, record_id: str | None = None, field: str | None = None) -> None:
        self.problems.append(Problem(self.path, message, index, record_id, field))

    def score(self, value, index: int, record_id: str, field: str) -> float | None:
        """A score on the scale, or None for null; anything else is a problem."""
        if value is None:
            return None
        if (problem := self.scale.problem(value)) is not None:
            self.add(problem, index, record_id, field)
            return None
        return float(value)

    def distribution(self, value, index: int, record_id: str) -> dict[str, float] | None:
        """judge-score's score_distribution, {level: probability}, checked; null is none."""
        if value is None:
            return None
        where = "score_distribution"
        if not isinstance(value, dict):
            self.add(f"must be an object of level: probability, got {type(value).__name__}", index, record_id, where)
            return None
        if not self.scale.integral:
            self.add(f"a score distribution is read on a scale of whole numbers in steps of 1, not {self.scale}", index, record_id, where)
            return None
        levels = [str(level) for level in self.scale.levels]
        if unknown := [k for k in value if k not in levels]:
            self.add(f"{', '.join(map(repr, unknown))} is no level of the scale {self.scale}", index, record_id, where)
            return None
        if bad := [k for k, p in value.items() if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1]:
            self.add(f"the probability of {bad[0]!r} must be a number in 0-1, got {value[bad[0]]!r}", index, record_id, where)
            return None
        total, tolerance = sum(value.values()), len(levels) * 0.5 * 10.0 ** -DISTRIBUTION_DECIMALS
        if not abs(total - 1) <= tolerance * (1 + 1e-9):  # the factor: the sum's own float error at the bound
            self.add(f"the probabilities add up to {total:.10g}, not 1 (within {tolerance:g}, the rounding of {len(levels)} levels "
                     f"to {DISTRIBUTION_DECIMALS} decimals)", index, record_id, where)
            return None
        return {level: p / total for level, p in value.items()}

    def text(self, record: dict, key: str, index: int, record_id: str) -> str | None:
        """An optional string field; another type is a problem (a number would not sort with the names)."""
        value = record.get(key)
        if value is None or isinstance(value, str):
            return value
        self.add(f"must be a string, got {value!r}", index, record_id, key)
        return None

    def first_time(self, key: tuple, scores: object, index: int, record_id: str, hint: str = "") -> bool:
        """The repeat rule (module docstring): True for a new key; an identical repeat is False, a differing one a problem."""
        if key not in self.first:
            self.first[key] = (index, scores)
            return True
        if self.first[key][1] != scores:
            what = "id" if len(key) == 1 or key[1] is None else f"id and annotator {key[1]!r}"
            self.add(f"duplicate {what} with different scores than record {self.first[key][0]}{hint}", index, record_id)
        return False

    def record_id(self, record, index: int) -> str | None:
        if not isinstance(record, dict):
            self.add(f"a record must be an object, got {type(record).__name__}", index)
        elif isinstance(record.get("id"), (str, int)) and not isinstance(record.get("id"), bool):
            return str(record["id"])
        else:
            self.add("a record needs an 'id' (a string)", index)
        return None


@dataclass(frozen=True)
class RawScore:
    field: str  # where it was read, as written in the file: "score", "criteria.text_quality", "overall"
    value: object


def _raw_judge_scores(record: dict, check: _Checker, index: int, rid: str) -> dict[str, RawScore]:
    """Criterion -> raw value, from judge-score's layout (`score`, `criteria`) or flat fields; two fields
    for one criterion (`score` and `overall`) must agree."""
    found = [(name, name, record[name]) for name in SCORE_FIELDS if name in record]
    if "score" in record:
        found.append(("overall", "score", record["score"]))
    criteria = record.get("criteria")
    if isinstance(criteria, dict):
        found += [(name, f"criteria.{name}", criteria[name]) for name in CRITERIA if name in criteria]
    elif criteria is not None:
        check.add(f"must be an object, got {type(criteria).__name__}", index, rid, "criteria")
    raw: dict[str, RawScore] = {}
    for criterion, name, value in found:
        if criterion in raw and raw[criterion].value != value:
            check.add(f"{value!r} disagrees with {raw[criterion].field} = {raw[criterion].value!r}", index, rid, name)
        raw.setdefault(criterion, RawScore(name, value))
    return raw


def _read_content(path: str, content: list | dict | None = None) -> list | dict:
    """A JSON list of records or JSONL, or (a JSON object) a benchmark's scored file; or `content`, those
    records given in memory (the Python API) and named `path`."""
    if content is None:
        content = read_json(path)  # which names a missing, empty or broken file
    if isinstance(content, list) or scored_format(content) is not None:
        return content
    found = "a JSON object that is no benchmark's scored file" if isinstance(content, dict) else "neither a JSON list nor an object"
    raise InputError([Problem(path, f"{found}: expected a JSON list of records, JSONL, an Inst-It evaluate log ('model_predictons') "
                                    "or a MEGA-Bench scored file ('data': [tasks])")])


def _scored_items(path: str, content: dict, scale: ScoreScale) -> ScoredFile:
    scored = scored_format(content).read_scores(path, content, scale)
    if scored.items and all(item.score is None for item in scored.items):
        scored.problems.append(Problem(path, f"every item is {scored.unscored}: no score to compare", field=scored.where))
    return scored


def read_predictions(path: str, scale: ScoreScale, content: list | dict | None = None) -> PredictionsFile:
    content = _read_content(path, content)
    if isinstance(content, dict):
        return _predictions_from_log(path, content, scale)
    check = _Checker(path, scale)
    out: dict[str, JudgeRecord] = {}
    unscored: list[tuple[int, str]] = []  # (index, id) of records without any score field
    scored_any, failures = False, 0
    for index, r in enumerate(content):
        if (rid := check.record_id(r, index)) is None:
            continue
        raw = _raw_judge_scores(r, check, index, rid)
        scored_any |= bool(raw)
        if not raw:
            unscored.append((index, rid))
        scores = {k: s for k, v in raw.items() if (s := check.score(v.value, index, rid, v.field)) is not None}
        expected = check.score(r.get("expected_score"), index, rid, "expected_score")
        distribution = check.distribution(r.get("score_distribution"), index, rid)
        if not check.first_time((rid,), (scores, expected), index, rid):
            continue
        failures += "overall" in raw and raw["overall"].value is None
        n_images = r.get("n_images")
        out[rid] = JudgeRecord(
            scores=scores,
            expected_score=expected,
            model=check.text(r, "model", index, rid),
            category=check.text(r, "category", index, rid) or category_from_id(rid),
            n_images=n_images if isinstance(n_images, int) and not isinstance(n_images, bool) else None,
            score_distribution=distribution,
            written_score=scores.get("overall"),
            judge_fingerprint=check.text(r, "judge_fingerprint", index, rid),
            rubric_fingerprint=check.text(r, "rubric_fingerprint", index, rid),
        )
    if not content:
        check.add("no records")
    elif not scored_any:
        check.add(f"no scores found: expected judge-score's 'score'/'criteria' or flat fields {', '.join(SCORE_FIELDS)}")
    else:
        for index, rid in unscored:
            check.add(f"no score: expected judge-score's 'score' or a flat field ({', '.join(SCORE_FIELDS)})", index, rid)
    return PredictionsFile(out, failures, [], check.problems)


def _predictions_from_log(path: str, log: dict, scale: ScoreScale) -> PredictionsFile:
    scored = _scored_items(path, log, scale)
    records = {i.id: JudgeRecord({} if i.score is None else {"overall": i.score}, None, None, i.group, None) for i in scored.items}
    return PredictionsFile(records, 0, [i.id for i in scored.items if i.score is None], scored.problems, scored.unscored)


def read_human(path: str, scale: ScoreScale, content: list | dict | None = None) -> HumanFile:
    content = _read_content(path, content)
    if isinstance(content, dict):
        return _human_from_log(path, content, scale)
    if any(isinstance(r, dict) and "human_scores" in r for r in content):
        return _from_annotations(path, content, scale)
    return _from_flat(path, content, scale)


def _human_from_log(path: str, log: dict, scale: ScoreScale) -> HumanFile:
    """One annotator (the file's judge) per id."""
    scored = _scored_items(path, log, scale)
    records = {i.id: HumanRecord({} if i.score is None else {"overall": [i.score]}, None, i.group) for i in scored.items}
    return HumanFile(records, [i.id for i in scored.items if i.score is None], scored.problems, scored.unscored)


def _from_annotations(path: str, records: list, scale: ScoreScale) -> HumanFile:
    """Annotation records. One with neither question nor answer is a rating only (`{id, human_scores,
    annotator}`, as annotation tools export them): read as a flat record is, its scores inside
    `human_scores`, so that what needs the answer (its length, its images) is unknown for it."""
    check = _Checker(path, scale)
    out: dict[str, HumanRecord] = {}
    for index, r in enumerate(records):
        if isinstance(r, dict) and not {"question", "answer"} & r.keys():
            _add_rating(r, r.get("human_scores"), "human_scores.", index, check, out)
            continue
        try:
            a = Annotation.model_validate(r)
        except ValidationError as err:
            check.problems += validation_problems(path, index, record_id_of(r), err)
            continue
        scores = {name: s for name, v in a.human_scores.given().items() if (s := check.score(v, index, a.id, f"human_scores.{name}")) is not None}
        if not check.first_time((a.id, a.annotator), scores, index, a.id, NAME_ANNOTATORS if a.annotator is None else ""):
            continue
        human = out.setdefault(a.id, HumanRecord({}, a.model, a.category))
        if human.answer_chars is None:  # the first record of this id with its sample gives them
            # Images the judge is shown (question and answer), counted as judge-score's n_images counts them.
            human.answer_chars, human.n_images = sum(len(s.text or "") for s in a.answer), len(a.images())
        for name, value in scores.items():
            human.ratings.setdefault(name, []).append(value)
    return HumanFile(out, [], sorted(check.problems, key=lambda p: p.index or 0))


def _from_flat(path: str, records: list, scale: ScoreScale) -> HumanFile:
    check = _Checker(path, scale)
    out: dict[str, HumanRecord] = {}
    for index, r in enumerate(records):
        _add_rating(r, r, "", index, check, out)
    if not records:
        check.add("no records")
    return HumanFile(out, [], check.problems)


def _add_rating(record, scores, where: str, index: int, check: _Checker, out: dict[str, HumanRecord]) -> None:
    """One record of a person's scores without the sample, `scores` read at `where` in it (the record
    itself, or its `human_scores.`), added to `out` under its id; every problem goes to `check`."""
    if (rid := check.record_id(record, index)) is None:
        return
    if where and not isinstance(scores, dict):
        check.add(f"must be an object of criterion: score, got {type(scores).__name__}", index, rid, where.rstrip("."))
        return
    if not any(name in scores for name in SCORE_FIELDS):
        check.add(f"no score: give at least one of {', '.join(SCORE_FIELDS)}", index, rid, where.rstrip(".") or None)
        return
    if where and (unknown := sorted(set(scores) - set(SCORE_FIELDS))):
        check.add(f"unknown criterion {', '.join(map(repr, unknown))}; the criteria are {', '.join(SCORE_FIELDS)}", index, rid, where.rstrip("."))
    values = {name: v for name in SCORE_FIELDS if (v := check.score(scores.get(name), index, rid, where + name)) is not None}
    annotator = check.text(record, "annotator", index, rid)
    if not check.first_time((rid, annotator), values, index, rid, NAME_ANNOTATORS if annotator is None else ""):
        return
    category = check.text(record, "category", index, rid) or category_from_id(rid)
    human = out.setdefault(rid, HumanRecord({}, check.text(record, "model", index, rid), category))
    for name, value in values.items():
        human.ratings.setdefault(name, []).append(value)


def _first(ids: set[str]) -> list[str]:
    return sorted(ids)[:SHOWN_IDS]


def unscored(name: str, ratings: Ratings) -> int:
    """How many of a judge's records have a null overall score: parse failures, or, comparing expected
    scores, records without one."""
    c = ratings.coverage[name]
    if c.overall_field == "expected_score":
        return sum(r.expected_score is None for r in ratings.judges[name].values())
    return c.parse_failures


def _unparsed(name: str, ratings: Ratings) -> str:
    """Why a judge's records on the shared ids score nothing, where that is because none parsed; and the way
    out where they have expected scores."""
    shared = [r for rid, r in ratings.judges[name].items() if rid in ratings.human]
    c = ratings.coverage[name]
    if not shared or any(r.scores for r in shared) or unscored(name, ratings) < len(shared):
        return ""
    why = f"; every one of the {len(shared)} record(s) of {c.predictions} on them has a null {c.overall_field}"
    if c.overall_field == "score" and all(r.expected_score is not None for r in shared):
        why += ": compare their expected_score with --overall expected_score"
    return why


def expected_as_overall(ratings: Ratings) -> Ratings:
    """Each judge's overall value is its expected score (judge-score's probability-weighted score): finer
    than the written score, and defined where the judge's text did not parse."""
    judges = {
        name: {rid: replace(r, scores={k: v for k, v in r.scores.items() if k != "overall"}
                            | ({"overall": r.expected_score} if r.expected_score is not None else {}))
               for rid, r in records.items()}
        for name, records in ratings.judges.items()
    }
    coverage = {name: c.model_copy(update={"overall_field": "expected_score"}) for name, c in ratings.coverage.items()}
    return replace(ratings, judges=judges, coverage=coverage)


def load_ratings(predictions: list[str | Path | list], names: list[str], human: str | Path | list, scale: ScoreScale) -> Ratings:
    """Every file read and checked; one InputError listing every problem of every file. A file may also be
    its records, given in memory (the Python API), named by its judge's name (or "human") in messages."""
    human_path, human_records = source_name(human, "human")
    try:
        human = read_human(human_path, scale, human_records)
    except InputError as err:
        human = HumanFile({}, [], err.problems)
    problems: list[Problem] = list(human.problems)
    judges, coverage = {}, {}
    for name, source in zip(names, predictions):
        path, records = source_name(source, name)
        try:
            found = read_predictions(path, scale, records)
        except InputError as err:
            problems += err.problems
            continue
        problems += found.problems
        ids, human_ids = set(found.records), set(human.records)
        if human.records and found.records and not ids & human_ids:
            problems.append(Problem(path, f"no id in common with {human_path} (first ids here: {_first(ids)}; there: {_first(human_ids)})"))
        judges[name] = found.records
        coverage[name] = Coverage(
            predictions=path, records=len(found.records), shared_ids=len(ids & human_ids),
            only_in_predictions=len(ids - human_ids), only_in_predictions_first=_first(ids - human_ids),
            only_in_human=len(human_ids - ids), only_in_human_first=_first(human_ids - ids), parse_failures=found.parse_failures,
            invalid=len(found.invalid), invalid_first=_first(set(found.invalid)), invalid_means=found.invalid_means,
        )
    if problems:
        raise InputError(problems)
    return Ratings(judges, human.records, coverage, human.invalid, human.invalid_means)


def source_name(source: str | Path | list, name: str) -> tuple[str, list | None]:
    """How messages and the report name a file, or records given in memory; and those records."""
    if isinstance(source, (str, Path)):
        return str(source), None
    return f"{name} (records)", source


def compared_criteria(ratings: Ratings, requested: list[str] | None, human_path: str) -> list[str]:
    """The criteria to report: those asked for, or by default every one that some judge and the human file
    both scored on a shared id (in SCORE_FIELDS order). A criterion with no such id is an error, not a
    report of empty tables."""
    found = [c for c in SCORE_FIELDS
             if any(c in record.scores and c in ratings.human[rid].ratings for judge in ratings.judges.values()
                    for rid, record in judge.items() if rid in ratings.human)]
    if requested is None:
        if not found:
            raise InputError([Problem(human_path, "no criterion is scored both here and in the predictions on a shared id"
                                      + "".join(_unparsed(name, ratings) for name in ratings.judges))])
        return found
    if missing := [c for c in requested if c not in found]:
        raise InputError([Problem(human_path, f"--criteria {c}: no shared id is scored on it both here and in the predictions") for c in missing])
    return list(dict.fromkeys(requested))  # a criterion named twice is reported once


def _listed(count: int, first: list[str]) -> str:
    return ", ".join(first) + (" ..." if count > SHOWN_IDS else "")


def fitted_identity(records: dict[str, JudgeRecord]) -> tuple[str | None, dict[str, str] | None]:
    """The judge (its fingerprint) and the rubric of each category that scored all these records, as a
    calibrator fitted on them records it; None where a record does not say, or they do not agree."""
    judges = {r.judge_fingerprint for r in records.values()}
    rubrics = {(r.category, r.rubric_fingerprint) for r in records.values()}
    categories = [category for category, _ in rubrics]
    one_each = rubrics and all(None not in pair for pair in rubrics) and len(set(categories)) == len(categories)
    return judges.pop() if len(judges) == 1 else None, dict(sorted(rubrics)) if one_each else None


def coverage_notes(ratings: Ratings, human_path: str) -> list[str]:
    """What was left out, in words, for the report and the terminal."""
    notes = []
    if ratings.human_invalid:
        count = len(ratings.human_invalid)
        notes.append(f"{count} item(s) of {human_path} {ratings.human_invalid_means}, left out: {_listed(count, _first(set(ratings.human_invalid)))}")
    for name, c in ratings.coverage.items():
        if c.only_in_predictions:
            notes.append(f"{name}: {c.only_in_predictions} id(s) only in {c.predictions}, left out of the agreement statistics; "
                         f"the benchmark scores (PPI++) use those it scored: {_listed(c.only_in_predictions, c.only_in_predictions_first)}")
        if c.only_in_human:
            notes.append(f"{name}: {c.only_in_human} id(s) only in {human_path} (not scored), left out: {_listed(c.only_in_human, c.only_in_human_first)}")
        if left_out := unscored(name, ratings):
            notes.append(f"{name}: {left_out} record(s) with a null {c.overall_field}"
                         f"{' (parse failures)' if c.overall_field == 'score' else ''} left out of the statistics")
        if c.invalid:
            notes.append(f"{name}: {c.invalid} item(s) of {c.predictions} {c.invalid_means}, left out: {_listed(c.invalid, c.invalid_first)}")
        if len(judges := {r.judge_fingerprint for r in ratings.judges[name].values()} - {None}) > 1:
            notes.append(f"{name}: the records of {c.predictions} come from {len(judges)} judges (judge_fingerprint {', '.join(sorted(judges))}): "
                         "its calibrator names none of them")
    return notes
