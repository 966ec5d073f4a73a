"""The interleaved data model: segments, samples, annotations, judge results, and their loaders.

Every command reads its input through `load_samples` or `load_annotations`, which validate the whole
file and raise one `InputError` that lists every problem (file, record, field), so a user fixes a
dataset in one pass instead of one crash at a time.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Annotated, Literal
from pathlib import Path
from PIL import Image
from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, field_validator, model_validator, model_serializer

from mmjudge.judge.parquet import UnreadableParquet, read_parquet
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.vision import image_problem

CRITERIA = ("text_quality", "image_quality", "text_image_coherence", "style_consistency")
SCORE_FIELDS = ("overall", *CRITERIA)
CATEGORIES = ("SA", "PBL", "MSR")  # MMIE's; other benchmarks' samples name their rubric's category
# A preference between two answers: A, B, or neither (a tie). In a pair's terms, whatever order the judge saw them in.
VERDICTS = ("A", "B", "tie")
Verdict = Literal["A", "B", "tie"]
GENERAL = "general"  # the category of a pair that names none (and whose id names no MMIE category)


IMAGE_PLACEHOLDER = "<image>"  # where the judge's prompt puts an image (InternVL's chat protocol)


# A text of 500,000 characters is some 125,000 tokens, the whole context of an InternVL2 judge; no text of
# MMIE, MileBench, Inst-It or MEGA-Bench comes near it. Beyond it the prompt could not be judged, and its
# attention alone would take more memory than any machine has.
MAX_TEXT_CHARS = 500_000


def judgeable_length(text: str) -> str:
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"{len(text):,} characters, more than the {MAX_TEXT_CHARS:,} a judge's context can hold")
    return text


# Text of a sample that goes into the judge's prompt: it must fit a judge's context. What it spells is read as
# text, `<image>` and special tokens included (judge.prompts).
JudgeText = Annotated[str, AfterValidator(judgeable_length)]


class Segment(BaseModel):
    """One piece of an interleaved message: a text, an image path, or both (text first)."""

    model_config = ConfigDict(extra="forbid")
    text: JudgeText | None = None
    image: str | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> Segment:
        if self.text is None and self.image is None:
            raise ValueError("a segment needs 'text' or 'image'")
        return self


def _as_segments(value: object) -> object:
    # MMIE answers from text-only models are plain strings; treat them as one text segment.
    if isinstance(value, str):
        return [{"text": value}]
    return value


def _as_read(record: dict, interleaved: tuple[str, ...]) -> dict:
    """A record's id as a string (a number is an id; `true` is none), and its interleaved fields as segments."""
    record = dict(record)
    if isinstance(record.get("id"), int) and not isinstance(record["id"], bool):
        record["id"] = str(record["id"])
    for key in interleaved:
        if key in record:
            record[key] = _as_segments(record[key])
    return record


def category_from_id(sample_id: str) -> str | None:
    """MMIE names a sample's category inside its id (e.g. `SA_0012`); None if no single one does."""
    tokens = {part.upper() for part in _split_alnum(sample_id)}
    found = [c for c in CATEGORIES if c in tokens]
    if len(found) != 1:
        found = [c for c in CATEGORIES if c in sample_id.upper()]
    return found[0] if len(found) == 1 else None


def _split_alnum(text: str) -> list[str]:
    parts, current = [], []
    for ch in text:
        if ch.isalpha():
            current.append(ch)
        elif current:
            parts.append("".join(current))
            current = []
    if current:
        parts.append("".join(current))
    return parts


class Sample(BaseModel):
    """An interleaved question and one model's answer, in MMIE's field names."""

    model_config = ConfigDict(extra="ignore")
    id: str
    question: list[Segment]
    answer: list[Segment]
    model: str | None = None
    gt_answer: list[Segment] | None = None
    category: str  # which rubric judges it

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        data = _as_read(data, ("question", "answer", "gt_answer"))
        if data.get("category") is None and isinstance(data.get("id"), str):
            data["category"] = category_from_id(data["id"])
        if data.get("category") is None:
            data.pop("category", None)
        elif isinstance(data["category"], str) and data["category"].upper() in CATEGORIES:
            data["category"] = data["category"].upper()  # MMIE's names, however written; others are rubric keys
        return data

    def images(self) -> list[str]:
        """Image paths in prompt order: question first, then answer (the reference answer is text-only
        in MMIE's prompt, so its images are not shown to the judge)."""
        return [s.image for s in self.question + self.answer if s.image is not None]


class HumanScores(BaseModel):
    model_config = ConfigDict(extra="forbid")
    overall: float | None = None
    text_quality: float | None = None
    image_quality: float | None = None
    text_image_coherence: float | None = None
    style_consistency: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _known(cls, value: object) -> object:
        if isinstance(value, dict) and (unknown := [key for key in value if key not in cls.model_fields]):
            raise ValueError(f"{', '.join(map(repr, unknown))}: not a criterion; the criteria are {', '.join(cls.model_fields)}")
        return value

    @model_validator(mode="after")
    def _some(self) -> HumanScores:
        if not self.given():
            raise ValueError(f"human_scores needs at least one of {', '.join(SCORE_FIELDS)}")
        return self

    def given(self) -> dict[str, float]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class Annotation(Sample):
    """A sample rated by a person: the unit `judge-train` learns from and `judge-calibrate` compares to."""

    human_scores: HumanScores
    feedback: str | None = None
    annotator: str | None = None

    @field_validator("human_scores", mode="before")
    @classmethod
    def _numbers(cls, value: object) -> object:
        if isinstance(value, dict):
            for key, score in value.items():
                if isinstance(score, bool) or (score is not None and not isinstance(score, (int, float))):
                    raise ValueError(f"{key} must be a number, got {score!r}")
        return value


def flip(verdict: str | None) -> str | None:
    """The same preference seen from the other order: A and B swap places, a tie stays a tie."""
    return {"A": "B", "B": "A"}.get(verdict, verdict)


def majority(verdicts: list[str | None]) -> str | None:
    """One verdict from several (an order's k sampled judgements, a pair's annotators): the one more than half
    of them give; a tie where none does; None where none gives a verdict at all."""
    given = [v for v in verdicts if v is not None]
    if not given:
        return None
    verdict, count = Counter(given).most_common(1)[0]
    return verdict if count * 2 > len(verdicts) else "tie"


NAME_ANNOTATORS = "; if these are two annotators, give each record an 'annotator'"


def repeated_preference(annotator: str | None) -> str:
    """The problem of a pair's record whose annotator (or, unnamed, whose id) gave another preference before."""
    if annotator is None:
        return f"duplicate id with another preference{NAME_ANNOTATORS}"
    return f"duplicate id and annotator {annotator!r} with another preference"


def people_majority(preferences: list[str | None]) -> str | None:
    """People's preference of a pair from its annotators' (each annotator once): the majority of those who gave
    one, a tie where they split; None where none did. An annotator without a preference casts no vote: with
    `majority`, A and a missing one were a tie."""
    return majority([p for p in preferences if p is not None])


def verdict_of(value: object) -> object:
    """A verdict as written in a file, normalised: "tie", "Tie" and "TIE" are one verdict; A and B are
    letters, written as the benchmarks write them. Anything else is left for validation to refuse."""
    if isinstance(value, str) and value.strip().lower() == "tie":
        return "tie"
    return value.strip().upper() if isinstance(value, str) and value.strip().upper() in ("A", "B") else value


class Pair(BaseModel):
    """A question and two answers to it, interleaved like a sample's, and what people preferred when they
    said: the unit of pairwise judging (judge-score) and of preference training and calibration.

    `preference` is the overall one, `criteria` one per criterion, each A, B or tie; `annotator` names who
    gave them (an annotated file repeats a pair once per annotator, as an annotation file repeats a sample),
    and `rationale` is why, when the data has it (judge-train learns it before the verdict). `group` is the
    benchmark's own grouping (a domain, a task), for per-group figures; `category` picks the rubric."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())  # model_a, model_b: a pair's fields, not pydantic's
    id: str
    question: list[Segment]
    answer_a: list[Segment]
    answer_b: list[Segment]
    model_a: str | None = None
    model_b: str | None = None
    category: str
    group: str | None = None
    preference: Verdict | None = None
    criteria: dict[str, Verdict] = {}
    annotator: str | None = None
    rationale: JudgeText | None = None

    @model_validator(mode="before")
    @classmethod
    def _fill(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        data = _as_read(data, ("question", "answer_a", "answer_b"))
        if "preference" in data:
            data["preference"] = verdict_of(data["preference"])
        if isinstance(data.get("criteria"), dict):
            data["criteria"] = {name: verdict_of(value) for name, value in data["criteria"].items()}
        if data.get("category") is None:
            data["category"] = (category_from_id(data["id"]) if isinstance(data.get("id"), str) else None) or GENERAL
        elif isinstance(data["category"], str) and data["category"].upper() in CATEGORIES:
            data["category"] = data["category"].upper()
        return data

    def answer(self, side: str) -> list[Segment]:
        return self.answer_a if side == "A" else self.answer_b

    def images(self) -> list[str]:
        """Image paths in the order a forward prompt shows them: question, answer A, answer B."""
        return [s.image for s in self.question + self.answer_a + self.answer_b if s.image is not None]

    def judged(self) -> dict:
        """What a judge is shown: the pair less what people said of it."""
        return self.model_dump(exclude={"preference", "criteria", "annotator", "rationale"})

    def as_sample(self, side: str) -> Sample:
        """One answer as a sample of its own, for a judge that scores answers one at a time (MMIE-Eval)."""
        return Sample(id=self.id, question=self.question, answer=self.answer(side), category=self.category,
                      model=self.model_a if side == "A" else self.model_b)


def finite_or_none(value):
    """A number or a distribution read from logits, or None where it holds what is no number (a float16
    overflow): that is no measurement, and JSON has no NaN (its bare NaN made eval_result.json unreadable
    to other parsers)."""
    values = value.values() if isinstance(value, dict) else [value]
    return value if all(v is None or math.isfinite(v) for v in values) else None


# The keys of a record that only a calibrator gives (judge-score --calibrator): without one, a record has
# exactly MMIE's documented keys.
CALIBRATOR_FIELDS = {"calibrated_score", "score_set", "escalate"}


class JudgeResult(BaseModel):
    """One scored sample as `judge-score` writes it."""

    model_config = ConfigDict(validate_assignment=True)  # the engine adds a forced reading's distribution later
    id: str
    model: str | None
    category: str
    feedback: str
    score: int | float | None
    criteria: dict[str, int | float | None]
    score_distribution: dict[str, float] | None = None
    expected_score: float | None = None
    reward: float | None = None  # a reward model's (judge-train --objective bradley_terry), which writes no score
    calibrated_score: float | None = None
    score_set: list[int | float] | None = None  # [lowest, highest] level of the calibrator's conformal set
    escalate: bool | None = None  # the calibrator's verdict: people should score this record
    parse_error: str | None = None
    truncated: list[str] = []
    n_images: int
    n_tiles: int | None  # None: a server that does not say how it tiled the images (judge-score --backend openai)
    prompt_tokens: int
    generated_tokens: int
    # Which judge and rubric scored it (judge/identity.py), so that a calibrator fitted on these records says
    # whose scores it maps; None where not known (a judge behind a server, whose weights are not visible).
    judge_fingerprint: str | None = None
    rubric_fingerprint: str | None = None

    @field_validator("score_distribution", "expected_score", "calibrated_score", "reward")
    @classmethod
    def _numbers_or_none(cls, value):
        return finite_or_none(value)

    @model_serializer(mode="wrap")
    def _reward_where_given(self, handler):
        # Only a reward model's records carry `reward`: a generative judge's keep exactly the keys they had.
        record = handler(self)
        if self.reward is None:
            record.pop("reward", None)
        return record

    @field_validator("score", "criteria")
    @classmethod
    def _finite_scores(cls, value):
        # A score the judge wrote is finite; a journal line with inf or NaN there (damaged, or written by hand)
        # is no result, and its sample is scored again.
        for score in value.values() if isinstance(value, dict) else [value]:
            if isinstance(score, float) and not math.isfinite(score):
                raise ValueError(f"{score} is not a finite score")
        return value


class OrderJudgement(BaseModel):
    """One judgement of a pair in one order. `first` is the answer the judge was shown first; `verdict` and
    `verdict_distribution` are in the pair's terms whatever the order (in the reverse order, the judge's
    "first answer is better" is B), and `label` is the verdict as the judge wrote it, in its rubric's own
    words and positions ("[[A]]" is "A", VL-RewardBench's "Answer 2" is "2", OpenING's "Tie(A)")."""

    model_config = ConfigDict(validate_assignment=True)
    first: Literal["A", "B"]
    feedback: str
    verdict: Verdict | None
    label: str | None
    criteria: dict[str, Verdict | None] = {}
    verdict_distribution: dict[str, float] | None = None
    parse_error: str | None = None
    truncated: list[str] = []
    n_tiles: int | None
    prompt_tokens: int
    generated_tokens: int

    @field_validator("verdict_distribution")
    @classmethod
    def _numbers_or_none(cls, value):
        return finite_or_none(value)


class PairResult(BaseModel):
    """One judged pair as judge-score writes it. A pairwise judge sees both orders (`forward`: A first;
    `reverse`: B first; one judgement each, or k when sampled); a pointwise judge scores each answer alone
    (`scores`) and prefers the one whose expected score is higher by more than the tie margin. `verdict` is
    the final one under `rule`, `verdict_distribution` its probabilities, and `swap_consistent` whether the
    two orders agree (None where an order gave no verdict)."""

    model_config = ConfigDict(protected_namespaces=())  # model_a, model_b: a pair's fields, not pydantic's
    id: str
    model_a: str | None
    model_b: str | None
    category: str
    group: str | None = None
    verdict: Verdict | None
    verdict_distribution: dict[str, float] | None = None
    rule: str
    swap_consistent: bool | None = None
    forward: list[OrderJudgement] = []
    reverse: list[OrderJudgement] = []
    scores: dict[str, JudgeResult] | None = None  # pointwise judges: "A" and "B"
    n_images: int
    judge_fingerprint: str | None = None  # which judge and rubric gave the verdicts (judge/identity.py), as a JudgeResult's
    rubric_fingerprint: str | None = None

    @field_validator("verdict_distribution")
    @classmethod
    def _numbers_or_none(cls, value):
        return finite_or_none(value)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one record, said so that the user can find and fix it."""

    file: str
    message: str
    index: int | None = None
    record_id: str | None = None
    field: str | None = None

    def __str__(self) -> str:
        where = [self.file]
        if self.index is not None:
            where.append(f"record {self.index}" + (f" (id {self.record_id!r})" if self.record_id else ""))
        elif self.record_id:
            where.append(f"id {self.record_id!r}")
        if self.field:
            where.append(self.field)
        return f"{': '.join(where)}: {self.message}"


class InputError(Exception):
    """Everything wrong with an input, found in one pass; `hint`: what the user can do about it, said after."""

    def __init__(self, problems: list[Problem], hint: str | None = None):
        self.problems = problems
        self.hint = hint
        shown = "\n  ".join(str(p) for p in problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        super().__init__(f"{len(problems)} problem(s) in the input:\n  {shown}{more}" + (f"\n{hint}" if hint else ""))


class UsageError(Exception):
    """A flag or setting the user gave that cannot work; the message says what to give instead."""


def missing_file(path: Path) -> str:
    """Why `path`, which is not a regular file, cannot be read as one: /dev/zero or a FIFO was "file not found"."""
    if not path.exists():
        return "file not found"
    return "a folder, not a file" if path.is_dir() else "not a regular file (a device, a FIFO or a socket); give a file"


def read_text(path: str | Path) -> str:
    """A user's text file, which must be UTF-8: an undecodable one is a problem naming the file and byte."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError([Problem(str(path), f"not UTF-8 text (byte {err.start}: {err.reason}); save it as UTF-8")]) from None


def read_json(path: str | Path, max_bytes: int | None = None) -> object:
    """The content of a JSON file, or of a JSONL file (`.jsonl`, one value per line) as a list; errors
    name the file and the line, or the record and field (see `value_problems`). A file of more than
    `max_bytes` is refused before it is read."""
    content, problems = load_json(path, max_bytes)
    if problems:
        raise InputError(problems)
    return content


# A settings file (a checkpoint's config.json, adapter_config.json or judge_config.json, a calibrator): kilobytes
# in real ones. Read whole, a JSON file takes about 3 times its size in memory: a 300 MB adapter_config.json took 1 GB.
MAX_SETTINGS_BYTES = 16 * 2**20


def load_json(path: str | Path, max_bytes: int | None = None) -> tuple[object, list[Problem]]:
    """`read_json`'s content and the problems of its values (a top-level list's index is the record), for
    a reader that sets those records aside (`--skip_invalid`); a file that cannot be read raises."""
    path = Path(path)
    if not path.is_file():
        raise InputError([Problem(str(path), missing_file(path))])
    if max_bytes is not None and (size := path.stat().st_size) > max_bytes:
        raise InputError([Problem(str(path), f"{size:,} bytes; a file of this kind holds a few kilobytes, and more than "
                                             f"{max_bytes:,} is refused unread")])
    text = read_text(path)
    if not text.strip():
        raise InputError([Problem(str(path), "file is empty")])
    strings = _SURROGATE_ESCAPE.search(text) is not None  # only then can a string hold a lone surrogate
    if path.suffix != ".jsonl":
        content = _loads(text, path)
        return content, [_located(path, where, message) for where, message in value_problems(content, strings)]
    records, problems, unreadable = [], [], []
    # Lines end at "\n" only: JSON strings may hold U+2028, U+2029 or U+0085 unescaped, where splitlines
    # would cut a record in two.
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            record = _loads(line, path, lineno)
        except InputError as err:
            unreadable += err.problems
            continue
        problems += [_located(path, (len(records), *where), message) for where, message in value_problems(record, strings)]
        records.append(record)
    if unreadable:
        raise InputError(unreadable)
    return records, problems


@dataclass(frozen=True)
class _NotANumber:
    """A number that Python's json module reads and JSON does not have (NaN, Infinity, a float beyond
    range), or one no input needs (a whole number of thousands of digits): a problem, not a value, since an
    output that echoes it would not be JSON."""

    message: str


def _parse_float(literal: str) -> float | _NotANumber:
    value = float(literal)
    return value if math.isfinite(value) else _NotANumber(f"{literal[:40]} is beyond the range of a number")


def _parse_int(literal: str) -> int | _NotANumber:
    try:
        return int(literal)
    except ValueError:  # more digits than Python converts (sys.get_int_max_str_digits())
        return _NotANumber(f"a whole number of {len(literal)} digits; no input holds one")


def _parse_constant(literal: str) -> _NotANumber:
    return _NotANumber(f"{literal} is not JSON; write null for no value")


def _loads(text: str, path: Path, line: int | None = None) -> object:
    """One JSON value; `line`: the line of a JSONL file it is on."""
    hooks = {"parse_float": _parse_float, "parse_constant": _parse_constant}
    try:
        try:
            return json.loads(text, **hooks)
        except json.JSONDecodeError:
            raise
        except ValueError:  # a whole number of more digits than Python converts; read again to say where
            return json.loads(text, parse_int=_parse_int, **hooks)
    except json.JSONDecodeError as err:
        where = f"on line {line}" if line else f"at line {err.lineno}, column {err.colno}"
        raise InputError([Problem(str(path), f"invalid JSON {where}: {err.msg}")]) from None
    except RecursionError:  # json's C scanner recurses once per level
        raise InputError([Problem(str(path), TOO_DEEP + (f" (line {line})" if line else ""))]) from None


MAX_DEPTH = 100  # levels of nesting in a JSON or YAML input; the toolkit's inputs nest a few levels
TOO_DEEP = f"nested more than {MAX_DEPTH} levels deep; no input of this toolkit nests so deep"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def value_problems(value: object, strings: bool = True, max_values: int | None = None) -> list[tuple[tuple, str]]:
    """(where, what) for each part of a value read from a file that no command can use: nesting deeper than
    MAX_DEPTH, a `_NotANumber`, more than `max_values` values (YAML's aliases can make a few lines stand for
    billions), and, when `strings`, a lone surrogate: half of a UTF-16 pair (JSON's \\ud800 escape), no
    character, which no tokenizer or UTF-8 output takes. Walked without recursion, so that no depth can
    crash it; a clean value (nearly every one) in one quick pass, a value with problems again to say where."""
    if not _walk(value, strings, max_values, locate=False):
        return []
    return _walk(value, strings, max_values, locate=True)


def _walk(value: object, strings: bool, max_values: int | None, locate: bool) -> list[tuple[tuple, str]]:
    problems: list[tuple[tuple, str]] = []

    def check(where: tuple, item: object) -> None:
        if type(item) is _NotANumber:
            problems.append((where, item.message))
        elif strings and type(item) is str and (found := _LONE_SURROGATE.search(item)):
            problems.append((where, f"holds a lone surrogate (\\u{ord(found.group()):04x}): half of a UTF-16 pair, no character"))

    check((), value)
    stack, seen = [((), 0, value)] if type(value) in (dict, list) else [], 0
    while stack and (locate or not problems):
        where, depth, item = stack.pop()
        if depth >= MAX_DEPTH:
            problems.append((where[:3], TOO_DEEP))
            continue
        seen += len(item)
        if max_values is not None and seen > max_values:
            problems.append(((), f"more than {max_values:,} values (aliases expanded); no input of this toolkit holds so many"))
            break
        for key, child in item.items() if type(item) is dict else enumerate(item):
            kind = type(child)  # by type, not isinstance: this loop sees every value of a 100 MB file
            if kind is dict or kind is list:
                stack.append(((*where, key) if locate else where, depth + 1, child))
            elif kind is _NotANumber or (strings and kind is str):
                check((*where, key), child)
            if strings and type(key) is str:
                check((*where, key), key)
    return problems


def _located(path: Path, where: tuple, message: str) -> Problem:
    """A problem at `where` in a file's value: a top-level list's index is the record."""
    if where and isinstance(where[0], int):
        return Problem(str(path), message, where[0], None, field_name(where[1:]) or None)
    return Problem(str(path), message, None, None, field_name(where) or None)


def write_json_atomically(path: Path, value: object) -> None:
    # allow_nan=False: a NaN that reached an output fails here rather than write a file that is not JSON.
    write_text_atomically(path, json.dumps(value, ensure_ascii=False, indent=2, allow_nan=False) + "\n")


def write_text_atomically(path: Path, text: str) -> None:
    """Write to a temporary file in the same directory and rename it over the target: readers see the old
    file or the new one, never half of one. The temporary file is this call's own (a random name, created
    exclusively): two writers of one path each rename a whole file, never one the other is writing."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        with naming(path), open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def naming(path: Path):
    """An OSError of a write to an open file names no file (a full disk was "a file: No space left on
    device"): it names `path`, the file being written."""
    try:
        yield
    except OSError as err:
        if err.filename is None:
            err.filename = str(path)
        raise


def load_records(path: str | Path) -> tuple[object, list[Problem]]:
    """A file of records as `load_json` gives it (its content, and the problems of its values): a Parquet file's
    rows (`.parquet`: judge/parquet.py), else a JSON file's value or a JSONL file's lines."""
    if Path(path).suffix != ".parquet":
        return load_json(path)
    try:
        records, found = read_parquet(path)
    except UnreadableParquet as err:
        raise InputError([Problem(str(path), err.reason)]) from None
    if not records:
        raise InputError([Problem(str(path), "no records")])
    problems = [_located(Path(path), where, message) for where, message in found + value_problems(records)]
    return records, [replace(p, record_id=record_id_of(records[p.index])) if p.index is not None else p for p in problems]  # a row's id said


def read_records(path: str | Path) -> list:
    """Records of a JSON list, of a JSONL file, or of a Parquet file's rows."""
    records, problems = load_records(path)
    if problems:
        raise InputError(problems)
    if not isinstance(records, list):
        raise InputError([Problem(str(path), RECORDS_EXPECTED)])
    return records


RECORDS_EXPECTED = "expected a JSON list of records or JSONL, one record per line"


def field_name(loc: tuple) -> str:
    """A pydantic error location as a user writes it: `answer[2].image`."""
    name = ""
    for part in loc:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name


def validation_problems(path: str | Path, index: int, record_id: str | None, err: ValidationError, within: tuple = ()) -> list[Problem]:
    """One Problem per error of a record that failed validation; `within` locates the validated value
    inside the record (e.g. `("query_response", 2)`), so the field is named from the record's top."""
    problems = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if p not in ("function-after[_not_empty(), Segment]",))
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "missing" and loc == ("category",):
            message = f"no category: set 'category' to one of {', '.join(CATEGORIES)} or put one in the id"
        problems.append(Problem(str(path), message, index, record_id, field_name(within + loc) or None))
    return problems


def record_id_of(record: object, key: str = "id") -> str | None:
    value = record.get(key) if isinstance(record, dict) else None
    return None if value is None else str(value)


def parse_records(path: str | Path, records: list, model: type[BaseModel], id_key: str = "id") -> tuple[list[tuple[int, BaseModel]], list[Problem]]:
    """Each record validated as `model`: the valid ones with their index, and every problem of the rest."""
    parsed, problems = [], []
    for index, record in enumerate(records):
        try:
            parsed.append((index, model.model_validate(record)))
        except ValidationError as err:
            problems.extend(validation_problems(path, index, record_id_of(record, id_key), err))
    return parsed, problems


def _parse(path: str | Path, model: type[Sample], records: list | None = None) -> tuple[list, list[Problem]]:
    """Every record of the file that validates, and the problems of those that do not; or of `records`,
    given in memory (the Python API) and named `path` in the problems."""
    if records is None:
        records, problems = load_records(path)
    else:
        problems = [_located(path, where, message) for where, message in value_problems(records)]
    if not isinstance(records, list):
        raise InputError([Problem(str(path), RECORDS_EXPECTED)])
    if file_problems := [p for p in problems if p.index is None]:
        raise InputError(file_problems)
    unusable = {p.index for p in problems}
    parsed, invalid = parse_records(path, [None if i in unusable else r for i, r in enumerate(records)], model)
    problems += [p for p in invalid if p.index not in unusable]
    if not records:
        problems.append(Problem(str(path), "no records"))
    return parsed, problems


def resolve_image(image: str, image_root: str | Path) -> Path:
    path = Path(image)
    return path if path.is_absolute() else Path(image_root) / path


# A 48-megapixel phone photo is the largest image a benchmark could hold; the judge sees any image as a
# few 448-px tiles. Beyond, decoding alone takes hundreds of MB an image (eight crafted 13000 x 13000 PNGs
# of 164 KB each, under PIL's own limit, took validation to 3.7 GB).
MAX_IMAGE_PIXELS = 50_000_000


def _image_problem(path: Path) -> str | None:
    try:
        found = path.is_file()
    except OSError as err:  # a name longer than the filesystem takes
        return f"image path unusable: {path} ({err.strerror})"
    if not found:
        return f"image not found: {path}" if not path.exists() else f"image is {missing_file(path)}: {path}"
    try:
        with Image.open(path) as img:
            if (pixels := img.width * img.height) > MAX_IMAGE_PIXELS:  # from the header: nothing decoded yet
                return (f"image of {img.width} x {img.height} pixels ({pixels / 1e6:.0f} megapixels), more than the "
                        f"{MAX_IMAGE_PIXELS / 1e6:.0f} any image needs: {path}; the judge sees it as a few 448-px tiles, so resize it")
            img.load()
            problem = image_problem(img)
    except Exception as err:  # PIL raises many types for a broken file; all mean the same to the user.
        return f"image cannot be decoded: {path} ({type(err).__name__}: {err})"
    return None if problem is None else f"{problem}: {path}"


@dataclass(frozen=True)
class ImagePlace:
    """Where an input names an image, in the input's own terms, so a problem points at the record."""

    index: int
    record_id: str | None
    field: str
    path: Path


def sample_image_places(index: int, sample: Sample | Pair, image_root: str | Path) -> list[ImagePlace]:
    parts = ("question", "answer_a", "answer_b") if isinstance(sample, Pair) else ("question", "answer")
    return [
        ImagePlace(index, sample.id, f"{part}[{k}].image", resolve_image(segment.image, image_root))
        for part in parts
        for k, segment in enumerate(getattr(sample, part))
        if segment.image is not None
    ]


def image_problems(path: str | Path, places: list[ImagePlace]) -> list[Problem]:
    """Check that every image exists and decodes, before any model is loaded."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        messages = list(pool.map(_image_problem, [place.path for place in places]))
    return [Problem(str(path), msg, p.index, p.record_id, p.field) for p, msg in zip(places, messages) if msg]


def _sample_image_problems(path: str | Path, samples: list[tuple[int, Sample]], image_root: str | Path) -> list[Problem]:
    return image_problems(path, [place for index, sample in samples for place in sample_image_places(index, sample, image_root)])


def _duplicate_problems(path: str | Path, samples: list[tuple[int, Sample]], key) -> list[Problem]:
    seen: dict[tuple, int] = {}
    problems = []
    for index, sample in samples:
        k = key(sample)
        if k in seen:
            problems.append(Problem(str(path), f"duplicate record: same as record {seen[k]}", index, sample.id))
        else:
            seen[k] = index
    return problems


def _same_sample_once(path: str | Path, parsed: list[tuple[int, Sample | Pair]]) -> tuple[list[tuple[int, Sample | Pair]], list[Problem], list[str]]:
    """An annotation file repeats a sample (or a pair) once per annotator: identical repeats count once, and
    a note says so; an id that names two different samples is an error. A pair is the same pair whatever its
    annotators preferred; each annotator's preference counts once, and one annotator (or, unnamed, one id)
    with two preferences is an error."""
    shown = lambda item: item.judged() if isinstance(item, Pair) else item  # noqa: E731
    what = "pair" if parsed and isinstance(parsed[0][1], Pair) else "sample"
    first: dict[str, tuple[int, Sample | Pair]] = {}
    preferences: dict[str, dict[str | None, str | None]] = {}  # id -> annotator -> preference
    kept, problems, repeats = [], [], 0
    for index, sample in parsed:
        if sample.id not in first:
            first[sample.id] = (index, sample)
            kept.append((index, sample))
        elif shown(sample) != shown(first[sample.id][1]):
            problems.append(Problem(str(path), f"duplicate id with a different {what} than record {first[sample.id][0]}", index, sample.id))
            continue
        else:
            repeats += 1
        if isinstance(sample, Pair):
            given = preferences.setdefault(sample.id, {}).setdefault(sample.annotator, sample.preference)
            if given != sample.preference:
                problems.append(Problem(str(path), repeated_preference(sample.annotator), index, sample.id, "preference"))
    # A pair's people: the preference of their majority (a tie where they split), as judge-score's summary compares.
    kept = [(index, item.model_copy(update={"preference": people_majority(list(preferences[item.id].values()))}) if isinstance(item, Pair) else item)
            for index, item in kept]
    notes = [f"{path}: {repeats} record(s) repeat a {what} read before (as an annotation file does, once per annotator); "
             f"each {what} is {'judged' if what == 'pair' else 'scored'} once"] if repeats else []
    return kept, problems, notes


def validate_samples(path: str | Path, image_root: str | Path | None = None, model: type[Sample] | type[Pair] = Sample,
                     records: list | None = None) -> tuple[list[Sample], list[Problem], list[str]]:
    """The valid samples (or, with `model=Pair`, pairs) of a file (or of `records` in memory, named `path`),
    every problem of the others, and notes the user should read; images are checked when `image_root` is
    given. For `--skip_invalid`; `load_samples` is the strict form."""
    parsed, problems = _parse(path, model, records)
    parsed, duplicates, notes = _same_sample_once(path, parsed)
    problems += duplicates
    if image_root is not None:
        problems += _sample_image_problems(path, parsed, image_root)
    bad = {p.index for p in problems}
    valid = [s for i, s in parsed if i not in bad]
    return valid, sorted(problems, key=lambda p: (p.index is not None, p.index or 0)), notes


def load_samples(path: str | Path, image_root: str | Path | None = None) -> list[Sample]:
    """Samples to score, all valid, or an InputError listing every problem. Ids must be unique, or repeat
    the same sample."""
    samples, problems, _ = validate_samples(path, image_root)
    if problems:
        raise InputError(problems)
    return samples


def holds_pairs(path: str | Path) -> bool:
    """Whether a file's records are pairs (records with answer_a and answer_b) rather than samples; a file
    that cannot be read is left to its reader to name what is wrong."""
    try:
        records, _ = load_records(path)
    except InputError:
        return False
    return isinstance(records, list) and bool(records) and is_pair_record(records[0])


def is_pair_record(record: object) -> bool:
    """Whether a record is meant as a pair: it holds answer_a or answer_b and no single answer. A pair short of
    one of its answers is still one, whose reader names the answer missing (not "answer: Field required")."""
    return isinstance(record, dict) and "answer" not in record and bool({"answer_a", "answer_b"} & record.keys())


def load_pairs(path: str | Path, image_root: str | Path | None = None, preferred: bool = False) -> list[Pair]:
    """Pairs, all valid, or an InputError listing every problem. One id may be annotated by several
    annotators, once each, with the same pair; with `preferred`, every record must say which answer people
    preferred (judge-train learns from it), and all of a pair's records are kept."""
    parsed, problems = _parse(path, Pair)
    if preferred:
        problems += _duplicate_problems(path, parsed, key=lambda p: (p.id, p.annotator))
        problems += [Problem(str(path), "no preference: give 'preference' (A, B or tie), which judge-train learns", index, p.id, "preference")
                     for index, p in parsed if p.preference is None]
        kept = parsed
    else:
        kept, duplicates, _ = _same_sample_once(path, parsed)
        problems += duplicates
    if image_root is not None:
        problems += _sample_image_problems(path, kept, image_root)
    if problems:
        raise InputError(sorted(problems, key=lambda p: (p.index is not None, p.index or 0)))
    return [p for _, p in kept]


def load_annotations(
    path: str | Path, image_root: str | Path | None = None, scale: tuple[float, float] = (ScoreScale.low, ScoreScale.high)
) -> list[Annotation]:
    """Human-rated samples. One id may be rated by several annotators, once each."""
    parsed, problems = _parse(path, Annotation)
    problems += _duplicate_problems(path, parsed, key=lambda a: (a.id, a.annotator))
    low, high = scale
    problems += [
        Problem(str(path), f"{value:g} is outside the scale {low:g}-{high:g}", index, a.id, f"human_scores.{name}")
        for index, a in parsed
        for name, value in a.human_scores.given().items()
        if not low <= value <= high
    ]
    if image_root is not None:
        problems += _sample_image_problems(path, parsed, image_root)
    if problems:
        raise InputError(sorted(problems, key=lambda p: (p.index is not None, p.index or 0)))
    return [a for _, a in parsed]
