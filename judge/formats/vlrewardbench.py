"""VL-RewardBench (github vl-rewardbench/VL_RewardBench): 1,250 pairs of answers to a question about an image.

Reads the released file, `test-00000-of-00001.parquet` (MMInstruction/VL-RewardBench; its images are held
in the file, and written once to this toolkit's image cache by judge/parquet.py, as any Parquet input's), or
the same records as JSON or JSONL, each image a path (`image` or `image_path`) relative to --input_dir.
A record `{id, query, response: [two answers], image, human_ranking, models, judge, rationale, query_source, ...}`
is a pair: the query and its image as the question, response[0] as answer A,
response[1] as B; people preferred the answer of the lower rank. As inference_hf.py does, "<image>\n" is
taken out of the texts: the image is sent apart, after the prompt. Its group is VL-RewardBench's: the
dataset named by the id's prefix (RLAIF, RLHF, hallucination: hallucination; mathverse, mmmu: reasoning;
wildvision and the rest: general), as cal.py names it.

Writes what VL-RewardBench's inference_hf.py writes, one JSON line per judgement (both orders, every
sample), `vlrewardbench_inference.jsonl`: the record with `ranking` and `meta: {filter_choice (the judge's
text), random_number (0: the answers in the record's order, as this toolkit's forward order; 1: swapped),
filter_number, flag_status}`, which cal.py reads; and the figures cal.py prints, computed by its rules,
`vlrewardbench_accuracy.json`: each judgement agrees (the verdict is not the answer people ranked lower),
rejects, or does not match the verdict pattern; a pair is classified by the status more than half of its
judgements have (k-sample voting; with none, "other"), and accuracy is agree / (agree + reject) over the
pairs classified so, per group, over all of them (overall) and as the mean of the three groups (macro).
cal.py counts at most k judgements of a pair, in an order it shuffles; this file counts every judgement
written, which is cal.py's figure for k equal to the judgements per pair (2 x samples).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from mmjudge.judge.data import (InputError, JudgeText, Pair, PairResult, Problem, Segment, parse_records, read_records, write_json_atomically,
                                write_text_atomically)
from mmjudge.judge.formats.base import BenchmarkInput, Format, Preference, PreferenceFile, first_record, judgements, pair_input, preferences_of

if TYPE_CHECKING:
    from mmjudge.judge.prompts import Rubric

CATEGORY = "vlrewardbench"
INFERENCE, ACCURACY = "vlrewardbench_inference.jsonl", "vlrewardbench_accuracy.json"
GROUPS = {"vlfeedback": "general", "wildvision-battle": "general", "povid": "hallucination", "rlhf-v": "hallucination",
          "rlaif-v": "hallucination", "reasoning_tasks": "reasoning"}  # cal.py's group of each dataset
GROUP_ORDER = ("general", "hallucination", "reasoning")


class Record(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    query: JudgeText
    response: list[JudgeText] = Field(min_length=2, max_length=2)
    human_ranking: list[int] = Field(min_length=2, max_length=2)
    image: object = None
    image_path: str | None = None
    models: list[str | None] | None = None


def dataset_of(record_id: str) -> str:
    """cal.py's dataset of a record: named by the id's prefix, up to its first '_' or '-'."""
    cuts = [k for k in (record_id.find("_"), record_id.find("-")) if k != -1]
    prefix = record_id[: min(cuts)] if cuts else record_id
    return {"RLAIF": "rlaif-v", "RLHF": "rlhf-v", "mathverse": "reasoning_tasks", "mmmu": "reasoning_tasks",
            "wildvision": "wildvision-battle", "hallucination": "povid"}.get(prefix, "vlfeedback")


def looks_like(content: object) -> bool:
    record = first_record(content)
    return record is not None and {"query", "response", "human_ranking"} <= set(record)


def _image(record: Record) -> str | None:
    return record.image if isinstance(record.image, str) else record.image_path


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    records = read_records(path)
    if not records:
        raise InputError([Problem(str(path), "no records")])
    parsed, problems = parse_records(path, records, Record)
    built = []
    for index, record in parsed:
        if (image := _image(record)) is None:
            problems.append(Problem(str(path), "no image: give 'image' (a path, or the parquet's bytes) or 'image_path'", index, record.id))
            continue
        models = record.models or [None, None]
        text = lambda t: t.replace("<image>\n", "")  # noqa: E731 - inference_hf.py takes this out of the prompt: the image is sent apart
        built.append((index, Pair(
            id=record.id, category=CATEGORY, group=GROUPS[dataset_of(record.id)], question=[Segment(text=text(record.query), image=image)],
            answer_a=[Segment(text=text(record.response[0]))], answer_b=[Segment(text=text(record.response[1]))],
            model_a=models[0], model_b=models[1] if len(models) > 1 else None,
            preference=preference(record.human_ranking),
        )))
    return pair_input(path, built, problems, image_root, rubrics, records)


def rejected_position(ranking: list[int], random_number: int) -> int:
    """The place (1 or 2) the answer people ranked lower has in the order shown: random_number 0 shows the
    record's order, 1 swaps it (inference_hf.py's rule)."""
    worse = 0 if ranking[0] > ranking[1] else 1
    return worse + 1 if random_number == 0 else 2 - worse


def flag_status(label: str | None, ranking: list[int], random_number: int) -> str:
    if label is None:
        return "doesntMatch"
    return "reject" if int(label) == rejected_position(ranking, random_number) else "agree"


def write(bench: BenchmarkInput, results: dict[str, PairResult], output_dir: Path) -> list[Path]:
    lines, statuses = [], {}
    for raw in bench.content:  # the records of the pairs read (pair_input), each id once
        pair_id = raw["id"]
        result = results.get(pair_id)
        for order, random_number in (("forward", 0), ("reverse", 1)):
            for judgement in judgements(result, order, "vlrewardbench"):
                status = flag_status(judgement.label, raw["human_ranking"], random_number)
                statuses.setdefault(pair_id, []).append(status)
                meta = {"filter_choice": judgement.feedback, "filter_number": int(judgement.label) if judgement.label else -1,
                        "random_number": random_number, "flag_status": status}
                line = {key: raw.get(key) for key in ("id", "query", "response")} | {"ranking": raw["human_ranking"]}
                line |= {key: raw.get(key) for key in ("models", "judge", "rationale")} | {"meta": meta, "query_source": raw.get("query_source")}
                lines.append(line)
    write_text_atomically(output_dir / INFERENCE, "".join(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n" for line in lines))
    write_json_atomically(output_dir / ACCURACY, accuracy(statuses))
    return [output_dir / INFERENCE, output_dir / ACCURACY]


def classify(statuses: list[str]) -> str:
    """A pair's class from its judgements' statuses: the status more than half of them have, else other."""
    for status in ("agree", "reject", "doesntMatch"):
        if statuses.count(status) > len(statuses) / 2:
            return status
    return "other"


def accuracy(statuses: dict[str, list[str]]) -> dict:
    """cal.py's figures from each pair's judgement statuses (module docstring), per dataset and group."""
    datasets: dict[str, dict] = {}
    for pair_id, found in statuses.items():
        counts = datasets.setdefault(dataset_of(pair_id), {"agree_number": 0, "reject_number": 0, "doesntMatch_number": 0, "other_number": 0})
        counts[f"{classify(found)}_number"] += 1
    for counts in datasets.values():
        decided = counts["agree_number"] + counts["reject_number"]
        counts["accept_rate"] = round(counts["agree_number"] / decided, 4) if decided else None
    correct = {g: sum(d["agree_number"] for name, d in datasets.items() if GROUPS[name] == g) for g in GROUP_ORDER}
    total = {g: sum(d["agree_number"] + d["reject_number"] for name, d in datasets.items() if GROUPS[name] == g) for g in GROUP_ORDER}
    groups = {g: {"correct": correct[g], "total": total[g], "accuracy": correct[g] / total[g] if total[g] else None} for g in GROUP_ORDER}
    macro = sum(correct[g] / total[g] for g in GROUP_ORDER) / 3 if all(total.values()) else None
    overall = sum(correct.values()) / sum(total.values()) if sum(total.values()) else None
    return {"judgements_per_pair": max(map(len, statuses.values()), default=0), "overall_accuracy": overall, "macro_average_accuracy": macro,
            "groups": groups, "datasets": datasets}


def preference(ranking: list[int]) -> str:
    """People's preference: the answer of the lower rank."""
    return "A" if ranking[0] < ranking[1] else "B" if ranking[1] < ranking[0] else "tie"


def read_preferences(path: str, content: object) -> PreferenceFile:
    """People's preferences of the released file's records (judge-calibrate --human)."""
    return preferences_of(path, content, Record, lambda r: Preference(r.id, preference(r.human_ranking), *(r.models or [None, None])[:2],
                                                                    group=GROUPS[dataset_of(r.id)]))


FORMAT = Format("vlrewardbench", (), looks_like, read, write, (INFERENCE, ACCURACY), prompt_source="VL_RewardBench/prompt.py",
                read_preferences=read_preferences)
