"""judge-calibrate --probes: the bias suite's effects (judge/probes.py) from judge-score's probe_<kind>.json files,
each against the judge's own scores of the unperturbed samples (the first --predictions file). No human score is
needed; the report gives each probe's mean shift and share changed with 95% bootstrap intervals and its gate.
Imports no torch."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from mmjudge.calibration.inputs import JudgeRecord, read_predictions
from mmjudge.judge.data import InputError, Problem, UsageError
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.probes import PROBES, ProbeEffect, probe_effect

PROBE_FILE = re.compile(r"probe_(\w+)\.json")


def probe_kind(path: str | Path) -> str:
    """The probe a judge-score probe file holds, from its name (probe_<kind>.json)."""
    match = PROBE_FILE.fullmatch(Path(path).name)
    if not match or match.group(1) not in PROBES:
        raise UsageError(f"--probes {path}: not a judge-score probe file; they are named probe_<kind>.json, kind one of {', '.join(PROBES)}")
    return match.group(1)


def _value(record: JudgeRecord, overall: str) -> float | None:
    return record.expected_score if overall == "expected_score" else record.scores.get("overall")


def probe_effects(original: dict[str, JudgeRecord], paths: list[str], scale: ScoreScale, overall: str, threshold: float, max_shift: float,
                  resamples: int, seed: int) -> dict[str, ProbeEffect]:
    """Each probe file's effect on the samples scored (a value in --overall's field) in both it and the original run."""
    kinds = [probe_kind(path) for path in paths]
    if len(set(kinds)) != len(kinds):
        raise UsageError(f"--probes {' '.join(map(str, paths))}: one file per probe, each once")
    effects, problems = {}, []
    for kind, path in zip(kinds, paths):
        found = read_predictions(str(path), scale)
        problems += found.problems
        pairs = [(a, b) for rid, r in found.records.items() if rid in original
                 and (a := _value(original[rid], overall)) is not None and (b := _value(r, overall)) is not None]
        if not problems and found.records and not set(found.records) & set(original):
            problems.append(Problem(str(path), "no id in common with the first --predictions file: probe files go with the run that wrote them"))
        before, after = np.array([a for a, _ in pairs]), np.array([b for _, b in pairs])
        effects[kind] = probe_effect(kind, before, after, scale.index(before) if pairs else before, scale.index(after) if pairs else after,
                                     threshold, max_shift, resamples, seed)
    if problems:
        raise InputError(problems)
    return effects
