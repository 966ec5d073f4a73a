"""Judging on Ray Data: `Scorer`, a stateful callable class for `Dataset.map_batches`. Each actor loads the judge
once, as `mmjudge.Judge` (the engine judge-score runs); each batch of rows comes back as the records judge-score
writes, a column per field, with an `error` column naming what kept a row from being judged. A bad row never
fails the job: it is judged as judge-score --skip_invalid would skip it, in its own row.

    import ray
    from mmjudge.ray.data import Scorer

    samples = ray.data.read_parquet("samples.parquet")          # MMIE samples or pairs, a row each
    scored = samples.map_batches(Scorer, fn_constructor_kwargs={"model_path": "OpenGVLab/InternVL2-4B", "input_dir": "/data"},
                                 concurrency=(1, 8), num_gpus=1, batch_size=64)
    scored.write_parquet("scored/")

Rows in: MMIE samples ({"id", "question", "answer", "category"?, "model"?, "gt_answer"?}) or pairs ({"id",
"question", "answer_a", "answer_b", ...}), as `Judge.score` takes them: a question or answer is a text or a list
of segments ({"text"} / {"image"}). An image is a path (read in `input_dir`), its bytes, a `{"bytes", "path"}`
dict (a Hugging Face Image column's), or a base64 data URL; an http(s) URL is that row's error, as judge-score
fetches none.

Rows out: judge-score's records (judge.data.JudgeResult's fields, PairResult's for pairs), plus `error`. The
fields that hold maps keyed by the rubric's criteria or levels (criteria, score_distribution, a pair's orders)
are JSON text: Arrow would give every row of a block every key another row has, so a record would come back
with criteria it never had. `record(row)` turns a row back into judge-score's record.

When an actor dies (its process exits, its node goes), Ray Data restarts it (`max_restarts`, -1 by default: no
limit), loading the judge again, and runs the batch it held again (`max_task_retries`, -1 by default); a batch
that never returned left no rows, so each row is written once. docs/past-one-machine.md says what this rests on.
"""

from __future__ import annotations

import base64
import binascii
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mmjudge.judge.data import CALIBRATOR_FIELDS, InputError, JudgeResult, PairResult
from mmjudge.judge.parquet import SEGMENT_FIELDS, as_result, as_row, row_of  # noqa: F401 -- row_of: the rows Scorer takes, made from Samples and Pairs

ERROR = "error"
WHITESPACE = re.compile(rb"\s+")


class RowError(ValueError):
    """What keeps one row from being judged, found before the judge sees it."""


class Scorer:
    """The judge of one Ray actor: loaded once in `__init__`, called on each batch of rows.

    model_path, device, dtype, revision, rubrics, config and **options: as `mmjudge.Judge.load` takes them
    (judge-score's --model_path, --device, ..., and scoring options such as mode, max_tiles, max_new_tokens).
    input_dir: the folder relative image paths are read in (default: the actor's working directory).
    calibrator: a judge-calibrate calibrator.json, applied as `Judge.score` applies it (samples only).
    """

    def __init__(self, model_path: str, *, input_dir: str | None = None, calibrator: str | None = None, device: str | None = None,
                 dtype: str | None = None, revision: str | None = None, rubrics: str | list[str] | None = None, config: str | None = None,
                 **options):
        from mmjudge.api import Judge

        self.judge = Judge.load(model_path, device=device, dtype=dtype, revision=revision, rubrics=rubrics, config=config, **options)
        self.input_dir = input_dir
        self.calibrator = calibrator

    def __call__(self, batch) -> dict[str, list]:
        rows = rows_of(batch)
        errors: dict[int, str] = {}
        records: dict[int, dict] = {}
        with tempfile.TemporaryDirectory(prefix="mmjudge-ray-") as folder:
            for i, row in enumerate(rows):
                try:
                    records[i] = with_image_files(row, i, Path(folder))
                except RowError as err:
                    errors[i] = str(err)
            judged = self.judged(records, errors)
        return columns(rows, judged, errors, self.calibrator is not None)

    def judged(self, records: dict[int, dict], errors: dict[int, str]) -> dict[int, dict]:
        """The records of the rows that can be judged, by row; each other row's error put in `errors`. The rows are
        judged together (batched by the engine); an input problem takes its rows out, and any other failure has
        each row judged alone, so that it stays the failing row's own."""
        pending = dict(records)
        while pending:
            rows = list(pending)
            try:
                scored = self.judge.score([pending[i] for i in rows], input_dir=self.input_dir, calibrator=self.calibrator, progress=False)
            except InputError as err:
                problems = rows_with_problems(err, rows, pending)
                if not problems and len(rows) == 1:
                    problems = {rows[0]: str(err)}
                if not problems:
                    return self.each_alone(pending, errors)
                for i, message in problems.items():
                    errors[i] = message
                    del pending[i]
                continue
            except Exception as err:  # noqa: BLE001 -- a row's failure is its error column, never the job's
                if len(rows) > 1:
                    return self.each_alone(pending, errors)
                errors[rows[0]] = f"{type(err).__name__}: {err}"
                return {}
            by_id = {record["id"]: record for record in scored}  # a sample given twice is judged once, as judge-score judges it
            return {i: by_id[pending[i]["id"]] for i in rows if pending[i].get("id") in by_id}
        return {}

    def each_alone(self, records: dict[int, dict], errors: dict[int, str]) -> dict[int, dict]:
        return {i: record for row, value in records.items() for i, record in self.judged({row: value}, errors).items()}


def rows_with_problems(err: InputError, rows: list[int], records: dict[int, dict]) -> dict[int, str]:
    """The rows an input error's problems name (by record id, or by position in the list judged), each with its
    problems; empty where a problem names no row."""
    found: dict[int, list[str]] = {}
    for problem in err.problems:
        named = [i for i in rows if records[i].get("id") == problem.record_id] if problem.record_id is not None else (
            [rows[problem.index]] if problem.index is not None and 0 <= problem.index < len(rows) else [])
        if not named:
            return {}
        for i in named:
            where = f"{problem.field}: " if problem.field else ""
            found.setdefault(i, []).append(f"{where}{problem.message}")
    return {i: "; ".join(messages) for i, messages in found.items()}


def rows_of(batch) -> list[dict]:
    """A batch as Ray Data hands it (a dict of NumPy columns, a pandas DataFrame or an Arrow table) as plain rows:
    lists, dicts and Python scalars, a null (or a pandas NaN) left out as a missing field is."""
    if hasattr(batch, "to_pylist"):  # pyarrow.Table
        return [plain(row) for row in batch.to_pylist()]
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas.DataFrame
        batch = {name: batch[name].tolist() for name in batch.columns}
    count = len(next(iter(batch.values()))) if batch else 0
    return [plain({name: values[i] for name, values in batch.items()}) for i in range(count)]


def plain(value: Any) -> Any:
    """NumPy arrays and scalars as Python's, dicts without their null fields (Arrow gives a struct every field any
    row of its block has; in a record a null field and a missing one mean the same)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items() if not missing(item)}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray":
        return [plain(item) for item in value]
    if hasattr(value, "item") and type(value).__module__ == "numpy":
        return value.item()
    return value


def missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # a pandas NaN


def with_image_files(row: dict, index: int, folder: Path) -> dict:
    """The row with each image that is not a path (bytes, a `{"bytes", "path"}` dict, a data URL) written to a file
    in `folder`; a RowError for an image the judge cannot be given."""
    def segment(value: Any, key: str, k: int) -> Any:
        if not isinstance(value, dict) or "image" not in value:
            return value
        return {**value, "image": image_file(value["image"], folder / f"{index}-{key}-{k}", f"{key}[{k}].image")}

    return {key: [segment(value, key, k) for k, value in enumerate(values)] if key in SEGMENT_FIELDS and isinstance(values, list) else values
            for key, values in row.items()}


def image_file(image: Any, path: Path, field: str) -> str:
    """A path the engine reads the image at: a path as given (relative to input_dir), else the image written to `path`."""
    if isinstance(image, dict):  # a Hugging Face Image column's value: its bytes where it has them, else its path
        image = image.get("bytes") if image.get("bytes") is not None else image.get("path")
    if isinstance(image, str) and image.startswith("data:"):
        image = data_url_bytes(image, field)
    elif isinstance(image, str) and "://" in image:
        raise RowError(f"{field}: {image[:80]!r} is a URL, and judge-score reads images from files, bytes or base64 data URLs, "
                       "fetching none: download it first, or give its bytes")
    if isinstance(image, (bytes, bytearray, memoryview)):
        path.write_bytes(bytes(image))
        return str(path)
    if not isinstance(image, str):
        raise RowError(f"{field}: give a path, bytes or a data URL, not {type(image).__name__}")
    return image


def data_url_bytes(url: str, field: str) -> bytes:
    header, comma, data = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise RowError(f"{field}: a data URL must be base64: data:image/png;base64,...")
    try:
        return base64.b64decode(WHITESPACE.sub(b"", data.encode("ascii")), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise RowError(f"{field}: the data URL's base64 does not decode") from None


def record_fields(pairs: bool, calibrated: bool) -> list[str]:
    """The fields of judge-score's records: a pair's, or a sample's (a calibrator's three only where one is applied)."""
    if pairs:
        return list(PairResult.model_fields)
    return [name for name in JudgeResult.model_fields if calibrated or name not in CALIBRATOR_FIELDS]


def columns(rows: list[dict], judged: dict[int, dict], errors: dict[int, str], calibrated: bool) -> dict[str, list]:
    """The batch's output: each record field a column (JSON_FIELDS as JSON text), then `error`; a row with an error
    has its id and nulls."""
    pairs = any("answer_a" in row for row in rows)
    names = record_fields(pairs, calibrated)
    out: dict[str, list] = {name: [] for name in [*names, ERROR]}
    for i, row in enumerate(rows):
        record = as_row(judged[i]) if i in judged else {"id": row.get("id")}
        for name in names:
            out[name].append(record.get(name))
        out[ERROR].append(None if i in judged else errors.get(i, "not judged"))
    return out


def result(row: dict) -> JudgeResult | PairResult:
    """A judged row (one without an error) as the engine's result: its JSON_FIELDS decoded, `error` left out."""
    fields = {name: value for name, value in as_result(plain_row(row)).items() if name != ERROR}
    return (PairResult if "verdict" in fields else JudgeResult).model_validate(fields)


def record(row: dict) -> dict:
    """A judged row as judge-score's record: the fields a record has only where they apply (reward, a calibrator's)
    only there."""
    judged = result(row)
    return judged.model_dump() if isinstance(judged, PairResult) or "escalate" in row else judged.model_dump(exclude=CALIBRATOR_FIELDS)


def plain_row(row: dict) -> dict:
    """A row as Ray Data gives it back, its values plain but its nulls kept: a record's null is one of its fields."""
    return {name: None if missing(value) else plain(value) for name, value in row.items()}


def records(rows: Iterable[dict]) -> tuple[list[dict], dict[str, str]]:
    """Judged rows as judge-score's records, and the errors of the others by id."""
    judged, errors = [], {}
    for row in rows:
        if row.get(ERROR) is not None:
            errors[str(row.get("id"))] = row[ERROR]
        else:
            judged.append(record(row))
    return judged, errors
