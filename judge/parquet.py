"""Parquet, read and written in one place: an input's records from a Parquet file (MMIE samples, pairs,
VL-RewardBench's release: any format whose records are JSON objects reads one, through `judge.data.load_records`),
and judge-score's records written as one (`--parquet`) and read back.

Read: a row is the record it stands for. Arrow gives every row of a column every field any row's struct has, and a
column to every row, so a field a record did not have comes back as a null: nulls in objects are left out, as a
missing field (a null field means the same in every record of this toolkit). An image the file holds (a binary
value, or a Hugging Face Image column's `{"bytes", "path"}` struct) becomes a path: its bytes written once to this
toolkit's image cache (`$XDG_CACHE_HOME/mmjudge/images`) under a name of their content, so that a resumed run sees
the same inputs; a struct without bytes is its path.

Written: a column per record field, in the records' order. The fields holding maps keyed by the rubric's criteria,
levels or a pair's orders (`JSON_FIELDS`) are JSON text, since Arrow would give each row the keys of every other
row's map; `read_results` decodes them, and keeps every null, which in a result record is a value.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
from pathlib import Path
from typing import Any

from PIL import Image
from pydantic import BaseModel

JSON_FIELDS = ("criteria", "score_distribution", "verdict_distribution", "forward", "reverse", "scores")
SEGMENT_FIELDS = ("question", "answer", "answer_a", "answer_b", "gt_answer")  # a sample's or pair's interleaved texts: segments in a row
IMAGE_STRUCT = {"bytes", "path"}  # a Hugging Face Image column's value (datasets, and Parquet files written by it)


class UnreadableParquet(ValueError):
    """A file pyarrow cannot read as Parquet, and why."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.reason = reason


def read_parquet(path: str | Path) -> tuple[list[dict], list[tuple[tuple, str]]]:
    """The records a Parquet file holds, a row each (module docstring), and (where, what) for each value that stands
    for none (an image struct with neither bytes nor a path), `where` starting with its row, as
    `judge.data.value_problems` says them."""
    problems: list[tuple[tuple, str]] = []
    return [as_record(row, (index,), problems) for index, row in enumerate(read_rows(path))], problems


def read_results(path: str | Path) -> list[dict]:
    """judge-score's records from the Parquet file `--parquet` wrote: equal to its eval_result.json's."""
    return [as_result(row) for row in read_rows(path)]


def read_rows(path: str | Path) -> list[dict]:
    import pyarrow.parquet

    try:
        return pyarrow.parquet.read_table(path).to_pylist()
    except FileNotFoundError:
        raise UnreadableParquet(path, "file not found") from None
    except Exception as err:  # pyarrow raises several types for a damaged file; all mean the same to the user
        raise UnreadableParquet(path, f"not a readable parquet file ({type(err).__name__}: {err})") from None


def as_record(value: Any, where: tuple, problems: list[tuple[tuple, str]]) -> Any:
    """A row's value as the JSON value it stands for: objects without Arrow's nulls, images held as bytes as paths;
    what cannot be one put in `problems`, with where it is."""
    if isinstance(value, dict):
        if value.keys() == IMAGE_STRUCT:
            if value["bytes"] is None and value["path"] is None:
                problems.append((where, "an image with neither bytes nor a path"))
            return str(cached_image(value["bytes"])) if value["bytes"] is not None else value["path"]
        return {key: as_record(item, (*where, key), problems) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [as_record(item, (*where, k), problems) for k, item in enumerate(value)]
    if isinstance(value, bytes):
        return str(cached_image(value))
    return value


def cached_image(data: bytes) -> Path:
    """An image held in a file as bytes, written once to the image cache under a name of its content: the same
    path every run, so that a resumed run sees the same inputs."""
    cache = image_cache()
    try:
        extension = (Image.open(io.BytesIO(data)).format or "bin").lower()
    except Exception:  # noqa: BLE001 - not an image: written as it is, and refused with its record by the image check
        extension = "bin"
    path = cache / f"{hashlib.sha256(data).hexdigest()}.{extension}"
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return path


def image_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mmjudge" / "images"


def row_of(sample: BaseModel) -> dict:
    """A Sample or Pair (judge.data) as a row Arrow holds alongside the others: every text a list of segments (MMIE
    lets a question be a text in one record and segments in the next, which no Arrow column holds), fields at their
    defaults left out."""
    return sample.model_dump(mode="json", exclude_none=True, exclude_defaults=True)


def as_row(record: dict) -> dict:
    """A result record as a row of judge-score's Parquet: JSON_FIELDS as JSON text."""
    return {name: json.dumps(value) if name in JSON_FIELDS and value is not None else value for name, value in record.items()}


def as_result(row: dict) -> dict:
    """A row of judge-score's Parquet as its record: JSON_FIELDS decoded, nulls kept."""
    return {name: json.loads(value) if name in JSON_FIELDS and isinstance(value, str) else value for name, value in row.items()}


def results_file(output_file: str) -> str:
    """The name of the Parquet file judge-score's --parquet writes beside its result file: eval_result.parquet."""
    return Path(output_file).with_suffix(".parquet").name


def write_results(path: Path, records: list[dict]) -> None:
    """judge-score's records as a Parquet file (module docstring)."""
    write_rows(path, [as_row(record) for record in records])


def write_rows(path: Path, rows: list[dict]) -> None:
    """Rows as a Parquet file, a column for each field any row has (pyarrow's from_pylist would take the first
    row's alone), written whole to a temporary file and renamed over `path`."""
    import pyarrow
    import pyarrow.parquet

    names = dict.fromkeys(name for row in rows for name in row)
    table = pyarrow.table({name: [row.get(name) for row in rows] for name in names})
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        pyarrow.parquet.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as err:  # named by the file being written, as judge.data.naming names them
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
