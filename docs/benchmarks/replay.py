"""A benchmark's result files from given judge scores, through judge-score's own reader and writer: for the
downstream check of docs/benchmarks.md, where a tiny random judge's outputs never parse and the scored
paths of the writers need scores.

    python docs/benchmarks/replay.py --format F --input_dir D --input_file I [--criteria_file C] --scores S --output_dir O
    python docs/benchmarks/replay.py --format F --input_dir D --input_file I --rubric R --outputs T --output_dir O   # pairs

For a pairwise benchmark, T is a JSON object of pair id -> {"forward": [judge text, ...], "reverse": [...]}:
stand-in outputs of a judge, each read by the rubric's verdict format as judge-score reads one, and the
pair's verdict decided as judge-score decides it (--pair_rule).

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

from mmjudge.judge.data import OrderJudgement, Pair, PairResult, read_json
from mmjudge.judge.formats import FORMATS, scored_format
from mmjudge.judge.preferences import ORDERS, RULES, in_pair_terms, pairwise_verdict
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import judge_result
from mmjudge.judge.verdicts import VERDICT_FORMATS


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


def stand_in_pair(pair: Pair, outputs: dict[str, list[str]], rubric, rule: str) -> PairResult:
    """The pair's result had its judge written `outputs` in each order."""
    fmt = VERDICT_FORMATS[rubric.verdict_format]
    orders = {}
    for order, first in ORDERS.items():
        readings = [(text, fmt.read(text, rubric.criteria)) for text in outputs.get(order, [])]
        orders[order] = [OrderJudgement(first=first, feedback=text, verdict=in_pair_terms(r.verdict, first), label=r.label, parse_error=r.error,
                                        n_tiles=None, prompt_tokens=0, generated_tokens=0) for text, r in readings]
    verdict, distribution, consistent = pairwise_verdict(orders["forward"], orders["reverse"], rule)
    return PairResult(id=pair.id, model_a=pair.model_a, model_b=pair.model_b, category=pair.category, group=pair.group, verdict=verdict,
                      verdict_distribution=distribution, rule=rule, swap_consistent=consistent, n_images=len(pair.images()), **orders)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", choices=list(FORMATS), required=True)
    parser.add_argument("--input_dir", type=Path, required=True)
    parser.add_argument("--input_file", required=True)
    parser.add_argument("--criteria_file", type=Path)
    parser.add_argument("--rubric", type=Path, nargs="+")
    parser.add_argument("--scores", type=Path)
    parser.add_argument("--outputs", type=Path)
    parser.add_argument("--pair_rule", choices=RULES, default="agree")
    parser.add_argument("--output_dir", type=Path, required=True)
    args = parser.parse_args()
    fmt = FORMATS[args.format]
    bench = fmt.read(args.input_dir / args.input_file, args.input_dir, load_rubrics(args.rubric or fmt.default_rubrics), args.criteria_file)
    for problem in bench.problems:
        print(f"skipped: {problem}")
    if args.outputs is not None:
        outputs = read_json(args.outputs)
        results = {p.id: stand_in_pair(p, outputs[p.id], bench.rubrics[p.category], args.pair_rule) for p in bench.samples if p.id in outputs}
        args.output_dir.mkdir(parents=True, exist_ok=True)
        for path in fmt.write(bench, results, args.output_dir):
            print(f"{fmt.name}: {path}")
        print(json.dumps({"pairs": len(bench.samples), "judged": len(results)}))
        return
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
