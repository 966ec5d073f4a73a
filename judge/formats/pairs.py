"""Pairs in the toolkit's own terms (judge/data.py's `Pair`): a JSON list or JSONL of `{id, question,
answer_a, answer_b, model_a?, model_b?, category?, group?, preference?, criteria?, annotator?, rationale?}`.
judge-score writes its eval_result.json of PairResults and nothing else, so this format only reads.

A pair of category general is judged by the toolkit's pairwise rubric (configs/rubrics/pairwise.yaml); a
pair whose category is MMIE's (named, or in its id: `SA_0012`) by MMIE's rubrics, which score each answer
alone (the verdict then comes from the two scores). An annotated file may repeat a pair once per annotator:
it is judged once, and its people's preference is their majority."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mmjudge.configs import CONFIG_DIR, DEFAULT_RUBRICS
from pydantic import BaseModel, ConfigDict, field_validator

from mmjudge.judge.data import Pair, PairResult, Verdict, is_pair_record, validate_samples, verdict_of
from mmjudge.judge.formats.base import BenchmarkInput, Format, Preference, PreferenceFile, first_record, preferences_of

if TYPE_CHECKING:
    from mmjudge.judge.prompts import Rubric

PAIRWISE_RUBRIC = CONFIG_DIR / "rubrics" / "pairwise.yaml"


def looks_like(content: object) -> bool:
    record = first_record(content)
    return record is not None and "id" in record and is_pair_record(record)


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    pairs, problems, notes = validate_samples(path, image_root, Pair)
    return BenchmarkInput(path, pairs, problems, rubrics, content=None, notes=notes)


def write(bench: BenchmarkInput, results: dict[str, PairResult], output_dir: Path) -> list[Path]:
    return []


class Rated(BaseModel):
    """A person's preference on a pair, with or without the pair itself."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())  # model_a, model_b: a pair's fields, not pydantic's
    id: str | int
    preference: Verdict | None
    model_a: str | None = None
    model_b: str | None = None
    group: str | None = None
    category: str | None = None
    annotator: str | None = None

    @field_validator("preference", mode="before")
    @classmethod
    def _normal(cls, value: object) -> object:
        return verdict_of(value)


def read_preferences(path: str, content: object) -> PreferenceFile:
    """People's preferences in the toolkit's terms: a pairs file, or `{id, preference, annotator?}` records."""
    return preferences_of(path, content, Rated, lambda r: Preference(str(r.id), r.preference, r.model_a, r.model_b, r.group or r.category, r.annotator))


FORMAT = Format("pairs", (*DEFAULT_RUBRICS, PAIRWISE_RUBRIC), looks_like, read, write, read_preferences=read_preferences)
