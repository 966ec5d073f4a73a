"""Benchmark formats: reading each benchmark's files into samples, and writing results back in its shape,
checked field by field on small hand-made files (no model: results are made up here)."""

import csv
import json
import re
import subprocess
import sys
from datetime import datetime

import pytest
from PIL import Image
from rouge import Rouge

from mmjudge.judge.data import InputError
from mmjudge.judge.formats import FORMATS, detect_format
from mmjudge.judge.formats.instit import NO_VALID
from mmjudge.judge.formats.milebench import normalize, question_segments, rouge_l
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import judge_result


def write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return path


def result(sample_id, score, feedback="Fine.", parse_error=None):
    """A judge-score result with what the writers read."""
    return judge_result(sample_id, score, feedback=feedback, parse_error=parse_error)


def read(name, path, root, criteria_file=None):
    fmt = FORMATS[name]
    return fmt.read(path, root, load_rubrics(fmt.default_rubrics), criteria_file)


# ---------------------------------------------------------------- Inst-It

INSTIT = [
    {"question_id": "q9", "question": "What is [1] holding?", "model_prediction": "A red cup.", "ground_truth": "A red mug.", "split": "image"},
    {"question_id": 3, "question": "When does [2] leave?", "model_prediction": "", "ground_truth": "At <8>.", "split": "video"},
    {"question_id": "q1", "question": "Who is [1]?", "model_prediction": "A cook.", "ground_truth": "A chef.", "split": "image"},
]


def test_instit_predictions_become_text_only_samples_in_input_order(tmp_path):
    bench = read("instit", write(tmp_path / "image_oe_inference.json", INSTIT), tmp_path)
    assert bench.problems == []
    assert [s.id for s in bench.samples] == ["q9", "3", "q1"]  # ids in their unusual order, kept
    first, empty = bench.samples[0], bench.samples[1]
    assert first.category == "instit_image" and empty.category == "instit_video"
    assert [s.text for s in first.question] == ["What is [1] holding?"] and first.images() == []
    assert first.answer[0].text == "A red cup." and first.gt_answer[0].text == "A red mug."
    assert empty.answer[0].text == ""  # an empty prediction is judged, as Inst-It's judge sees it
    assert bench.rubrics["instit_image"].score_scale.step == 0.1


def test_instit_reads_its_own_evaluate_log(tmp_path):
    log = {"accuracy": 50.0, "total_num": 3, "valid_num": 2, "timestamp": "2025-01-01 00:00:00", "gpt_prompt": "p",
           "model_predictons": [{**item, "score": 0.5, "valid": True, "error_in_gpt_eval": "No Error."} for item in INSTIT]}
    path = write(tmp_path / "gpt4o_log.json", log)
    assert detect_format(path).name == "instit"
    assert [s.id for s in read("instit", path, tmp_path).samples] == ["q9", "3", "q1"]


def test_instit_bad_items_are_all_reported_with_their_field(tmp_path):
    items = [INSTIT[0], {**INSTIT[2], "split": "audio"}, {**INSTIT[1], "model_prediction": None}, {"question_id": "q9", **{k: v for k, v in INSTIT[0].items() if k != "question_id"}},
             {**INSTIT[2], "question_id": "q4", "model_prediction": "It is <image>."}]
    bench = read("instit", write(tmp_path / "p.json", items), tmp_path)
    found = {(p.index, p.field): p.message for p in bench.problems}
    assert set(found) == {(1, "split"), (2, "model_prediction"), (3, "question_id")}
    assert "duplicate question_id: item 0" in found[(3, "question_id")]
    assert [s.id for s in bench.samples] == ["q9", "q4"]  # a prediction that spells <image> is judged as the text it is
    assert bench.samples[1].answer[0].text == "It is <image>."
    with pytest.raises(InputError, match="no prediction items"):
        read("instit", write(tmp_path / "e.json", {"model_predictons": []}), tmp_path)


def test_instit_log_keeps_its_rules_and_spelling(tmp_path):
    items = [*INSTIT, {**INSTIT[0], "question_id": "bad", "split": "audio"}]
    bench = read("instit", write(tmp_path / "p.json", items), tmp_path)
    results = {"q9": result("q9", 0.7), "3": result("3", None, parse_error="no '### Score' heading"), "q1": result("q1", 0.4)}
    [path] = FORMATS["instit"].write(bench, results, tmp_path)
    log = json.loads(path.read_text())
    assert list(log) == ["accuracy", "total_num", "valid_num", "timestamp", "gpt_prompt", "model_predictons"]
    assert log["total_num"] == 4 and log["valid_num"] == 2
    assert log["accuracy"] == pytest.approx((0.7 + 0.4) / 2 * 100)  # invalid items leave the denominator
    assert datetime.strptime(log["timestamp"], "%Y-%m-%d %H:%M:%S")
    # One text, as Inst-It always writes: the prompt of the split of the item it evaluated last (this file mixes splits).
    assert log["gpt_prompt"] == bench.rubrics["instit_image"].instructions
    assert log["gpt_prompt"].startswith("You grade answers to questions about particular objects or people in one image")
    logged = log["model_predictons"]
    assert [e["question_id"] for e in logged] == ["q9", 3, "q1", "bad"]
    assert {k: logged[0][k] for k in INSTIT[0]} == INSTIT[0]  # every input key kept as it was
    assert (logged[0]["score"], logged[0]["valid"], logged[0]["error_in_gpt_eval"]) == (0.7, True, "No Error.")
    assert (logged[1]["score"], logged[1]["valid"]) == (0, False) and "no '### Score' heading" in logged[1]["error_in_gpt_eval"]
    assert (logged[3]["score"], logged[3]["valid"]) == (0, False) and "invalid input" in logged[3]["error_in_gpt_eval"]


def test_instit_log_of_a_mixed_file_has_one_prompt_the_last_item_s(tmp_path):
    # Inst-It's evaluate.py writes PROMPTS[split] of the item it evaluated last: always a text, never one per split.
    bench = read("instit", write(tmp_path / "p.json", [INSTIT[0], INSTIT[2], INSTIT[1]]), tmp_path)
    results = {"q9": result("q9", 0.7), "q1": result("q1", 0.4), "3": result("3", 0.2)}
    [path] = FORMATS["instit"].write(bench, results, tmp_path)
    assert json.loads(path.read_text())["gpt_prompt"] == bench.rubrics["instit_video"].instructions


def test_instit_multiple_choice_is_refused_not_judged(tmp_path):
    # inference_image.py / inference_video.py write multiple-choice predictions with the open-ended keys; the
    # ground truth is an option letter, and Inst-It scores them by the letter it finds in the prediction.
    choices = [{"question_id": "001-01", "question": "What new element is introduced at <4>?", "model_prediction": "B",
                "ground_truth": "C", "split": "video"},
               {"question_id": "001-02", "question": "How does [5] change?", "model_prediction": "The answer is D", "ground_truth": "D", "split": "video"}]
    with pytest.raises(InputError, match=r"a multiple-choice file .*\(evaluate.py --evaluation_formats mc\)"):
        read("instit", write(tmp_path / "video_mc_inference.json", choices), tmp_path)
    bench = read("instit", write(tmp_path / "mixed.json", [INSTIT[0], choices[0]]), tmp_path)
    assert [s.id for s in bench.samples] == ["q9"]
    assert [(p.index, p.field) for p in bench.problems] == [(1, "ground_truth")]
    assert bench.problems[0].message.startswith("a multiple-choice item (ground_truth 'C')")


def test_instit_log_leaves_out_an_item_that_is_not_an_object_or_has_no_question_id(tmp_path):
    # --skip_invalid: the run goes on, and the log must still be written, with items of Inst-It's shape only.
    no_id = {k: v for k, v in INSTIT[1].items() if k != "question_id"}
    items = [INSTIT[0], "q3: a stray line", None, 7, no_id, INSTIT[2]]
    bench = read("instit", write(tmp_path / "p.json", items), tmp_path)
    assert sorted(p.index for p in bench.problems) == [1, 2, 3, 4]  # each reported as an input problem
    [path] = FORMATS["instit"].write(bench, {"q9": result("q9", 0.7), "q1": result("q1", 0.4)}, tmp_path)
    log = json.loads(path.read_text())
    assert [e["question_id"] for e in log["model_predictons"]] == ["q9", "q1"]
    assert (log["total_num"], log["valid_num"]) == (2, 2) and log["accuracy"] == pytest.approx(55.0)


def test_instit_log_without_a_valid_item_and_with_a_limit(tmp_path):
    bench = read("instit", write(tmp_path / "p.json", INSTIT), tmp_path)
    [path] = FORMATS["instit"].write(bench, {"q9": result("q9", None, parse_error="x")}, tmp_path)  # --limit 1
    log = json.loads(path.read_text())
    assert log["accuracy"] == NO_VALID and log["total_num"] == 1 and log["valid_num"] == 0
    assert log["gpt_prompt"] == bench.rubrics["instit_image"].instructions  # one split: one text, as Inst-It writes it


# ---------------------------------------------------------------- MileBench


MILEBENCH = "data/MileBench"  # generate.py's default --data_dir: pred.json's image paths start with it


def milebench_annotation(root, dataset, n_images: dict, question_type="open-ended"):
    """`<dataset>/<dataset>.json` as MileBench ships it: sample id -> the images the sample has, untruncated."""
    folder = root / MILEBENCH / dataset
    (folder / "images").mkdir(parents=True, exist_ok=True)
    for k in range(max(n_images.values(), default=0)):
        Image.new("RGB", (32, 32), (k * 6 % 256, 0, 0)).save(folder / "images" / f"f{k}.jpg")
    data = [{"sample_id": sid, "task_instruction_id": 0, "image_quantity_level": "Few", "response": "Put the mug in the sink.",
             "task_instance": {"context": "".join(f"Step {k}: {{image#{k + 1}}}" for k in range(n)) + " What next?",
                               "images_path": [f"f{k}.jpg" for k in range(n)]}} for sid, n in n_images.items()]
    write(folder / f"{dataset}.json", {"meta_data": {"task_instruction": ["You are an agent; follow the steps."], "question_type": question_type},
                                       "data": data})


@pytest.fixture
def milebench_dir(tmp_path):
    milebench_annotation(tmp_path, "ALFRED", {1: 2, 2: 7, 3: 40, 4: 3, 5: 2})
    pred_dir = tmp_path / "outputs" / "my-model" / "ALFRED"
    pred_dir.mkdir(parents=True)
    return tmp_path, pred_dir


def milebench_record(sample_id, n_images, pred="put the mug in the sink", gt="Put the mug in the sink.", model="my-model", dataset="ALFRED"):
    """A pred.json record as generate.py writes it (its context cut to the last n_images under the token budget)."""
    context = "".join(f"Step {k}: <ImageHere>" for k in range(n_images))
    return {"sample_id": sample_id, "image": [f"{MILEBENCH}/{dataset}/images/f{k}.jpg" for k in range(n_images)],
            "question": f"You are an agent; follow the steps.\n{context}\nWhat is the next step?",
            "gt_response": gt, "gen_model_id": model, "pred_response": pred, "gen_kwargs": {"max_new_tokens": 32}}


@pytest.mark.parametrize("text, expected", [
    ("Hello, World!", "hello world"),  # ", " and "!" at the end... "!" has no space around it: it becomes a space, then stripped
    ("red/blue, (green)", "red blue green"),  # "/" inside a word -> space; ", " and " (" apart -> deleted
    ("1,000 apples; (fresh)", "1000 apples fresh"),  # a number with a comma: every mark is deleted
    ("Pi is 3.14. Done.", "pi is 3.14 done"),  # periods go, except before a digit
    ("'Quoted'", "quoted"),
    ("tab\there\nnewline", "tab here newline"),
    ("." * 40 + "x", "." * 8 + "x"),  # only the first 32 periods are removed, as in MileBench
])
def test_milebench_normalisation_follows_its_rules(text, expected):
    assert normalize(text) == expected


def test_rouge_l_is_milebench_s():
    prediction, reference = "The mug goes in the sink, then the tap.", "Put the mug in the sink."
    expected = Rouge().get_scores(normalize(prediction), normalize(reference))[0]["rouge-l"]["f"]
    assert rouge_l(prediction, reference) == expected and 0 < expected < 1
    assert rouge_l("", reference) == 0.0  # MileBench scores an empty prediction 0
    assert rouge_l("..... !!!", reference) == 0.0  # nothing left but marks: 0, not an exception


def test_milebench_question_keeps_its_interleaving():
    segments = question_segments("Instr.\nA <ImageHere> B <ImageHere>C", ["x.jpg", "y.jpg"])
    assert [(s.text, s.image) for s in segments] == [("Instr.", None), ("A ", "x.jpg"), (" B ", "y.jpg"), ("C", None)]
    starts_with_image = question_segments("<ImageHere> what is it?", ["x.jpg"])
    assert [(s.text, s.image) for s in starts_with_image] == [(None, "x.jpg"), (" what is it?", None)]


def test_a_milebench_prediction_that_spells_image_markers_is_judged_as_text(milebench_dir):
    """The question's <ImageHere> places its images (MileBench's own syntax); the prediction is the text judged."""
    root, pred_dir = milebench_dir
    pred = "Step 2: <ImageHere> then <image>, <img></img>."
    bench = read("milebench", write(pred_dir / "pred.json", [milebench_record(1, 2, pred=pred)]), root)
    [sample] = bench.samples
    assert bench.problems == [] and [(s.text, s.image) for s in sample.answer] == [(pred, None)] and len(sample.images()) == 2


def test_milebench_problems_are_named_as_its_fields(milebench_dir):
    root, pred_dir = milebench_dir
    records = [milebench_record(1, 2), {**milebench_record(2, 2), "image": [f"{MILEBENCH}/ALFRED/images/f0.jpg"]},
               milebench_record(1, 1), milebench_record(4, 1, gt="..."), {**milebench_record(5, 1), "image": [f"{MILEBENCH}/ALFRED/nope.jpg"]},
               milebench_record(9, 1)]
    bench = read("milebench", write(pred_dir / "pred.json", records), root)
    found = {(p.index, p.field): p.message for p in bench.problems}
    assert found == {
        (1, "question"): "2 <ImageHere> placeholder(s) for 1 image(s)",
        (2, "sample_id"): "duplicate sample_id: record 0 has it too",
        (3, "gt_response"): "no words once normalised as MileBench does: ROUGE-L is undefined",
        (4, "image[0]"): f"image not found: {root / MILEBENCH / 'ALFRED/nope.jpg'}",
        (5, "sample_id"): f"no sample of this id in MileBench's annotation {root / MILEBENCH / 'ALFRED/ALFRED.json'}",
    }
    assert [s.id for s in bench.samples] == ["1"]
    sample = bench.samples[0]
    assert sample.category == "milebench" and sample.model == "my-model"
    assert sample.question[0].text == "You are an agent; follow the steps." and len(sample.images()) == 2


def test_a_first_record_short_of_its_formats_fields_is_read_in_the_format_of_the_next_and_named(milebench_dir, tmp_path):
    root, pred_dir = milebench_dir
    broken = {k: v for k, v in milebench_record(1, 2).items() if k != "pred_response"}
    path = write(pred_dir / "pred.json", [broken, milebench_record(2, 2)])
    assert detect_format(path).name == "milebench"
    bench = read("milebench", path, root)
    assert [(p.index, p.field) for p in bench.problems] == [(0, "pred_response")] and [s.id for s in bench.samples] == ["2"]
    with pytest.raises(InputError, match="fit no known format"):  # no record of any format: still refused, naming the first
        detect_format(write(tmp_path / "other.json", [{"a": 1}, {"b": 2}]))


def test_milebench_eval_json_is_the_one_evaluate_py_writes_plus_the_judge_s(milebench_dir, capsys):
    root, pred_dir = milebench_dir
    # Sample 3 has 40 images in the annotation; generate.py cut its context to the last 3 under its token budget.
    records = [milebench_record(1, 2), milebench_record(2, 7, pred="wash the mug"), milebench_record(3, 3, pred=""),
               milebench_record(4, 3, model=None), milebench_record(5, 2, pred="the mug goes in the sink")]
    bench = read("milebench", write(pred_dir / "pred.json", records), root)
    assert bench.samples[3].model == "my-model"  # no gen_model_id: the folder of outputs/<model>/<dataset>/
    # 5 is left out by --limit; 3's judge output had no score.
    results = {"1": result("1", 6), "2": result("2", 3), "3": result("3", None, parse_error="x"), "4": result("4", 0)}
    eval_path, judge_path, _ = FORMATS["milebench"].write(bench, results, pred_dir)
    rouge = {r["sample_id"]: rouge_l(r["pred_response"], r["gt_response"]) for r in records}
    few, medium, many = [rouge[1], rouge[4], rouge[5]], [rouge[2]], [rouge[3]]
    assert rouge[3] == 0.0 and rouge[1] == pytest.approx(1.0) and 0 < rouge[5] < 1
    # MileBench's own figures, over every prediction (whatever --limit judged), each sample in the level of
    # the annotation's image count, the sums and counts per level, exactly as evaluate.py writes them.
    assert json.loads(eval_path.read_text()) == {
        "Rouge-L f": pytest.approx(sum(rouge.values()) / 5),
        "image_quantity_level-Accuracy": {"Few": pytest.approx(sum(few) / 3), "Medium": pytest.approx(medium[0]), "Many": 0.0},
        "image_quantity_level-Result": {"Few": [pytest.approx(sum(few)), 3], "Medium": [pytest.approx(medium[0]), 1], "Many": [0.0, 1]},
        "Judge score": pytest.approx((1 + 0.5 + 0) / 3),  # shares of the 0-6 scale; the unscored one left out
    }
    assert json.loads(judge_path.read_text()) == {
        "Judge score": pytest.approx(0.5), "image_quantity_level-Accuracy": {"Few": 0.5, "Medium": 0.5, "Many": None},
        "image_quantity_level-Result": {"Few": [1.0, 2], "Medium": [0.5, 1], "Many": [0, 0]}, "judged": 4, "unscored": 1}
    assert "note: ALFRED: 1 judged sample(s) have no score in the judge's output" in capsys.readouterr().err


def test_milebench_result_csv_is_the_row_score_py_writes(milebench_dir):
    # score.py names a model by its outputs/<model>/ folder, not by gen_model_id.
    root, pred_dir = milebench_dir
    bench = read("milebench", write(pred_dir / "pred.json", [milebench_record(1, 2, model="llava-v1.5-7b-hf"), milebench_record(2, 7)]), root)
    eval_path, _, csv_path = FORMATS["milebench"].write(bench, {"1": result("1", 6), "2": result("2", 3)}, pred_dir)
    figures = json.loads(eval_path.read_text())
    assert list(csv.reader(csv_path.open())) == [
        ["Model", "ALFRED (Rouge-L f)", "ALFRED (Judge score)"],
        ["my-model", str(round(figures["Rouge-L f"] * 100, 2)), str(round(figures["Judge score"] * 100, 2))]]


@pytest.mark.parametrize("dataset, question_type, metric", [
    ("ActionLocalization", "multi-choice", "option accuracy ('multi-choice' in meta_data.question_type)"),
    ("TextNeedleInAHaystack", "open-ended", "containment accuracy (a needle dataset)"),
    ("MMCoQA", "open-ended", "containment accuracy (a needle dataset)"),
])
def test_milebench_datasets_scored_by_another_metric_are_refused(tmp_path, dataset, question_type, metric):
    # evaluate.py picks the metric by the dataset: ROUGE-L only for open-ended, non-needle ones.
    milebench_annotation(tmp_path, dataset, {1: 2}, question_type)
    path = write(tmp_path / "outputs" / "m" / dataset / "pred.json", [milebench_record(1, 2, dataset=dataset)])
    with pytest.raises(InputError) as err:
        read("milebench", path, tmp_path)
    assert f"MileBench scores {dataset} by {metric}, not ROUGE-L" in str(err.value)


def test_milebench_without_its_annotation_says_where_it_looked(milebench_dir):
    root, pred_dir = milebench_dir
    (root / MILEBENCH / "ALFRED" / "ALFRED.json").unlink()
    with pytest.raises(InputError, match=re.escape(f"{root / MILEBENCH / 'ALFRED/ALFRED.json'}: file not found")):
        read("milebench", write(pred_dir / "pred.json", [milebench_record(1, 2)]), root)
    path = write(root / "outputs" / "m" / "Other" / "pred.json", [milebench_record(1, 2)])
    with pytest.raises(InputError, match=r"no image path of this file runs through a folder Other/"):
        read("milebench", path, root)


def test_milebench_eval_json_leaves_out_a_figure_no_sample_gives(milebench_dir, capsys):
    # MileBench's score.py does round(value * 100, 2) on every key but the split ones, and a null there
    # drops the model's row without a word; so an undefined figure is left out, and the user told.
    root, pred_dir = milebench_dir
    bench = read("milebench", write(pred_dir / "pred.json", [milebench_record(1, 2), milebench_record(2, 7)]), root)
    unparsed = {sid: result(sid, None, parse_error="no '### Score' heading") for sid in ("1", "2")}
    eval_path, _, csv_path = FORMATS["milebench"].write(bench, unparsed, pred_dir)
    figures = json.loads(eval_path.read_text())
    assert set(figures) == {"Rouge-L f", "image_quantity_level-Accuracy", "image_quantity_level-Result"}
    assert "note: ALFRED: no 'Judge score' in eval.json: none of the 2 judged sample(s) has a judge score" in capsys.readouterr().err
    assert list(csv.reader(csv_path.open()))[1] == ["my-model", str(round(figures["Rouge-L f"] * 100, 2))]


# ---------------------------------------------------------------- detection


def test_each_format_is_detected_and_an_unknown_shape_asks_for_format(tmp_path):
    assert detect_format(write(tmp_path / "a.json", INSTIT)).name == "instit"
    assert detect_format(write(tmp_path / "b.json", [milebench_record(1, 0)])).name == "milebench"
    assert detect_format(write(tmp_path / "m.json", [{"task_name": "t", "query_response": []}])).name == "megabench"
    assert detect_format(write(tmp_path / "s.json", {"data": [{"task_name": "t", "query_response": []}], "summary": {}})).name == "megabench"
    assert detect_format(write(tmp_path / "c.json", [{"id": "SA_1", "question": "q", "answer": "a"}])).name == "mmie"
    with pytest.raises(InputError, match=re.escape("first record's keys ['foo'] fit no known format; give --format mmie|milebench|instit|megabench")):
        detect_format(write(tmp_path / "d.json", [{"foo": 1}]))
    with pytest.raises(InputError, match="no records"):
        detect_format(write(tmp_path / "e.json", []))


def test_the_formats_load_without_torch():
    # judge-calibrate reads the benchmarks' scored files through these modules, and it imports no torch.
    code = ("import sys, importlib.abc\n"
            "class NoTorch(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'torch': raise ImportError('torch is blocked')\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "import mmjudge.judge.formats\n"
            "assert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_milebench_file_with_no_valid_record_names_what_is_wrong_with_each(milebench_dir):
    # The error named the images' folder ("no image path of this file runs through a folder ALFRED/"), not the records.
    root, pred_dir = milebench_dir
    records = [{k: v for k, v in milebench_record(1, 2).items() if k != "pred_response"}, {**milebench_record(2, 2), "image": "f0.jpg"}]
    with pytest.raises(InputError) as err:
        read("milebench", write(pred_dir / "pred.json", records), root)
    assert [(p.index, p.field) for p in err.value.problems] == [(0, "pred_response"), (1, "image")]
