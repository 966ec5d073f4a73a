"""Crash-safe progress for judge-score.

Each rank appends finished results to its own `{output_file}.journal.rank{R}.jsonl` under the output
directory, one JSON line per sample (or pair, once both its orders are judged), flushed and fsync'ed after every batch. The first line of each
journal is the run's fingerprint (model, rubric, settings, and the input's content); a rerun resumes
only when it matches.
A `kill -9` can at worst leave a torn last line, which is ignored on reading, so at most the batch in
flight is lost and no result is ever counted twice (results are keyed by sample id).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from mmjudge.infer.options import PAIR_OPTIONS
from mmjudge.judge.data import JudgeResult, PairResult, UsageError, naming
from mmjudge.judge.outputs import open_own_file

if TYPE_CHECKING:
    from mmjudge.judge.prompts import Rubric

Result = JudgeResult | PairResult  # a journal holds one kind, the one its run writes


def fingerprint(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def setting_fingerprints(settings: dict) -> dict[str, str]:
    """Each setting's own fingerprint, kept in a journal's header beside the run's, so that a journal of
    other settings is refused naming which changed."""
    return {name: fingerprint({name: value}) for name, value in settings.items()}


# How a refusal names a setting that changed (infer/run.py's and the backends' names); any other by its name.
SETTING_WORDS = {
    "model": "the judge's folder", "weights": "the judge's weight files", "dtype": "--dtype", "settings": "the judge's settings (--max_tiles)",
    "prompt_token_budget": "--prompt_token_budget", "ignore_stop": "--ignore_stop", "structured": "--structured",
    "deterministic": "deterministic scoring", "prefix_cache": "--prefix_cache (on or 0)", "rubrics": "the rubrics", "mode": "--mode", "max_new_tokens": "--max_new_tokens",
    "image_token_budget": "--image_token_budget", "input": "--input_file's path", "input_sha256": "the input file's content",
    "criteria_sha256": "--criteria_file's content", "images": "the images (a file's size or time)",
    "pairs": f"the pair options ({', '.join(f'--{name}' for name in PAIR_OPTIONS)})", "base_url": "--base_url", "max_tiles": "--max_tiles",
}


def _changed(header: dict, settings: dict[str, str] | None) -> str:
    """The settings that differ from those a journal's header records, in words; the list of what may
    differ where either side does not say (a journal written before headers kept them)."""
    written = header.get("settings")
    if not isinstance(written, dict) or settings is None:
        return "model, rubric, mode, limits, deterministic scoring, input or images"
    changed = sorted(name for name in set(written) | set(settings) if written.get(name) != settings.get(name))
    return ", ".join(SETTING_WORDS.get(name, name) for name in changed)


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def journal_pattern(output_file: str) -> str:
    return f"{output_file}.journal.rank*.jsonl"


def journal_paths(output_dir: Path, output_file: str) -> list[Path]:
    return sorted(output_dir.glob(journal_pattern(output_file)))


def read_finished(output_dir: Path, output_file: str, run_fingerprint: str, record: type[Result] = JudgeResult,
                  settings: dict[str, str] | None = None, rubrics: dict[str, Rubric] | None = None) -> dict[str, Result]:
    """Results already in the journals of every rank (any earlier world size), by sample id. A line that is
    not a `record` (a damaged file), or with `rubrics` a score off its rubric's scale, is named, and its sample
    scored again. `settings`: the run's setting_fingerprints, which a refusal compares with the journal's to
    name what changed."""
    finished: dict[str, Result] = {}
    for path in journal_paths(output_dir, output_file):
        if path.is_symlink() or not path.is_file():  # a link or a FIFO planted there: never read (a FIFO would hang the run)
            raise UsageError(f"--output_dir {output_dir}: {path.name} there is not a regular file of the run's; remove it, or give another --output_dir")
        lines = path.read_bytes().split(b"\n")
        if len(lines) == 1:  # no complete line: a run killed before its header was written holds no result
            continue
        header = _parse_line(lines[0])
        if header is None or "fingerprint" not in header:
            raise UsageError(f"{path}: its first line is not a journal header (a damaged file?); "
                             "rerun with --no_resume to start over, or choose another --output_dir")
        if header["fingerprint"] != run_fingerprint:
            raise UsageError(
                f"{path} was written by a run with other settings ({_changed(header, settings)}); "
                "rerun with --no_resume to start over, or choose another --output_dir"
            )
        # The last element is "" after a complete line, or a torn line after a crash: skip either.
        damaged = []
        for lineno, line in enumerate(lines[1:-1], 2):
            try:
                result = record.model_validate(_parse_line(line))
            except ValidationError:
                damaged.append(lineno)
                continue
            if rubrics is not None and _off_scale(result, rubrics):
                damaged.append(lineno)
                continue
            finished[result.id] = result
        if damaged:
            print(f"note: {path}: line(s) {', '.join(map(str, damaged[:10]))}{' ...' if len(damaged) > 10 else ''} "
                  "hold no result (a damaged journal); those samples are scored again", file=sys.stderr)
    return finished


def _off_scale(result: Result, rubrics: dict[str, Rubric]) -> bool:
    """A score the judge could not have given: the parser snaps every score it reads onto the rubric's scale,
    so one off it (999, written by hand or by damage) is no result."""
    if not isinstance(result, JudgeResult):
        return False
    rubric = rubrics.get(result.category)
    scores = [score for score in (result.score, *result.criteria.values()) if score is not None]
    return rubric is None or any(rubric.score_scale.problem(score) for score in scores)


def _parse_line(line: bytes) -> dict | None:
    try:
        value = json.loads(line.decode("utf-8"))  # strictly: bytes that are not UTF-8 are damage, not text to repair
    except (ValueError, RecursionError):  # not UTF-8 or not JSON, a number Python does not convert, nesting too deep to read
        return None
    return value if isinstance(value, dict) else None


def clear(output_dir: Path, output_file: str) -> None:
    for path in journal_paths(output_dir, output_file):
        path.unlink()


class Journal:
    """The append-only journal of one rank."""

    def __init__(self, output_dir: Path, output_file: str, rank: int, run_fingerprint: str, settings: dict[str, str] | None = None):
        self.path = output_dir / f"{output_file}.journal.rank{rank}.jsonl"
        self._file = self._open()
        self._drop_torn_tail()
        if self.path.stat().st_size == 0:  # new, or killed before its header was whole
            self._file.write(json.dumps({"fingerprint": run_fingerprint, **({"settings": settings} if settings else {})}) + "\n")
            self._sync()

    def _drop_torn_tail(self) -> None:
        # A torn last line (crash mid-write) must not glue itself to the next record.
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            self._file.close()
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
            self._file = self._open()

    def _open(self):
        return os.fdopen(open_own_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "--output_dir"), "a", encoding="utf-8")

    def append(self, results: list[Result]) -> None:
        with naming(self.path):
            self._file.write("".join(json.dumps(r.model_dump(), ensure_ascii=False, allow_nan=False) + "\n" for r in results))
            self._sync()

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
