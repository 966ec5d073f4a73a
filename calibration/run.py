"""One judge-calibrate run on scores, once its settings are given, whether by judge-calibrate's flags
(calibration/cli.py) or by the Python API's `mmjudge.calibrate`. Imports no torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmjudge.judge.data import UsageError
from mmjudge.judge.probes import BARELY_MOVES, FAMILY_MAX_GAP, PROBE_MAX_SHIFT

if TYPE_CHECKING:
    from mmjudge.calibration.analysis import Report

PathLike = str | Path


def calibrate(predictions: PathLike | list[dict] | Sequence[PathLike | list[dict]] | dict[str, PathLike | list[dict]],
              human: PathLike | list[dict], *, names: Sequence[str] | None = None, output_dir: PathLike | None = None,
              calibrator_of: str | None = None, probes: Sequence[PathLike] = (), probe_threshold: float = BARELY_MOVES,
              probe_max_shift: float = PROBE_MAX_SHIFT, judge_family: str | None = None, **options) -> Report:
    """How far one or more judges agree with people, and the calibration maps (judge-calibrate). Imports no torch.

    predictions: one judge's predictions, as a file (judge-score's eval_result.json, a JSON list of {id,
        overall, ...}, an Inst-It or MEGA-Bench scored file) or as records (what `Judge.score` returns);
        several judges' as a list of those, or as {name: file or records}. (--predictions)
    human: the human scores: annotation records (several annotators per id allowed) or a flat
        [{id, overall, ...}] list, as a file or records. (--human)
    names: a name per judge (default: the dict's keys, the files' names, or judge, judge_2, ...). (--names)
    output_dir: where report.json, report.md, report.html, plots/ and calibrator.json go (default: nowhere,
        the report is only returned). (--output_dir)
    calibrator_of: the judge (by its name) whose map calibrator.json holds (default: the first). (--calibrator_of)
    probes: judge-score's probe_<kind>.json files of the first judge's run (--probe): each probe's effect on its
        scores, with its interval and gate, in report.probes. (--probes)
    probe_threshold: the share of samples whose score must change under an image probe. (--probe_threshold)
    probe_max_shift: the mean shift, in levels, padding or rewording may cause; and how much more the judge may
        over-score its own family's answers than others'. (--probe_max_shift)
    judge_family: the judge's family as answers' model names hold it (e.g. "qwen"): self- and family-preference
        of the first judge, in report.family_preference. (--judge_family)
    **options: calibration.analysis.Options' fields, with judge-calibrate's defaults: criteria, group_by
        (--by), bootstrap, seed, fit, folds, scale ((low, high) or (low, high, step)), overall, coverage,
        target_agreement, agreement.

    Verdicts on pairs (judge-score's pairwise eval_result.json, a benchmark's file of verdicts) go to
    `calibrate_pairs`, with its options (max_error, uncertainty, panel, ...), and return its PreferenceReport.

    Returns the Report (calibration/analysis.py) that report.json holds: `report.judges[name].criteria[c].all`
    has n, Pearson with its interval, MSE, QWK; `.calibration.calibrator` the fitted map.
    """
    from dataclasses import replace

    from mmjudge.calibration.analysis import Options, analyse
    from mmjudge.calibration.inputs import compared_criteria, coverage_notes, expected_as_overall, load_ratings, source_name
    from mmjudge.calibration.preferences import is_preference_file
    from mmjudge.calibration.probes import family_preference, probe_effects
    from mmjudge.calibration.report import slug, write_reports
    from mmjudge.judge.outputs import locked, overwritten_inputs

    sources, names = _judges(predictions, names)
    if sources and all(isinstance(s, (str, Path)) for s in sources) and is_preference_file(str(sources[0])):
        family = {"judge_family": judge_family} if judge_family else {}
        return calibrate_pairs(sources, human, names=names, output_dir=output_dir, calibrator_of=calibrator_of, **family, **options)
    opts, problems = _options(Options, options)
    human_name, _ = source_name(human, "human")
    if len(names) != len(sources):
        problems.append(f"--names has {len(names)} name(s) for {len(sources)} predictions file(s)")
    elif len(set(names)) != len(names):
        problems.append(f"judge names must differ, got {names}: give --names")
    elif len({slug(n) for n in names}) != len(names):  # their plots and calibrator files would overwrite each other
        problems.append(f"judge names {names} give the same file names {[slug(n) for n in names]}: give --names that differ in letters or digits")
    elif calibrator_of is not None and calibrator_of not in names:
        problems.append(f"--calibrator_of {calibrator_of}: no judge of that name; the judges are {', '.join(names)}")
    if not 0 < probe_threshold < 1:
        problems.append(f"--probe_threshold must lie between 0 and 1 (exclusive), got {probe_threshold}")
    if not probe_max_shift >= 0:
        problems.append(f"--probe_max_shift must be 0 or more, got {probe_max_shift}")
    if problems:
        raise UsageError("; ".join(problems))
    out = Path(output_dir) if output_dir is not None else None
    files = [("--human", human), *[("--predictions", s) for s in sources], *[("--probes", path) for path in probes]]
    if out and (problems := overwritten_inputs(out, ["report.json", "report.md", "report.html", "plots/*", "calibrator*.json"],
                                               [(flag, s) for flag, s in files if isinstance(s, (str, Path))])):
        raise UsageError("\n  ".join(problems))
    ratings = load_ratings(sources, names, human, opts.scale)
    if opts.overall == "expected_score":
        ratings = expected_as_overall(ratings)
    opts = replace(opts, criteria=compared_criteria(ratings, opts.criteria, human_name))
    report, paired = analyse(ratings, opts, human_name, coverage_notes(ratings, human_name))
    if probes:
        report.probes = probe_effects(ratings.judges[names[0]], [str(path) for path in probes], opts.scale, opts.overall, probe_threshold,
                                      probe_max_shift, opts.bootstrap, opts.seed)
        report.probes_of = names[0]
    if judge_family:
        report.family_preference = family_preference(ratings.judges[names[0]], ratings.human, judge_family, opts.overall, probe_max_shift,
                                                      opts.bootstrap, opts.seed)
    calibrators = {name: j.calibration.calibrator for name, j in report.judges.items() if j.calibration and j.calibration.calibrator}
    chosen = calibrator_of or next(iter(calibrators), None)
    report.calibrator_of = chosen if chosen in calibrators else None
    if out is None:
        return report
    written = {name: [*(["calibrator.json"] if name == report.calibrator_of else []), *([f"calibrator_{slug(name)}.json"] if len(report.judges) > 1 else [])]
               for name in calibrators}
    with locked(out, "judge-calibrate"):
        # An earlier run's map must not stay beside a report that fitted none (or another judge's): judge-score
        # --calibrator would apply it. No input is among them (overwritten_inputs refused that above).
        stale = sorted({f.name for f in out.glob("calibrator*.json")} - {f for names in written.values() for f in names})
        for name in stale:
            (out / name).unlink()
        report.removed_calibrators = stale
        write_reports(report, paired, out)
        for name, calibrator in calibrators.items():
            for file_name in written[name]:
                calibrator.save(out / file_name)
    return report


def _judges(predictions, names: Sequence[str] | None) -> tuple[list, list[str]]:
    """Each judge's predictions (a path or records) and its name."""
    if isinstance(predictions, dict):
        return list(predictions.values()), list(names or predictions)
    one = isinstance(predictions, (str, Path)) or (isinstance(predictions, list) and (not predictions or isinstance(predictions[0], dict)))
    sources = [predictions] if one else list(predictions)
    defaults = [Path(s).stem if isinstance(s, (str, Path)) else "judge" if k == 0 else f"judge_{k + 1}" for k, s in enumerate(sources)]
    return sources, list(names or defaults)


def _options(options_class, given: dict) -> tuple[Any, list[str]]:
    """calibration.analysis.Options from keyword arguments, and what cannot work in them."""
    from mmjudge.judge.parsing import ScoreScale

    known = [f.name for f in fields(options_class)]
    if unknown := sorted(set(given) - set(known)):
        raise UsageError(f"unknown calibration option(s) {', '.join(unknown)}; the options are {', '.join(known)}")
    problems = []
    if isinstance(given.get("scale"), (tuple, list)):
        try:
            given = {**given, "scale": ScoreScale(*given["scale"])}
        except (TypeError, ValueError) as err:
            problems.append(f"--scale LOW HIGH, --step STEP: {err}")
            given = {k: v for k, v in given.items() if k != "scale"}
    opts = options_class(**given)
    if opts.bootstrap < 0:
        problems.append(f"--bootstrap must be 0 or more, got {opts.bootstrap}")
    if opts.folds < 2:
        problems.append(f"--folds must be at least 2, got {opts.folds}")
    for name in ("coverage", "target_agreement"):
        if not 0 < getattr(opts, name) < 1:
            problems.append(f"--{name} must lie between 0 and 1 (exclusive), got {getattr(opts, name)}")
    return opts, problems


PAIR_OPTIONS = ("group_by", "bootstrap", "seed", "max_error", "uncertainty", "panel", "folds", "judge_family", "family_max_gap")


def calibrate_pairs(predictions: PathLike | Sequence[PathLike], human: PathLike, *, names: Sequence[str] | None = None,
                    output_dir: PathLike | None = None, calibrator_of: str | None = None, **options):
    """judge-calibrate on verdicts on pairs (calibration/preferences.py): agreement with people's preferences, position
    bias, rankings, selective judging's thresholds and, with panel=True, a judge panel. `mmjudge.calibrate` comes here
    for files of verdicts. Files only (the verdicts' readers read benchmark files by their format).

    **options: group_by (--by), bootstrap, seed, folds, and max_error (alpha), uncertainty ("verdict_probability" or
        "entropy"), panel (bool), judge_family (the first judge's family: how much more often than people it picks that
        family's answer, in report.family_preference) and family_max_gap (that gate's share), as judge-calibrate's flags. Returns the PreferenceReport; with output_dir, writes
        report.json, report.md, report.html, plots/, calibrator.json (kind pairs) and, with panel, panel.json and
        panel_verdicts.json.
    """
    from mmjudge.calibration.preferences import Selection, analyse
    from mmjudge.calibration.report import write_preference_report
    from mmjudge.judge.outputs import locked, overwritten_inputs

    paths = [str(predictions)] if isinstance(predictions, (str, Path)) else [str(p) for p in predictions]
    names = list(names or [Path(path).stem for path in paths])
    if unknown := sorted(set(options) - set(PAIR_OPTIONS)):
        raise UsageError(f"{', '.join(unknown)}: not options of verdicts on pairs; they are {', '.join(PAIR_OPTIONS)}")
    group_by, bootstrap, seed = options.pop("group_by", "category"), options.pop("bootstrap", 1000), options.pop("seed", 0)
    judge_family, family_max_gap = options.pop("judge_family", None), options.pop("family_max_gap", FAMILY_MAX_GAP)
    selection = Selection(**options)
    problems = []
    if len(names) != len(paths) or len(set(names)) != len(names):
        problems.append(f"--names {names}: one name per predictions file ({len(paths)}), each its own")
    if calibrator_of is not None and calibrator_of not in names:
        problems.append(f"--calibrator_of {calibrator_of}: no judge of that name; the judges are {', '.join(names)}")
    if not 0 < selection.max_error < 1:
        problems.append(f"--max_error must lie between 0 and 1 (exclusive), got {selection.max_error}")
    if selection.folds < 2:
        problems.append(f"--folds must be at least 2, got {selection.folds}")
    if not 0 <= family_max_gap < 1:
        problems.append(f"--family_max_gap must lie between 0 (included) and 1, got {family_max_gap}")
    if selection.panel and len(paths) < 2:
        problems.append(f"--panel combines several judges; {len(paths)} predictions file given")
    if problems:
        raise UsageError("; ".join(problems))
    out = Path(output_dir) if output_dir is not None else None
    inputs = [("--human", human), *[("--predictions", path) for path in paths]]
    if out and (problems := overwritten_inputs(out, ["report.json", "report.md", "report.html", "plots/*", "calibrator*.json", "panel*.json"], inputs)):
        raise UsageError("\n  ".join(problems))
    report = analyse(paths, names, str(human), group_by, bootstrap, seed, selection, judge_family, family_max_gap)
    if out is not None:
        with locked(out, "judge-calibrate"):
            write_preference_report(report, out, calibrator_of or names[0])
    return report
