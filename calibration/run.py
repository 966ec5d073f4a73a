"""One judge-calibrate run on scores, once its settings are given, whether by judge-calibrate's flags
(calibration/cli.py) or by the Python API's `mmjudge.calibrate`. Imports no torch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmjudge.judge.data import UsageError
from mmjudge.judge.probes import BARELY_MOVES, PROBE_MAX_SHIFT

if TYPE_CHECKING:
    from mmjudge.calibration.analysis import Report

PathLike = str | Path


def calibrate(predictions: PathLike | list[dict] | Sequence[PathLike | list[dict]] | dict[str, PathLike | list[dict]],
              human: PathLike | list[dict], *, names: Sequence[str] | None = None, output_dir: PathLike | None = None,
              calibrator_of: str | None = None, probes: Sequence[PathLike] = (), probe_threshold: float = BARELY_MOVES,
              probe_max_shift: float = PROBE_MAX_SHIFT, **options) -> Report:
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
    probe_max_shift: the mean shift, in levels, padding or rewording may cause. (--probe_max_shift)
    **options: calibration.analysis.Options' fields, with judge-calibrate's defaults: criteria, group_by
        (--by), bootstrap, seed, fit, folds, scale ((low, high) or (low, high, step)), overall, coverage,
        target_agreement, agreement.

    Returns the Report (calibration/analysis.py) that report.json holds: `report.judges[name].criteria[c].all`
    has n, Pearson with its interval, MSE, QWK; `.calibration.calibrator` the fitted map.
    """
    from dataclasses import replace

    from mmjudge.calibration.analysis import Options, analyse
    from mmjudge.calibration.inputs import compared_criteria, coverage_notes, expected_as_overall, load_ratings, source_name
    from mmjudge.calibration.probes import probe_effects
    from mmjudge.calibration.report import slug, write_reports
    from mmjudge.judge.outputs import locked, overwritten_inputs

    sources, names = _judges(predictions, names)
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
