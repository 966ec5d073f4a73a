"""MMRB2, Multimodal RewardBench 2 (github facebookresearch/MMRB2): 4 x 1,000 expert pairs in four tasks, one
of them interleaved text-and-image answers, each judged in both orders.

Reads a task's file as its build_from_hf.py writes it (t2i.json, edit.json, interleaved.json,
reasoning.json): `{"pairs": [{id, prompt_content: [["text", ...], ["image", path]], response_a: {model_name,
response_content}, response_b, chosen: "A"|"B", human_annotations, prompt_source, prompt_metadata}]}`, paths
relative to --input_dir (the benchmark's folder). A record is a pair, its task (and rubric category
`mmrb2_<task>`) given by its prompt_source, as the benchmark's build groups its sources; each piece of the
contents is a segment, in order.

Writes the predictions its compute_accuracy.py reads, `mmrb2_predictions.json`: `{pair id: {"forward":
[{judgement, evaluator, metadata}], "reverse": [...]}}`, the judgement as the judge wrote it (in the reverse
order, "A" is the pair's B: compute_accuracy.py flips it), metadata the judge's JSON where it parses; a
judgement without better_response is left out, as its evaluate.py leaves out a judgement that failed. And
the figures compute_accuracy.py writes with --output, computed by its rules, `mmrb2_accuracy.json`:
`{task_name, accuracy, total_pairs, evaluated_pairs, missing_pairs}`, where accuracy counts the first
judgement of each order, reverse flipped, over every judgement given; with the correct and evaluated counts;
its pairs are those read (a record set aside under --skip_invalid is not one).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from mmjudge.judge.data import InputError, JudgeText, Pair, PairResult, Problem, Segment, flip, parse_records, read_json, write_json_atomically
from mmjudge.judge.formats.base import BenchmarkInput, Format, Preference, PreferenceFile, judgements, pair_input, preferences_of
from mmjudge.judge.verdicts import mmrb2_json

if TYPE_CHECKING:
    from mmjudge.judge.prompts import Rubric

PREDICTIONS, ACCURACY = "mmrb2_predictions.json", "mmrb2_accuracy.json"
EVALUATOR = "mmjudge"
# The task of each source, as the benchmark's build (benchmark/sources) groups them into its four files.
TASKS = {
    "image": ("oneigbench", "r2ibench", "wise", "evalmuse", "realunify_ueg"),
    "edit": ("emu-edit", "dreambench", "dreambooth", "risebench", "hq-edit", "new_synthetic_edit", "text_heavy_edit"),
    "interleaved": ("isgbench", "chameleon", "interleavedeval", "mmmg"),
    "reasoning": ("blink", "mindcube", "muirbench", "realunify", "visulogic", "vstar"),
}
TASK_OF = {source: task for task, sources in TASKS.items() for source in sources}
CATEGORIES = tuple(f"mmrb2_{task}" for task in TASKS)


class Response(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())  # model_name: the field its release names so
    model_name: str | None = None
    response_content: list[tuple[str, JudgeText]]


class Record(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    prompt_content: list[tuple[str, JudgeText]]
    response_a: Response
    response_b: Response
    chosen: Literal["A", "B", ""] | None = None  # build_from_hf.py writes "" where the row has no choice
    prompt_source: str


def looks_like(content: object) -> bool:
    items = content.get("pairs") if isinstance(content, dict) else None
    return isinstance(items, list) and bool(items) and isinstance(items[0], dict) and {"response_a", "response_b"} <= set(items[0])


def segments(content: list[tuple[str, str]]) -> list[Segment]:
    return [Segment(image=value) if kind == "image" else Segment(text=value) for kind, value in content]


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    content = read_json(path)
    if not looks_like(content):
        raise InputError([Problem(str(path), "expected MMRB2's {\"pairs\": [{id, prompt_content, response_a, response_b, chosen}]}")])
    parsed, problems = parse_records(path, content["pairs"], Record)
    built = []
    for index, r in parsed:
        kinds = [kind for part in (r.prompt_content, r.response_a.response_content, r.response_b.response_content) for kind, _ in part]
        if unknown := sorted(set(kinds) - {"text", "image"}):
            problems.append(Problem(str(path), f"content of kind {', '.join(map(repr, unknown))}: MMRB2's contents are text and image", index, r.id))
        elif r.prompt_source not in TASK_OF:
            problems.append(Problem(str(path), f"{r.prompt_source!r} is no source of MMRB2's four tasks ({', '.join(sorted(TASK_OF))})",
                                    index, r.id, "prompt_source"))
        else:
            built.append((index, Pair(id=r.id, category=f"mmrb2_{TASK_OF[r.prompt_source]}", group=TASK_OF[r.prompt_source],
                                      question=segments(r.prompt_content), answer_a=segments(r.response_a.response_content),
                                      answer_b=segments(r.response_b.response_content), model_a=r.response_a.model_name,
                                      model_b=r.response_b.model_name, preference=r.chosen or None)))
    return pair_input(path, built, problems, image_root, rubrics, content["pairs"])


def _metadata(feedback: str) -> dict:
    """The judge's JSON as MMRB2's evaluators read it, their metadata; {} where it is no object, or one that JSON
    cannot write (NaN, which json_repair reads) or nested past what it can."""
    value = mmrb2_json(feedback)
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def write(bench: BenchmarkInput, results: dict[str, PairResult], output_dir: Path) -> list[Path]:
    predictions = {}
    for pair_id, result in results.items():
        predictions[pair_id] = {order: [{"judgement": j.label, "evaluator": EVALUATOR, "metadata": _metadata(j.feedback)}
                                        for j in judgements(result, order, "mmrb2") if j.label is not None] for order in ("forward", "reverse")}
    pairs = bench.content  # the records of the pairs read (pair_input), each id once
    tasks = sorted({TASK_OF[p["prompt_source"]] for p in pairs})
    write_json_atomically(output_dir / PREDICTIONS, predictions)
    write_json_atomically(output_dir / ACCURACY, accuracy(predictions, pairs, tasks[0] if len(tasks) == 1 else "mixed"))
    return [output_dir / PREDICTIONS, output_dir / ACCURACY]


def accuracy(predictions: dict, pairs: list[dict], task: str) -> dict:
    """compute_accuracy.py's figures of one task (module docstring)."""
    evaluated = missing = correct = given = 0
    for pair in pairs:
        prediction = predictions.get(pair.get("id"))
        if prediction is None:
            missing += 1
            continue
        evaluated += 1
        for order in ("forward", "reverse"):
            if prediction.get(order) and (judgement := prediction[order][0].get("judgement")):
                given += 1
                correct += (judgement if order == "forward" else flip(judgement)) == pair.get("chosen")
    return {"task_name": task, "accuracy": correct / given if given else 0.0, "total_pairs": len(pairs), "evaluated_pairs": evaluated,
            "missing_pairs": missing, "total_correct": correct, "total_evaluated": given}


def read_preferences(path: str, content: object) -> PreferenceFile:
    """The experts' choices of a task file's pairs (judge-calibrate --human)."""
    pairs = content.get("pairs") if isinstance(content, dict) else None
    return preferences_of(path, pairs, Record, lambda r: Preference(r.id, r.chosen or None, r.response_a.model_name,
                                                                  r.response_b.model_name, TASK_OF.get(r.prompt_source)))


FORMAT = Format("mmrb2", (), looks_like, read, write, (PREDICTIONS, ACCURACY),
                prompt_source="MMRB2/evaluate/generate_judgements/evaluator_apis/llm_judges/evaluation_prompts.py", read_preferences=read_preferences)
