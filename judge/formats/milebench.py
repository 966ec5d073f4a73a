"""MileBench: a local judge for its open-ended answers, reported beside the ROUGE-L MileBench computes.

Reads a pred.json as MileBench's generate.py writes it, a list of `{sample_id, image: [paths], question,
gt_response, gen_model_id, pred_response, gen_kwargs}`, image paths relative to --input_dir. The question
is the prompt the evaluated model saw: its first line is the task instruction (generate.py writes
`task_instruction + "\\n" + context`), and the context holds one `<ImageHere>` per image, in order. The
judge sees the same interleaving. Under --prompt_token_budget (configs/score/milebench.yaml) the context is
cut as MileBench cuts it: the instruction and the question stay, the oldest context goes first.

Writes, for the dataset the file belongs to (its folder's name, as in MileBench's
`outputs/<model>/<dataset>/pred.json` layout):

    eval.json   "Rouge-L f", "image_quantity_level-Accuracy": {Few, Medium, Many}   MileBench's own figures
                "Judge score", "image_quantity_level-Result": {Few, Medium, Many}    the judge's, alike
    result.csv  a row per model: Model, "<dataset> (Rouge-L f)", "<dataset> (Judge score)"

"Judge score" is the mean judge score as a share of the rubric's scale (0-1, like ROUGE-L). result.csv
holds x100 values rounded to 2 decimals, as MileBench's score.py writes them; score.py reads this eval.json
as it reads its own (it skips both split keys). A figure no judged sample gives ("Judge score" when no judge
output had a score, both when no sample was judged) is left out of eval.json, with a note, never null:
score.py rounds every other key x100 and, at a null, silently drops the model's row. ROUGE-L follows
MileBench's evaluate.py: its answer normalisation (`normalize`), the `rouge` package's ROUGE-L F, and 0 for
an empty prediction. Image-count levels count the record's images: Few < 6, Medium 6-31, Many > 31. Two
deliberate differences: each sample is counted in its own level (MileBench's evaluate.py puts every ROUGE
score in the level of the dataset's last sample), and a level with no sample is null, not 0.
"""

from __future__ import annotations

import csv
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import mean
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict
from rouge import Rouge

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
    parse_records,
    read_records,
    resolve_image,
    write_json_atomically,
    write_text_atomically,
)
from judge.formats.base import BenchmarkInput, Format, first_record

if TYPE_CHECKING:
    from judge.prompts import Rubric

PLACEHOLDER = "<ImageHere>"
CATEGORY = "milebench"
LEVELS = (("Few", 0, 5), ("Medium", 6, 31), ("Many", 32, None))  # images in the sample, MileBench's levels
EVAL, RESULT = "eval.json", "result.csv"


class Prediction(BaseModel):
    model_config = ConfigDict(extra="allow")
    sample_id: int | str
    image: list[str]
    question: JudgeText
    gt_response: JudgeText
    pred_response: JudgeText
    gen_model_id: str | None = None


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


def question_segments(question: str, images: list[str]) -> list[Segment]:
    """The question as the judge's interleaved segments: the instruction line, then each piece of context
    with the image that follows it."""
    instruction, _, context = question.partition("\n")
    if PLACEHOLDER in instruction:  # no instruction line before the first image
        instruction, context = "", question
    segments = [Segment(text=instruction)] if instruction else []
    pieces = context.split(PLACEHOLDER)
    segments += [Segment(text=text or None, image=image) for text, image in zip(pieces, images)]
    if pieces[-1]:
        segments.append(Segment(text=pieces[-1]))
    return segments


def read(path: Path, image_root: Path, rubrics: dict[str, Rubric], criteria_file: Path | None = None) -> BenchmarkInput:
    records = read_records(path)
    if not records:
        raise InputError([Problem(str(path), "no predictions")])
    fallback_model = path.resolve().parent.parent.name  # outputs/<model>/<dataset>/pred.json
    parsed, problems = parse_records(path, records, Prediction, "sample_id")
    samples, places, first_index = [], [], {}
    for index, pred in parsed:
        sid = str(pred.sample_id)
        record_problems = _prediction_problems(pred, first_index)
        problems += [Problem(str(path), message, index, sid, field) for field, message in record_problems]
        if record_problems:
            continue
        first_index[sid] = index
        places += [ImagePlace(index, sid, f"image[{k}]", resolve_image(p, image_root)) for k, p in enumerate(pred.image)]
        samples.append(Sample(
            id=sid, category=CATEGORY, model=pred.gen_model_id or fallback_model,
            question=question_segments(pred.question, pred.image), answer=[Segment(text=pred.pred_response)],
            gt_answer=[Segment(text=pred.gt_response)],
        ))
    problems += image_problems(path, places)
    bad = {p.index for p in problems}
    samples = [s for s in samples if first_index[s.id] not in bad]
    return BenchmarkInput(path, samples, problems, rubrics, content=None)


def _prediction_problems(pred: Prediction, first_index: dict[str, int]) -> list[tuple[str, str]]:
    """(field, message) of what MileBench's own code would trip on."""
    found = []
    if str(pred.sample_id) in first_index:
        found.append(("sample_id", f"duplicate sample_id: record {first_index[str(pred.sample_id)]} has it too"))
    if (n := pred.question.count(PLACEHOLDER)) != len(pred.image):
        found.append(("question", f"{n} {PLACEHOLDER} placeholder(s) for {len(pred.image)} image(s)"))
    if not _has_words(normalize(pred.gt_response)):
        found.append(("gt_response", "no words once normalised as MileBench does: ROUGE-L is undefined"))
    return found


@dataclass(frozen=True)
class Scored:
    model: str
    level: str
    rouge: float
    judge: float | None  # share of the judge's scale; None when the judge's output had no score


def level(n_images: int) -> str:
    return next(name for name, low, high in LEVELS if n_images >= low and (high is None or n_images <= high))


def write(bench: BenchmarkInput, results: dict[str, JudgeResult], output_dir: Path) -> list[Path]:
    """eval.json and result.csv over the samples this run judged (invalid ones are in the summary)."""
    scale = bench.rubrics[CATEGORY].score_scale
    scored = [
        Scored(sample.model, level(len(sample.images())), rouge_l(sample.answer[0].text, sample.gt_answer[0].text),
               None if r.score is None else scale.share(r.score))
        for sample in bench.samples
        if (r := results.get(sample.id)) is not None
    ]
    dataset = bench.path.resolve().parent.name
    figures = _figures(scored)
    for key in [k for k, v in figures.items() if v is None]:  # see the module docstring: never null
        print(f"note: {dataset}: no {key!r} in eval.json: none of the {len(scored)} judged sample(s) has one", file=sys.stderr)
    write_json_atomically(output_dir / EVAL, {k: v for k, v in figures.items() if v is not None})
    write_text_atomically(output_dir / RESULT, _result_csv(scored, dataset))
    return [output_dir / EVAL, output_dir / RESULT]


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return mean(present) if present else None


def _figures(scored: list[Scored]) -> dict:
    by_level = {name: [s for s in scored if s.level == name] for name, _, _ in LEVELS}
    return {
        "Rouge-L f": _mean([s.rouge for s in scored]),
        "image_quantity_level-Accuracy": {name: _mean([s.rouge for s in group]) for name, group in by_level.items()},
        "Judge score": _mean([s.judge for s in scored]),
        "image_quantity_level-Result": {name: _mean([s.judge for s in group]) for name, group in by_level.items()},
    }


def _result_csv(scored: list[Scored], dataset: str) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["Model", f"{dataset} (Rouge-L f)", f"{dataset} (Judge score)"])
    for model in sorted({s.model for s in scored}):
        figures = _figures([s for s in scored if s.model == model])
        writer.writerow([model] + ["" if v is None else round(v * 100, 2) for v in (figures["Rouge-L f"], figures["Judge score"])])
    return out.getvalue()


FORMAT = Format(CATEGORY, (CONFIG_DIR / "rubrics" / "milebench.yaml",), looks_like, read, write, (EVAL, RESULT))
