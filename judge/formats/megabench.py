"""MEGA-Bench, open set: a local judge in place of its GPT-4o judge.

Reads a submission as MEGA-Bench's pipelines write it, a list of tasks `{task_name, global_description,
global_images, example_info: {image_paths, example_text}, query_response: [{response, correct_answer:
{field: value}, global_idx, query_idx, images, query_text}]}` (or a scored file, `{"data": [tasks]}`),
media paths relative to --input_dir, and the tasks' rows of MEGA-Bench's dataset from --criteria_file
(the `open` subset exported with `datasets`: `load_dataset("TIGER-Lab/MEGA-Bench", "open")["test"]
.to_json(...)`, JSON Lines, or a JSON list of rows). From the rows it reads what MEGA-Bench's evaluator
reads: each task's `metric_info` (which metric scores each answer field, how the fields aggregate, how
the response is parsed, and the judge's `gpt4o_eval_configs`) and each query's `eval_context` (the row at
the query's query_idx, or the row whose id is its global_idx).

Each query is a sample, id `<task_name>/<k>` (k: its position in query_response). The judge stands in for
GPT-4o on the one field MEGA-Bench scores with `gpt_4o_as_judge`, and sees what GPT-4o sees: that
field's part of the response as the task's parser cuts it (judge/formats/megabench_rules.py), the
query's images (none when the task is judged "text only") and text, and the reference answer, under the
rubric `megabench` (configs/rubrics/megabench.yaml) with the task's criteria in place of
`{task_criteria}`: its eval_criteria_prompt, filled as template_mapping says from the query's eval_context
(placeholders of the response, the question and the reference answers point at the prompt's own sections,
which show each once). A task whose queries' contexts fill its criteria differently gets a rubric per
text: `megabench/<task>`, then `megabench/<task>#2`, ... The query text's `<image>` and `<video>` markers
are where its media go, as MEGA-Bench's inference code places them; a "text only" task shows "[image]" or
"[video]" there. A video cannot be shown to this judge: a task judged "with image" that has one in a query
is refused (MEGA-Bench's evaluated models see frames sampled from it; its judge, like this one, takes images).
The scale is MEGA-Bench's: a whole number 0-10, used as N/10. The other answer fields keep MEGA-Bench's
own rule-based metric, and the query's score aggregates the fields as the task says.

Writes the scored file MEGA-Bench's evaluator writes, under the name each breakdown tool reads
(`BREAKDOWNS`): MEGA-Bench's derive_breakdown_results.py reads every data_with_scores*.json of a folder,
lmms-eval's (MEGA-Bench's README sends users to it) every megabench*data_with_scores*.json, so no one name
is read by both, and neither glob takes the other's name. The same content goes under both,
data_with_scores_open.json and megabench_open_data_with_scores.json (a copy, not a link, so that a zipped
or uploaded folder keeps both), whatever the input's name; each tool needs the core set's scored file,
named its way, beside it. The file holds the submission with, per query, `scores: {field: {f: s}, info: {f: "Score: N;
Explanation: ..."}, query: s}`, per task `eval_type: "llm"`, `task_score` (the sum) and
`mean_task_score`, and a `summary` with macro (mean of tasks) and micro (mean of queries) means. A query
not scored (invalid input, not judged in this run, or a judge output without a score) is marked as
MEGA-Bench marks a query without a score, `{field: {}, info: {f: why}, query: -1}` (its evaluator
re-evaluates such a query), and counted in the summary's num_queries_unevaluated; a task's mean is over
its scored queries, and a task with none is -1, which the breakdown tool leaves out, counted in
num_tasks_unevaluated.
"""

from __future__ import annotations

import ast
import mimetypes
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from string import Formatter
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.data import (
    MAX_TEXT_CHARS,
    ImagePlace,
    InputError,
    JudgeResult,
    Problem,
    Sample,
    Segment,
    image_problems,
    missing_file,
    parse_records,
    read_json,
    resolve_image,
    validation_problems,
    write_json_atomically,
)
from mmjudge.judge.formats import megabench_rules as rules
from mmjudge.judge.formats.base import BenchmarkInput, Format, ScoredFile, ScoredItem, first_record, interleaved

if TYPE_CHECKING:
    from mmjudge.judge.parsing import ScoreScale
    from mmjudge.judge.prompts import Rubric

BASE_RUBRIC = "megabench"
CRITERIA_SLOT = "{task_criteria}"


@dataclass(frozen=True)
class Breakdown:
    """A breakdown tool's view of a folder: the files it reads, and the names of the open and core sets' files."""

    tool: str
    reads: str  # the glob of the scored files it merges
    open_file: str
    core_file: str


BREAKDOWNS = (Breakdown("MEGA-Bench's megabench/tools/derive_breakdown_results.py", "data_with_scores*.json",
                        "data_with_scores_open.json", "data_with_scores_core.json"),
              Breakdown("lmms-eval's lmms_eval/tasks/megabench/breakdown/derive_breakdown_results.py", "megabench*data_with_scores*.json",
                        "megabench_open_data_with_scores.json", "megabench_core_data_with_scores.json"))


TASKS = "data"  # a scored file: {"data": [tasks], "summary": {...}}
JUDGE_METRIC = "gpt_4o_as_judge"
RULE_METRICS = (rules.NUMERIC_MATCH,)  # the rule-based metrics MEGA-Bench's open set uses beside its judge
MARKER = re.compile(r"(<image>|<video>)")  # where a query's media go, as MEGA-Bench's inference code splits its text
# Where an eval_criteria_prompt's placeholders point when the judge's prompt already shows the content.
SECTIONS = {
    "model_output": 'the answer (under "### Answer")',
    "example_question": 'the question (under "### Question")',
    "answers": 'the reference answer (under "### Reference Answer")',
}


class JudgeConfig(BaseModel):
    """A task's `gpt4o_eval_configs`: how MEGA-Bench's GPT-4o judge is prompted."""

    model_config = ConfigDict(extra="allow")
    eval_criteria_prompt: str
    template_mapping: dict[str, str] = {}
    judge_model_type: Literal["with image", "text only"] = "with image"


class Aggregation(BaseModel):
    model_config = ConfigDict(extra="allow")
    function: str | None
    field_weights: dict[str, float] = {}


class MetricInfo(BaseModel):
    """A task's `metric_info`, as MEGA-Bench's dataset holds it."""

    model_config = ConfigDict(extra="allow")
    field_score_function: dict[str, str]
    aggregation: Aggregation
    response_parse_function: str | None
    gpt4o_eval_configs: JudgeConfig | None = None
    global_aux_metrics: dict[str, str] = {}

    @property
    def judged(self) -> list[str]:
        return [name for name, metric in self.field_score_function.items() if metric == JUDGE_METRIC]


def _literal(value: object) -> object:
    """The dataset keeps metric_info and eval_context as Python literals in text, as MEGA-Bench reads them."""
    if not isinstance(value, str):
        return value
    try:
        return ast.literal_eval(value)
    except Exception as err:  # noqa: BLE001 - any failure means the same: not a literal
        raise ValueError(f"not a Python literal: {type(err).__name__}") from None


class Row(BaseModel):
    """One query's row of MEGA-Bench's dataset; only what its evaluator reads."""

    model_config = ConfigDict(extra="allow")
    task_name: str
    id: str | int | None = None
    metric_info: MetricInfo
    eval_context: dict[str, object] = {}

    @field_validator("metric_info", "eval_context", mode="before")
    @classmethod
    def _from_text(cls, value: object) -> object:
        return _literal(value)


@dataclass
class TaskRows:
    metric: MetricInfo
    contexts: list[dict]  # by query_idx: the task's rows in the dataset's order
    by_id: dict[str, dict]  # by global_idx: the row's id


class Query(BaseModel):
    model_config = ConfigDict(extra="allow")
    response: str
    correct_answer: dict[str, object]
    query_text: str
    images: list[str] = []
    query_idx: int | None = None
    global_idx: str | int | None = None


class Task(BaseModel):
    model_config = ConfigDict(extra="allow")
    task_name: str
    query_response: list[dict]


@dataclass(frozen=True)
class Plan:
    """How a valid query is scored: its judged field by the judge, the rest by their rules."""

    judged: str
    rule_scores: dict[str, float]
    aggregation: Aggregation


@dataclass(frozen=True)
class Submission:
    tasks: list  # as read, for the scored file
    plans: dict[str, Plan]  # by sample id
    judged_field: dict[str, str]  # task name -> its judged field, where the task's metric_info says


def looks_like(content: object) -> bool:
    if isinstance(content, dict) and isinstance(content.get(TASKS), list):
        content = content[TASKS]
    record = first_record(content)
    return record is not None and {"task_name", "query_response"} <= set(record)


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    if criteria_file is None:
        raise InputError([Problem(str(path), "MEGA-Bench's open tasks are judged by their own criteria: give --criteria_file, "
                                             "the tasks' rows of MEGA-Bench's dataset")])
    content = read_json(path)
    tasks = content[TASKS] if isinstance(content, dict) and isinstance(content.get(TASKS), list) else content
    if not isinstance(tasks, list) or not tasks:
        raise InputError([Problem(str(path), "expected a non-empty list of tasks, or {\"data\": [tasks]}")])
    rows, problems = load_criteria(criteria_file)
    parsed, task_problems = parse_records(path, tasks, Task, "task_name")
    problems += task_problems
    rubrics, samples, places, plans, seen = dict(rubrics), [], [], {}, set()
    for index, task in parsed:
        task_problems = _task_problems(path, index, task, rows, rubrics, seen, criteria_file)
        problems += task_problems
        seen.add(task.task_name)
        if task_problems:
            continue
        texts: dict[str, str] = {}  # filled criteria -> its rubric's category
        for k, raw_query in enumerate(task.query_response):
            sid = f"{task.task_name}/{k}"
            try:
                query = Query.model_validate(raw_query)
            except ValidationError as err:
                problems += validation_problems(path, index, sid, err, within=("query_response", k))
                continue
            built = _query(path, index, k, task.task_name, query, rows[task.task_name], image_root)
            if isinstance(built, list):
                problems += built
                continue
            sample, plan, criteria, shown = built
            category = texts.setdefault(criteria, _category(task.task_name, len(texts)))
            rubrics.setdefault(category, task_rubric(rubrics[BASE_RUBRIC], category, criteria))
            samples.append(sample.model_copy(update={"category": category}))
            plans[sid] = plan
            places += shown
    problems += image_problems(path, places)
    bad = {p.record_id for p in problems}
    samples = [s for s in samples if s.id not in bad]
    judged_field = {name: spec.metric.judged[0] for name, spec in rows.items() if len(spec.metric.judged) == 1}
    return BenchmarkInput(path, samples, problems, rubrics, Submission(tasks, plans, judged_field))


def _category(task_name: str, n_before: int) -> str:
    return f"{BASE_RUBRIC}/{task_name}" + (f"#{n_before + 1}" if n_before else "")


def load_criteria(path: Path) -> tuple[dict[str, TaskRows], list[Problem]]:
    """Task name -> its rows, from MEGA-Bench's dataset exported as JSON Lines or a JSON list."""
    if not path.is_file():
        raise InputError([Problem(str(path), f"criteria: {missing_file(path)}")])
    content = read_json(path)
    if not isinstance(content, list):
        raise InputError([Problem(str(path), "expected MEGA-Bench's dataset rows: JSON Lines, or a JSON list of rows "
                                             "{task_name, id, metric_info, eval_context, ...}")])
    parsed, problems = parse_records(path, content, Row, "task_name")
    tasks: dict[str, TaskRows] = {}
    first_row: dict[str, int] = {}
    for index, row in parsed:
        if row.task_name not in tasks:
            tasks[row.task_name], first_row[row.task_name] = TaskRows(row.metric_info, [], {}), index
        elif row.metric_info != tasks[row.task_name].metric:  # MEGA-Bench reads the first row's; it refuses a task whose rows differ
            problems.append(Problem(str(path), f"metric_info differs from the task's first row, {first_row[row.task_name]}",
                                    index, row.task_name, "metric_info"))
        spec = tasks[row.task_name]
        spec.contexts.append(row.eval_context)
        if row.id is not None:
            spec.by_id[str(row.id)] = row.eval_context
    return tasks, sorted(problems, key=lambda p: p.index)


def _task_problems(path: Path, index: int, task: Task, rows: dict[str, TaskRows], rubrics: dict[str, Rubric],
                   seen: set[str], criteria_file: Path) -> list[Problem]:
    name, found = task.task_name, []
    if name in seen:
        found.append(Problem(str(path), "a second task of this name", index, name, "task_name"))
    if BASE_RUBRIC not in rubrics:
        found.append(Problem(str(path), f"no rubric of category {BASE_RUBRIC!r}; give one with --rubric", index, name))
    elif CRITERIA_SLOT not in rubrics[BASE_RUBRIC].instructions:
        found.append(Problem(str(path), f"rubric {BASE_RUBRIC!r} has no {CRITERIA_SLOT} in its instructions", index, name))
    if name not in rows:
        found.append(Problem(str(path), f"no row of this task in {criteria_file}", index, name))
    elif (reason := _unjudgeable(rows[name].metric)) is not None:
        found.append(Problem(str(path), f"metric_info in {criteria_file}: {reason}", index, name))
    return found


def _unjudgeable(metric: MetricInfo) -> str | None:
    """Why this judge cannot stand in for MEGA-Bench's on a task scored so, or None."""
    functions = metric.field_score_function
    if not metric.judged:
        if "ascii_art_gpt4o_judge" in functions.values():
            return "ascii_art_gpt4o_judge asks GPT-4o whether two ASCII arts, rendered as images, show the same thing: a yes/no, not this judge's 0-10"
        return f"no field is scored by {JUDGE_METRIC} ({functions}): MEGA-Bench scores this task by rule, with no judge"
    if len(metric.judged) > 1:
        return f"{len(metric.judged)} fields are scored by {JUDGE_METRIC} ({metric.judged}); the judge stands in for one per query"
    if unknown := sorted({m for m in functions.values() if m != JUDGE_METRIC and m not in RULE_METRICS}):
        return f"fields are scored by {unknown}, which this toolkit does not compute (it has {list(RULE_METRICS)})"
    if metric.global_aux_metrics:
        return f"global_aux_metrics {metric.global_aux_metrics} are not computed here"
    if metric.aggregation.function not in rules.AGGREGATIONS:
        return f"aggregation {metric.aggregation.function!r} is none of {list(rules.AGGREGATIONS)}"
    if metric.aggregation.function == "mean" and (unweighted := sorted(set(functions) - set(metric.aggregation.field_weights))):
        return f"the mean aggregation has no field_weights for {unweighted}"
    if metric.response_parse_function not in rules.PARSERS:
        return f"response_parse_function {metric.response_parse_function!r} is none of {list(rules.PARSERS)}"
    if metric.gpt4o_eval_configs is None:
        return "no gpt4o_eval_configs: the judge's criteria"
    return None


def _query(path: Path, index: int, k: int, task_name: str, query: Query, spec: TaskRows,
           image_root: Path) -> tuple[Sample, Plan, str, list[ImagePlace]] | list[Problem]:
    """The query's sample, scoring plan, filled criteria and the images shown; or its problems."""
    sid, metric, config = f"{task_name}/{k}", spec.metric, spec.metric.gpt4o_eval_configs
    problem = lambda message, field=None: Problem(str(path), message, index, sid, field)  # noqa: E731
    found = []
    pieces = MARKER.split(query.query_text)
    markers = pieces[1::2]
    if len(markers) != len(query.images):
        found.append(problem(f"{len(markers)} <image>/<video> marker(s) for {len(query.images)} medium/media in images "
                             "(MEGA-Bench's inference code refuses the query too)", f"query_response[{k}].query_text"))
    with_images = config.judge_model_type == "with image"
    videos = [i for i, image in enumerate(query.images) if _is_video(image)]
    if with_images and videos:
        found.append(problem("a video: this judge sees images only (MEGA-Bench's evaluated models see frames sampled from it); the "
                             "task is judged 'with image' in its gpt4o_eval_configs", f"query_response[{k}].images[{videos[0]}]"))
    judged = metric.judged[0]
    if judged not in query.correct_answer:
        found.append(problem(f"no {judged!r} field, the one {JUDGE_METRIC} scores", f"query_response[{k}].correct_answer"))
    if metric.response_parse_function in rules.SINGLE_FIELD_PARSERS and len(rules.answer_fields(query.correct_answer)) != 1:
        found.append(problem(f"{metric.response_parse_function} parses an answer of one field; this one has "
                             f"{rules.answer_fields(query.correct_answer)}", f"query_response[{k}].correct_answer"))
    context = _eval_context(query, spec)
    if context is None:
        found.append(problem(f"no eval_context: no row at query_idx {query.query_idx} of the task, nor of id {query.global_idx!r}"))
    elif (reason := _unfillable(config, context)) is not None:
        found.append(problem(f"criteria: {reason}"))
    if found:
        return found
    parsed = rules.parse_response(metric.response_parse_function, query.response, query.correct_answer)
    answer = rules.field_part(parsed, judged)
    answer = answer if isinstance(answer, str) else str(answer)  # as GPT-4o's prompt would show it
    reference = reference_text(query.correct_answer)
    shown = query.images if with_images else []
    places = [ImagePlace(index, sid, f"query_response[{k}].images[{i}]", resolve_image(p, image_root)) for i, p in enumerate(shown)]
    # Text only: each marker becomes its name in brackets, "[image]", in the one text.
    texts = pieces[0::2] if with_images else ["".join(f"[{piece[1:-1]}]" if i % 2 else piece for i, piece in enumerate(pieces))]
    rule_scores = {name: rules.numeric_match(rules.field_part(parsed, name), rules.unquoted(value))
                   for name, value in query.correct_answer.items() if metric.field_score_function.get(name) == rules.NUMERIC_MATCH}
    sample = Sample(id=sid, category=BASE_RUBRIC, question=interleaved(texts, shown), answer=[Segment(text=answer)],
                    gt_answer=[Segment(text=reference)])
    return sample, Plan(judged, rule_scores, metric.aggregation), criteria_text(config, context), places


def _is_video(path: str) -> bool:
    kind, _ = mimetypes.guess_type(path)
    return kind is not None and kind.startswith("video")


def _eval_context(query: Query, spec: TaskRows) -> dict | None:
    """MEGA-Bench's lookup: the row at the query's query_idx, or the row whose id is its global_idx."""
    if query.query_idx is not None:
        return spec.contexts[query.query_idx] if 0 <= query.query_idx < len(spec.contexts) else None
    return spec.by_id.get(str(query.global_idx))


def criteria_text(config: JudgeConfig, eval_context: dict) -> str:
    """The eval_criteria_prompt with its placeholders filled (see the module docstring)."""
    values = {}
    for placeholder, source in config.template_mapping.items():
        kind, _, key = source.partition(".")
        values[placeholder] = eval_context[key] if kind == "eval_context" else SECTIONS[kind]
    return config.eval_criteria_prompt.format(**values)


def _unfillable(config: JudgeConfig, eval_context: dict) -> str | None:
    # MEGA-Bench fills the prompt with str.format, as criteria_text does: a field of more than a name
    # ({x.__class__}, {x[0]}, {x:>999999999}) would reach into Python objects or build any length of text.
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in Formatter().parse(config.eval_criteria_prompt) if name is not None]
    except ValueError as err:
        return f"eval_criteria_prompt cannot be filled: {err}"
    if odd := [name for name, spec, conversion in fields if not name.isidentifier() or spec or conversion]:
        return f"eval_criteria_prompt: placeholder {{{odd[0]}}} is more than a name; a placeholder is {{name}}, filled as template_mapping says"
    for placeholder, source in config.template_mapping.items():
        kind, _, key = source.partition(".")
        if kind == "eval_context" and key not in eval_context:
            return f"{{{placeholder}}} takes eval_context.{key}, which this query's eval_context does not give"
        if kind != "eval_context" and kind not in SECTIONS:
            return f"{{{placeholder}}} maps to {source!r}, which is none of {sorted(SECTIONS)} or eval_context.*"
    try:
        filled = criteria_text(config, eval_context)
    except KeyError as err:
        return f"placeholder {{{err.args[0]}}} has no template_mapping entry"
    except (ValueError, IndexError) as err:
        return f"eval_criteria_prompt cannot be filled: {err}"
    if len(filled) > MAX_TEXT_CHARS:
        return f"eval_criteria_prompt filled is {len(filled):,} characters, more than the {MAX_TEXT_CHARS:,} a judge's prompt may hold"
    return None


def task_rubric(base: Rubric, category: str, criteria: str) -> Rubric:
    # str.replace, not format: the instructions may hold other braces.
    return base.model_copy(update={"category": category, "instructions": base.instructions.replace(CRITERIA_SLOT, criteria)})


def reference_text(correct_answer: dict[str, object]) -> str:
    """The reference answer: its value when it has one field, else a `field: value` line each."""
    as_text = {k: v if isinstance(v, str) else str(v) for k, v in correct_answer.items()}
    if len(as_text) == 1:
        return next(iter(as_text.values()))
    return "\n".join(f"{k}: {v}" for k, v in as_text.items())


def write(bench: BenchmarkInput, results: dict[str, JudgeResult], output_dir: Path) -> list[Path]:
    """The scored submission, every query of it (see the module docstring)."""
    submission: Submission = bench.content
    # By the task's position too: a second task of a name is invalid, the first one of it is not.
    invalid = {(p.index, p.record_id): p.message for p in bench.problems if p.index is not None}
    scale = bench.rubrics[BASE_RUBRIC].score_scale
    scored = []
    for index, raw in enumerate(submission.tasks):
        if not isinstance(raw, dict) or not isinstance(raw.get("task_name"), str) or not isinstance(raw.get("query_response"), list):
            continue  # not a task: reported as invalid input
        name = raw["task_name"]
        queries = []
        for k, query in enumerate(raw["query_response"]):
            sid = f"{name}/{k}"
            reason = invalid.get((index, sid)) or invalid.get((index, name))
            scores = _scores(submission.plans.get(sid), results.get(sid), reason, submission.judged_field.get(name, "query"), scale)
            queries.append({**(query if isinstance(query, dict) else {}), "scores": scores})  # a malformed query keeps only its scores
        scored.append({**raw, "query_response": queries, "eval_type": "llm", **_task_scores(queries)})
    figures = summary(scored)
    outputs = [output_dir / b.open_file for b in BREAKDOWNS]
    for output in outputs:
        write_json_atomically(output, {TASKS: scored, "summary": figures})
    names = " and ".join(p.name for p in outputs)
    if not figures["num_tasks_evaluated"]["llm"]:
        print(f"note: no task of {names} has a scored query: the breakdown tools need one in the open set's file, "
              "as in the core set's", file=sys.stderr)
    for breakdown, output in zip(BREAKDOWNS, outputs):
        if not [p for p in output_dir.glob(breakdown.reads) if p != output]:
            print(f"note: {breakdown.tool} (--input_dir {output_dir}) reads the {breakdown.reads} files of a folder and needs the core "
                  f"set's beside {output.name}: copy the core set's scored file there as {breakdown.core_file}", file=sys.stderr)
    return outputs


def _scores(plan: Plan | None, result: JudgeResult | None, invalid: str | None, judged: str, scale: ScoreScale) -> dict:
    """A query's `scores`: the judged field's N/10 and the rule-based fields, aggregated; or the mark of no score."""
    if invalid is not None:
        why = f"not scored, invalid input: {invalid}"
    elif result is None or plan is None:
        why = "not judged in this run"
    elif result.score is None:
        why = f"Score is NULL: {result.parse_error}"
    else:
        fields = {plan.judged: scale.share(result.score), **plan.rule_scores}
        info = {plan.judged: f"Score: {result.score}; Explanation: {result.feedback.strip()}"}
        return {"field": fields, "info": info, "query": rules.aggregate(plan.aggregation.function, fields, plan.aggregation.field_weights)}
    return {"field": {}, "info": {judged: why}, "query": rules.UNSCORED}


def _task_scores(queries: list[dict]) -> dict:
    """MEGA-Bench's task_score (the sum) and mean_task_score, over the scored queries; -1 for a task with
    queries and no score (0 for one without queries, as MEGA-Bench's evaluator writes it)."""
    scores = [q["scores"]["query"] for q in queries if q["scores"]["query"] >= 0]
    if queries and not scores:
        return {"task_score": rules.UNSCORED, "mean_task_score": rules.UNSCORED}
    return {"task_score": sum(scores), "mean_task_score": sum(scores) / len(scores) if scores else 0}


def summary(tasks: list[dict]) -> dict:
    """MEGA-Bench's summary of an evaluation: counts and means by eval type (rule-based: none here), the
    unscored queries and the tasks left without a score counted as unevaluated."""
    evaluated = [t for t in tasks if t["mean_task_score"] != rules.UNSCORED]
    queries = [q["scores"]["query"] for t in tasks for q in t["query_response"]]
    n_scored = sum(score >= 0 for score in queries)
    demos = sum(1 for t in evaluated if (t.get("example_info") or {}).get("example_text") or (t.get("example_info") or {}).get("image_paths"))
    macro = sum(t["mean_task_score"] for t in evaluated) / len(evaluated) if evaluated else 0
    micro = sum(t["task_score"] for t in evaluated) / n_scored if n_scored else 0
    by_type = lambda value: {"rule": 0, "llm": value}  # noqa: E731
    return {
        "num_tasks_evaluated": by_type(len(evaluated)),
        "num_tasks_unevaluated": by_type(len(tasks) - len(evaluated)),
        "num_queries_evaluated": by_type(n_scored),
        "num_queries_unevaluated": by_type(len(queries) - n_scored),
        # MEGA-Bench counts an evaluated task's queries and its demonstration as samples
        "num_samples_all": by_type(sum(len(t["query_response"]) for t in evaluated) + demos),
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


FORMAT = Format("megabench", (CONFIG_DIR / "rubrics" / "megabench.yaml",), looks_like, read, write,
                tuple(b.open_file for b in BREAKDOWNS), read_scores)
