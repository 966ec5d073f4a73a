"""judge/parquet.py: records read from a Parquet file as the JSON records they stand for (Arrow's filled-in nulls
left out, images the file holds as cached paths), and judge-score's records written and read back."""

import hashlib
import io
import json

import pyarrow
import pyarrow.parquet
import pytest
from PIL import Image

from mmjudge.judge.data import InputError, read_records
from mmjudge.judge.formats import detect_format
from mmjudge.judge.parquet import image_cache, read_results, write_results, write_rows


def png(color: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), color).save(out, format="PNG")
    return out.getvalue()


def test_a_row_holds_only_the_fields_its_record_had_and_images_become_cached_paths(tmp_path, monkeypatch):
    """Arrow gives every row every column and every struct every field any row has: read back, a null there is a
    missing field, never a value the record did not have. An image as a struct or bare bytes is a file in the cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rows = [{"id": "SA_1", "model": "m", "question": [{"text": "q"}, {"image": {"bytes": png("red"), "path": "a.png"}}], "answer": [{"text": "x"}]},
            {"id": "SA_2", "question": [{"text": "q", "image": {"bytes": None, "path": "images/b.png"}}], "answer": [{"text": "y"}],
             "gt_answer": [{"text": "g"}]}]
    write_rows(path := tmp_path / "s.parquet", rows)
    red = str(image_cache() / f"{hashlib.sha256(png('red')).hexdigest()}.png")
    assert read_records(path) == [
        {"id": "SA_1", "model": "m", "question": [{"text": "q"}, {"image": red}], "answer": [{"text": "x"}]},
        {"id": "SA_2", "question": [{"text": "q", "image": "images/b.png"}], "answer": [{"text": "y"}], "gt_answer": [{"text": "g"}]}]
    assert (tmp_path / "cache" / "mmjudge" / "images").is_dir() and Image.open(red).getpixel((0, 0)) == (255, 0, 0)
    assert detect_format(path).name == "mmie"
    write_rows(pairs := tmp_path / "p.parquet", [{"id": "p", "question": [{"image": png("blue")}], "answer_a": [{"text": "a"}], "answer_b": [{"text": "b"}]}])
    assert detect_format(pairs).name == "pairs" and read_records(pairs)[0]["question"][0]["image"].endswith(".png")


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    (path := tmp_path / "s.parquet").write_text("[]")
    with pytest.raises(InputError, match="s.parquet: not a readable parquet file"):
        read_records(path)


def test_results_written_as_parquet_read_back_as_written(tmp_path):
    """Maps keyed by a rubric's criteria differ from record to record (as JSON text, not Arrow structs that would give
    each the other's keys); a record's null stays a value."""
    records = [{"id": "a", "score": 3, "criteria": {"clarity": 4}, "score_distribution": {"1": 0.25, "3": 0.75}, "parse_error": None},
               {"id": "b", "score": 2.5, "criteria": {"accuracy": None}, "score_distribution": None, "parse_error": "no score", "reward": 0.5}]
    write_results(path := tmp_path / "eval_result.parquet", records)
    assert read_results(path) == [{**records[0], "reward": None}, records[1]]  # one column per field: a row without one holds its null
    assert json.loads(pyarrow.parquet.read_table(path).column("criteria")[1].as_py()) == {"accuracy": None}


@pytest.mark.slow  # datasets imports in seconds
def test_a_parquet_file_written_by_hugging_face_datasets_reads_as_its_records(tmp_path, monkeypatch):
    """datasets' own writer, its Image feature in the segments: an image given as a file comes back as its path (no
    bytes), one given as bytes as a file in the cache holding them; the text segments without the Image's nulls."""
    import datasets

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "q.png").write_bytes(png("green"))
    segments = [{"text": datasets.Value("string"), "image": datasets.Image(decode=False)}]
    features = datasets.Features({"id": datasets.Value("string"), "question": segments, "answer": segments})
    rows = [{"id": "SA_1", "question": [{"text": "q", "image": None}, {"text": None, "image": "images/q.png"}], "answer": [{"text": "a", "image": None}]},
            {"id": "SA_2", "question": [{"text": "q", "image": None}], "answer": [{"text": None, "image": {"bytes": png("red"), "path": None}}]}]
    datasets.Dataset.from_list(rows, features=features).to_parquet(path := tmp_path / "s.parquet")
    red = image_cache() / f"{hashlib.sha256(png('red')).hexdigest()}.png"
    assert read_records(path) == [{"id": "SA_1", "question": [{"text": "q"}, {"image": "images/q.png"}], "answer": [{"text": "a"}]},
                                  {"id": "SA_2", "question": [{"text": "q"}], "answer": [{"image": str(red)}]}]
    assert red.read_bytes() == png("red")
