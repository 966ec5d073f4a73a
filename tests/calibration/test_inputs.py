"""Benchmarks' scored files (Inst-It Bench evaluate logs, MEGA-Bench scored files) as either side of judge-calibrate."""

import json

import pytest

from mmjudge.calibration.inputs import coverage_notes, load_ratings, read_human, read_predictions
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.data import InputError

TENTHS = ScoreScale(0, 1, 0.1)


def item(question_id, score, split="image", valid=True):
    return {"question_id": question_id, "question": "What is [1] doing at <3>?", "model_prediction": "walking",
            "ground_truth": "running", "split": split, "score": score, "valid": valid,
            "error_in_gpt_eval": "No Error." if valid else "Error code: 500"}


def log(path, items):
    """A log as Inst-It's evaluate.py writes it (the items key misspelt as there); the summary is not read."""
    content = {"accuracy": 51.2, "total_num": len(items), "valid_num": len(items), "timestamp": "2025-01-02 03:04:05", "gpt_prompt": "You are an expert evaluator ...", "model_predictons": items}
    path.write_text(json.dumps(content, indent=4))
    return str(path)


def test_items_become_records_and_failed_judge_calls_stay_unscored(tmp_path):
    path = log(tmp_path / "log.json", [item("001-01", 0.7), item(17, 0.3, "video"), item("002-01", 0, "video", valid=False)])
    judge = read_predictions(path, TENTHS)
    assert judge.problems == [] and judge.invalid == ["002-01"] and judge.parse_failures == 0
    assert {i: (r.scores, r.category) for i, r in judge.records.items()} == {
        "001-01": ({"overall": 0.7}, "image"), "17": ({"overall": 0.3}, "video"), "002-01": ({}, "video")}
    human = read_human(path, TENTHS)
    assert human.problems == [] and human.invalid == ["002-01"]
    assert {i: r.ratings for i, r in human.records.items()} == {"001-01": {"overall": [0.7]}, "17": {"overall": [0.3]}, "002-01": {}}
    assert human.records["17"].category == "video"


def test_ids_pair_up_whatever_their_order_and_failed_calls_on_either_side_are_named(tmp_path):
    ids = ["003-02", 5, "001-01", "10", "2", "001-10"]
    local = log(tmp_path / "local.json", [item(q, 0.1 * k, valid=q != "10") for k, q in enumerate(ids)])
    gpt = log(tmp_path / "gpt.json", [item(q, 0.1 * k, valid=q != "2") for k, q in reversed(list(enumerate(ids)))])
    ratings = load_ratings([local], ["local"], gpt, TENTHS)
    for k, q in enumerate(ids):
        if q not in ("10", "2"):
            assert ratings.judges["local"][str(q)].scores["overall"] == ratings.human[str(q)].mean("overall") == pytest.approx(0.1 * k)
    coverage = ratings.coverage["local"]
    assert (coverage.shared_ids, coverage.only_in_predictions, coverage.only_in_human) == (6, 0, 0)
    assert (coverage.invalid, coverage.invalid_first, ratings.human_invalid) == (1, ["10"], ["2"])
    notes = coverage_notes(ratings, gpt)
    assert any(n.startswith(f"1 item(s) of {gpt} marked valid: false") and n.endswith("left out: 2") for n in notes)
    assert any(n.startswith(f"local: 1 item(s) of {local} marked valid: false") and n.endswith("left out: 10") for n in notes)


def test_an_identical_repeat_counts_once(tmp_path):
    path = log(tmp_path / "log.json", [item(1, 0.5), item(1, 0.5), item(2, 0.6)])
    assert list(read_predictions(path, TENTHS).records) == ["1", "2"]


def test_every_problem_of_a_malformed_log_at_once(tmp_path):
    no_valid = item(4, 0.5)
    del no_valid["valid"]
    items = [item(0, 0.5), "not an item", item(None, 0.5), item(3, 1.5), no_valid, item(5, None), item(6, "0.8"),
             item(7, 0.2, split=None), item(8, True), item(0, 0.6), item(9, "n/a", valid=False)]
    path = log(tmp_path / "bad.json", items)
    problems = [str(p) for p in read_predictions(path, TENTHS).problems]
    assert problems == [
        f"{path}: model_predictons[1]: an item must be an object, got str",
        f"{path}: model_predictons[2].question_id: must be a string or an integer, got None",
        f"{path}: model_predictons[3].score: 1.5 is outside the scale 0-1",
        f"{path}: model_predictons[4].valid: must be true or false, missing",
        f"{path}: model_predictons[5].score: a valid item needs a number, got None",
        f"{path}: model_predictons[6].score: '0.8' is not a number",
        f"{path}: model_predictons[7].split: must be a string (image or video), got None",
        f"{path}: model_predictons[8].score: True is not a number",
        f"{path}: model_predictons[9]: question_id '0' again, scored differently than model_predictons[0]",
    ]  # item 10: a failed call's score is not read


@pytest.mark.parametrize(
    "items, message",
    [([], "model_predictons: no items: the log scored no question"), ({"0": item(0, 0.5)}, "model_predictons: must be a list of items, got dict"),
     ([item(0, 0, valid=False)], "model_predictons: every item is marked valid: false (a failed judge call, which Inst-It scores 0 and leaves "
                                 "out of its accuracy): no score to compare")],
)
def test_a_log_without_scored_items_is_an_error(tmp_path, items, message):
    path = log(tmp_path / "log.json", items)
    assert [str(p) for p in read_human(path, TENTHS).problems] == [f"{path}: {message}"]


@pytest.mark.parametrize(
    "name, text, message",
    [("other.json", json.dumps({"accuracy": 50, "predictions": []}), "other.json: a JSON object that is no benchmark's scored file: expected a JSON list"),
     ("number.json", "3", "number.json: neither a JSON list nor an object: expected a JSON list of records, JSONL, an Inst-It evaluate log "
                          "('model_predictons') or a MEGA-Bench scored file ('data': [tasks])"),
     ("broken.json", '{"model_predictons": [}', "broken.json: invalid JSON at line 1, column 23"),
     ("broken.jsonl", '{"id": 1, "overall": 2}\n{"id": 2,', "broken.jsonl: invalid JSON on line 2"),
     ("empty.json", " \n", "empty.json: file is empty"), ("missing.json", None, "missing.json: file not found")],
)
def test_unreadable_files_are_named_as_judge_data_names_them(tmp_path, name, text, message):
    if text is not None:
        (tmp_path / name).write_text(text)
    with pytest.raises(InputError) as err:
        read_human(str(tmp_path / name), TENTHS)
    assert message in str(err.value)


def test_jsonl_records_are_read(tmp_path):
    (tmp_path / "h.jsonl").write_text('{"id": "a", "overall": 0.2}\n\n{"id": "b", "overall": 0.9}\n')
    assert {i: r.ratings for i, r in read_human(str(tmp_path / "h.jsonl"), TENTHS).records.items()} == {"a": {"overall": [0.2]}, "b": {"overall": [0.9]}}


# ---------------------------------------------------------------- MEGA-Bench

def query(field, info=None, total=None, **rule_fields):
    """A query of a MEGA-Bench scored file: the judged field `reference` (its value and info) beside any
    rule-based fields, aggregated by their mean unless `total` says otherwise."""
    fields = {"reference": field, **rule_fields}
    return {"response": "r", "correct_answer": dict.fromkeys(fields, "x"),
            "scores": {"field": fields, "info": {} if info is None else {"reference": info},
                       "query": total if total is not None else sum(fields.values()) / len(fields)}}


def test_megabench_unscored_queries_are_not_read_as_zeros(tmp_path):
    # GPT-4o's file scores a judge output without a score 0 ("Score is NULL"), judge-score's marks a query it
    # did not score -1 with no field, and a yes/no judge (ascii_art_30) writes no info: none of them is a 0-10
    # judge score. A query with a rule-based field beside the judged one is compared on the judged field alone.
    tasks = [{"task_name": "poetry", "query_response": [
                 query(0.7, "Score: 7; Explanation: vivid"), query(0, "Score is NULL: I cannot help with that.;"),
                 {"response": "r", "scores": {"field": {}, "info": {"reference": "not scored: no '### Score' heading"}, "query": -1}}]},
             {"task_name": "scibench_w_solution_open_ended", "query_response": [query(0.3, "Score: 3; Explanation: wrong", Answer=1.0)]},
             {"task_name": "ascii_art_30", "query_response": [{"response": "r", "scores": {"field": {"ascii art": 1}, "info": {}, "query": 1.0}}]}]
    path = tmp_path / "data_with_scores_open.json"
    path.write_text(json.dumps({"data": tasks, "summary": {}}))
    judge = read_predictions(str(path), ScoreScale(0, 10))
    assert judge.problems == []
    assert {i: r.scores for i, r in judge.records.items()} == {
        "poetry/0": {"overall": 7.0}, "poetry/1": {}, "poetry/2": {}, "scibench_w_solution_open_ended/0": {"overall": 3.0}, "ascii_art_30/0": {}}
    assert sorted(judge.invalid) == ["ascii_art_30/0", "poetry/1", "poetry/2"]
    assert judge.records["scibench_w_solution_open_ended/0"].category == "scibench_w_solution_open_ended"
    human = read_human(str(path), ScoreScale(0, 10))
    assert human.problems == [] and sorted(human.invalid) == sorted(judge.invalid) and human.invalid_means.startswith("marked unscored")
