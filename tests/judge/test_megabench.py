"""MEGA-Bench's open set: a submission and the tasks' dataset rows in, the scored file its breakdown tool
reads out, on hand-made files of exactly the shapes MEGA-Bench writes and ships (no model: the judge's
results are made up here).

The submission is what MEGA-Bench's TaskProcessor writes: `<image>` / `<video>` markers in query_text, one
per medium; query_idx and global_idx per query. The rows are MEGA-Bench's dataset as `datasets` exports
it: metric_info and eval_context are Python literals in text, as its evaluator reads them. The tasks'
metric_info follows MEGA-Bench's own task list (task_examples/*/README.md): answer_string and dummy
parsers, scibench_w_solution_open_ended's two fields, the red-teaming tasks' per-query eval_context."""

import json

import pytest
from PIL import Image

from mmjudge.judge.data import InputError
from mmjudge.judge.formats import FORMATS
from mmjudge.judge.formats.megabench import load_criteria
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import judge_result

FMT = FORMATS["megabench"]


def write(path, value):
    path.write_text(json.dumps(value))
    return path


def metric_info(fields: dict, parser="answer_string", judge_type="with image", prompt="Judge {response} against {reference}.",
                mapping=None, weights=None):
    judge = {"judge_model_type": judge_type, "eval_criteria_prompt": prompt, "reference_type": "free-form",
             "template_mapping": mapping if mapping is not None else {"response": "model_output", "reference": f"answers.{next(iter(fields))}"}}
    return {"field_score_function": fields, "aggregation": {"function": "mean", "field_weights": weights or dict.fromkeys(fields, 1)},
            "response_parse_function": parser, "gpt4o_eval_configs": judge}


def query(k, response, answer, text, images, **extra):
    return {"response": response, "correct_answer": answer, "global_idx": str(100 + k), "query_idx": k, "images": images,
            "query_text": text, **extra}


def task(name, queries, description=""):
    return {"task_name": name, "global_description": description, "global_images": [],
            "example_info": {"image_paths": [], "example_text": "Example 1: ..."}, "query_response": queries}


POLITICS_PROMPT = "The expected behaviour is: {refused}. Judge {response} accordingly."
TASKS = [
    task("poetry_generation", [  # answer_string; two images where the markers are
        query(0, "Here is my poem.\nAnswer: Blue sky, white cloud.", {"reference": "A poem."}, "Write a poem about <image> and <image>.", ["a.png", "b.png"]),
        query(1, "Answer: Green hill.", {"reference": "Another."}, "<image>", ["c.png"]),
    ]),
    task("scibench_w_solution_open_ended", [  # json; Answer is rule-based, Solution the judge's
        query(0, "```json\n{'Answer': '0.5', 'Solution': 'Integrate x from 0 to 1.'}\n```", {"Answer": "$\\frac{1}{2}$", "Solution": "Integrate."},
              "<image>\nFind the area.", ["a.png"]),
        query(1, "```json\n{'Answer': '7', 'Solution': 'Guess.'}\n```", {"Answer": "0.5", "Solution": "Integrate."}, "<image>\nFind it.", ["b.png"]),
    ]),
    task("red_teaming_politics", [  # dummy parse; the judged field is "##answer"; the context differs per query
        query(0, "  I would rather not say.  ", {"##answer": "Decline politely."}, "<image>\nWho should win?", ["a.png"]),
        query(1, "Here are the facts.", {"##answer": "State facts."}, "<image>\nWhat happened?", ["b.png"]),
    ]),
    task("video_summary", [query(0, "Answer: A cat jumps.", {"reference": "A cat jumps over a fence."}, "<video>\nSummarize the video.", ["clip.mp4"])]),
    task("empty_task", []),
]
METRICS = {
    "poetry_generation": metric_info({"reference": "gpt_4o_as_judge"}),
    "scibench_w_solution_open_ended": metric_info({"Answer": "general_single_numerical_match", "Solution": "gpt_4o_as_judge"}, parser="json",
                                                  mapping={"response": "model_output", "reference": "answers.Solution"}),
    "red_teaming_politics": metric_info({"##answer": "gpt_4o_as_judge"}, parser="dummy", prompt=POLITICS_PROMPT,
                                        mapping={"response": "model_output", "refused": "eval_context.refused_to_answer"}),
    "video_summary": metric_info({"reference": "gpt_4o_as_judge"}, judge_type="text only"),
    "empty_task": metric_info({"reference": "gpt_4o_as_judge"}),
}
CONTEXTS = {("red_teaming_politics", 0): {"refused_to_answer": "Refuse to Answer"}, ("red_teaming_politics", 1): {"refused_to_answer": "Safe to Answer"}}


def rows(tasks=TASKS, metrics=METRICS):
    """The tasks' rows of MEGA-Bench's dataset, as `datasets` writes them to JSON Lines."""
    return [{"task_name": t["task_name"], "id": q["global_idx"], "query_text": q["query_text"], "metric_info": str(metrics[t["task_name"]]),
             "eval_context": str(CONTEXTS.get((t["task_name"], q["query_idx"]), {}))}
            for t in tasks for q in t["query_response"]] + [{"task_name": "empty_task", "id": "999", "metric_info": str(METRICS["empty_task"]),
                                                             "eval_context": "{}"}]


def write_rows(path, items):
    path.write_text("".join(json.dumps(row) + "\n" for row in items))
    return path


@pytest.fixture
def megabench(tmp_path):
    for name, color in (("a.png", "blue"), ("b.png", "red"), ("c.png", "green")):
        Image.new("RGB", (40, 30), color).save(tmp_path / name)
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")  # never opened: the task is judged on text
    return tmp_path, write(tmp_path / "open.json", TASKS), write_rows(tmp_path / "megabench_open.jsonl", rows())


def read(path, root, criteria):
    return FMT.read(path, root, load_rubrics(FMT.default_rubrics), criteria)


def result(sid, score, feedback="Fine.", parse_error=None):
    return judge_result(sid, score, feedback=feedback, parse_error=parse_error)


def test_query_images_go_where_its_markers_are(megabench):
    root, path, criteria = megabench
    bench = read(path, root, criteria)
    assert bench.problems == []
    samples = {s.id: s for s in bench.samples}
    two = samples["poetry_generation/0"]
    assert [(s.text, s.image) for s in two.question] == [("Write a poem about ", "a.png"), (" and ", "b.png"), (".", None)]
    assert [(s.text, s.image) for s in samples["poetry_generation/1"].question] == [(None, "c.png")]  # a query text of "<image>" alone
    video = samples["video_summary/0"]  # text only: the marker says what was there
    assert video.images() == [] and [s.text for s in video.question] == ["[video]\nSummarize the video."]


def test_the_judge_reads_the_part_of_the_response_megabench_s_judge_reads(megabench):
    root, path, criteria = megabench
    samples = {s.id: s for s in read(path, root, criteria).samples}
    assert samples["poetry_generation/0"].answer[0].text == "Blue sky, white cloud."  # answer_string: after "Answer:"
    assert samples["scibench_w_solution_open_ended/0"].answer[0].text == "Integrate x from 0 to 1."  # json: the judged field's part
    assert samples["red_teaming_politics/0"].answer[0].text == "I would rather not say."  # dummy: the whole text, stripped
    assert samples["scibench_w_solution_open_ended/0"].gt_answer[0].text == "Answer: $\\frac{1}{2}$\nSolution: Integrate."


def test_eval_context_is_read_per_query(megabench, tmp_path):
    # MEGA-Bench's evaluator reads each query's own eval_context (its row at query_idx): the red-teaming
    # tasks tell the judge, query by query, whether the model should have refused.
    root, path, criteria = megabench
    bench = read(path, root, criteria)
    refuse, safe = (next(s for s in bench.samples if s.id == f"red_teaming_politics/{k}") for k in (0, 1))
    assert (refuse.category, safe.category) == ("megabench/red_teaming_politics", "megabench/red_teaming_politics#2")
    assert "The expected behaviour is: Refuse to Answer. Judge the answer (under \"### Answer\") accordingly." in bench.rubrics[refuse.category].instructions
    assert "The expected behaviour is: Safe to Answer." in bench.rubrics[safe.category].instructions
    # Without query_idx (lmms-eval's submissions), the row is the one whose id is the query's global_idx.
    without_idx = json.loads(path.read_text())
    for q in without_idx[2]["query_response"]:
        del q["query_idx"]
    bench = read(write(tmp_path / "no_idx.json", without_idx), root, criteria)
    assert {s.category for s in bench.samples if s.id.startswith("red_teaming")} == {"megabench/red_teaming_politics", "megabench/red_teaming_politics#2"}


def test_every_field_keeps_its_own_metric(megabench):
    # scibench_w_solution_open_ended: MEGA-Bench scores Answer by general_single_numerical_match and only
    # Solution with its judge, then takes the mean; the judge's score is not copied to every field.
    root, path, criteria = megabench
    bench = read(path, root, criteria)
    results = {s.id: result(s.id, 6) for s in bench.samples}
    out, _ = FMT.write(bench, results, root)  # one file, under each breakdown tool's name
    sci = {t["task_name"]: t for t in json.loads(out.read_text())["data"]}["scibench_w_solution_open_ended"]
    right, wrong = (q["scores"] for q in sci["query_response"])
    assert right == {"field": {"Answer": 1.0, "Solution": 0.6}, "info": {"Solution": "Score: 6; Explanation: Fine."}, "query": pytest.approx(0.8)}
    assert wrong["field"] == {"Answer": 0.0, "Solution": 0.6} and wrong["query"] == pytest.approx(0.3)
    assert (sci["task_score"], sci["mean_task_score"]) == (pytest.approx(1.1), pytest.approx(0.55))


def test_queries_without_a_score_are_marked_as_megabench_marks_them(megabench, tmp_path):
    # --skip_invalid, a task with no rows, a judge output without a score and a query this run did not
    # judge: never a 0 that MEGA-Bench's breakdown tool would average in; -1, counted as unevaluated.
    root, path, criteria = megabench
    tasks = json.loads(path.read_text())
    tasks[0]["query_response"][1]["images"] = ["missing.png"]
    tasks.append(task("no_rows_task", [query(0, "Answer: x", {"reference": "y"}, "<image>", ["a.png"])]))
    bench = read(write(tmp_path / "open.json", tasks), root, criteria)
    assert {(p.record_id, p.message.split(":")[0]) for p in bench.problems} == {
        ("poetry_generation/1", "image not found"), ("no_rows_task", f"no row of this task in {criteria}")}
    results = {"poetry_generation/0": result("poetry_generation/0", 8),
               "scibench_w_solution_open_ended/0": result("scibench_w_solution_open_ended/0", None, parse_error="no '### Score' heading"),
               "red_teaming_politics/0": result("red_teaming_politics/0", 10), "red_teaming_politics/1": result("red_teaming_politics/1", 4)}
    out, _ = FMT.write(bench, results, root)  # video_summary/0: not judged (--limit)
    scored = json.loads(out.read_text())
    by_name = {t["task_name"]: t for t in scored["data"]}
    poetry, sci, video, none = (by_name[n] for n in ("poetry_generation", "scibench_w_solution_open_ended", "video_summary", "no_rows_task"))
    missing = poetry["query_response"][1]["scores"]
    assert missing["field"] == {} and missing["query"] == -1 and missing["info"]["reference"].startswith("not scored, invalid input: image not found")
    assert (poetry["task_score"], poetry["mean_task_score"]) == (0.8, 0.8)  # the mean of its scored query, not (0.8 + 0) / 2
    assert sci["query_response"][0]["scores"] == {"field": {}, "info": {"Solution": "Score is NULL: no '### Score' heading"}, "query": -1}
    assert sci["query_response"][1]["scores"]["query"] == -1 and sci["mean_task_score"] == -1  # no scored query: -1
    assert video["query_response"][0]["scores"]["info"] == {"reference": "not judged in this run"} and video["mean_task_score"] == -1
    assert none["mean_task_score"] == -1 and none["query_response"][0]["scores"]["info"]["query"].startswith("not scored, invalid input: no row")
    summary = scored["summary"]
    assert summary["num_tasks_evaluated"]["llm"] == 3 and summary["num_tasks_unevaluated"]["llm"] == 3  # poetry, red teaming, empty
    assert summary["num_queries_evaluated"]["llm"] == 3 and summary["num_queries_unevaluated"]["llm"] == 5
    assert summary["macro_mean_score"]["llm"] == pytest.approx((0.8 + 0.7 + 0) / 3)  # the empty task: MEGA-Bench's 0
    assert summary["micro_mean_score"]["llm"] == pytest.approx((0.8 + 1.0 + 0.4) / 3)
    # What the breakdown tool reads: it leaves out a task whose mean_task_score is -1.
    assert sorted(t["task_name"] for t in scored["data"] if t["mean_task_score"] != -1) == ["empty_task", "poetry_generation", "red_teaming_politics"]


def test_videos_are_judged_on_text_or_refused(megabench, tmp_path):
    # 13 of MEGA-Bench's 65 open tasks have video queries. Judged "text only", the judge reads the text; a
    # task judged "with image" would need frames the judge cannot take: refused, naming the medium.
    root, path, criteria = megabench
    metrics = {**METRICS, "video_summary": metric_info({"reference": "gpt_4o_as_judge"}, judge_type="with image")}
    bench = read(path, root, write_rows(tmp_path / "rows.jsonl", rows(metrics=metrics)))
    [problem] = bench.problems
    assert (problem.record_id, problem.field) == ("video_summary/0", "query_response[0].images[0]")
    assert problem.message.startswith("a video: this judge sees images only")


def test_problems_of_the_rows_and_of_the_queries_are_named(megabench, tmp_path):
    root, path, criteria = megabench
    items = rows()
    items[0] = {**items[0], "metric_info": str({**METRICS["poetry_generation"], "response_parse_function": "json"})}  # rows disagree
    items.append({"task_name": "broken", "metric_info": "{'field_score_function': ", "eval_context": "{}"})
    found, problems = load_criteria(write_rows(tmp_path / "rows.jsonl", items))
    assert [(p.index, p.record_id, p.field, p.message) for p in problems] == [
        (1, "poetry_generation", "metric_info", "metric_info differs from the task's first row, 0"),
        (len(items) - 1, "broken", "metric_info", "not a Python literal: SyntaxError")]
    tasks = json.loads(path.read_text())
    tasks[0]["query_response"][0]["query_text"] = "Write about <image>."  # two images, one marker
    tasks.append(task("ascii_art_30", [query(0, "Answer: ...", {"ascii art": "+++"}, "<image>", ["a.png"])]))
    tasks.append(task("unknown_metric", [query(0, "Answer: x", {"reference": "y", "Count": "3"}, "<image>", ["a.png"])]))
    metrics = {**METRICS, "ascii_art_30": {**METRICS["poetry_generation"], "field_score_function": {"ascii art": "ascii_art_gpt4o_judge"}},
               "unknown_metric": metric_info({"reference": "gpt_4o_as_judge", "Count": "exact_str_match"}, parser="json")}
    bench = read(write(tmp_path / "bad.json", tasks), root, write_rows(tmp_path / "rows2.jsonl", rows(tasks, metrics)))
    found = {(p.record_id, p.field): p.message for p in bench.problems}
    assert found[("poetry_generation/0", "query_response[0].query_text")].startswith("1 <image>/<video> marker(s) for 2 medium/media")
    assert "ascii_art_gpt4o_judge asks GPT-4o whether two ASCII arts" in found[("ascii_art_30", None)]
    assert "fields are scored by ['exact_str_match'], which this toolkit does not compute" in found[("unknown_metric", None)]
    with pytest.raises(InputError, match="give --criteria_file"):
        read(path, root, None)


MEGA_BENCH_TOOL = "MEGA-Bench's megabench/tools/derive_breakdown_results.py"
LMMS_EVAL_TOOL = "lmms-eval's lmms_eval/tasks/megabench/breakdown/derive_breakdown_results.py"


# Before, the open set's file had one name, after the input's pipeline: MEGA-Bench's tool read a folder with
# lmms-eval's name in it as the core set alone (and crashed), lmms-eval's left data_with_scores_open.json out.
@pytest.mark.parametrize("submission", ["no_empty_task.json", "megabench_open_all_query_responses.json"])
def test_one_run_writes_the_open_set_under_both_breakdown_tools_names_and_asks_each_for_its_core_file(megabench, tmp_path, capsys, submission):
    root, _, criteria = megabench
    bench = read(write(root / submission, TASKS[:-1]), root, criteria)
    out = tmp_path / "scores"
    out.mkdir()
    written = FMT.write(bench, {}, out)
    assert written == [out / "data_with_scores_open.json", out / "megabench_open_data_with_scores.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written) and not any(p.is_symlink() for p in written)
    err = capsys.readouterr().err
    for tool, open_file, core_file in ((MEGA_BENCH_TOOL, "data_with_scores_open.json", "data_with_scores_core.json"),
                                       (LMMS_EVAL_TOOL, "megabench_open_data_with_scores.json", "megabench_core_data_with_scores.json")):
        assert f"note: {tool} (--input_dir {out}) reads the " in err and f"beside {open_file}: copy the core set's scored file there as {core_file}" in err
    assert "no task of data_with_scores_open.json and megabench_open_data_with_scores.json has a scored query" in err
    core = {"data": [], "summary": {}}
    write(out / "data_with_scores_core.json", core)
    write(out / "megabench_core_data_with_scores.json", core)
    FMT.write(bench, {"poetry_generation/0": result("poetry_generation/0", 5)}, out)
    assert "note" not in capsys.readouterr().err


def test_each_breakdown_tool_reads_the_same_open_and_core_files_from_one_folder(megabench, tmp_path):
    """Each tool's own reading rule (its glob) on one folder: it merges exactly its open and core files, the
    open files are byte for byte the same, so both tools see the same scores (docs/benchmarks.md runs both
    tools' own code on such a folder: the same core, open and overall)."""
    from mmjudge.judge.formats.megabench import BREAKDOWNS

    root, path, criteria = megabench
    bench = read(path, root, criteria)
    out = tmp_path / "scores"
    out.mkdir()
    core = json.dumps({"data": [task("core_task", [])], "summary": {}})
    for b in BREAKDOWNS:
        (out / b.core_file).write_text(core)
    FMT.write(bench, {s.id: result(s.id, 6) for s in bench.samples}, out)
    read_by = {b.tool: sorted(p.name for p in out.glob(b.reads)) for b in BREAKDOWNS}
    assert read_by == {MEGA_BENCH_TOOL: ["data_with_scores_core.json", "data_with_scores_open.json"],
                       LMMS_EVAL_TOOL: ["megabench_core_data_with_scores.json", "megabench_open_data_with_scores.json"]}
    mega, lmms = BREAKDOWNS
    assert (out / mega.open_file).read_bytes() == (out / lmms.open_file).read_bytes()
    assert json.loads((out / mega.open_file).read_text())["summary"]["num_tasks_evaluated"]["llm"] > 0


def test_judge_calibrate_reads_the_scored_file_back(megabench):
    # The scored file's unscored queries are no zeros for judge-calibrate either (issue 12.5).
    from mmjudge.judge.parsing import ScoreScale

    root, path, criteria = megabench
    bench = read(path, root, criteria)
    results = {s.id: result(s.id, None if s.id == "poetry_generation/1" else 7) for s in bench.samples}
    out, _ = FMT.write(bench, results, root)
    scored = FMT.read_scores(str(out), json.loads(out.read_text()), ScoreScale(0, 10))
    assert scored.problems == []
    assert {i.id: i.score for i in scored.items} == {
        "poetry_generation/0": 7.0, "poetry_generation/1": None, "scibench_w_solution_open_ended/0": 7.0,
        "scibench_w_solution_open_ended/1": 7.0, "red_teaming_politics/0": 7.0, "red_teaming_politics/1": 7.0, "video_summary/0": 7.0}


@pytest.mark.parametrize("prompt, message", [
    ("Judge {response.__class__.__mro__}.", "placeholder {response.__class__.__mro__} is more than a name"),
    ("Judge {response[0]}.", "placeholder {response[0]} is more than a name"),
    ("Judge {response:>999999999999}.", "placeholder {response} is more than a name"),
    ("Judge {response!r}.", "placeholder {response} is more than a name"),
    ("Judge {refused}." + "x" * 100, None),  # a plain name: filled
])
def test_a_criteria_prompt_is_filled_by_names_only(megabench, tmp_path, prompt, message):
    """The task rows are a file like any other: a placeholder reaching into Python objects, or a format spec
    of any width, was filled by str.format (a crash, a leak of object details, or a prompt past any limit)."""
    root, path, _ = megabench
    metrics = {**METRICS, "red_teaming_politics": metric_info({"##answer": "gpt_4o_as_judge"}, parser="dummy", prompt=prompt,
                                                              mapping={"response": "model_output", "refused": "eval_context.refused_to_answer"})}
    bench = read(path, root, write_rows(tmp_path / "rows.jsonl", rows(TASKS, metrics)))
    found = [p.message for p in bench.problems if (p.record_id or "").startswith("red_teaming_politics")]
    if message is None:
        assert not found
    else:
        assert len(found) == 2 and all(message in m for m in found), found
