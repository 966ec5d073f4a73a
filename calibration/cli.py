"""judge-calibrate: how far does a judge agree with people, and a map that brings its scale closer.

    judge-calibrate --predictions eval_result.json --human annotations.json --output_dir report

Writes report.json, report.md, report.html (plots embedded), plots/*.png, and calibrator.json (for
`judge-score --calibrator`; with several judges also calibrator_<name>.json for each).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from calibration.analysis import Options, analyse
from calibration.inputs import load_ratings
from calibration.report import slug, write_reports
from judge.cli import UsageError, add_common_flags, run
from judge.data import SCORE_FIELDS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="judge-calibrate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--predictions", nargs="+", required=True, help="judge-score outputs (or JSON lists with id and scores), one per judge")
    p.add_argument("--human", required=True, help="annotations (several annotators per id allowed) or a flat {id, criterion: score} list")
    p.add_argument("--output_dir", required=True, help="where the reports go")
    p.add_argument("--names", nargs="+", help="a display name per predictions file (default: the file names)")
    p.add_argument("--criteria", nargs="+", choices=SCORE_FIELDS, default=list(SCORE_FIELDS), help="criteria to compare (default: all five)")
    p.add_argument("--by", choices=["category", "model", "none"], default="category", help="grouping of the per-group figures (default: category)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for Pearson's interval; 0 turns it off (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap and the calibration folds (default: 0)")
    p.add_argument("--fit", choices=["isotonic", "linear", "none"], default="isotonic", help="calibration map (default: isotonic)")
    p.add_argument("--folds", type=int, default=5, help="cross-fitting folds for held-out calibration errors (default: 5)")
    p.add_argument("--scale", nargs=2, type=float, default=[0, 6], metavar=("LOW", "HIGH"), help="the score scale (default: 0 6, MMIE's)")
    add_common_flags(p)
    return p


def main(argv=None) -> int:
    return run(_main, argv)


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    names = args.names or [Path(p).stem for p in args.predictions]
    if len(names) != len(args.predictions):
        raise UsageError(f"--names has {len(names)} name(s) for {len(args.predictions)} predictions file(s)")
    if len(set(names)) != len(names):
        raise UsageError(f"judge names must differ: {names}; give --names")
    if args.folds < 2:
        raise UsageError("--folds must be at least 2")
    scale = tuple(args.scale)
    ratings = load_ratings(args.predictions, names, args.human, scale)
    opts = Options(args.criteria, args.by, args.bootstrap, args.seed, args.fit, args.folds, scale)
    report, calibrators, arrays = analyse(ratings, opts)
    out = Path(args.output_dir)
    write_reports(report, arrays, out)
    for k, (name, cal) in enumerate(calibrators.items()):
        if k == 0:
            cal.save(out / "calibrator.json")
        if len(calibrators) > 1:
            cal.save(out / f"calibrator_{slug(name)}.json")
    for note in ratings.notes:
        print(f"note: {note}", file=sys.stderr)
    for name, info in report["judges"].items():
        overall = info["criteria"].get("overall", {}).get("all", {})
        r, mse = overall.get("pearson", {}).get("value"), overall.get("mse", {}).get("value")
        print(f"{name}: overall Pearson {'undefined' if r is None else f'{r:.3f}'}, MSE {'undefined' if mse is None else f'{mse:.3f}'}")
    print(f"report: {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
