"""MEGA-Bench, open set: a local judge in place of its GPT-4o judge.

Reads a submission as MEGA-Bench's pipelines write it, a list of tasks `{task_name, global_description,
global_images, example_info: {image_paths, example_text}, query_response: [{response, correct_answer:
{field: value}, global_idx, query_idx, images, query_text}]}` (or a scored file, `{"data": [tasks]}`),
image paths relative to --input_dir; and each task's evaluation criteria from --criteria_file. The
benchmark keeps those in its dataset (`metric_info` -> `gpt4o_eval_configs`), so the user exports them to
a JSON or YAML file mapping each task name to the criteria text, or to the `gpt4o_eval_configs` object
`{eval_criteria_prompt, template_mapping, judge_model_type, eval_context}`.

Each query is a sample, id `<task_name>/<k>` (k: its position in query_response), judged by the rubric
`megabench` (configs/rubrics/megabench.yaml) with the task's criteria in place of `{task_criteria}`, on
MEGA-Bench's scale: a whole number 0-10, used as N/10. As MEGA-Bench's judge, it sees the query's images
first when the task is judged "with image" and none when "text only". An eval_criteria_prompt is filled
as its template_mapping says, except that the placeholders of the response, the question and the
reference answers point at the prompt's own sections, which show each once.

Writes data_with_scores_open.json, the file MEGA-Bench's evaluator writes and its breakdown tool
(derive_breakdown_results.py reads data_with_scores*.json) takes: the submission with, per query,
`scores: {field: {f: s}, info: {f: "Score: N; Explanation: ..."}, query: s}` (every answer field gets the
query's score), per task `eval_type: "llm"`, `task_score` (the sum) and `mean_task_score`, and a `summary`
with macro (mean of tasks) and micro (mean of queries) means. A query the judge could not score counts 0,
MEGA-Bench's rule for a missing score, with the reason in `info`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from judge.configs import CONFIG_DIR
from judge.data import (
    ImagePlace,
    InputError,
    JudgeResult,
    JudgeText,
    Problem,
    Sample,
    Segment,
    image_problems,
    no_image_placeholder,
    parse_records,
    read_json,
    resolve_image,
    validation_problems,
    write_json_atomically,
)
from judge.formats.base import BenchmarkInput, Format, ScoredFile, ScoredItem, first_record
from judge.yamlfile import read_yaml

if TYPE_CHECKING:
    from judge.parsing import ScoreScale
    from judge.prompts import Rubric

BASE_RUBRIC = "megabench"
CRITERIA_SLOT = "{task_criteria}"
OUTPUT = "data_with_scores_open.json"
TASKS = "data"  # a scored file: {"data": [tasks], "summary": {...}}
# Where an eval_criteria_prompt's placeholders point when the judge's prompt already shows the content.
SECTIONS = {
    "model_output": 'the answer (under "### Answer")',
    "example_question": 'the question (under "### Question")',
    "answers": 'the reference answer (under "### Reference Answer")',
}


class TaskCriteria(BaseModel):
    """One task's `gpt4o_eval_configs`, as MEGA-Bench's dataset holds it."""

    model_config = ConfigDict(extra="allow")
    eval_criteria_prompt: JudgeText  # it goes into the judge's prompt
    template_mapping: dict[str, str] = {}
    judge_model_type: Literal["with image", "text only"] = "with image"
    eval_context: dict[str, object] = {}


class Query(BaseModel):
    model_config = ConfigDict(extra="allow")
    response: JudgeText
    correct_answer: dict[str, object]
    query_text: JudgeText
    images: list[str] = []

    @field_validator("correct_answer")
    @classmethod
    def _reference_is_judge_text(cls, answer: dict[str, object]) -> dict[str, object]:
        for value in answer.values():  # the judge reads them as the reference answer
            if isinstance(value, str):
                no_image_placeholder(value)
        return answer


class Task(BaseModel):
    model_config = ConfigDict(extra="allow")
    task_name: str
    query_response: list[dict]


def looks_like(content: object) -> bool:
    if isinstance(content, dict) and isinstance(content.get("data"), list):
        content = content["data"]
    record = first_record(content)
    return record is not None and {"task_name", "query_response"} <= set(record)


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    if criteria_file is None:
        raise InputError([Problem(str(path), "MEGA-Bench's open tasks are judged by their own criteria: give --criteria_file")])
    content = read_json(path)
    tasks = content["data"] if isinstance(content, dict) and isinstance(content.get("data"), list) else content
    if not isinstance(tasks, list) or not tasks:
        raise InputError([Problem(str(path), "expected a non-empty list of tasks, or {\"data\": [tasks]}")])
    criteria, problems = load_criteria(criteria_file)
    parsed, task_problems = parse_records(path, tasks, Task, "task_name")
    problems += task_problems
    rubrics, samples, places, seen = dict(rubrics), [], [], set()
    for index, task in parsed:
        task_problems = _task_problems(path, index, task, criteria, rubrics, seen, criteria_file)
        problems += task_problems
        seen.add(task.task_name)
        if task_problems:
            continue
        rubrics[category(task.task_name)] = task_rubric(rubrics[BASE_RUBRIC], task.task_name, criteria[task.task_name])
        with_images = criteria[task.task_name].judge_model_type == "with image"
        for k, raw_query in enumerate(task.query_response):
            sid = f"{task.task_name}/{k}"
            try:
                query = Query.model_validate(raw_query)
            except ValidationError as err:
                problems += validation_problems(path, index, sid, err, within=("query_response", k))
                continue
            shown = query.images if with_images else []
            places += [ImagePlace(index, sid, f"query_response[{k}].images[{i}]", resolve_image(p, image_root)) for i, p in enumerate(shown)]
            samples.append(Sample(
                id=sid, category=category(task.task_name), question=[Segment(image=p) for p in shown] + [Segment(text=query.query_text)],
                answer=[Segment(text=query.response)], gt_answer=[Segment(text=reference_text(query.correct_answer))],
            ))
    problems += image_problems(path, places)
    bad = {p.record_id for p in problems}
    samples = [s for s in samples if s.id not in bad]
    return BenchmarkInput(path, samples, problems, rubrics, tasks)


def category(task_name: str) -> str:
    return f"{BASE_RUBRIC}/{task_name}"


def load_criteria(path: Path) -> tuple[dict[str, TaskCriteria], list[Problem]]:
    """Task name -> criteria, from JSON or YAML; a plain text is the whole criteria."""
    if not path.is_file():
        raise InputError([Problem(str(path), "criteria file not found")])
    entries = read_yaml(path) if path.suffix in (".yaml", ".yml") else read_json(path)
    if not isinstance(entries, dict):
        raise InputError([Problem(str(path), "expected an object mapping each task name to its criteria")])
    criteria, problems = {}, []
    for name, entry in entries.items():
        try:
            criteria[name] = TaskCriteria(eval_criteria_prompt=entry) if isinstance(entry, str) else TaskCriteria.model_validate(entry)
        except ValidationError as err:
            problems += validation_problems(path, None, str(name), err)
    return criteria, problems


def _task_problems(path: Path, index: int, task: Task, criteria: dict[str, TaskCriteria], rubrics: dict[str, Rubric],
                   seen: set[str], criteria_file: Path) -> list[Problem]:
    name, found = task.task_name, []
    if name in seen:
        found.append(Problem(str(path), "a second task of this name", index, name, "task_name"))
    if BASE_RUBRIC not in rubrics:
        found.append(Problem(str(path), f"no rubric of category {BASE_RUBRIC!r}; give one with --rubric", index, name))
    elif CRITERIA_SLOT not in rubrics[BASE_RUBRIC].instructions:
        found.append(Problem(str(path), f"rubric {BASE_RUBRIC!r} has no {CRITERIA_SLOT} in its instructions", index, name))
    if name not in criteria:
        found.append(Problem(str(path), f"no criteria for this task in {criteria_file}", index, name))
    elif (reason := _unfillable(criteria[name])) is not None:
        found.append(Problem(str(path), f"criteria in {criteria_file}: {reason}", index, name))
    return found


def criteria_text(criteria: TaskCriteria) -> str:
    """The eval_criteria_prompt with its placeholders filled (see the module docstring)."""
    values = {}
    for placeholder, source in criteria.template_mapping.items():
        kind, _, key = source.partition(".")
        values[placeholder] = criteria.eval_context[key] if kind == "eval_context" else SECTIONS[kind]
    return criteria.eval_criteria_prompt.format(**values)


def _unfillable(criteria: TaskCriteria) -> str | None:
    for placeholder, source in criteria.template_mapping.items():
        kind, _, key = source.partition(".")
        if kind == "eval_context" and key not in criteria.eval_context:
            return f"{{{placeholder}}} takes eval_context.{key}, which the criteria entry does not give"
        if kind != "eval_context" and kind not in SECTIONS:
            return f"{{{placeholder}}} maps to {source!r}, which is none of {sorted(SECTIONS)} or eval_context.*"
    try:
        criteria_text(criteria)
    except KeyError as err:
        return f"placeholder {{{err.args[0]}}} has no template_mapping entry"
    except (ValueError, IndexError) as err:
        return f"eval_criteria_prompt cannot be filled: {err}"
    return None


def task_rubric(base: Rubric, task_name: str, criteria: TaskCriteria) -> Rubric:
    # str.replace, not format: the instructions may hold other braces.
    return base.model_copy(update={"category": category(task_name),
                                   "instructions": base.instructions.replace(CRITERIA_SLOT, criteria_text(criteria))})


def reference_text(correct_answer: dict[str, object]) -> str:
    """The reference answer: its value when it has one field, else a `field: value` line each."""
    as_text = {k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for k, v in correct_answer.items()}
    if len(as_text) == 1:
        return next(iter(as_text.values()))
    return "\n".join(f"{k}: {v}" for k, v in as_text.items())


def write(bench: BenchmarkInput, results: dict[str, JudgeResult], output_dir: Path) -> list[Path]:
    """The scored submission over the queries this run judged or found invalid (with --limit, the queries
    left out are not in it)."""
    # By the task's position too: a second task of a name is invalid, the first one of it is not.
    invalid = {(p.index, p.record_id): p.message for p in bench.problems if p.index is not None}
    scale = bench.rubrics[BASE_RUBRIC].score_scale
    scored = []
    for index, raw in enumerate(bench.content):
        if not isinstance(raw, dict) or not isinstance(raw.get("task_name"), str) or not isinstance(raw.get("query_response"), list):
            continue  # not a task: reported as invalid input
        queries = _scored_queries(index, raw, invalid, results, scale)
        if raw["query_response"] and not queries:
            continue
        total = sum(q["scores"]["query"] for q in queries)
        scored.append({**raw, "query_response": queries, "eval_type": "llm", "task_score": total,
                       "mean_task_score": total / len(queries) if queries else 0})  # MEGA-Bench's 0 for an empty task
    write_json_atomically(output_dir / OUTPUT, {"data": scored, "summary": summary(scored)})
    return [output_dir / OUTPUT]


def _scored_queries(index: int, task: dict, invalid: dict[tuple[int, str], str], results: dict[str, JudgeResult],
                    scale) -> list[dict]:
    queries = []
    for k, query in enumerate(task["query_response"]):
        sid = f"{task['task_name']}/{k}"
        if (reason := invalid.get((index, sid)) or invalid.get((index, task["task_name"]))) is not None:
            score, info = 0.0, f"not judged, invalid input: {reason}"
        elif (result := results.get(sid)) is None:
            continue
        elif result.score is None:
            score, info = 0.0, f"Score is NULL: {result.parse_error}"
        else:
            score = scale.share(result.score)
            info = f"Score: {result.score}; Explanation: {result.feedback.strip()}"
        query = query if isinstance(query, dict) else {}  # a malformed query keeps only its scores
        answer = query.get("correct_answer")
        fields = list(answer) if isinstance(answer, dict) and answer else ["response"]
        queries.append({**query, "scores": {"field": dict.fromkeys(fields, score), "info": dict.fromkeys(fields, info), "query": score}})
    return queries


def summary(tasks: list[dict]) -> dict:
    """MEGA-Bench's summary of an evaluation: counts and means by eval type (rule-based: none here)."""
    n_queries = sum(len(t["query_response"]) for t in tasks)
    demos = sum(1 for t in tasks if (t.get("example_info") or {}).get("example_text") or (t.get("example_info") or {}).get("image_paths"))
    macro = sum(t["mean_task_score"] for t in tasks) / len(tasks) if tasks else 0
    micro = sum(t["task_score"] for t in tasks) / n_queries if n_queries else 0
    by_type = lambda value: {"rule": 0, "llm": value}  # noqa: E731
    return {
        "num_tasks_evaluated": by_type(len(tasks)),
        "num_tasks_unevaluated": by_type(0),
        "num_queries_evaluated": by_type(n_queries),
        "num_queries_unevaluated": by_type(0),
        "num_samples_all": by_type(n_queries + demos),  # MEGA-Bench counts a task's demonstration as a sample
        "macro_mean_score": by_type(macro),
        "micro_mean_score": by_type(micro),
        "overall_macro_mean_score": macro,
        "overall_micro_mean_score": micro,
    }


JUDGED, NULL = "Score: ", "Score is NULL"  # how MEGA-Bench's judge begins a field's info: scored, or no score in its output
UNSCORED = ("marked unscored (MEGA-Bench's -1; 'Score is NULL', a judge output without a score, which MEGA-Bench counts 0; "
            "or no 0-10 judge field, as in ascii_art_30)")


def read_scores(path: str, scored: dict, scale: ScoreScale) -> ScoredFile:
    """A scored file's queries, GPT-4o's or judge-score's: each one's judge score is its judged field's N/10
    read as N (the field whose info the judge wrote, "Score: N; ..."; other fields are rule-based).
    Unscored: a query of -1, a judge field whose info says "Score is NULL" (MEGA-Bench scores it 0), and a
    query no 0-10 judge scored (ascii_art_30's yes/no judge writes no info)."""
    tasks, problems = scored[TASKS], []
    if not isinstance(tasks, list) or not tasks:
        return ScoredFile([], [Problem(path, "must be a non-empty list of tasks", field=TASKS)], UNSCORED, TASKS)
    first: dict[str, tuple[str, ScoredItem]] = {}  # id -> (where, item)
    for t, task in enumerate(tasks):
        where = f"{TASKS}[{t}]"
        if not isinstance(task, dict) or not isinstance(task.get("task_name"), str) or not isinstance(task.get("query_response"), list):
            problems.append(Problem(path, "a task needs a task_name and a query_response list", field=where))
            continue
        for k, query in enumerate(task["query_response"]):
            found, score = _judge_score(path, query, f"{where}.query_response[{k}]", scale)
            problems += found
            if found:
                continue
            item = ScoredItem(f"{task['task_name']}/{k}", score, task["task_name"])
            if item.id not in first:
                first[item.id] = (where, item)
            elif first[item.id][1] != item:  # a task name twice: its queries' ids collide
                problems.append(Problem(path, f"query {item.id!r} again, scored differently than in {first[item.id][0]}", field=where))
    return ScoredFile([item for _, item in first.values()], problems, UNSCORED, TASKS)


def _judge_score(path: str, query: object, where: str, scale: ScoreScale) -> tuple[list[Problem], float | None]:
    scores = query.get("scores") if isinstance(query, dict) else None
    value = scores.get("query") if isinstance(scores, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return [Problem(path, "no scores.query number: not a scored file, or a query it left unscored", field=where)], None
    info, fields = scores.get("info"), scores.get("field")
    info = info if isinstance(info, dict) else {}
    judged = [name for name, text in info.items() if isinstance(text, str) and text.startswith(JUDGED)]
    if value < 0 or not judged or any(isinstance(text, str) and text.startswith(NULL) for text in info.values()):
        return [], None
    values, problems = [], []
    for name in judged:
        field_value = fields.get(name) if isinstance(fields, dict) else None
        if isinstance(field_value, bool) or not isinstance(field_value, (int, float)):
            problems.append(Problem(path, f"the judge's info has no score beside it, got {field_value!r}", field=f"{where}.scores.field.{name}"))
        elif (problem := scale.problem(round(field_value * 10, 6))) is not None:
            problems.append(Problem(path, problem, field=f"{where}.scores.field.{name} x 10"))
        else:
            values.append(round(field_value * 10, 6))
    return problems, (sum(values) / len(values) if values and not problems else None)


FORMAT = Format("megabench", (CONFIG_DIR / "rubrics" / "megabench.yaml",), looks_like, read, write, (OUTPUT,), read_scores)
