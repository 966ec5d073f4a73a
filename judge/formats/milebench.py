"""MileBench: a local judge for its open-ended answers, reported beside the ROUGE-L MileBench computes.

Reads a pred.json as MileBench's generate.py writes it, a list of `{sample_id, image: [paths], question,
gt_response, gen_model_id, pred_response, gen_kwargs}`, image paths relative to --input_dir, and the
dataset's annotation, `<dataset>.json` in the `<dataset>/` folder that holds the images (MileBench's
layout: generate.py writes each image as `<data_dir>/<dataset>/images/<file>`, and evaluate.py reads
`<data_dir>/<dataset>/<dataset>.json`). The annotation says what evaluate.py reads from it: the dataset's
`question_type`, and each sample's `images_path`, the images the sample has before any truncation.

Only open-ended datasets are judged: evaluate.py scores those with ROUGE-L, which the judge stands beside.
A multi-choice dataset (option accuracy) or a needle one (NeedleInAHaystack, MMCoQA: containment
accuracy) keeps MileBench's own metric, and judge-score refuses it.

The question is the prompt the evaluated model saw: its first line is the task instruction (generate.py
writes `task_instruction + "\\n" + context`), and the context holds one `<ImageHere>` per image, in order.
The judge sees the same interleaving. Under --prompt_token_budget (configs/score/milebench.yaml) the
context is cut as MileBench cuts it: the instruction and the question stay, the oldest context goes first.

Writes, for the dataset the file belongs to (its folder's name, in MileBench's
`outputs/<model>/<dataset>/pred.json` layout):

    eval.json        "Rouge-L f", "image_quantity_level-Accuracy": {Few, Medium, Many},
                     "image_quantity_level-Result": {level: [sum, count]}      evaluate.py's own, computed as it does
                     "Judge score"                                             the judge's, beside them
    eval_judge.json  the judge's figures in eval.json's shape, and how many judged samples it left unscored
    result.csv       score.py's row for this dataset: Model (the <model> folder), "<dataset> (Rouge-L f)",
                     "<dataset> (Judge score)", x100 rounded to 2 decimals

MileBench's figures cover every prediction read (whatever --limit judged), so eval.json is the one
evaluate.py writes, plus "Judge score": ROUGE-L is its answer normalisation (`normalize`) and the `rouge`
package's F, 0 for an empty prediction; a sample's image-count level counts the annotation's images_path
(Few < 6, Medium 6-31, Many > 31); a level without samples has mean 0 and [0, 0]. "Judge score" is the
mean judge score as a share of the rubric's scale (0-1, like ROUGE-L) over the judged samples the judge
scored. Where it has none, it is left out of eval.json with a note, never null: score.py rounds every key
but the two split ones x100 and, at a null, silently drops the model's row. A judged sample whose judge
output had no score is no score: it is left out of the judge's figures and counted in eval_judge.json.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict
from rouge import Rouge

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.data import (
    ImagePlace,
    InputError,
    JudgeResult,
    JudgeText,
    Problem,
    Sample,
    Segment,
    image_problems,
    parse_records,
    read_json,
    read_records,
    resolve_image,
    write_json_atomically,
    write_text_atomically,
)
from mmjudge.judge.formats.base import BenchmarkInput, Format, first_record, interleaved, spreadsheet_cell

if TYPE_CHECKING:
    from mmjudge.judge.prompts import Rubric

PLACEHOLDER = "<ImageHere>"
CATEGORY = "milebench"
LEVELS = (("Few", 0, 5), ("Medium", 6, 31), ("Many", 32, None))  # images in the sample, MileBench's levels
OPEN_ENDED = "open-ended"
NEEDLES = ("NeedleInAHaystack", "MMCoQA")  # evaluate.py scores a dataset so named by containment, whatever its question_type
EVAL, JUDGE_EVAL, RESULT = "eval.json", "eval_judge.json", "result.csv"
ROUGE, JUDGE = "Rouge-L f", "Judge score"
BY_LEVEL, LEVEL_SUMS = "image_quantity_level-Accuracy", "image_quantity_level-Result"


class Prediction(BaseModel):
    model_config = ConfigDict(extra="allow")
    sample_id: int | str
    image: list[str]
    question: JudgeText
    gt_response: JudgeText
    pred_response: JudgeText
    gen_model_id: str | None = None


class AnnotationSample(BaseModel):
    model_config = ConfigDict(extra="allow")
    sample_id: int | str
    task_instance: dict

    @property
    def n_images(self) -> int | None:
        images = self.task_instance.get("images_path")
        return len(images) if isinstance(images, list) else None


@dataclass(frozen=True)
class Annotation:
    """What evaluate.py reads from `<dataset>.json`."""

    path: Path
    question_type: str
    n_images: dict[str, int]  # sample_id -> images in the sample, untruncated


@dataclass(frozen=True)
class Row:
    """One prediction as MileBench scores it."""

    id: str
    level: str
    rouge: float


@dataclass(frozen=True)
class Dataset:
    """What `write` needs beside the judge's results: MileBench's scores of every prediction read."""

    name: str
    model: str  # the <model> folder of outputs/<model>/<dataset>/pred.json: score.py's name for the model
    rows: list[Row]


def looks_like(content: object) -> bool:
    record = first_record(content)
    return record is not None and {"sample_id", "pred_response"} <= set(record)


# MileBench's answer normalisation (evaluate.py, `Eval.process`), rule for rule.
_PUNCTUATION = (";", "/", "[", "]", '"', "{", "}", "(", ")", "=", "+", "\\", "_", "-", ">", "<", "@", "`", ",", "?", "!")
_NUMBER_WITH_COMMA = re.compile(r"\d,\d")
_PERIOD = re.compile(r"\.(?!\d)")  # its pattern's leading `(?!<=\d)` is a look-ahead that never fails
_PERIODS_REMOVED = 32  # it passes re.UNICODE (32) where re.sub takes the count


def normalize(text: str) -> str:
    text = text.replace("\n", " ").replace("\t", " ").strip()
    delete_all = _NUMBER_WITH_COMMA.search(text) is not None
    out = text
    for mark in _PUNCTUATION:
        # A mark set apart by a space is deleted; one inside a word becomes a space (so "red/blue" splits).
        # The test reads the text as it came in, not as the marks before changed it.
        apart = f"{mark} " in text or f" {mark}" in text
        out = out.replace(mark, "" if apart or delete_all else " ")
    out = _PERIOD.sub("", out, count=_PERIODS_REMOVED)
    return out.strip("'").strip('"').strip().lower()


def rouge_l(prediction: str, reference: str) -> float:
    """MileBench's ROUGE-L F of one answer; 0 for a prediction with no words left."""
    prediction, reference = normalize(prediction), normalize(reference)
    if not _has_words(prediction):
        return 0.0
    return Rouge(metrics=["rouge-l"]).get_scores(prediction, reference)[0]["rouge-l"]["f"]


def _has_words(normalized: str) -> bool:
    # The rouge package splits sentences at "." and refuses a text with none.
    return any(part.strip() for part in normalized.split("."))


def level(n_images: int) -> str:
    return next(name for name, low, high in LEVELS if n_images >= low and (high is None or n_images <= high))


def question_segments(question: str, images: list[str]) -> list[Segment]:
    """The question as the judge's interleaved segments: the instruction line, then each piece of context
    with the image that follows it."""
    instruction, _, context = question.partition("\n")
    if PLACEHOLDER in instruction:  # no instruction line before the first image
        instruction, context = "", question
    return ([Segment(text=instruction)] if instruction else []) + interleaved(context.split(PLACEHOLDER), images)


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    records = read_records(path)
    if not records:
        raise InputError([Problem(str(path), "no predictions")])
    dataset, model = path.resolve().parent.name, path.resolve().parent.parent.name  # outputs/<model>/<dataset>/pred.json
    parsed, problems = parse_records(path, records, Prediction, "sample_id")
    if not parsed:  # no record names an image, so none says where the annotation is: what is wrong with them comes first
        raise InputError(problems)
    annotation = load_annotation(_annotation_path(path, dataset, [resolve_image(p, image_root) for _, pred in parsed for p in pred.image]))
    _refuse_other_metrics(annotation, dataset)
    samples, rows, places, first_index = [], [], [], {}
    for index, pred in parsed:
        sid = str(pred.sample_id)
        record_problems = _prediction_problems(pred, first_index, annotation)
        problems += [Problem(str(path), message, index, sid, field) for field, message in record_problems]
        if record_problems:
            continue
        first_index[sid] = index
        rows.append(Row(sid, level(annotation.n_images[sid]), rouge_l(pred.pred_response, pred.gt_response)))
        places += [ImagePlace(index, sid, f"image[{k}]", resolve_image(p, image_root)) for k, p in enumerate(pred.image)]
        samples.append(Sample(
            id=sid, category=CATEGORY, model=pred.gen_model_id or model,
            question=question_segments(pred.question, pred.image), answer=[Segment(text=pred.pred_response)],
            gt_answer=[Segment(text=pred.gt_response)],
        ))
    problems += image_problems(path, places)
    bad = {p.index for p in problems}
    samples = [s for s in samples if first_index[s.id] not in bad]
    return BenchmarkInput(path, samples, problems, rubrics, Dataset(dataset, model, rows), _coverage_notes(annotation, rows, len(records)),
                          [("--input_file's MileBench annotation", annotation.path)])


def _annotation_path(path: Path, dataset: str, images: list[Path]) -> Path:
    """`<dataset>.json` in the `<dataset>/` folder above the images, where MileBench keeps it."""
    for image in images:
        folder = next((parent for parent in image.parents if parent.name == dataset), None)
        if folder is not None:
            return folder / f"{dataset}.json"
    raise InputError([Problem(str(path), f"no image path of this file runs through a folder {dataset}/ (MileBench's "
                                         f"<data_dir>/{dataset}/images/...): judge-score reads {dataset}.json from it, MileBench's "
                                         "annotation of the dataset, for its question type and each sample's image count")])


def load_annotation(path: Path) -> Annotation:
    content = read_json(path)
    meta = content.get("meta_data") if isinstance(content, dict) else None
    data = content.get("data") if isinstance(content, dict) else None
    if not isinstance(meta, dict) or not isinstance(meta.get("question_type"), str) or not isinstance(data, list):
        raise InputError([Problem(str(path), "not a MileBench annotation: expected {\"meta_data\": {\"question_type\": ...}, \"data\": [samples]}")])
    n_images = {}
    parsed, problems = parse_records(path, data, AnnotationSample, id_key="sample_id")
    for index, sample in parsed:
        if sample.n_images is None:
            problems.append(Problem(str(path), "task_instance.images_path must be a list", index, str(sample.sample_id), "task_instance"))
        n_images[str(sample.sample_id)] = sample.n_images
    if problems:
        raise InputError(problems)
    return Annotation(path, meta["question_type"], n_images)


def _refuse_other_metrics(annotation: Annotation, dataset: str) -> None:
    """MileBench scores only its open-ended, non-needle datasets with ROUGE-L, the one metric a judge stands beside."""
    needle = next((name for name in NEEDLES if name in dataset), None)
    if needle is None and annotation.question_type == OPEN_ENDED:
        return
    metric = ("containment accuracy (a needle dataset)" if needle else
              f"option accuracy ({annotation.question_type!r} in meta_data.question_type)" if annotation.question_type == "multi-choice" else
              f"no metric it knows (meta_data.question_type {annotation.question_type!r})")
    raise InputError([Problem(str(annotation.path), f"MileBench scores {dataset} by {metric}, not ROUGE-L: it keeps its own metric "
                                                    "(evaluate.py); judge-score judges open-ended datasets only")])


def _prediction_problems(pred: Prediction, first_index: dict[str, int], annotation: Annotation) -> list[tuple[str, str]]:
    """(field, message) of what MileBench's own code would trip on."""
    found, sid = [], str(pred.sample_id)
    if sid in first_index:
        found.append(("sample_id", f"duplicate sample_id: record {first_index[sid]} has it too"))
    if sid not in annotation.n_images:
        found.append(("sample_id", f"no sample of this id in MileBench's annotation {annotation.path}"))
    if (n := pred.question.count(PLACEHOLDER)) != len(pred.image):
        found.append(("question", f"{n} {PLACEHOLDER} placeholder(s) for {len(pred.image)} image(s)"))
    if not _has_words(normalize(pred.gt_response)):
        found.append(("gt_response", "no words once normalised as MileBench does: ROUGE-L is undefined"))
    return found


def _coverage_notes(annotation: Annotation, rows: list[Row], n_records: int) -> list[str]:
    notes = []
    if len(rows) < n_records:
        notes.append(f"eval.json's MileBench figures cover the {len(rows)} valid prediction(s) of {n_records}")
    if missing := sorted(set(annotation.n_images) - {row.id for row in rows}):
        notes.append(f"{len(missing)} sample(s) of {annotation.path} have no valid prediction (first: {missing[:3]}); MileBench's "
                     "evaluate.py refuses such a pred.json ('There is prediction absent')")
    return notes


def write(bench: BenchmarkInput, results: dict[str, JudgeResult], output_dir: Path) -> list[Path]:
    """eval.json, eval_judge.json and result.csv (see the module docstring)."""
    dataset: Dataset = bench.content
    scale = bench.rubrics[CATEGORY].score_scale
    judged = [(row.level, result.score) for row in dataset.rows if (result := results.get(row.id)) is not None]
    judge = [(lvl, scale.share(score)) for lvl, score in judged if score is not None]
    figures = {ROUGE: _mean([row.rouge for row in dataset.rows]), **_by_level([(row.level, row.rouge) for row in dataset.rows])}
    judge_figures = {JUDGE: _mean([share for _, share in judge]), **_by_level(judge, empty=None), "judged": len(judged),
                     "unscored": len(judged) - len(judge)}
    if judge_figures[JUDGE] is not None:
        figures[JUDGE] = judge_figures[JUDGE]
    if figures[ROUGE] is None:  # see the module docstring: never null in eval.json
        print(f"note: {dataset.name}: no {ROUGE!r} in eval.json: no valid prediction", file=sys.stderr)
    if judge_figures[JUDGE] is None:
        print(f"note: {dataset.name}: no {JUDGE!r} in eval.json: none of the {len(judged)} judged sample(s) has a judge score", file=sys.stderr)
    figures = {k: v for k, v in figures.items() if v is not None}
    if judge_figures["unscored"]:
        print(f"note: {dataset.name}: {judge_figures['unscored']} judged sample(s) have no score in the judge's output: left out of "
              f"{JUDGE!r}, counted in {JUDGE_EVAL}", file=sys.stderr)
    write_json_atomically(output_dir / EVAL, figures)
    write_json_atomically(output_dir / JUDGE_EVAL, judge_figures)
    write_text_atomically(output_dir / RESULT, _result_csv(figures, dataset))
    return [output_dir / EVAL, output_dir / JUDGE_EVAL, output_dir / RESULT]


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _by_level(scores: list[tuple[str, float]], empty: float | None = 0) -> dict:
    """MileBench's two splits by image count: each level's mean (`empty` where it has no sample) and [sum, count]."""
    groups = {name: [score for lvl, score in scores if lvl == name] for name, _, _ in LEVELS}
    return {BY_LEVEL: {name: empty if not group else float(np.mean(group)) for name, group in groups.items()},
            LEVEL_SUMS: {name: [sum(group), len(group)] for name, group in groups.items()}}


def _result_csv(figures: dict, dataset: Dataset) -> str:
    """The row score.py writes for this dataset: every figure but the split ones, x100 rounded to 2 decimals."""
    shown = {f"{dataset.name} ({key})": round(value * 100, 2) for key, value in figures.items() if key not in (BY_LEVEL, LEVEL_SUMS)}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["Model", *map(spreadsheet_cell, shown)])
    writer.writerow([spreadsheet_cell(dataset.model), *shown.values()])
    return out.getvalue()


FORMAT = Format(CATEGORY, (CONFIG_DIR / "rubrics" / "milebench.yaml",), looks_like, read, write, (EVAL, JUDGE_EVAL, RESULT))
