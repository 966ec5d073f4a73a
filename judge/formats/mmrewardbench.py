"""Multimodal RewardBench (github facebookresearch/multimodal_rewardbench): 5,000 pairs of answers to a
question about an image, in six domains.

Reads `data/all_data.json` as its 0_download_data.py writes it, a list of `{ID, Text, Image, Output1, Output2,
Better, Category, ...}`, the image path relative to --input_dir (its `data/` folder). A record is a pair:
Text and Image as the question, Output1 as answer A, Output2 as B; people preferred B where Better is
"Output2", else A (the label its judge script gives). Its group is the domain 2_get_accuracy.py reports:
the Category, with safety split into safety/bias (an ID starting "pairs") and safety/toxicity, and
reasoning into reasoning/math (an ID starting "math") and reasoning/coding.

Writes the submission its leaderboard takes and 2_get_accuracy.py reads, `mmrewardbench_answers.jsonl`:
one line per judged record, `{ID, Text, Image, Label, Meta: {the record}, output}`, where output is the
judge's text in the benchmark's own order (this toolkit's forward order), which ends in [[A]] or [[B]];
and the accuracies 2_get_accuracy.py prints, by its rules, `mmrewardbench_accuracy.json`: an output with
neither mark counts as a coin flip drawn from Python's random seeded 123, one draw per such output in the
file's order, as its script draws them; accuracy over all records and per domain, in the order the domains
first appear.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from mmjudge.judge.data import InputError, JudgeText, Pair, PairResult, Problem, Segment, parse_records, read_records, write_json_atomically, write_text_atomically
from mmjudge.judge.formats.base import BenchmarkInput, Format, Preference, PreferenceFile, first_record, judgements, pair_input, preferences_of

if TYPE_CHECKING:
    from mmjudge.judge.prompts import Rubric

CATEGORY = "mmrewardbench"
ANSWERS, ACCURACY = "mmrewardbench_answers.jsonl", "mmrewardbench_accuracy.json"
SEED = 123  # 2_get_accuracy.py's


class Record(BaseModel):
    model_config = ConfigDict(extra="allow")
    ID: str
    Text: JudgeText
    Image: str
    Output1: JudgeText
    Output2: JudgeText
    Better: str
    Category: str


def looks_like(content: object) -> bool:
    record = first_record(content)
    return record is not None and {"Output1", "Output2", "Better"} <= set(record)


def domain(record_id: str, category: str) -> str:
    """The domain 2_get_accuracy.py counts a record in."""
    if category == "safety":
        return "safety/bias" if record_id.lower().startswith("pairs") else "safety/toxicity"
    if category == "reasoning":
        return "reasoning/math" if record_id.lower().startswith("math") else "reasoning/coding"
    return category


def label(better: str) -> str:
    return "B" if better == "Output2" else "A"


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    records = read_records(path)
    if not records:
        raise InputError([Problem(str(path), "no records")])
    parsed, problems = parse_records(path, records, Record, "ID")
    built = [(index, Pair(id=r.ID, category=CATEGORY, group=domain(r.ID, r.Category), question=[Segment(text=r.Text, image=r.Image)],
                          answer_a=[Segment(text=r.Output1)], answer_b=[Segment(text=r.Output2)], preference=label(r.Better)))
             for index, r in parsed]
    return pair_input(path, built, problems, image_root, rubrics, records)


def write(bench: BenchmarkInput, results: dict[str, PairResult], output_dir: Path) -> list[Path]:
    lines = []
    for raw in bench.content:  # the records of the pairs read (pair_input), each id once
        forward = judgements(results.get(raw["ID"]), "forward", "brackets")
        if forward:
            lines.append({"ID": raw["ID"], "Text": raw["Text"], "Image": raw["Image"], "Label": label(raw["Better"]), "Meta": raw,
                          "output": forward[0].feedback})
    write_text_atomically(output_dir / ANSWERS, "".join(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n" for line in lines))
    write_json_atomically(output_dir / ACCURACY, accuracy(lines))
    return [output_dir / ANSWERS, output_dir / ACCURACY]


def verdict(output: str, draw: random.Random) -> str:
    """2_get_accuracy.py's reading of an output: [[A]], else [[B]], else a coin flip."""
    if "[[A]]" in output:
        return "A"
    if "[[B]]" in output:
        return "B"
    return "A" if draw.random() < 0.5 else "B"


def accuracy(lines: list[dict]) -> dict:
    """Correct, total and accuracy over all lines and per domain (module docstring)."""
    draw = random.Random(SEED)
    correct: dict[str, list[int]] = {}
    for line in lines:
        hit = int(verdict(line["output"], draw) == line["Label"])
        for task in ("all", domain(line["ID"], line["Meta"]["Category"])):
            correct.setdefault(task, []).append(hit)
    return {task: {"correct": sum(hits), "total": len(hits), "accuracy": sum(hits) / len(hits)} for task, hits in correct.items()}


def read_preferences(path: str, content: object) -> PreferenceFile:
    """People's preferences of all_data.json's records (judge-calibrate --human)."""
    return preferences_of(path, content, Record, lambda r: Preference(r.ID, label(r.Better), group=domain(r.ID, r.Category)), "ID")


FORMAT = Format("mmrewardbench", (), looks_like, read, write, (ANSWERS, ACCURACY), prompt_source="multimodal_rewardbench/scripts/1_run_model_as_judge_gpt4o.py",
                read_preferences=read_preferences)
