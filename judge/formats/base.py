"""What every benchmark format module provides (see `judge/formats/__init__.py`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from mmjudge.judge.data import (JudgeResult, OrderJudgement, Pair, PairResult, Problem, Sample, Segment, image_problems, parse_records,
                                sample_image_places)
from mmjudge.judge.preferences import in_pair_terms, pointwise_value
from mmjudge.judge.verdicts import VERDICT_FORMATS, VerdictFormat

if TYPE_CHECKING:  # judge.prompts imports torch (tiling); the formats are read by judge-calibrate too, which must not
    from mmjudge.judge.parsing import ScoreScale
    from mmjudge.judge.prompts import Rubric


@dataclass
class BenchmarkInput:
    path: Path
    samples: list[Sample | Pair]  # the valid ones, in file order
    problems: list[Problem]  # what is wrong with the others (judge-score stops, or skips them)
    rubrics: dict[str, Rubric]  # by category: every sample's category has one
    # what `write` needs of the file: the file as read (None where the samples say all it needs); a pairwise
    # format's, the records its pairs were read from, one per pair (a record set aside is not among them)
    content: object
    notes: list[str] = field(default_factory=list)  # what the user must hear about the input (judge-score prints them)
    # other files the input is read from, as (what it is, path), that no output may replace: MileBench's annotation
    sources: list[tuple[str, Path]] = field(default_factory=list)


@dataclass(frozen=True)
class ScoredItem:
    """One judged item of a benchmark's scored file: an Inst-It log item, a MEGA-Bench query."""

    id: str  # as judge-score names the sample
    score: float | None  # on the judge's own scale; None where the file marks the item unscored
    group: str  # Inst-It's split, MEGA-Bench's task


@dataclass
class ScoredFile:
    """A scored file as judge-calibrate reads it: every item once, and every problem of the file."""

    items: list[ScoredItem]
    problems: list[Problem]
    unscored: str  # how the benchmark marks an unscored item, in words, for the notes that count them
    where: str  # the key that holds the items, to name in a problem of them all


@dataclass(frozen=True)
class Preference:
    """One verdict on a pair, read from a file for judge-calibrate: an annotator's, or a judge's."""

    id: str  # as judge-score names the pair
    verdict: str | None  # A, B or tie; None where the record gives none
    model_a: str | None = None
    model_b: str | None = None
    group: str | None = None  # the benchmark's domain or task
    annotator: str | None = None
    lean: str | None = None  # the answer a tie leans to, where the file says (OpenING's Tie(A))


@dataclass
class PreferenceFile:
    records: list[Preference]
    problems: list[Problem]


def preferences_of(path: str, records: list, model: type, build: Callable[[object], Preference], id_key: str = "id") -> PreferenceFile:
    """Each record validated as `model` and read by `build`; every record that is not one is a problem."""
    if not isinstance(records, list):
        return PreferenceFile([], [Problem(path, "expected a list of records")])
    parsed, problems = parse_records(path, records, model, id_key)
    return PreferenceFile([build(record) for _, record in parsed], problems)


@dataclass(frozen=True)
class Format:
    name: str
    default_rubrics: tuple[Path, ...]
    looks_like: Callable[[object], bool]  # on the file's content: is it this benchmark's?
    read: Callable[..., BenchmarkInput]  # (path, image_root, rubrics, criteria_file) -> BenchmarkInput
    write: Callable[[BenchmarkInput, dict[str, JudgeResult | PairResult], Path], list[Path]]  # -> the files written
    outputs: tuple[str, ...] = ()  # file names `write` creates in the output directory
    # (path, the file's content, the scale its scores must be on) -> its judged items; None: the benchmark
    # has no scored file of a judge's (`write`'s output is one where it has).
    read_scores: Callable[[str, dict, ScoreScale], ScoredFile] | None = None
    # A benchmark whose judge prompt is its own has no default rubric: this toolkit does not copy it. This
    # names the file of its repository that `judge-rubric import --benchmark NAME` reads it from.
    prompt_source: str | None = None
    # (path, the file's content) -> its verdicts on pairs, for judge-calibrate; None: no such file
    read_preferences: Callable[[str, object], PreferenceFile] | None = None


# What a spreadsheet reads as the start of a formula in a CSV cell: such a cell is written after a single quote,
# which spreadsheets show as text (the usual guard against CSV injection); a name from a file stays a name.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(text: str) -> str:
    """`text` as a CSV cell no spreadsheet reads as a formula."""
    return f"'{text}" if text.startswith(FORMULA_STARTS) else text


def first_record(content: object) -> dict | None:
    if isinstance(content, list) and content and isinstance(content[0], dict):
        return content[0]
    return None


def interleaved(texts: list[str], images: list[str]) -> list[Segment]:
    """A text with images at its markers, as segments: the text before each image with it, then the text
    after the last; `texts` are the pieces between the markers (one more than the images), empty ones dropped."""
    segments = [Segment(text=text or None, image=image) for text, image in zip(texts, images)]
    return segments + [Segment(text=text) for text in texts[len(images):] if text]


def pair_input(path: Path, built: list[tuple[int, Pair]], problems: list[Problem], image_root: Path, rubrics: dict[str, Rubric],
               records: list, notes: list[str] | None = None) -> BenchmarkInput:
    """A benchmark's pairs as judge-score takes them: every pair's images checked, a repeated id refused
    (the benchmarks' own metrics key their records by id), and the pairs of records with a problem left out.
    `records` are the file's records, which `built`'s indexes count; `write` gets those of the pairs kept
    only: a record set aside (under --skip_invalid) that shares its id with a judged one is written nowhere,
    neither with the judged one's judgements nor as the judged one's record."""
    first: dict[str, int] = {}
    for index, pair in built:
        if pair.id in first:
            problems.append(Problem(str(path), f"duplicate id: record {first[pair.id]} has it too", index, pair.id))
        first.setdefault(pair.id, index)
    problems += image_problems(path, [place for index, pair in built for place in sample_image_places(index, pair, image_root)])
    bad = {p.index for p in problems}
    kept = [(index, pair) for index, pair in built if index not in bad]
    return BenchmarkInput(path, [pair for _, pair in kept], problems, rubrics, [records[index] for index, _ in kept], notes or [])


def judgements(result: PairResult | None, order: str, verdict_format: str) -> list[OrderJudgement]:
    """An order's judgements of a pair, none where the pair has no result (not judged in this run). A pairwise
    judge's are those it wrote; a pointwise judge (a reward model among them) scored each answer alone and wrote
    no verdict, so its pair's verdict is the order's one judgement, written as `verdict_format` (the benchmark's
    judges' convention) writes it in the order's positions, which the benchmark's own code parses."""
    if result is None or result.scores is None:
        return getattr(result, order) if result is not None else []
    return [] if result.verdict is None else [pointwise_judgement(result, order, VERDICT_FORMATS[verdict_format])]


def pointwise_judgement(result: PairResult, order: str, fmt: VerdictFormat) -> OrderJudgement:
    """A pointwise pair record's verdict as a judge of the benchmark would write it, shown in `order`. A tie
    that the convention cannot write is no verdict (an empty text), but OpenING's, whose judges lean a tie
    to one answer: to the one of the higher score or reward."""
    first = "A" if order == "forward" else "B"
    shown = in_pair_terms(result.verdict, first)  # positional: the mapping is its own inverse
    try:
        text = fmt.write(shown, {}, {}, None)
    except ValueError:  # a tie
        lean = "A" if pointwise_value(result.scores["A"]) >= pointwise_value(result.scores["B"]) else "B"
        text = f"Tie({in_pair_terms(lean, first)} is better)" if fmt.name == "opening" else ""
    return OrderJudgement(first=first, feedback=text, verdict=result.verdict, label=fmt.read(text, {}).label, n_tiles=None,
                          prompt_tokens=sum(score.prompt_tokens for score in result.scores.values()), generated_tokens=0)
