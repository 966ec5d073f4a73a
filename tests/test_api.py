"""The Python API as a notebook uses it (issue 27, item 3; issue 43, item 2): `import mmjudge` costs nothing, a
judge loaded once scores dicts with PIL images into exactly the records judge-score writes for the same input,
one answer in one call, pairs in memory through `compare`, options and a rubric given per call, a calibration
report from those records in memory, and a short fine-tune whose judge loads back; errors name the keywords."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from PIL import Image

import mmjudge
from mmjudge.configs import rubric_paths
from mmjudge.infer.cli import main as score_main
from mmjudge.infer.loaded import LoadedJudge
from mmjudge.judge.data import InputError, Sample, UsageError
from mmjudge.judge.testing import write_dataset, write_pairs
from tests.infer.test_score import short_context

FAST = {"max_new_tokens": 6, "max_tiles": 2, "workers": 2}
FAST_FLAGS = ["--max_new_tokens", "6", "--max_tiles", "2", "--workers", "2"]


def picture(seed: int, size=(96, 64)) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def notebook_samples() -> list[dict]:
    """Three MMIE samples as a notebook writes them: texts, and PIL images made in memory."""
    return [
        {"id": "SA_1", "question": "Draw a red square.", "answer": [{"text": "Here it is:"}, {"image": picture(1)}], "model": "m1"},
        {"id": "PBL_2", "question": [{"text": "What is this?"}, {"image": picture(2)}], "answer": "A noisy picture.", "model": "m2"},
        {"id": "MSR_3", "question": "Explain, then show.", "answer": [{"text": "First"}, {"image": picture(3)}, {"text": "then"},
                                                                       {"image": picture(4, (40, 120))}], "gt_answer": "A reference.", "model": "m1"},
    ]


def as_files(samples: list[dict], folder) -> list[dict]:
    """The same samples as a dataset on disk: each PIL image a PNG, named by a path relative to `folder`."""
    (folder / "images").mkdir(parents=True)
    records = []
    for sample in samples:
        record = dict(sample)
        for key in ("question", "answer"):
            if isinstance(sample[key], list):
                record[key] = []
                for k, segment in enumerate(sample[key]):
                    if "image" in segment:
                        name = f"images/{sample['id']}-{key}-{k}.png"
                        segment["image"].save(folder / name)
                        segment = {"image": name}
                    record[key].append(segment)
        records.append(record)
    (folder / "data.json").write_text(json.dumps(records))
    return records


def ids_of(annotations) -> list[str]:
    """Each id of an annotation file once (a second annotator repeats it)."""
    return list(dict.fromkeys(r["id"] for r in json.loads(annotations.read_text())))


@pytest.fixture(scope="module")
def judge(checkpoint):
    return mmjudge.Judge.load(checkpoint, **FAST)


def test_import_mmjudge_loads_nothing_heavy_and_calibrate_no_torch(tmp_path):
    annotated = write_dataset(tmp_path, 6, seed=0, annotated=True)
    records = [{"id": i, "score": 3, "criteria": {}} for i in ids_of(annotated)]
    code = ("import sys, json, mmjudge\n"
            "loaded = lambda: sorted(m for m in ('torch', 'transformers', 'pydantic', 'numpy') if m in sys.modules)\n"
            "print(mmjudge.__all__, loaded())\n"
            f"report = mmjudge.calibrate(json.loads({json.dumps(json.dumps(records))}), {str(annotated)!r}, bootstrap=0)\n"
            "print(type(report).__name__, report.judges['judge'].criteria['overall'].all['n'].value, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    names, calibrated = done.stdout.strip().splitlines()
    assert names == f"{mmjudge.__all__!r} []"
    assert calibrated == "Report 6.0 False"
    for name in mmjudge.__all__:
        assert getattr(mmjudge, name) is not None
        assert name == "__version__" or getattr(mmjudge, name).__doc__, name


def test_a_notebook_scores_dicts_with_pil_images_as_judge_score_scores_the_files(judge, checkpoint, tmp_path):
    samples = notebook_samples()
    records = judge.score(samples, progress=False)
    as_files(samples, tmp_path / "data")
    assert score_main(["--model_path", str(checkpoint), "--input_dir", str(tmp_path / "data"), "--input_file", "data.json",
                       "--output_dir", str(tmp_path / "out"), *FAST_FLAGS]) == 0
    written = json.loads((tmp_path / "out" / "eval_result.json").read_text())
    assert [r["id"] for r in records] == ["SA_1", "PBL_2", "MSR_3"]
    assert records == written  # every field, the feedback, distributions and token counts included
    assert [r["n_images"] for r in records] == [1, 1, 2]
    # The same input as a file, and as Samples, gives the same records.
    assert judge.score(tmp_path / "data" / "data.json", progress=False) == written
    assert judge.score([Sample.model_validate(r) for r in json.loads((tmp_path / "data" / "data.json").read_text())],
                       input_dir=tmp_path / "data", progress=False) == written
    assert isinstance(samples[0]["answer"][1]["image"], Image.Image)  # the caller's samples are left as they were


def test_score_one_is_the_record_of_that_one_sample(judge):
    image = picture(7)
    one = judge.score_one("What is shown?", "Noise.", images=[image], category="PBL", model="m")
    [same] = judge.score([{"id": "sample", "question": "What is shown?", "answer": [{"text": "Noise."}, {"image": image}],
                           "category": "PBL", "model": "m"}], progress=False)
    assert one == same and one["category"] == "PBL" and one["n_images"] == 1
    with pytest.raises(UsageError, match="category: give the rubric that judges the answer, one of SA, PBL, MSR"):
        judge.score_one("q", "a")
    tiny = mmjudge.Judge(judge.path, judge.model, judge.device, judge.fingerprint, rubric_paths("tiny"))  # its rubrics hold the pairwise one too
    with pytest.raises(UsageError, match="one of MSR, PBL, SA$"):  # which judges pairs, never one answer
        tiny.score_one("q", "a")
    with pytest.raises(UsageError, match="give a list of samples"):
        judge.score({"id": "SA_1", "question": "q", "answer": "a"})
    # mistakes of a caller are UsageErrors naming the argument, not a TypeError from inside
    for wrong in (None, 42):
        with pytest.raises(UsageError, match=f"samples: give a file's path or a list of samples, not {type(wrong).__name__}"):
            judge.score(wrong)
    with pytest.raises(UsageError, match="question: give a text or a list of segments"):
        judge.score_one(None, "a", category="SA")
    assert judge.score_one("What is shown?", "Noise.", images=image, category="PBL", model="m") == one  # one image, not a list of one
    assert repr(judge).startswith("Judge(") and "device='cpu'" in repr(judge)


def closed_picture() -> Image.Image:
    image = picture(2)
    image.close()
    return image


@pytest.mark.parametrize("image, said", [
    (Image.new("HSV", (8, 8)), "an image of mode 'HSV', which no image file holds; convert it first"),
    (Image.new("La", (8, 8)), "an image of mode 'La', which no image file holds"),
    (Image.new("RGBa", (8, 8)), "an image of mode 'RGBa', which no image file holds"),
    (Image.new("RGB", (0, 0)), "the image is 0 x 0 pixels; an image has at least one pixel each way"),
    (closed_picture(), r"the image cannot be read \(Operation on closed image\); give it open"),
])
def test_an_image_the_judge_cannot_see_is_refused_by_its_place(judge, image, said):
    """PIL's HSV, La and RGBa images, a 0x0 and a closed one failed deep in the writing with PIL's own errors."""
    with pytest.raises(InputError) as info:
        judge.score_one("What is shown?", "Noise.", images=[picture(1), image], category="PBL")
    [problem] = map(str, info.value.problems)
    assert re.fullmatch(f"samples: record 0 \\(id 'sample'\\): answer\\[2\\].image: {said}.*", problem)


def test_score_one_without_images_given_as_none(judge):
    assert judge.score_one("What is shown?", "Noise.", images=None, category="PBL")["n_images"] == 0


def test_every_problem_of_the_samples_is_raised_before_the_model_runs(judge, tmp_path):
    samples = [{"id": "SA_1", "question": "q", "answer": [{"image": str(tmp_path / "missing.png")}]},
               {"id": "SA_2", "question": "q"},
               {"id": "XY_3", "question": "q", "answer": "a", "category": "XY"}]
    with pytest.raises(InputError) as info:
        judge.score(samples)
    problems = [str(p) for p in info.value.problems]
    assert f"samples: record 0 (id 'SA_1'): answer[0].image: image not found: {tmp_path / 'missing.png'}" in problems
    assert "samples: record 1 (id 'SA_2'): answer: Field required" in problems
    assert any(p.startswith("samples: no rubric for category XY") for p in problems)


def test_a_prompt_past_the_judges_context_is_refused_by_its_sample_or_cut_by_the_prompt_budget(checkpoint, tmp_path):
    """The API scored a prompt past the judge's context without a word (issue 45, item 2), where judge-score and
    judge-serve refuse it: refused here too, naming the sample as judge-score names its record, before any is
    scored; under prompt_token_budget the question's oldest context is cut and recorded as truncated."""
    short, data, samples = short_context(checkpoint, write_dataset(tmp_path / "dataset", 8, seed=0).parent, tmp_path)
    judge = mmjudge.Judge.load(short, **FAST)
    said = (r"record 1 \(id '{}'\): its prompt is 1,\d{{3}} tokens, and the judge's context of 1,024 tokens holds the prompt and its "
            r"answer together; give prompt_token_budget \(below 1,024\)").format(samples[1]["id"])
    for given, where in ((data / "data.json", "data.json"), (samples, "samples")):
        with pytest.raises(InputError, match=rf"{where}: {said}") as err:
            judge.score(given, input_dir=data, progress=False)
        assert [p.index for p in err.value.problems] == [1]
    whole, cut = judge.score(data / "data.json", prompt_token_budget=900, progress=False)
    assert cut["prompt_tokens"] <= 900 and cut["truncated"] and not whole["truncated"]


def test_scoring_options_and_rubrics_are_judge_scores_by_name(checkpoint):
    with pytest.raises(UsageError, match="unknown scoring option"):
        mmjudge.Judge.load(checkpoint, max_new_token=6)
    with pytest.raises(UsageError, match="max_new_tokens must be a whole number of at least 1, got 0"):
        mmjudge.Judge.load(checkpoint, max_new_tokens=0)
    with pytest.raises(UsageError, match="^deterministic runs batch-invariant Triton kernels on a CUDA GPU, and device cpu is not"):
        mmjudge.Judge.load(checkpoint, device="cpu", deterministic=True)
    tiny = mmjudge.Judge.load(checkpoint, rubrics="tiny", config="milebench", max_new_tokens=4)
    record = tiny.score_one("q", "a", category="SA", progress=False)
    assert 1 <= record["generated_tokens"] <= 4


def test_calibrate_gives_the_report_judge_calibrate_writes(tmp_path):
    human = write_dataset(tmp_path, 12, seed=1, annotated=True)
    records = [{"id": i, "score": k % 7, "criteria": {}} for k, i in enumerate(ids_of(human))]
    (tmp_path / "pred.json").write_text(json.dumps(records))
    from_files = mmjudge.calibrate(str(tmp_path / "pred.json"), str(human), output_dir=tmp_path / "report", bootstrap=50)
    assert json.loads((tmp_path / "report" / "report.json").read_text()) == from_files.model_dump(mode="json")
    assert (tmp_path / "report" / "calibrator.json").is_file()
    in_memory = mmjudge.calibrate({"pred": records}, json.loads(human.read_text()), bootstrap=50)
    assert in_memory.judges["pred"].criteria == from_files.judges["pred"].criteria
    with pytest.raises(UsageError, match="^folds must be at least 2, got 1"):
        mmjudge.calibrate(records, str(human), folds=1)


SEGMENTED = ("question", "answer", "answer_a", "answer_b")
# A rubric as a notebook writes it, in a string (prometheus-eval's habit): MMIE's SA judged by a shorter prompt.
RUBRIC = """category: SA
criteria:
  text_quality: Text quality
instructions: "Rate the answer from 0 to 6."
template: "{instructions}\\n### Question\\n{question}\\n### Answer\\n{answer}\\n### Feedback\\n"
"""


def in_memory(records: list[dict], folder) -> list[dict]:
    """The records of a file as a notebook holds them: each image a PIL image, read from `folder`."""
    def segment(part: dict) -> dict:
        return {**part, "image": Image.open(folder / part["image"]).convert("RGB")} if "image" in part else part

    return [{key: [segment(part) for part in value] if key in SEGMENTED and isinstance(value, list) else value for key, value in record.items()}
            for record in records]


def judge_score(checkpoint, folder, input_file: str, out, *flags) -> list[dict]:
    assert score_main(["--model_path", str(checkpoint), "--input_dir", str(folder), "--input_file", input_file, "--output_dir", str(out),
                       *FAST_FLAGS, *flags]) == 0
    return json.loads((out / "eval_result.json").read_text())


def test_a_notebook_compares_pairs_in_memory_with_options_per_call_as_judge_score_judges_the_file(judge, checkpoint, tmp_path):
    pairs_file = write_pairs(tmp_path / "data", 3, seed=2)
    pairs = in_memory(json.loads(pairs_file.read_text()), pairs_file.parent)
    per_call = {"samples": 2, "temperature": 0.7, "seed": 3, "max_new_tokens": 4}
    model = judge.model
    records = judge.compare(pairs, progress=False, **per_call)
    written = judge_score(checkpoint, pairs_file.parent, "pairs.json", tmp_path / "out", "--samples", "2", "--temperature", "0.7",
                          "--seed", "3", "--max_new_tokens", "4")
    assert [r["id"] for r in records] == ["pair_0001", "pair_0002", "pair_0003"]
    assert records == written  # every field: the verdicts, each order's two sampled judgements, their distributions
    assert all(len(r["forward"]) == 2 and 1 <= r["forward"][0]["generated_tokens"] <= 4 for r in records)
    assert judge.score(pairs, progress=False, **per_call) == written  # score takes pairs in memory as compare does
    assert judge.compare(pairs_file, progress=False, **per_call) == written  # and the file itself
    # the options were this call's: the judge is the one loaded, its own options unchanged
    assert judge.model is model and judge.options == FAST
    assert judge.compare(pairs, progress=False) == judge_score(checkpoint, pairs_file.parent, "pairs.json", tmp_path / "again")
    with pytest.raises(UsageError, match=r"^pairs: these are single answers \(mmie's samples\), not pairs; score them with score$"):
        judge.compare(notebook_samples())
    with pytest.raises(UsageError, match="^samples, temperature: for pairs of answers; these samples are single answers$"):
        judge.score(notebook_samples(), samples=2, temperature=0.5)
    with pytest.raises(UsageError, match="unknown scoring option.*max_new_token[;]"):
        judge.compare(pairs, max_new_token=4)


def test_the_typed_records_are_judge_scores_records_field_for_field(judge, tmp_path):
    """ScoreRecord and VerdictRecord (the types score and compare return) hold the engine's result fields, and a
    record of each has exactly their required keys: typed, and still judge-score's records as JSON."""
    from mmjudge.api import OrderRecord, ScoreRecord, VerdictRecord
    from mmjudge.judge.data import CALIBRATOR_FIELDS, JudgeResult, OrderJudgement, PairResult

    for typed, model in ((ScoreRecord, JudgeResult), (VerdictRecord, PairResult), (OrderRecord, OrderJudgement)):
        assert typed.__required_keys__ | typed.__optional_keys__ == set(model.model_fields), typed.__name__
    assert ScoreRecord.__optional_keys__ == CALIBRATOR_FIELDS | {"reward"}  # reward: a reward model's records only
    [record] = judge.score(notebook_samples()[:1], max_new_tokens=2, progress=False)
    assert set(record) == ScoreRecord.__required_keys__
    pairs = json.loads(write_pairs(tmp_path / "data", 1, seed=0).read_text())
    [verdict] = judge.compare(pairs, input_dir=tmp_path / "data", max_new_tokens=2, progress=False)
    assert set(verdict) == VerdictRecord.__required_keys__ and set(verdict["forward"][0]) == OrderRecord.__required_keys__


def test_a_rubric_given_per_call_as_a_string_or_a_dict_judges_as_its_file_does(judge, checkpoint, tmp_path):
    samples = [s for s in notebook_samples() if s["id"].startswith("SA")]
    as_files(samples, tmp_path / "data")
    (tmp_path / "sa.yaml").write_text(RUBRIC)
    written = judge_score(checkpoint, tmp_path / "data", "data.json", tmp_path / "out", "--rubric", str(tmp_path / "sa.yaml"), "--max_new_tokens", "3")
    assert judge.score(samples, rubric=RUBRIC, max_new_tokens=3, progress=False) == written
    assert judge.score(samples, rubric=yaml.safe_load(RUBRIC), max_new_tokens=3, progress=False) == written
    one = judge.score_one("Draw a red square.", "Here it is:", images=[samples[0]["answer"][1]["image"]], model="m1", rubric=RUBRIC,
                          max_new_tokens=3)
    assert {k: v for k, v in one.items() if k != "id"} == {k: v for k, v in written[0].items() if k != "id"}  # its category is the rubric's
    with pytest.raises(InputError) as info:
        judge.score(samples, rubric={"category": "SA", "template": "{answer}"})
    assert [str(p) for p in info.value.problems] == ["rubric: instructions: Field required"]
    with pytest.raises(UsageError, match="^rubric: give a dict of a rubric file's keys, its YAML text or a Rubric, not int$"):
        judge.score(samples, rubric=3)


def test_errors_name_the_python_keywords_not_the_flags(checkpoint, tmp_path):
    with pytest.raises(UsageError, match=r"^config tiny: no such file, and no bundled scoring preset of that name \(instit, megabench"):
        mmjudge.Judge.load(checkpoint, config="tiny")
    with pytest.raises(UsageError, match="^model_path .*missing"):
        mmjudge.Judge.load(tmp_path / "missing")
    with pytest.raises(UsageError, match="^dtype float8: one of bfloat16, float16, float32$"):
        mmjudge.Judge.load(checkpoint, dtype="float8")
    train_file = write_dataset(tmp_path / "data", 2, seed=0, annotated=True)
    with pytest.raises(UsageError, match="^deepspeed zero9: file not found$"):
        mmjudge.fine_tune(checkpoint, train_file, tmp_path / "out", deepspeed="zero9")
    with pytest.raises(UsageError, match="^resume: nothing to resume in .*; drop resume to start a fresh run in a new or empty output_dir$"):
        mmjudge.fine_tune(checkpoint, train_file, tmp_path / "out", resume=True)
    records = [{"id": i, "score": None, "expected_score": 3.0, "criteria": {}} for i in ids_of(train_file)]
    with pytest.raises(InputError, match="has a null score: compare their expected_score with overall expected_score$"):
        mmjudge.calibrate(records, str(train_file), bootstrap=0)


def test_every_argument_of_load_is_checked_before_the_weights_and_named_by_its_keyword(checkpoint, monkeypatch):
    """issue 56: rubrics="nosuchrubric" loaded the weights and failed at the first score(); a wrong type was a TypeError."""
    monkeypatch.setattr(LoadedJudge, "load", lambda *a, **k: pytest.fail("the weights loaded"))
    for arguments, said in [({"rubrics": "nosuchrubric"}, "^rubrics nosuchrubric: file not found$"),
                            ({"rubrics": ["sa", "nosuch"]}, "^rubrics nosuch: file not found$"),
                            ({"rubrics": 3}, r"^rubrics: give a path \(a str or Path\), not int$"),
                            ({"config": 5}, "^config: give a scoring preset's path or bundled name"),
                            ({"revision": 5}, "^revision: give a branch, tag or commit name"),
                            ({"max_new_tokens": 0}, r"^invalid scoring options \(from the defaults and the options given\):\n  max_new_tokens")]:
        with pytest.raises(UsageError, match=said):
            mmjudge.Judge.load(checkpoint, **arguments)
    with pytest.raises(UsageError, match=r"^model_path: give a local folder or a Hub id \(a str or Path\), not int$"):
        mmjudge.Judge.load(5)


def test_fine_tune_names_every_bad_input_and_setting_at_once_by_keyword(checkpoint, tmp_path):
    """issue 56: two bad inputs were named one at a time; a wrong type was a TypeError; a pair missing answer_b was
    read as a sample ("answer: Field required")."""
    train_file = write_dataset(tmp_path / "data", 2, seed=0, annotated=True)
    with pytest.raises(UsageError) as raised:
        mmjudge.fine_tune(checkpoint, train_file, tmp_path / "out", input_dir=tmp_path / "nodir", eval_file=tmp_path / "no.json",
                          rubrics="norubric", deepspeed="zero9", config=5, learning_rate="x", lora_r=0)
    said = str(raised.value)
    assert said.startswith("5 problems with the inputs and settings:\n")
    for problem in (f"input_dir {tmp_path / 'nodir'}: folder not found", f"eval_file {tmp_path / 'no.json'}: file not found",
                    "rubrics norubric: file not found", "deepspeed zero9: file not found", "config: give a path (a str or Path), not int"):
        assert f"\n  {problem}" in said
    with pytest.raises(UsageError) as raised:  # the settings themselves, each named by its keyword, not by the config
        mmjudge.fine_tune(checkpoint, train_file, tmp_path / "out", config="tiny", learning_rate="x", lora_r=0)
    assert str(raised.value).splitlines()[1:] == ["  learning_rate: Input should be a valid number, unable to parse string as a number",
                                                  "  lora_r must be a whole number of at least 1, got 0"]
    (tmp_path / "pairs.json").write_text(json.dumps([{"id": "p1", "question": "q", "answer_a": "a", "preference": "A"}]))
    with pytest.raises(InputError, match=r"^1 problem\(s\) in the input:\n  .*pairs.json: record 0 \(id 'p1'\): answer_b: Field required$"):
        mmjudge.fine_tune(checkpoint, tmp_path / "pairs.json", tmp_path / "out", config="tiny")


def test_fine_tune_names_a_missing_model_with_every_other_problem_in_one_error(tmp_path):
    """issue 56: with two bad inputs fine_tune named one; the missing model only once the others were fixed."""
    nowhere = tmp_path / "no-model"
    (tmp_path / "pairs.json").write_text(json.dumps([{"id": "p1", "question": "q", "answer_a": "a", "preference": "A"}]))
    for model, said in [(nowhere, f"model_path {nowhere}: not a local directory, nor a Hugging Face Hub id (org/name)"),
                        (5, "model_path: give a local directory or a Hugging Face Hub id (a str or Path), not int")]:
        with pytest.raises(UsageError) as raised:  # a setting and the model
            mmjudge.fine_tune(model, tmp_path / "pairs.json", tmp_path / "out", config="tiny", learning_rate=-1.0)
        assert str(raised.value).splitlines()[1:] == [f"  {said}", "  learning_rate must be a finite number of at least 0, got -1.0"]
        with pytest.raises(UsageError) as raised:  # a record and the model
            mmjudge.fine_tune(model, tmp_path / "pairs.json", tmp_path / "out", config="tiny")
        assert str(raised.value).splitlines() == ["2 problems with the inputs and settings:", f"  {said}",
                                                  f"  {tmp_path / 'pairs.json'}: record 0 (id 'p1'): answer_b: Field required"]
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_fine_tune_trains_a_judge_that_loads_back(checkpoint, tmp_path):
    train_file = write_dataset(tmp_path / "data", 8, seed=0, annotated=True)
    trained = mmjudge.fine_tune(checkpoint, train_file, tmp_path / "judge", config="tiny", rubrics="tiny", max_steps=1,
                                dataloader_workers=0)
    assert (trained.global_step, trained.evaluated, trained.best, trained.measure) == (1, False, None, "overall Pearson")
    record = mmjudge.Judge.load(trained.output_dir, rubrics="tiny", **FAST).score_one("q", "a", category="SA")
    assert record["category"] == "SA" and record["generated_tokens"] >= 1
    with pytest.raises(UsageError, match="not empty"):
        mmjudge.fine_tune(checkpoint, train_file, tmp_path / "judge", config="tiny")


def test_the_api_page_reference_is_the_codes_signatures_and_docstrings():
    """docs/api.md's reference is made from the code (docs/api_reference.py): a keyword added, renamed or
    described anew in a docstring fails here until the page is made again."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("api_reference", Path(__file__).resolve().parents[1] / "docs" / "api_reference.py")
    made = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(made)
    page = made.PAGE.read_text()
    assert made.page_with_reference(page) == page, "run: .venv/bin/python docs/api_reference.py"
    for name, function in made.DOCUMENTED:
        assert f"### `{name}{made.signature(function)}`" in page


@pytest.mark.slow
def test_a_probe_per_call_scores_the_copies_judge_score_probe_scores(judge, checkpoint, tmp_path):
    """Judge.score(probe=...) gives the records judge-score --probe writes to probe_<kind>.json."""
    samples = notebook_samples()
    as_files(samples, tmp_path / "data")
    rewordings = [{"id": "PBL_2", "answer": "Said another way."}]
    (tmp_path / "paraphrases.json").write_text(json.dumps(rewordings))
    assert score_main(["--model_path", str(checkpoint), "--input_dir", str(tmp_path / "data"), "--input_file", "data.json",
                       "--output_dir", str(tmp_path / "out"), *FAST_FLAGS, "--mode", "logits", "--probe", "paraphrase",
                       "--paraphrases", str(tmp_path / "paraphrases.json")]) == 0
    written = json.loads((tmp_path / "out" / "probe_paraphrase.json").read_text())
    assert [r["id"] for r in written] == ["PBL_2"]
    assert judge.score(tmp_path / "data" / "data.json", progress=False, mode="logits", probe="paraphrase", paraphrases=rewordings) == written
    with pytest.raises(UsageError, match="probe 'grey'"):
        judge.score(samples, progress=False, probe="grey")


def test_calibrate_on_verdicts_fits_abstention_and_a_panel(tmp_path):
    from mmjudge.judge.testing import write_verdicts

    people = write_verdicts(tmp_path / "v", 200, seed=1)
    report = mmjudge.calibrate({name: tmp_path / "v" / f"{name}.json" for name in ("sharp", "blunt")}, people, bootstrap=0, max_error=0.2,
                               panel=True, output_dir=tmp_path / "report")
    assert report.kind == "preferences" and report.judges["sharp"].selective.max_error == 0.2 and report.panel.n == 200
    assert json.loads((tmp_path / "report" / "calibrator.json").read_text())["kind"] == "pairs"
    with pytest.raises(UsageError, match="coverage: not options of verdicts on pairs"):
        mmjudge.calibrate(tmp_path / "v" / "sharp.json", people, coverage=0.8)
