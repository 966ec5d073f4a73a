"""judge-calibrate: how far a judge agrees with people, and a map that brings its scale closer to theirs.

    judge-calibrate --predictions eval_result.json [other.json ...] --human annotations.json --output_dir report
    judge-calibrate --predictions local_log.json --human gpt4o_log.json --scale 0 1 --step 0.1 --output_dir report  # Inst-It logs

Writes report.json, report.md, report.html (plots embedded), plots/*.png, and calibrator.json (the map of the
first judge, or of --calibrator_of, for `judge-score --calibrator`, which applies it to that judge only; with
several judges also calibrator_<name>.json for each).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mmjudge.calibration.analysis import Options, Report, analyse
from mmjudge.calibration.inputs import Ratings, coverage_notes, expected_as_overall, load_ratings
from mmjudge.calibration.report import slug, write_reports
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.cli import add_common_flags, run
from mmjudge.judge.data import SCORE_FIELDS, InputError, Problem, UsageError
from mmjudge.judge.outputs import locked, overwritten_inputs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="judge-calibrate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--predictions", nargs="+", required=True, help="judge-score outputs (or JSON lists with id and scores, or Inst-It evaluate logs), one per judge")
    p.add_argument("--human", required=True,
                   help="annotation records (several annotators per id allowed; their mean is the reference), a flat [{id, overall, ...}] list, "
                        "or an Inst-It evaluate log (its judge as the one annotator)")
    p.add_argument("--output_dir", required=True, help="where the reports go")
    p.add_argument("--names", nargs="+", help="a display name per predictions file (default: the file names without extension)")
    p.add_argument("--calibrator_of", "--calibrator-of", metavar="NAME",
                   help="the judge (by its name) whose map calibrator.json holds, for judge-score --calibrator (default: the first)")
    p.add_argument("--criteria", nargs="+", choices=SCORE_FIELDS, help="criteria to compare (default: every one both sides scored)")
    p.add_argument("--by", choices=["category", "model", "none"], default="category", help="grouping of the per-group figures (default: category)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for Pearson's interval; 0 turns it off (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap, the calibration folds and the plot jitter (default: 0)")
    p.add_argument("--fit", choices=["isotonic", "linear", "none"], default="isotonic", help="calibration map (default: isotonic)")
    p.add_argument("--overall", choices=["score", "expected_score"], default="score",
                   help="the judge's overall value: the score it wrote, or its expected score over the score distribution "
                        "(finer, and defined where its text did not parse) (default: score)")
    p.add_argument("--folds", type=int, default=5, help="cross-fitting folds for the held-out calibration errors (default: 5)")
    p.add_argument("--coverage", type=float, default=Options.coverage,
                   help="probability that a record's conformal set of score levels holds the human score, fitted from the judge's "
                        f"score distributions into calibrator.json (default: {Options.coverage})")
    p.add_argument("--target_agreement", type=float, default=Options.target_agreement,
                   help="agreement with people that the records the judge may score alone must reach; the rest are escalated "
                        f"(default: {Options.target_agreement})")
    p.add_argument("--agreement", choices=["exact", "within_1"], default=Options.agreement,
                   help=f"what agreeing means for --target_agreement: the same level, or at most one level apart (default: {Options.agreement})")
    p.add_argument("--scale", nargs=2, type=float, default=[ScoreScale.low, ScoreScale.high], metavar=("LOW", "HIGH"),
                   help=f"the score scale (default: {ScoreScale.low} {ScoreScale.high}, MMIE's)")
    p.add_argument("--step", type=float, default=ScoreScale.step,
                   help=f"the distance between score levels LOW, LOW+STEP, ..., HIGH (default: {ScoreScale.step}; Inst-It's GPT-4o scores: "
                        "--scale 0 1 --step 0.1)")
    add_common_flags(p)
    return p


def check_args(args: argparse.Namespace) -> tuple[list[str], ScoreScale]:
    """The judge names and the scale; every problem with the flags in one UsageError."""
    names = args.names or [Path(p).stem for p in args.predictions]
    problems = []
    if len(names) != len(args.predictions):
        problems.append(f"--names has {len(names)} name(s) for {len(args.predictions)} predictions file(s)")
    elif len(set(names)) != len(names):
        problems.append(f"judge names must differ, got {names}: give --names")
    elif len({slug(n) for n in names}) != len(names):  # their plots and calibrator files would overwrite each other
        problems.append(f"judge names {names} give the same file names {[slug(n) for n in names]}: give --names that differ in letters or digits")
    elif args.calibrator_of is not None and args.calibrator_of not in names:
        problems.append(f"--calibrator_of {args.calibrator_of}: no judge of that name; the judges are {', '.join(names)}")
    if args.bootstrap < 0:
        problems.append(f"--bootstrap must be 0 or more, got {args.bootstrap}")
    if args.folds < 2:
        problems.append(f"--folds must be at least 2, got {args.folds}")
    for flag in ("coverage", "target_agreement"):
        if not 0 < getattr(args, flag) < 1:
            problems.append(f"--{flag} must lie between 0 and 1 (exclusive), got {getattr(args, flag)}")
    scale = None
    try:
        scale = ScoreScale(*args.scale, args.step)
    except ValueError as err:
        problems.append(f"--scale LOW HIGH, --step STEP: {err}")
    if problems:
        raise UsageError("; ".join(problems))
    return names, scale


def compared_criteria(ratings: Ratings, requested: list[str] | None, human_path: str) -> list[str]:
    """The criteria to report: those asked for, or by default every one that some judge and the human file
    both scored on a shared id (in SCORE_FIELDS order). A criterion with no such id is an error, not a
    report of empty tables."""
    found = [c for c in SCORE_FIELDS
             if any(c in record.scores and c in ratings.human[rid].ratings for judge in ratings.judges.values()
                    for rid, record in judge.items() if rid in ratings.human)]
    if requested is None:
        if not found:
            raise InputError([Problem(human_path, "no criterion is scored both here and in the predictions on a shared id")])
        return found
    if missing := [c for c in requested if c not in found]:
        raise InputError([Problem(human_path, f"--criteria {c}: no shared id is scored on it both here and in the predictions") for c in missing])
    return list(dict.fromkeys(requested))  # a criterion named twice is reported once


def print_summary(report: Report, out: Path) -> None:
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    for name, judge in report.judges.items():
        for criterion, result in judge.criteria.items():
            table = result.all
            print(f"{name} {criterion}: n {table['n'].value:.0f}, Pearson {_short(table['pearson'].value)}, MSE {_short(table['mse'].value)}"
                  + (f"  ({result.collapse})" if result.collapse else ""))
    print(f"report: {out / 'report.html'}")


def _short(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    names, scale = check_args(args)
    out = Path(args.output_dir)
    inputs = [("--human", args.human), *[("--predictions", path) for path in args.predictions]]
    if problems := overwritten_inputs(out, ["report.json", "report.md", "report.html", "plots/*", "calibrator*.json"], inputs):
        raise UsageError("\n  ".join(problems))
    ratings = load_ratings(args.predictions, names, args.human, scale)
    if args.overall == "expected_score":
        ratings = expected_as_overall(ratings)
    criteria = compared_criteria(ratings, args.criteria, args.human)
    opts = Options(criteria, args.by, args.bootstrap, args.seed, args.fit, args.folds, scale, args.overall, args.coverage,
                   args.target_agreement, args.agreement)
    report, paired = analyse(ratings, opts, args.human, coverage_notes(ratings, args.human))
    calibrators = {name: j.calibration.calibrator for name, j in report.judges.items() if j.calibration and j.calibration.calibrator}
    chosen = args.calibrator_of or next(iter(calibrators), None)
    report.calibrator_of = chosen if chosen in calibrators else None
    files = {name: [*(["calibrator.json"] if name == report.calibrator_of else []), *([f"calibrator_{slug(name)}.json"] if len(report.judges) > 1 else [])]
             for name in calibrators}
    with locked(out, "judge-calibrate"):
        # An earlier run's map must not stay beside a report that fitted none (or another judge's): judge-score
        # --calibrator would apply it. No input is among them (overwritten_inputs refused that above).
        stale = sorted({f.name for f in out.glob("calibrator*.json")} - {f for names in files.values() for f in names})
        for name in stale:
            (out / name).unlink()
        report.removed_calibrators = stale
        write_reports(report, paired, out)
        for name, calibrator in calibrators.items():
            for file_name in files[name]:
                calibrator.save(out / file_name)
    print_summary(report, out)
    return 0


def main(argv=None) -> int:
    return run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
