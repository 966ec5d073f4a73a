"""The benchmark files judge-score reads and writes: one module per benchmark, each holding both ways.

    format     reads                                                 writes (besides judge-score's own files)
    mmie       MMIE samples (JSON list, JSONL or Parquet)            nothing: eval_result.json is MMIE's shape
    milebench  MileBench pred.json + the dataset's annotation        eval.json (evaluate.py's + the judge's), eval_judge.json, result.csv
    instit     Inst-It Bench open-ended predictions, or a log        its evaluate log, instit_evaluate.json
    megabench  MEGA-Bench open-set submission + its dataset's rows   data_with_scores_open.json (megabench_open_data_with_scores.json
                                                                     for lmms-eval's submissions), for the breakdown tool
    pairs      pairs of answers (JSON list, JSONL or Parquet)        nothing: eval_result.json holds the pairs' verdicts
    vlrewardbench  its released parquet (or JSON/JSONL)              the inference lines cal.py reads, its accuracies
    mmrewardbench  data/all_data.json                                the submission 2_get_accuracy.py reads, its accuracies
    mmrb2      a task's {"pairs": [...]} file                        the predictions compute_accuracy.py reads, its accuracy
    opening    an Interleaved Arena battle file + the models' answers   IntJudge's results file, calculate_agreement.py's
                                                                     agreement and calculate_model_winrate.py's win rates

The four pairwise benchmarks judge with their own prompts, which this toolkit does not ship: `judge-rubric
import --benchmark NAME` reads a benchmark's prompt from its repository's code, as data, into a rubric.

A format's `read` turns the file into `Sample`s and reports every problem of the file in the benchmark's
own terms (item, field), all at once; its `write` puts the judge's results back into the benchmark's
shape, so the benchmark's downstream tooling keeps working. Results reach `write` as judge-score's
`JudgeResult`s (a pairwise format's as `PairResult`s), keyed by sample id. Where the benchmark's judge writes a scored file (Inst-It's log,
MEGA-Bench's data_with_scores), `read_scores` reads it back, GPT-4o's or judge-score's, for
judge-calibrate, as `read_preferences` reads a pairwise format's verdicts (people's, or a judge's): each file
format has this one owner. Nothing here imports torch (judge-calibrate does not).
"""

from __future__ import annotations

from pathlib import Path

from mmjudge.judge.data import InputError, Problem, load_records
from mmjudge.judge.formats import instit, megabench, milebench, mmie, mmrb2, mmrewardbench, opening, pairs, vlrewardbench
from mmjudge.judge.formats.base import BenchmarkInput, Format, first_record

FORMATS: dict[str, Format] = {f.name: f for f in (mmie.FORMAT, milebench.FORMAT, instit.FORMAT, megabench.FORMAT, pairs.FORMAT,
                                                 vlrewardbench.FORMAT, mmrewardbench.FORMAT, mmrb2.FORMAT, opening.FORMAT)}

__all__ = ["FORMATS", "BenchmarkInput", "Format", "detect_format", "scored_format"]


def detect_format(path: Path) -> Format:
    """The one format whose shape the file has; an error that asks for --format otherwise. A value no
    command can use (a lone surrogate, NaN) is left to the format's reader, which names its record and,
    under --skip_invalid, sets only that record aside."""
    content, _ = load_records(path)
    if isinstance(content, list) and not content:
        raise InputError([Problem(str(path), "no records")])
    matches = [f for f in FORMATS.values() if f.looks_like(content)]
    if not matches and isinstance(content, list):
        # A first record short of a field its format needs: the format is the one the next records have, and
        # its reader names the first record's fault.
        matches = next((found for record in content[1:] if (found := [f for f in FORMATS.values() if f.looks_like([record])])), [])
    if len(matches) == 1:
        return matches[0]
    record = first_record(content)
    seen = f"first record's keys {sorted(record)}" if record else f"a JSON {type(content).__name__}"
    which = "several formats" if matches else "no known format"
    raise InputError([Problem(str(path), f"{seen} fit {which}; give --format {'|'.join(FORMATS)}")])


def scored_format(content: object) -> Format | None:
    """The format whose scored file this content is (an Inst-It evaluate log, a MEGA-Bench scored file), or None."""
    if not isinstance(content, dict):
        return None
    return next((f for f in FORMATS.values() if f.read_scores is not None and f.looks_like(content)), None)
