"""Inst-It Bench, open-ended questions: a local judge in place of its GPT-4o judge.

Reads what Inst-It's inference scripts write, a list of `{question_id, question, model_prediction,
ground_truth, split}`, or an evaluate log of its own (`{accuracy, ..., "model_predictons": [...]}`) whose
items already carry GPT-4o's `score`. Inst-It's judge reads text only (question, ground truth, response),
so this one does too. Each item is judged by the rubric of its split, `instit_image` or `instit_video`
(configs/rubrics/instit.yaml), on Inst-It's scale: 0 to 1 in steps of 0.1.

Multiple-choice files have the same keys; Inst-It scores them by the option letter (A-D) found in the
prediction, with no judge (evaluate.py --evaluation_formats mc). An item whose ground_truth is an option
letter is such an item, and is refused: a file of them all in one message, before the model loads.

Writes instit_evaluate.json in the shape of Inst-It's evaluate log, with its rules: an item the judge
could not score is `valid: false` with score 0 and leaves the denominator; `accuracy` is the mean of the
scores over the valid items x 100, or the string "No valid evaluations." when none is valid;
`gpt_prompt` is one text, the instructions of the last item's split (Inst-It writes the prompt of the
item it evaluated last, whatever the file mixes). Item keys and the log's keys are Inst-It's own
(`model_predictons` and `error_in_gpt_eval` included, spelled as its code spells them), so its
leaderboard tooling and `judge-calibrate` read the file as they read GPT-4o's. An input item that is not
a JSON object, or has no question_id, is left out of the log (its problem is in judge-score's summary):
every item of Inst-It's log is an object with one, and `judge-calibrate` refuses a log with any other.

`read_scores` reads such a log, GPT-4o's or judge-score's, for judge-calibrate: an item marked
`valid: false` is unscored (its 0 is no score).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.data import InputError, JudgeResult, JudgeText, Problem, Sample, Segment, parse_records, read_json, write_json_atomically
from mmjudge.judge.formats.base import BenchmarkInput, Format, ScoredFile, ScoredItem, first_record

if TYPE_CHECKING:
    from mmjudge.judge.parsing import ScoreScale
    from mmjudge.judge.prompts import Rubric

LOG_ITEMS = "model_predictons"  # sic, as Inst-It's evaluate.py writes it
OUTPUT = "instit_evaluate.json"
NO_VALID = "No valid evaluations."  # Inst-It's accuracy when no item could be judged
OPTIONS = ("A", "B", "C", "D")  # a multiple-choice item's ground truth is one of these
UNSCORED = "marked valid: false (a failed judge call, which Inst-It scores 0 and leaves out of its accuracy)"


class Item(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())  # model_prediction: the log's own field
    question_id: str | int
    question: JudgeText
    model_prediction: JudgeText
    ground_truth: JudgeText
    split: Literal["image", "video"]  # which of Inst-It's judge prompts applies


def looks_like(content: object) -> bool:
    if isinstance(content, dict):
        return LOG_ITEMS in content
    record = first_record(content)
    return record is not None and {"question_id", "model_prediction"} <= set(record)


def _items(path: Path, content: object) -> list:
    items = content.get(LOG_ITEMS) if isinstance(content, dict) else content
    if not isinstance(items, list):
        where = f"'{LOG_ITEMS}'" if isinstance(content, dict) else "the file"
        raise InputError([Problem(str(path), f"{where} must be a list of prediction items")])
    if not items:
        raise InputError([Problem(str(path), "no prediction items")])
    return items


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    items = _items(path, read_json(path))
    parsed, problems = parse_records(path, items, Item, "question_id")
    choices = [(index, item) for index, item in parsed if item.ground_truth in OPTIONS]
    if choices and len(choices) == len(items):
        raise InputError([Problem(str(path), "a multiple-choice file (every ground_truth is an option letter A-D): Inst-It scores it by "
                                             "the letter found in each prediction, with no judge (evaluate.py --evaluation_formats mc); "
                                             "judge-score judges open-ended files")])
    problems += [Problem(str(path), f"a multiple-choice item (ground_truth {item.ground_truth!r}): Inst-It scores it by the letter in "
                                    "the prediction, with no judge", index, str(item.question_id), "ground_truth") for index, item in choices]
    samples, first_index = [], {}
    for index, item in parsed:
        qid = str(item.question_id)
        if item.ground_truth in OPTIONS:
            continue
        if qid in first_index:
            problems.append(Problem(str(path), f"duplicate question_id: item {first_index[qid]} has it too", index, qid, "question_id"))
            continue
        first_index[qid] = index
        samples.append(Sample(
            id=qid, category=f"instit_{item.split}", question=[Segment(text=item.question)],
            answer=[Segment(text=item.model_prediction)], gt_answer=[Segment(text=item.ground_truth)],
        ))
    return BenchmarkInput(path, samples, problems, rubrics, items)


def write(bench: BenchmarkInput, results: dict[str, JudgeResult], output_dir: Path) -> list[Path]:
    """The evaluate log of the items this run judged or found invalid (with --limit, the others are left
    out), in the input's order."""
    invalid = {p.index: p.message for p in bench.problems if p.index is not None}
    logged = []
    for index, item in enumerate(bench.content):
        if not isinstance(item, dict) or "question_id" not in item:
            continue  # no log entry can hold it (see the module docstring); its problem is in the summary
        if index in invalid:
            verdict = {"score": 0, "valid": False, "error_in_gpt_eval": f"not judged, invalid input: {invalid[index]}"}
        elif (result := results.get(str(item["question_id"]))) is None:
            continue
        elif result.score is None:
            verdict = {"score": 0, "valid": False, "error_in_gpt_eval": f"no score in the judge's output: {result.parse_error}"}
        else:
            verdict = {"score": result.score, "valid": True, "error_in_gpt_eval": "No Error."}
        logged.append({**item, **verdict})
    valid = [entry["score"] for entry in logged if entry["valid"]]
    log = {
        "accuracy": sum(valid) / len(valid) * 100 if valid else NO_VALID,
        "total_num": len(logged),
        "valid_num": len(valid),
        "timestamp": datetime.now().strftime("%Y-%m-%d %H:%M:%S"),
        "gpt_prompt": _prompt(bench, logged),
        LOG_ITEMS: logged,
    }
    write_json_atomically(output_dir / OUTPUT, log)
    return [output_dir / OUTPUT]


def _prompt(bench: BenchmarkInput, logged: list[dict]) -> str:
    """The judge's instructions for the split of the last logged item that has a rubric, as Inst-It writes
    the prompt of the item it evaluated last."""
    splits = [entry.get("split") for entry in logged if f"instit_{entry.get('split')}" in bench.rubrics]
    return bench.rubrics[f"instit_{splits[-1]}"].instructions if splits else ""


def read_scores(path: str, log: dict, scale: ScoreScale) -> ScoredFile:
    """The items of an Inst-It evaluate log, an identical repeat once; every malformed item is a problem."""
    items, problems = log[LOG_ITEMS], []
    if not isinstance(items, list):
        return ScoredFile([], [Problem(path, f"must be a list of items, got {type(items).__name__}", field=LOG_ITEMS)], UNSCORED, LOG_ITEMS)
    if not items:
        return ScoredFile([], [Problem(path, "no items: the log scored no question", field=LOG_ITEMS)], UNSCORED, LOG_ITEMS)
    first: dict[str, tuple[int, ScoredItem]] = {}  # id -> (index, item)
    for index, raw in enumerate(items):
        where = f"{LOG_ITEMS}[{index}]"
        found, item = _scored_item(path, raw, where, scale)
        problems += found
        if item is None:
            continue
        if item.id not in first:
            first[item.id] = (index, item)
        elif first[item.id][1] != item:
            problems.append(Problem(path, f"question_id {item.id!r} again, scored differently than {LOG_ITEMS}[{first[item.id][0]}]", field=where))
    return ScoredFile([item for _, item in first.values()], problems, UNSCORED, LOG_ITEMS)


def _found(item: dict, key: str) -> str:
    return f"got {item[key]!r}" if key in item else "missing"


def _scored_item(path: str, item: object, where: str, scale: ScoreScale) -> tuple[list[Problem], ScoredItem | None]:
    """The item's problems, and the item when it has none."""
    if not isinstance(item, dict):
        return [Problem(path, f"an item must be an object, got {type(item).__name__}", field=where)], None
    problems = []
    qid, valid, split = item.get("question_id"), item.get("valid"), item.get("split")
    if isinstance(qid, bool) or not isinstance(qid, (str, int)):
        problems.append(Problem(path, f"must be a string or an integer, {_found(item, 'question_id')}", field=f"{where}.question_id"))
    if not isinstance(valid, bool):
        problems.append(Problem(path, f"must be true or false, {_found(item, 'valid')}", field=f"{where}.valid"))
    if not isinstance(split, str):
        problems.append(Problem(path, f"must be a string (image or video), {_found(item, 'split')}", field=f"{where}.split"))
    score = None
    if valid is True:  # a failed call's score (Inst-It writes 0) is no score: it is not read
        score = item.get("score")
        if score is None:
            problems.append(Problem(path, f"a valid item needs a number, {_found(item, 'score')}", field=f"{where}.score"))
        elif (problem := scale.problem(score)) is not None:
            problems.append(Problem(path, problem, field=f"{where}.score"))
    if problems:
        return problems, None
    return [], ScoredItem(str(qid), None if score is None else float(score), split)


FORMAT = Format("instit", (CONFIG_DIR / "rubrics" / "instit.yaml",), looks_like, read, write, (OUTPUT,), read_scores)
