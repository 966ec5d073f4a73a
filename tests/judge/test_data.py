import json
import os
import re
from pathlib import Path

import pytest
from PIL import Image

from mmjudge.judge.cli import run
from mmjudge.judge.data import (
    Annotation,
    InputError,
    Sample,
    category_from_id,
    load_annotations,
    load_samples,
    read_records,
    validate_samples,
    write_json_atomically,
)


def write_json(path, records):
    path.write_text(json.dumps(records))
    return path


def sample(id="SA_0001", **extra):
    return {"id": id, "question": [{"text": "What next?"}], "answer": [{"text": "This."}], "model": "m", **extra}


@pytest.mark.parametrize(
    "sample_id, expected",
    [("SA_0001", "SA"), ("pbl-17", "PBL"), ("msr_math_3", "MSR"), ("12_MSR", "MSR"), ("plain", None), ("SA_PBL_1", None)],
)
def test_category_from_id(sample_id, expected):
    assert category_from_id(sample_id) == expected


def test_plain_string_answer_becomes_one_text_segment():
    s = Sample.model_validate(sample(answer="just text"))
    assert [seg.text for seg in s.answer] == ["just text"]
    assert s.category == "SA"


def test_explicit_category_wins_over_id():
    assert Sample.model_validate(sample(id="SA_1", category="msr")).category == "MSR"


def test_images_in_prompt_order_exclude_reference():
    s = Sample.model_validate(
        sample(
            question=[{"text": "q", "image": "q.png"}],
            answer=[{"image": "a1.png"}, {"text": "t", "image": "a2.png"}],
            gt_answer=[{"image": "gt.png"}],
        )
    )
    assert s.images() == ["q.png", "a1.png", "a2.png"]


def test_jsonl_and_json_list_read_the_same(tmp_path):
    records = [sample("SA_1"), sample("PBL_2")]
    write_json(tmp_path / "a.json", records)
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert read_records(tmp_path / "a.json") == read_records(tmp_path / "a.jsonl")


def test_all_problems_reported_together_with_file_record_and_field(tmp_path):
    path = write_json(
        tmp_path / "bad.json",
        [
            sample("SA_1"),
            {"id": "SA_2", "question": [{}], "answer": [{"text": "x"}]},  # empty segment
            {"id": "nocat", "question": [{"text": "q"}], "answer": [{"text": "a"}]},  # no category
            {"id": "PBL_4", "answer": [{"text": "a"}]},  # no question
        ],
    )
    with pytest.raises(InputError) as info:
        load_samples(path)
    text = str(info.value)
    assert len(info.value.problems) == 3
    assert "record 1 (id 'SA_2'): question[0]: a segment needs 'text' or 'image'" in text
    assert "record 2 (id 'nocat'): category: no category" in text
    assert "record 3 (id 'PBL_4'): question: Field required" in text
    assert str(path) in text


def test_invalid_json_names_the_line(tmp_path):
    (tmp_path / "x.jsonl").write_text(json.dumps(sample()) + "\n{broken\n")
    with pytest.raises(InputError, match=r"x.jsonl: invalid JSON on line 2"):
        read_records(tmp_path / "x.jsonl")


def test_a_file_that_is_not_utf8_is_named_with_the_byte(tmp_path):
    (tmp_path / "latin1.json").write_bytes(json.dumps([sample()], ensure_ascii=False).replace("What next?", "Caf\u00e9?").encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1.json: not UTF-8 text \(byte \d+: invalid continuation byte\)"):
        load_samples(tmp_path / "latin1.json")


@pytest.mark.parametrize("content, message", [("", "file is empty"), ("{}", "expected a JSON list"), ("[]", "no records")])
def test_empty_or_wrong_shape_files(tmp_path, content, message):
    (tmp_path / "f.json").write_text(content)
    with pytest.raises(InputError, match=message):
        load_samples(tmp_path / "f.json")


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        load_samples(tmp_path / "nope.json")


def test_a_device_a_fifo_or_a_folder_is_named_as_such_not_as_missing(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    for path, message in ((Path("/dev/zero"), "not a regular file (a device, a FIFO or a socket)"), (tmp_path / "fifo", "not a regular file"),
                          (tmp_path, "a folder, not a file")):
        with pytest.raises(InputError, match=re.escape(f"{path}: {message}")):
            load_samples(path)


def test_an_image_that_is_a_folder_or_a_device_is_named_as_such_not_as_missing(tmp_path):
    (tmp_path / "folder").mkdir()
    records = [sample("SA_1", answer=[{"image": "folder"}]), sample("SA_2", answer=[{"image": "/dev/zero"}]), sample("SA_3", answer=[{"image": "gone.png"}])]
    _, problems, _ = validate_samples(write_json(tmp_path / "d.json", records), image_root=tmp_path)
    assert [p.message for p in problems] == [f"image is a folder, not a file: {tmp_path / 'folder'}",
                                             "image is not a regular file (a device, a FIFO or a socket); give a file: /dev/zero",
                                             f"image not found: {tmp_path / 'gone.png'}"]


def test_duplicate_ids_count_once_if_identical_and_fail_if_not(tmp_path):
    # an annotation file repeats each sample once per annotator
    path = write_json(tmp_path / "d.json", [sample("SA_1", annotator="a"), sample("SA_1", annotator="b"), sample("SA_2")])
    assert [s.id for s in load_samples(path)] == ["SA_1", "SA_2"]
    _, problems, notes = validate_samples(path)
    assert problems == [] and notes == [f"{path}: 1 record(s) repeat a sample read before (as an annotation file does, "
                                        "once per annotator); each sample is scored once"]
    path = write_json(tmp_path / "e.json", [sample("SA_1"), sample("SA_1", answer="another answer")])
    with pytest.raises(InputError, match=r"record 1 \(id 'SA_1'\): duplicate id with a different sample than record 0"):
        load_samples(path)


def test_missing_and_undecodable_images_reported_with_paths(tmp_path):
    Image.new("RGB", (8, 8), "red").save(tmp_path / "ok.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    path = write_json(
        tmp_path / "d.json",
        [
            sample("SA_1", answer=[{"image": "ok.png"}]),
            sample("SA_2", answer=[{"text": "t", "image": "missing.png"}]),
            sample("SA_3", question=[{"image": "broken.png"}]),
        ],
    )
    with pytest.raises(InputError) as info:
        load_samples(path, image_root=tmp_path)
    text = str(info.value)
    assert len(info.value.problems) == 2
    assert f"record 1 (id 'SA_2'): answer[0].image: image not found: {tmp_path / 'missing.png'}" in text
    assert f"record 2 (id 'SA_3'): question[0].image: image cannot be decoded: {tmp_path / 'broken.png'}" in text


def test_annotations_several_annotators_and_scale(tmp_path):
    records = [
        sample("SA_1", human_scores={"overall": 5, "text_quality": 4}, annotator="a"),
        sample("SA_1", human_scores={"overall": 4}, annotator="b"),
    ]
    annotations = load_annotations(write_json(tmp_path / "a.json", records))
    assert [a.human_scores.given() for a in annotations] == [{"overall": 5, "text_quality": 4}, {"overall": 4}]
    assert isinstance(annotations[0], Annotation)


def test_annotation_errors(tmp_path):
    records = [
        sample("SA_1", human_scores={"overall": 9}),
        sample("SA_2", human_scores={"overall": "high"}),
        sample("SA_3", human_scores={}),
        sample("SA_4", human_scores={"fluency": 3}),
        sample("SA_5", human_scores={"overall": 2}, annotator="x"),
        sample("SA_5", human_scores={"overall": 3}, annotator="x"),
    ]
    with pytest.raises(InputError) as info:
        load_annotations(write_json(tmp_path / "a.json", records))
    text = str(info.value)
    assert "record 1 (id 'SA_2'): human_scores: overall must be a number, got 'high'" in text
    assert "record 2 (id 'SA_3'): human_scores: human_scores needs at least one of" in text
    assert "record 3 (id 'SA_4'): human_scores: 'fluency': not a criterion; the criteria are overall, text_quality, image_quality, " in text
    assert "record 5 (id 'SA_5'): duplicate record: same as record 4" in text
    assert "record 0 (id 'SA_1'): human_scores.overall: 9 is outside the scale 0-6" in text
    assert len(info.value.problems) == 5
    assert load_annotations(write_json(tmp_path / "d.json", [records[0]]), scale=(0, 10))[0].human_scores.overall == 9


def test_validate_samples_keeps_the_good_records_for_skip_invalid(tmp_path):
    records = [sample("SA_1"), {"id": "SA_2"}, sample("PBL_3", answer=[{"image": "gone.png"}]),
               sample("MSR_4", answer=[{"text": "First <image> then text."}])]
    samples, problems, _ = validate_samples(write_json(tmp_path / "d.json", records), image_root=tmp_path)
    assert [s.id for s in samples] == ["SA_1", "MSR_4"]  # a literal <image> is text (judge.prompts), not a problem
    assert sorted({p.index for p in problems}) == [1, 2]


def test_a_full_disk_names_the_file_being_written(tmp_path, capsys, monkeypatch):
    import mmjudge.judge.data

    def full(fd):  # as the kernel reports it: no file named
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mmjudge.judge.data.os, "fsync", full)
    assert run(lambda argv: write_json_atomically(tmp_path / "summary.json", {}), []) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'summary.json'}: No space left on device\n"  # was "a file"
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "result.json"
    target.write_text("old")
    write_json_atomically(target, [{"id": "x"}])
    assert json.loads(target.read_text()) == [{"id": "x"}]
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
def test_jsonl_records_may_hold_line_separators_in_their_strings(tmp_path, separator):
    # JSON lets these stand unescaped inside a string; only "\n" ends a JSONL record
    (tmp_path / "s.jsonl").write_text(json.dumps(sample("SA_1", answer=f"one{separator}two"), ensure_ascii=False) + "\n" + json.dumps(sample("SA_2")) + "\n")
    assert [s.answer[0].text for s in load_samples(tmp_path / "s.jsonl")] == [f"one{separator}two", "This."]


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_values_no_command_can_use_are_named_and_their_records_set_aside(tmp_path, suffix):
    """NaN and Infinity are not JSON (an output echoing them would not be), 1e400 is no float, a
    5000-digit number is none Python converts, and a lone surrogate (half a UTF-16 pair) is no character
    a tokenizer or a UTF-8 file takes: each a problem of its record, which --skip_invalid sets aside."""
    lines = [json.dumps(sample("SA_1")), json.dumps(sample("SA_2", extra=float("nan"))), json.dumps(sample("SA_3", extra=1.0)).replace("1.0", "1e400"),
             json.dumps(sample("SA_4")).replace('"SA_4"', "4" * 5000), json.dumps(sample("SA_5", answer="half \ud800 pair")),
             json.dumps(sample("SA_6", answer="a whole pair \U0001f600"))]
    path = tmp_path / f"d{suffix}"
    path.write_text("\n".join(lines) if suffix == ".jsonl" else "[" + ",\n".join(lines) + "]")
    samples, problems, _ = validate_samples(path)
    assert [s.id for s in samples] == ["SA_1", "SA_6"] and samples[1].answer[0].text == "a whole pair \U0001f600"
    assert [(p.index, p.field, p.message) for p in problems] == [
        (1, "extra", "NaN is not JSON; write null for no value"),
        (2, "extra", "1e400 is beyond the range of a number"),
        (3, "id", "a whole number of 5000 digits; no input holds one"),
        (4, "answer", "holds a lone surrogate (\\ud800): half of a UTF-16 pair, no character"),
    ]
    with pytest.raises(InputError, match="record 1: extra: NaN is not JSON"):
        read_records(path)


@pytest.mark.parametrize("depth", [150, 100_000])
def test_deeply_nested_json_is_refused_with_a_message_not_a_crash(tmp_path, depth):
    (tmp_path / "deep.json").write_text("[" + json.dumps(sample()) + ", " + "[" * depth + "]" * depth + "]")
    with pytest.raises(InputError, match="nested more than 100 levels deep"):
        load_samples(tmp_path / "deep.json")


def test_a_text_longer_than_any_judge_reads_is_refused_in_validation(tmp_path):
    # A 1-MB answer once reached the model and asked for 341 GB; it is a problem of its record instead.
    samples, problems, _ = validate_samples(write_json(tmp_path / "d.json", [sample("SA_1", answer="word " * 200_000), sample("SA_2")]))
    assert [s.id for s in samples] == ["SA_2"]
    assert [(p.index, p.field, p.message) for p in problems] == [
        (0, "answer[0].text", "1,000,000 characters, more than the 500,000 a judge's context can hold")]


def test_an_image_path_the_filesystem_cannot_take_is_a_problem_of_its_record(tmp_path):
    samples, problems, _ = validate_samples(write_json(tmp_path / "d.json", [sample("SA_1", answer=[{"image": "x" * 5000 + ".png"}]), sample("SA_2")]),
                                            image_root=tmp_path)
    assert [s.id for s in samples] == ["SA_2"] and problems[0].message.endswith("(File name too long)")


def test_true_is_no_id(tmp_path):
    _, problems, _ = validate_samples(write_json(tmp_path / "d.json", [sample(id=True, category="SA"), sample(id=7, category="SA")]))
    assert [(p.index, p.field) for p in problems] == [(0, "id")]


def test_a_result_holds_numbers_or_none_and_no_output_holds_nan(tmp_path):
    from mmjudge.judge.testing import judge_result

    result = judge_result("SA_1", 3, score_distribution={"0": float("nan"), "1": 0.5}, expected_score=float("nan"))
    assert (result.score_distribution, result.expected_score) == (None, None)
    result.score_distribution, result.calibrated_score = {"0": 1.0, "1": float("inf")}, float("nan")  # as the engine sets them later
    assert (result.score_distribution, result.calibrated_score) == (None, None)
    with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
        write_json_atomically(tmp_path / "out.json", {"x": float("nan")})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # PIL warns when it opens the header
def test_an_image_larger_than_any_real_one_is_refused_from_its_header(tmp_path):
    """Eight 13000 x 13000 PNGs of a few hundred KB each (one colour) took validation to 3.7 GB decoding them;
    they are refused from their headers, without decoding a pixel."""
    Image.new("1", (13000, 13000)).save(tmp_path / "huge.png")
    Image.new("RGB", (8000, 6000)).save(tmp_path / "photo.png")  # a 48-megapixel photo is still read
    records = [sample(f"SA_{k}", answer=[{"image": "huge.png"}]) for k in range(8)] + [sample("SA_9", answer=[{"image": "photo.png"}])]
    samples, problems, _ = validate_samples(write_json(tmp_path / "d.json", records), image_root=tmp_path)
    assert [s.id for s in samples] == ["SA_9"] and len(problems) == 8
    assert problems[0].message == (f"image of 13000 x 13000 pixels (169 megapixels), more than the 50 any image needs: {tmp_path / 'huge.png'}; "
                                   "the judge sees it as a few 448-px tiles, so resize it")
