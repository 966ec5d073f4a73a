"""MMIE: the toolkit's own data model is MMIE's (`judge/data.py`), and judge-score's eval_result.json is
the output MMIE's scorer writes, so this format only reads."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mmjudge.configs import DEFAULT_RUBRICS
from mmjudge.judge.data import JudgeResult, validate_samples
from mmjudge.judge.formats.base import BenchmarkInput, Format, first_record

if TYPE_CHECKING:
    from mmjudge.judge.prompts import Rubric


def looks_like(content: object) -> bool:
    record = first_record(content)
    return record is not None and {"id", "question", "answer"} <= set(record)


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    samples, problems, notes = validate_samples(path, image_root)
    return BenchmarkInput(path, samples, problems, rubrics, content=None, notes=notes)


def write(bench: BenchmarkInput, results: dict[str, JudgeResult], output_dir: Path) -> list[Path]:
    return []


FORMAT = Format("mmie", DEFAULT_RUBRICS, looks_like, read, write)
