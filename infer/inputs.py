"""A benchmark's file read as judge-score reads it, for judge-score (infer/run.py) and the Python API alike."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from mmjudge.judge.data import UsageError
from mmjudge.judge.formats import BenchmarkInput, Format
from mmjudge.judge.prompts import Rubric, load_rubrics


def read_benchmark(fmt: Format, path: Path, input_dir: Path, rubrics: Sequence[str | Path] | dict[str, Rubric] | None,
                   criteria_file: str | Path | None, notes: bool = True) -> BenchmarkInput:
    """A benchmark's file read as judge-score reads it, with its rubrics (`rubrics`: files, or rubrics already
    loaded by category; none: the format's): every problem of the file listed in the result, nothing of a
    model used yet. `notes`: print what the reader noticed (once per run: judge-score's rank 0)."""
    if criteria_file and fmt.name != "megabench":
        raise UsageError(f"--criteria_file applies to --format megabench only, not {fmt.name}")
    loaded = rubrics if isinstance(rubrics, dict) else load_rubrics(rubrics or fmt.default_rubrics)
    bench = fmt.read(path, input_dir, loaded, Path(criteria_file) if criteria_file else None)
    bench.problems.sort(key=lambda p: (p.index is not None, p.index or 0))
    for note in bench.notes if notes else ():
        print(f"note: {note}", file=sys.stderr)
    return bench
