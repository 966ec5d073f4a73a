"""Batch judging on Ray Data (mmjudge/ray/data.py) and judge-score --ray (infer/ray_backend.py): records equal to
judge-score's on 200 samples and 100 pairs with images, in one local Ray cluster of 2 CPUs for the module; an actor
killed mid-job, and every record found once; bad rows each their own error; --ray refused where it cannot work."""

import base64
import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import ray

from mmjudge.infer.cli import main as judge_score
from mmjudge.judge.data import Pair, Sample
from mmjudge.judge.parquet import read_results
from mmjudge.judge.testing import write_dataset, write_pairs, write_parquet_copy
from mmjudge.ray.data import Scorer, records, row_of

# The tiny judge, kept fast: one tile an image, the score read from one forward pass.
OPTIONS = {"rubrics": "tiny", "max_tiles": 1, "mode": "logits"}
FLAGS = ["--rubric", "tiny", "--max_tiles", "1", "--mode", "logits"]
FLOATS = 1e-6  # the engine batches differently on each actor: on a CPU not bit-exact (docs/past-one-machine.md)


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("samples"), 200, seed=3)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> Path:
    return write_pairs(tmp_path_factory.mktemp("pairs"), 100, seed=4)


def scored(checkpoint: Path, data: Path, output_dir: Path, *flags: str) -> tuple[list[dict], dict]:
    """judge-score run in this process (with --ray, on the module's cluster, which it finds connected): its records
    and summary."""
    argv = ["--model_path", str(checkpoint), "--input_dir", str(data.parent), "--input_file", data.name,
            "--output_dir", str(output_dir), *FLAGS, *flags]
    assert judge_score(argv) == 0
    return json.loads((output_dir / "eval_result.json").read_text()), json.loads((output_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def reference_run(checkpoint, samples, tmp_path_factory) -> tuple[dict[str, dict], dict]:
    """judge-score's records of the 200 samples, without Ray, and its summary."""
    records, summary = scored(checkpoint, samples, tmp_path_factory.mktemp("reference"))
    return {r["id"]: r for r in records}, summary


@pytest.fixture(scope="module")
def reference(reference_run) -> dict[str, dict]:
    return reference_run[0]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("ray_batch", Path(__file__).parents[1] / "benchmarks" / "ray_batch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The benchmark's comparison: texts, verdicts and every other field exact; floats (distributions, expected scores)
# within FLOATS.
differences = load_benchmark().differences


def assert_same(got, expected, where: str = "record") -> None:
    assert differences(got, expected, FLOATS, where) == []


def rows(path: Path, model) -> list[dict]:
    return [row_of(model.model_validate(record)) for record in json.loads(path.read_text())]


@pytest.mark.slow
def test_judge_score_ray_writes_what_judge_score_writes_from_the_same_samples_in_parquet(cluster, checkpoint, samples, reference_run, tmp_path,
                                                                                        monkeypatch):
    """The 200 samples as a Parquet file, each image a Hugging Face Image struct holding its bytes, judged on the
    cluster: the records and summary judge-score writes of them as JSON, and the same records again in Parquet."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # where the Parquet's images are written as it is read
    reference, expected_summary = reference_run
    parquet = write_parquet_copy(samples)
    got, summary = scored(checkpoint, parquet, tmp_path / "ray", "--ray", "local", "--ray_actors", "2", "--ray_batch_size", "25", "--parquet")
    assert [r["id"] for r in got] == list(reference)  # every sample once, in the input's order
    for record in got:
        assert_same(record, reference[record["id"]], record["id"])
    assert_same(summary, expected_summary, "summary")
    assert read_results(tmp_path / "ray" / "eval_result.parquet") == got


class DiesOnce(Scorer):
    """A Scorer whose process exits the first time it is handed `victim`, wherever that lands: the marker file, on
    the disk every actor of this one-machine cluster shares, says it has died once."""

    def __init__(self, victim: str, marker: str, **judge):
        super().__init__(**judge)
        self.victim, self.marker = victim, Path(marker)

    def __call__(self, batch):
        if self.victim in list(batch["id"]) and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os._exit(1)
        return super().__call__(batch)


@pytest.mark.slow
def test_pairs_through_map_batches_equal_judge_scores_though_an_actor_dies_mid_job(cluster, checkpoint, pairs, tmp_path):
    expected, _ = scored(checkpoint, pairs, tmp_path / "reference")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # DiesOnce: the workers cannot import this test module
    given = rows(pairs, Pair)
    marker = tmp_path / "died"
    judge = {"model_path": str(checkpoint), "input_dir": str(pairs.parent), **OPTIONS}
    out = ray.data.from_items(given).map_batches(DiesOnce, fn_constructor_kwargs={"victim": given[57]["id"], "marker": str(marker), **judge},
                                                 concurrency=2, num_cpus=1, batch_size=10).take_all()
    assert marker.exists()  # an actor did die, mid-job, and Ray Data restarted it and ran its batch again
    judged, errors = records(out)
    assert errors == {}
    assert Counter(r["id"] for r in judged) == Counter(pair["id"] for pair in given)  # each once: none lost, none doubled
    by_id = {r["id"]: r for r in expected}
    for record in judged:
        assert_same(record, by_id[record["id"]], record["id"])


@pytest.mark.slow
def test_generate_mode_writes_judge_scores_feedback(cluster, checkpoint, samples, tmp_path):
    few = samples.parent / "few.json"
    few.write_text(json.dumps(json.loads(samples.read_text())[:6]))
    generate = ["--mode", "generate", "--max_new_tokens", "24"]
    expected, _ = scored(checkpoint, few, tmp_path / "reference", *generate)
    got, _ = scored(checkpoint, few, tmp_path / "ray", *generate, "--ray", "local", "--ray_batch_size", "3")  # one actor: one more start costs
    assert [r["feedback"] for r in got] == [r["feedback"] for r in expected]
    for a, b in zip(got, expected):
        assert_same(a, b, b["id"])


class LosesOne(Scorer):
    """A Scorer whose actors cannot judge the input's third sample (its id ends in _0003), as when its image is missing on
    their node."""

    def __call__(self, batch):
        out = super().__call__(batch)
        out["error"] = ["image not found on this node" if sample_id.endswith("_0003") else error for sample_id, error in zip(out["id"], out["error"])]
        return out


@pytest.mark.slow
def test_a_sample_no_actor_can_judge_is_named_and_a_rerun_without_ray_finishes_from_the_journal(cluster, checkpoint, samples, reference,
                                                                                               tmp_path, monkeypatch, capsys):
    import mmjudge.ray.data

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    monkeypatch.setattr(mmjudge.ray.data, "Scorer", LosesOne)  # the class judge-score --ray hands its actors
    argv = ["--model_path", str(checkpoint), "--input_dir", str(samples.parent), "--input_file", samples.name, "--limit", "8",
            "--output_dir", str(tmp_path), *FLAGS]
    assert judge_score([*argv, "--ray", "local", "--ray_batch_size", "4"]) == 2
    err = capsys.readouterr().err
    victim = list(reference)[2]
    assert f"record 2 (id '{victim}'): not judged on the Ray cluster, image not found on this node" in err
    assert not (tmp_path / "eval_result.json").exists()
    assert judge_score(argv) == 0  # without --ray: the same journal, its 7 results resumed
    assert "resuming: 7 sample(s) already scored" in capsys.readouterr().err
    got = json.loads((tmp_path / "eval_result.json").read_text())
    assert [r["id"] for r in got] == list(reference)[:8]
    for record in got:
        assert_same(record, reference[record["id"]], record["id"])


@pytest.fixture(scope="module")
def few(tmp_path_factory) -> Path:
    """8 samples, for the quick tests (the 200 are the slow ones')."""
    return write_dataset(tmp_path_factory.mktemp("few"), 8, seed=3)


@pytest.fixture(scope="module")
def scorer(checkpoint, few) -> Scorer:
    """One actor's judge, called here in the test's process as Ray calls it in an actor's."""
    return Scorer(str(checkpoint), input_dir=str(few.parent), **OPTIONS)


def test_bad_rows_are_their_own_errors_and_images_come_as_bytes_or_urls(scorer, few):
    good = rows(few, Sample)[0]
    image = next(s["image"] for s in good["answer"] + good["question"] if "image" in s)
    content = (few.parent / image).read_bytes()

    def with_image(row_id: str, value) -> dict:
        return {**good, "id": row_id, "question": [{"image": value} if s.get("image") == image else s for s in good["question"]],
                "answer": [{**s, "image": value} if s.get("image") == image else s for s in good["answer"]]}

    batch = [good, with_image("bytes", content), with_image("data-url", "data:image/png;base64," + base64.b64encode(content).decode()),
             with_image("hf-dict", {"bytes": content, "path": "x.png"}), with_image("http", "https://example.com/cat.png"),
             with_image("bad-base64", "data:image/png;base64,!!!"), with_image("missing", "images/none.png"),
             {"id": "no-answer", "question": good["question"]}]
    out = scorer({name: [row.get(name) for row in batch] for name in {key for row in batch for key in row}})
    judged, errors = records([dict(zip(out, values)) for values in zip(*out.values())])
    assert sorted(errors) == ["bad-base64", "http", "missing", "no-answer"]
    assert "URL" in errors["http"] and "base64" in errors["bad-base64"] and "none.png" in errors["missing"] and "answer" in errors["no-answer"]
    assert judged[0]["id"] == good["id"] and judged[0]["score_distribution"] is not None
    for record in judged[1:]:  # the same image, however it came, judged as the path was
        assert_same({**record, "id": good["id"]}, judged[0], record["id"])


@pytest.mark.parametrize("flags, refused", [
    (["--ray_actors", "2"], "--ray_actors applies to --ray only"),
    (["--ray", "local", "--backend", "openai", "--base_url", "http://127.0.0.1:9/v1", "--mode", "generate"], "--backend openai"),
    (["--ray", "local", "--ray_actors", "3:1"], "MIN:MAX"),
    (["--ray", "local", "--ray_batch_size", "0"], "--ray_batch_size must be at least 1"),
    (["--ray", "local", "--probe_images", "blank"], "--probe_images"),
])
def test_ray_flags_that_cannot_work_are_refused_before_loading(checkpoint, few, tmp_path, capsys, flags, refused):
    argv = ["--model_path", str(checkpoint), "--input_dir", str(few.parent), "--input_file", few.name, "--output_dir", str(tmp_path), *flags]
    assert judge_score(argv) == 2
    assert refused in capsys.readouterr().err
    assert not (tmp_path / "eval_result.json").exists()


def test_ray_not_installed_is_refused_with_the_extra_to_install(checkpoint, few, tmp_path, capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "ray" else find_spec(name, *args))
    argv = ["--model_path", str(checkpoint), "--input_dir", str(few.parent), "--input_file", few.name, "--output_dir", str(tmp_path),
            "--ray", "auto"]
    assert judge_score(argv) == 2
    assert "pip install 'mmjudge[ray]'" in capsys.readouterr().err


def test_a_block_as_arrow_holds_it_judged_as_given(scorer, few):
    """Arrow gives each segment every field any segment of its block has (an image segment a null text): read back
    as nulls, a record would hold segments MMIE does not have."""
    import pyarrow

    given = rows(few, Sample)[:4]
    out = scorer(pyarrow.Table.from_pylist(given))
    judged, errors = records([dict(zip(out, values)) for values in zip(*out.values())])
    assert errors == {}
    assert [r["id"] for r in judged] == [row["id"] for row in given]
    alone = scorer({name: [row.get(name) for row in given] for name in {key for row in given for key in row}})
    assert_same(judged, records([dict(zip(alone, values)) for values in zip(*alone.values())])[0])


def with_image_bytes(parquet: Path) -> Path:
    """The Parquet file again, each image its bytes alone (a binary column) rather than a `{"bytes", "path"}` struct."""
    import pyarrow.parquet

    def bare(value):
        if isinstance(value, list):
            return [bare(item) for item in value]
        if isinstance(value, dict):
            return {key: item["bytes"] if key == "image" and item is not None else bare(item) for key, item in value.items()}
        return value

    out = parquet.with_name(f"bytes-{parquet.name}")
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist([bare(row) for row in pyarrow.parquet.read_table(parquet).to_pylist()]), out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["samples", "pairs"])
def test_judge_score_reads_parquet_as_it_reads_the_same_records_in_json_and_writes_its_records_in_parquet(checkpoint, kind, tmp_path, monkeypatch):
    """Without Ray: MMIE samples (images as Image structs) and pairs (images as bare bytes) from Parquet judged
    exactly as from their JSON, and eval_result.parquet read back equal to eval_result.json."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = write_dataset(tmp_path / "data", 4, seed=5) if kind == "samples" else write_pairs(tmp_path / "data", 2, seed=6)
    parquet = write_parquet_copy(data) if kind == "samples" else with_image_bytes(write_parquet_copy(data))
    expected, expected_summary = scored(checkpoint, data, tmp_path / "json")
    got, summary = scored(checkpoint, parquet, tmp_path / "parquet", "--parquet")
    assert got == expected and summary == expected_summary
    assert read_results(tmp_path / "parquet" / "eval_result.parquet") == got
    assert not (tmp_path / "json" / "eval_result.parquet").exists()  # Parquet out only where asked for


def test_bad_parquet_rows_are_named_before_loading_or_skipped_by_skip_invalid(checkpoint, few, tmp_path, capsys, monkeypatch):
    import pyarrow.parquet

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rows = pyarrow.parquet.read_table(write_parquet_copy(few)).to_pylist()[:3]
    rows[0]["question"].append({"text": None, "image": {"bytes": None, "path": None}})  # an Image struct with nothing in it
    rows[1]["answer"] = None  # the column's null: a record without an answer
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), bad := few.parent / "bad.parquet")
    argv = ["--model_path", str(checkpoint), "--input_dir", str(few.parent), "--input_file", bad.name, "--output_dir", str(tmp_path), *FLAGS]
    assert judge_score(argv) == 2
    err = capsys.readouterr().err
    assert f"{bad}: record 0 (id '{rows[0]['id']}'): question[{len(rows[0]['question']) - 1}].image: an image with neither bytes nor a path" in err
    assert f"{bad}: record 1 (id '{rows[1]['id']}'): answer: Field required" in err
    assert "--skip_invalid judges the other records" in err and not (tmp_path / "eval_result.json").exists()
    assert judge_score([*argv, "--skip_invalid"]) == 0
    assert [r["id"] for r in json.loads((tmp_path / "eval_result.json").read_text())] == [rows[2]["id"]]
    skipped = json.loads((tmp_path / "summary.json").read_text())["skipped_invalid"]
    assert [f"record {i} (id '{rows[i]['id']}')" in line for i, line in enumerate(skipped)] == [True, True]


def test_images_a_parquet_file_held_go_to_the_actors_inside_their_rows(few, tmp_path, monkeypatch):
    """An image read from a Parquet file's bytes is a file in this machine's cache, which an actor on another node
    lacks: judge-score --ray sends it in the row, as a data URL; an image the input names by path stays a path."""
    from mmjudge.infer.ray_backend import carrying_cached_images
    from mmjudge.judge.parquet import cached_image

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    row = rows(few, Sample)[0]
    image = next(s["image"] for s in row["question"] + row["answer"] if "image" in s)
    content = (few.parent / image).read_bytes()
    held = {**row, "question": [{"text": "q"}, {"image": str(cached_image(content))}]}
    sent = carrying_cached_images(held)
    assert sent["question"] == [{"text": "q"}, {"image": f"data:image/{Path(str(cached_image(content))).suffix[1:]};base64,{base64.b64encode(content).decode()}"}]
    assert sent["answer"] == row["answer"] and carrying_cached_images(row) == row
