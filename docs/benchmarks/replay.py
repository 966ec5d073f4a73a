"""A benchmark's result files from given judge scores, through judge-score's own reader and writer: for the
downstream check of docs/benchmarks.md, where a tiny random judge's outputs never parse and the scored
paths of the writers need scores.

    python docs/benchmarks/replay.py --format F --input_dir D --input_file I [--criteria_file C] --scores S --output_dir O

S is a JSON object of sample id -> score (null: the judge's output had no score), or a benchmark's scored
file (an Inst-It evaluate log, a MEGA-Bench scored file), whose judge scores stand in for the judge's: read
by the same code judge-calibrate reads it with. A sample that S does not name is left unjudged (as
--limit leaves it). The input is read, and refused, exactly as judge-score reads it (its problems skipped,
as --skip_invalid skips them).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmjudge.judge.data import read_json
from mmjudge.judge.formats import FORMATS, scored_format
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import judge_result


def stand_in_scores(path: Path, scale) -> dict[str, float | None]:
    content = read_json(path)
    fmt = scored_format(content)
    if fmt is None:
        return content
    scored = fmt.read_scores(str(path), content, scale)
    if scored.problems:
        raise SystemExit("\n".join(map(str, scored.problems)))
    return {item.id: item.score for item in scored.items}


def on_scale(score: float | None, scale) -> int | float | None:
    """The score as the judge's parser writes it: the scale's level (7, not 7.0)."""
    return None if score is None else scale.snap(score)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", choices=list(FORMATS), required=True)
    parser.add_argument("--input_dir", type=Path, required=True)
    parser.add_argument("--input_file", required=True)
    parser.add_argument("--criteria_file", type=Path)
    parser.add_argument("--scores", type=Path, required=True)
    parser.add_argument("--output_dir", type=Path, required=True)
    args = parser.parse_args()
    fmt = FORMATS[args.format]
    bench = fmt.read(args.input_dir / args.input_file, args.input_dir, load_rubrics(fmt.default_rubrics), args.criteria_file)
    for problem in bench.problems:
        print(f"skipped: {problem}")
    scores = stand_in_scores(args.scores, next(iter(bench.rubrics.values())).score_scale)
    scale = {s.id: bench.rubrics[s.category].score_scale for s in bench.samples}
    results = {s.id: judge_result(s.id, on_scale(scores[s.id], scale[s.id]), feedback="(a stand-in score)",
                                  parse_error=None if scores[s.id] is not None else "no '### Score' heading in the judge's output")
               for s in bench.samples if s.id in scores}
    args.output_dir.mkdir(parents=True, exist_ok=True)
    for path in fmt.write(bench, results, args.output_dir):
        print(f"{fmt.name}: {path}")
    print(json.dumps({"samples": len(bench.samples), "judged": len(results), "scored": sum(r.score is not None for r in results.values())}))


if __name__ == "__main__":
    main()
