"""judge-calibrate: how far a judge agrees with people, and a map that brings its scale closer to theirs.

    judge-calibrate --predictions eval_result.json [other.json ...] --human annotations.json --output_dir report
    judge-calibrate --predictions local_log.json --human gpt4o_log.json --scale 0 1 --step 0.1 --output_dir report  # Inst-It logs
    judge-calibrate --predictions eval_result.json --human pairs.json --output_dir report  # verdicts on pairs

Writes report.json, report.md, report.html (plots embedded), plots/*.png, and calibrator.json (the map of the
first judge, or of --calibrator_of, for `judge-score --calibrator`, which applies it to that judge only; with
several judges also calibrator_<name>.json for each). Predictions of verdicts on pairs (a pairwise judge-score
run, an OpenING battle file of a judge's winners) get a report on preferences instead
(calibration/preferences.py): agreement with and without ties, Cohen's kappa, position bias, swap consistency,
win rates under four tie rules and a Bradley-Terry ranking; and selective judging: the confidence below which
judge-score --calibrator abstains so that the kept verdicts' error is at most --max_error (with probability 0.9),
with coverage against error at several risk levels; --panel combines the judges into a calibrated panel.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mmjudge.calibration.analysis import Options, Report
from mmjudge.calibration.preferences import Selection, is_preference_file
from mmjudge.calibration.run import calibrate, calibrate_pairs
from mmjudge.judge.calibrator import UNCERTAINTIES
from mmjudge.judge.probes import BARELY_MOVES, FAMILY_MAX_GAP, PROBE_MAX_SHIFT
from mmjudge.judge.cli import CommandParser, add_common_flags, run
from mmjudge.judge.data import SCORE_FIELDS, UsageError
from mmjudge.judge.parsing import ScoreScale


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="judge-calibrate", description=__doc__)
    p.add_argument("--predictions", nargs="+", required=True, path="file", help="judge-score outputs (or JSON lists with id and scores, or Inst-It evaluate logs), one per judge")
    p.add_argument("--human", required=True, path="file",
                   help="annotation records (several annotators per id allowed; their mean is the reference), a flat [{id, overall, ...}] list, "
                        "or an Inst-It evaluate log (its judge as the one annotator)")
    p.add_argument("--output_dir", required=True, path="output_dir", help="where the reports go")
    p.add_argument("--names", nargs="+", help="a display name per predictions file (default: the file names without extension)")
    p.add_argument("--calibrator_of", metavar="NAME",
                   help="the judge (by its name) whose map calibrator.json holds, for judge-score --calibrator (default: the first)")
    p.add_argument("--criteria", nargs="+", choices=SCORE_FIELDS, help="criteria to compare (default: every one both sides scored)")
    p.add_argument("--by", choices=["category", "model", "none"], default=Options.group_by, help="grouping of the per-group figures; for pairs, category is the benchmark's group (domain, task) (default: %(default)s)")
    p.add_argument("--bootstrap", type=int, default=Options.bootstrap, help="bootstrap resamples for Pearson's interval; 0 turns it off (default: %(default)s)")
    p.add_argument("--seed", type=int, default=Options.seed, help="seed of the bootstrap, the calibration folds and the plot jitter (default: %(default)s)")
    p.add_argument("--fit", choices=["isotonic", "linear", "none"], default=Options.fit, help="calibration map (default: %(default)s)")
    p.add_argument("--overall", choices=["score", "expected_score"], default=Options.overall,
                   help="the judge's overall value: the score it wrote, or its expected score over the score distribution "
                        "(finer, and defined where its text did not parse) (default: %(default)s)")
    p.add_argument("--folds", type=int, default=Options.folds, help="cross-fitting folds for the held-out calibration errors (default: %(default)s)")
    p.add_argument("--coverage", type=float, default=Options.coverage,
                   help="probability that a record's conformal set of score levels holds the human score, fitted from the judge's "
                        f"score distributions into calibrator.json (default: {Options.coverage})")
    p.add_argument("--target_agreement", type=float, default=Options.target_agreement,
                   help="agreement with people that the records the judge may score alone must reach; the rest are escalated "
                        f"(default: {Options.target_agreement})")
    p.add_argument("--agreement", choices=["exact", "within_1"], default=Options.agreement,
                   help=f"what agreeing means for --target_agreement: the same level, or at most one level apart (default: {Options.agreement})")
    p.add_argument("--probes", nargs="+", path="file", default=[],
                   help="judge-score's probe_<kind>.json files (judge-score --probe) of the first judge's run: each probe's effect on its "
                        "scores, with its 95%% interval and a pass/fail gate, in the report (default: none)")
    p.add_argument("--probe_threshold", type=float, default=BARELY_MOVES,
                   help="the share of samples whose score an image probe (blank, shuffle, blur, noise, quarter, reverse) must change to pass "
                        "(default: %(default)s)")
    p.add_argument("--probe_max_shift", type=float, default=PROBE_MAX_SHIFT,
                   help="the mean shift in score levels that padding (verbosity) or rewording (paraphrase) may cause and pass (default: %(default)s)")
    p.add_argument("--judge_family", metavar="NAME",
                   help="the judge's model family as the answers' model names hold it (e.g. qwen): reports whether the first judge over-scores "
                        "its family's answers, beside other models', against people (self- and family-preference); on pairs, whether it picks "
                        "its family's answer more often than people do (default: none)")
    p.add_argument("--family_max_gap", type=float, default=FAMILY_MAX_GAP,
                   help="pairs, with --judge_family: how much more often than people the judge may pick its family's answer and pass, a share "
                        "(default: %(default)s)")
    p.add_argument("--max_error", type=float, default=Selection.max_error,
                   help="pairs: the share of kept verdicts that may disagree with people (alpha); calibrator.json then holds the confidence "
                        "below which judge-score --calibrator abstains, met with probability 0.9 over the labelled pairs (default: %(default)s)")
    p.add_argument("--uncertainty", choices=UNCERTAINTIES, default=Selection.uncertainty,
                   help="pairs: a pair's confidence, from its verdict distribution averaged over both orders: the probability of its verdict, "
                        "or 1 - the distribution's normalised entropy (SCOPE's) (default: %(default)s)")
    p.add_argument("--panel", action="store_true",
                   help="pairs: also fit a panel of every judge given (a stacked logistic model on their verdict distributions, cross-fitted), "
                        "reported beside each judge; writes panel.json and panel_verdicts.json (default: off)")
    p.add_argument("--scale", nargs=2, type=float, default=[ScoreScale.low, ScoreScale.high], metavar=("LOW", "HIGH"),
                   help=f"the score scale (default: {ScoreScale.low} {ScoreScale.high}, MMIE's)")
    p.add_argument("--step", type=float, default=ScoreScale.step,
                   help=f"the distance between score levels LOW, LOW+STEP, ..., HIGH (default: {ScoreScale.step}; Inst-It's GPT-4o scores: "
                        "--scale 0 1 --step 0.1)")
    add_common_flags(p)
    return p


def print_summary(report: Report, out: Path) -> None:
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    for name, judge in report.judges.items():
        for criterion, result in judge.criteria.items():
            table = result.all
            print(f"{name} {criterion}: n {table['n'].value:.0f}, Pearson {_short(table['pearson'].value)}, MSE {_short(table['mse'].value)}"
                  + (f"  ({result.collapse})" if result.collapse else ""))
    for kind, effect in report.probes.items():
        result = "no samples" if effect.passed is None else "PASS" if effect.passed else "FAIL"
        print(f"probe {kind}: mean shift {effect.mean_shift.value:+.3f} [{effect.mean_shift.low:+.3f}, {effect.mean_shift.high:+.3f}], "
              f"changed {effect.share_changed.value:.0%} (n {effect.n}): {result}")
    if (family := report.family_preference) is not None:
        print(f"family {family.family!r}: " + (family.reason or f"residual {family.residual_family:+.3f} on its answers (n {family.n_family}), "
              f"{family.residual_other:+.3f} on others' (n {family.n_other}): {'PASS' if family.passed else 'FAIL'}"))
    print(f"report: {out / 'report.html'}")


def _short(value: float | None) -> str:
    return "undefined" if value is None else f"{value:.3f}"


# Flags of score agreement that preferences have no use for: a run on pairs refuses them rather than ignore them.
SCORE_ONLY = ("criteria", "fit", "overall", "probes", "probe_threshold", "probe_max_shift", "coverage", "target_agreement", "agreement", "scale", "step")
PAIRS_ONLY = ("max_error", "uncertainty", "panel", "family_max_gap")


def preferences(args, out: Path) -> int:
    parser = build_parser()
    if given := [f"--{flag}" for flag in SCORE_ONLY if getattr(args, flag) != parser.get_default(flag)]:
        raise UsageError(f"{', '.join(given)}: for scores; these predictions are verdicts on pairs")
    report = calibrate_pairs(args.predictions, args.human, names=args.names, output_dir=out, calibrator_of=args.calibrator_of,
                             group_by=args.by, bootstrap=args.bootstrap, seed=args.seed, max_error=args.max_error,
                             uncertainty=args.uncertainty, panel=args.panel, folds=args.folds, judge_family=args.judge_family,
                             family_max_gap=args.family_max_gap)
    for note in report.notes:
        print(f"note: {note}", file=sys.stderr)
    for name, j in report.judges.items():
        print(f"{name}: accuracy {_short(j.accuracy_with_ties.value)} with ties (n {j.n_with_ties}), {_short(j.accuracy_without_ties.value)} "
              f"without (n {j.n_without_ties}), kappa {_short(j.kappa.value)}, first shown wins {_short(j.position_bias['both'].share)}")
        if (sel := j.selective) is not None:
            point = next(p for p in sel.points if p.alpha == sel.max_error)
            kept = "none kept (no threshold met it)" if point.threshold is None else (
                f"threshold {point.threshold:.3f}, held-out coverage {_short(point.held_out_coverage)}, error among kept {_short(point.held_out_error)}")
            print(f"{name}: selective at max error {sel.max_error:g}: {kept} (error keeping all {sel.error_all:.3f}, n {sel.n})")
    if report.panel is not None:
        panel = report.panel
        print(f"panel: held-out accuracy {_short(panel.held_out_agreement)} (n {panel.n}); each judge "
              + ", ".join(f"{m} {a:.3f}" for m, a in panel.member_agreement.items()) + (f"; {panel.reason}" if panel.reason else ""))
    if (family := report.family_preference) is not None:
        print(f"family {family.family!r} ({report.family_of}): " + (family.reason or f"picks its family's answer {family.judge_share:.3f}, people "
              f"{family.people_share:.3f} (n {family.n}): {'PASS' if family.passed else 'FAIL'}"))
    print(f"report: {out / 'report.html'}")
    return 0


def _main(argv) -> int:
    args = build_parser().parse_args(argv)
    if is_preference_file(args.predictions[0]):
        return preferences(args, Path(args.output_dir))
    if given := [f"--{flag}" for flag in PAIRS_ONLY if getattr(args, flag) != build_parser().get_default(flag)]:
        raise UsageError(f"{', '.join(given)}: for verdicts on pairs; these predictions are scores")
    report = calibrate(args.predictions, args.human, names=args.names, output_dir=args.output_dir, criteria=args.criteria,
                       group_by=args.by, bootstrap=args.bootstrap, seed=args.seed, fit=args.fit, folds=args.folds,
                       scale=(*args.scale, args.step), overall=args.overall, coverage=args.coverage,
                       target_agreement=args.target_agreement, agreement=args.agreement, calibrator_of=args.calibrator_of, probes=args.probes,
                       probe_threshold=args.probe_threshold, probe_max_shift=args.probe_max_shift, judge_family=args.judge_family)
    print_summary(report, Path(args.output_dir))
    return 0


def main(argv=None) -> int:
    return run(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
