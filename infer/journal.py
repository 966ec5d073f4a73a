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

from pydantic import ValidationError

from mmjudge.judge.data import JudgeResult, PairResult, UsageError, naming

Result = JudgeResult | PairResult  # a journal holds one kind, the one its run writes


def fingerprint(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def journal_pattern(output_file: str) -> str:
    return f"{output_file}.journal.rank*.jsonl"


def journal_paths(output_dir: Path, output_file: str) -> list[Path]:
    return sorted(output_dir.glob(journal_pattern(output_file)))


def read_finished(output_dir: Path, output_file: str, run_fingerprint: str, record: type[Result] = JudgeResult) -> dict[str, Result]:
    """Results already in the journals of every rank (any earlier world size), by sample id. A line that is
    not a `record` (a damaged file) is named, and its sample scored again."""
    finished: dict[str, Result] = {}
    for path in journal_paths(output_dir, output_file):
        lines = path.read_bytes().split(b"\n")
        if len(lines) == 1:  # no complete line: a run killed before its header was written holds no result
            continue
        header = _parse_line(lines[0])
        if header is None or "fingerprint" not in header:
            raise UsageError(f"{path}: its first line is not a journal header (a damaged file?); "
                             "rerun with --no_resume to start over, or choose another --output_dir")
        if header["fingerprint"] != run_fingerprint:
            raise UsageError(
                f"{path} was written by a run with other settings (model, rubric, mode, limits, deterministic scoring, input or images); "
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
            finished[result.id] = result
        if damaged:
            print(f"note: {path}: line(s) {', '.join(map(str, damaged[:10]))}{' ...' if len(damaged) > 10 else ''} "
                  "hold no result (a damaged journal); those samples are scored again", file=sys.stderr)
    return finished


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

    def __init__(self, output_dir: Path, output_file: str, rank: int, run_fingerprint: str):
        self.path = output_dir / f"{output_file}.journal.rank{rank}.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._drop_torn_tail()
        if self.path.stat().st_size == 0:  # new, or killed before its header was whole
            self._file.write(json.dumps({"fingerprint": run_fingerprint}) + "\n")
            self._sync()

    def _drop_torn_tail(self) -> None:
        # A torn last line (crash mid-write) must not glue itself to the next record.
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            self._file.close()
            with self.path.open("r+b") as f:
                f.truncate(data.rfind(b"\n") + 1)
            self._file = self.path.open("a", encoding="utf-8")

    def append(self, results: list[Result]) -> None:
        with naming(self.path):
            self._file.write("".join(json.dumps(r.model_dump(), ensure_ascii=False, allow_nan=False) + "\n" for r in results))
            self._sync()

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
