"""judge-demo: the whole toolkit end to end on a tiny random judge, in a few minutes on a CPU.

    1. write a tiny InternVL2-style judge and a synthetic annotated MMIE-style dataset (real images),
       split by id into train, validation and test
    2. judge-score the test split with the untrained judge
    3. judge-train the judge on the train split; at every checkpoint it scores the validation split and
       keeps the best checkpoint
    4. judge-score the test and validation splits with the trained judge, and again with the answers'
       images blanked (--probe_images blank: does the judge look at them?)
    5. judge-calibrate both against the test split's human scores, on the judges' expected scores: their
       agreement, conformal score sets, and each evaluated model's benchmark score by PPI++, which adds the
       validation ids that only the judge scored to the test ids that people scored too

The test split is seen by neither training nor checkpoint selection, so the before/after figures are not
flattered by the choice of checkpoint; the validation split's human scores are used by no figure here.
Each step runs the real command a user would type, as a subprocess (this package only reads the commands'
outputs, with their own formatters), and the demo stops with that command's exit code if one fails. The
settings are configs/demo.yaml's, each overridden by the flag of its name.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from mmjudge.calibration.benchmark import summary_lines
from mmjudge.infer.probe import format_reliance
from mmjudge.judge.cli import CommandParser, add_common_flags, add_settings_flags, config_given, config_values, run, settings_from_config
from mmjudge.judge.data import UsageError
from mmjudge.configs import CONFIG_DIR, by_name
from mmjudge.train.config import TrainConfig

DEFAULT_CONFIG = CONFIG_DIR / "demo.yaml"
SPLITS = ("train", "validation", "test")


def _setting(help: str):
    return field(metadata={"help": help})


@dataclass(frozen=True)
class DemoSettings:
    """Every setting of judge-demo: configs/demo.yaml sets these keys and each has a flag of its name."""

    samples: int = _setting("synthetic samples (one id each), split by id into train, validation and test")
    validation_share: float = _setting("share of the ids that judge-train scores at every checkpoint to keep the best")
    test_share: float = _setting("share of the ids for the before/after figures, seen by neither training nor selection")
    max_steps: int | None = _setting("judge-train's optimizer steps (none: the epochs of the bundled training preset tiny)")
    seed: int = _setting("seed of the judge, the dataset and the split")


def split_sizes(settings: DemoSettings) -> dict[str, int]:
    """The number of ids in each split; every split needs one at least."""
    test = round(settings.samples * settings.test_share)
    validation = round(settings.samples * settings.validation_share)
    sizes = {"train": settings.samples - validation - test, "validation": validation, "test": test}
    if empty := [name for name, size in sizes.items() if size < 1]:
        raise UsageError(f"--samples {settings.samples}, --validation_share {settings.validation_share} and --test_share "
                         f"{settings.test_share} leave no sample for {' and '.join(empty)}")
    return sizes


def split(data_dir: Path, sizes: dict[str, int], seed: int) -> dict[str, Path]:
    """train.json, validation.json and test.json: the ids in a seeded random order, cut to the sizes. A
    sample's annotators share its id, so they stay in one split."""
    records = json.loads((data_dir / "data.json").read_text())
    ids = sorted({r["id"] for r in records})
    random.Random(seed).shuffle(ids)
    paths, start = {}, 0
    for name in SPLITS:
        chosen = set(ids[start:start + sizes[name]])
        start += sizes[name]
        paths[name] = data_dir / f"{name}.json"
        paths[name].write_text(json.dumps([r for r in records if r["id"] in chosen], indent=1))
    # What the trained judge scores: the test ids, whose human scores judge-calibrate reads, and the
    # validation ids, which stand for the bulk of a benchmark that no person scores.
    paths["judged"] = data_dir / "judged.json"
    paths["judged"].write_text(json.dumps(json.loads(paths["test"].read_text()) + json.loads(paths["validation"].read_text()), indent=1))
    return paths


def step(title: str, args: list[str], log_dir: Path) -> None:
    print(f"\n== {title}\n$ {shlex.join(args)}", flush=True)
    start = time.perf_counter()
    log = log_dir / f"{title.split(':')[0].strip().replace(' ', '_')}.log"
    with log.open("w") as out:
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT)
    print(f"   {'ok' if done.returncode == 0 else 'FAILED'} in {time.perf_counter() - start:.0f}s (log: {log})", flush=True)
    if done.returncode != 0:
        print(log.read_text()[-3000:], file=sys.stderr)
        raise SystemExit(done.returncode)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    p = CommandParser(prog="judge-demo", description=__doc__)
    p.add_argument("--output_dir", default="demo_outputs", path="output_dir", help="where everything is written (default: demo_outputs)")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), path="file", help="YAML of the settings below (default: configs/demo.yaml)")
    add_settings_flags(p, DemoSettings, config_values(DemoSettings, config_given(argv, None, DEFAULT_CONFIG), argparse.Namespace()))
    add_common_flags(p)
    return p


def main(argv=None) -> int:
    return run(_main, argv)


def _main(argv) -> int:
    args = build_parser(argv).parse_args(argv)
    settings = settings_from_config(DemoSettings, args.config, args)
    sizes = split_sizes(settings)
    out = Path(args.output_dir).resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    py, seed = sys.executable, str(settings.seed)
    rubric = ["--rubric", "tiny"]  # the bundled files by name, as a user types them
    # Both judges write their review as judge-train's evaluation has them write it, and are compared on their
    # expected scores: the untrained judge writes no score a parser could find, but judge-score reads its
    # score distribution after a forced "### Score" heading, so both sides are measured the same way.
    review_tokens = str(settings_from_config(TrainConfig, by_name("train", "tiny"), argparse.Namespace()).eval_max_new_tokens)
    score = ["--max_new_tokens", review_tokens, "--max_tiles", "1", "--no_resume", *rubric]
    steps = [] if settings.max_steps is None else ["--max_steps", str(settings.max_steps)]
    start = time.perf_counter()

    step("1a: write a tiny judge", [py, "-m", "mmjudge.judge.testing", "checkpoint", "--format", "original", "--seed", seed, str(out / "base-judge")], logs)
    step("1b: write a dataset", [py, "-m", "mmjudge.judge.testing", "dataset", "--samples", str(settings.samples), "--annotated", "--seed", seed, str(out / "data")], logs)
    files = split(out / "data", sizes, settings.seed)
    step("2: score before training", [py, "-m", "mmjudge.infer.cli", "--model_path", str(out / "base-judge"), "--input_dir", str(out / "data"),
                                       "--input_file", "test.json", "--output_dir", str(out / "scores-before"), *score], logs)
    shutil.rmtree(out / "trained-judge", ignore_errors=True)  # judge-train starts only in an empty directory: a rerun replaces the judge
    step("3: train", [py, "-m", "mmjudge.train.cli", "--model_path", str(out / "base-judge"), "--train_file", str(files["train"]),
                      "--eval_file", str(files["validation"]), "--input_dir", str(out / "data"), "--output_dir", str(out / "trained-judge"),
                      "--config", "tiny", *steps, *rubric], logs)
    step("4: score after training", [py, "-m", "mmjudge.infer.cli", "--model_path", str(out / "trained-judge"), "--input_dir", str(out / "data"),
                                      "--input_file", "judged.json", "--output_dir", str(out / "scores-after"), "--probe_images", "blank", *score], logs)
    step("5: calibrate", [py, "-m", "mmjudge.calibration.cli", "--predictions", str(out / "scores-before" / "eval_result.json"),
                          str(out / "scores-after" / "eval_result.json"), "--names", "before", "after", "--human", str(files["test"]),
                          "--overall", "expected_score", "--output_dir", str(out / "report")], logs)

    report = json.loads((out / "report" / "report.json").read_text())
    print_headline(report, time.perf_counter() - start, sizes)
    print_trust(report["judges"]["after"], json.loads((out / "scores-after" / "summary.json").read_text())["image_reliance"], sizes)
    print(f"\nTrained judge: {out / 'trained-judge'}\nScores: {out / 'scores-before'}, {out / 'scores-after'} "
          f"(image reliance: {out / 'scores-after' / 'probe_blank.png'})\nReport: {out / 'report' / 'report.html'}")
    return 0


def print_headline(report: dict, seconds: float, sizes: dict[str, int]) -> None:
    print(f"\nDone in {seconds:.0f}s. Agreement of the judge's expected score with the human overall score on the {sizes['test']} test samples, "
          f"unseen in training ({sizes['train']}) and checkpoint selection ({sizes['validation']}):")
    for name in ("before", "after"):
        entry = report["judges"][name]["criteria"].get("overall", {})
        r, n = entry.get("all", {}).get("pearson", {}), entry.get("all", {}).get("n", {}).get("value", 0)
        why = entry.get("undefined") or r.get("reason")
        value = "undefined" if r.get("value") is None else f"{r['value']:.3f}"
        print(f"  {name:>6}: Pearson {value}, n = {n:.0f}{f'  ({why})' if why else ''}")


def print_trust(after: dict, reliance: dict, sizes: dict[str, int]) -> None:
    """How far the trained judge can be trusted: each model's benchmark score by PPI++ beside the judge's and
    the people's alone, its conformal score sets on held-out folds, and whether it looks at the images."""
    print(f"\nBenchmark score per model (mean overall, 95% interval), from the {sizes['test']} human-scored test ids "
          f"and the {sizes['validation']} validation ids only the judge scored:")
    for line in summary_lines({"judges": {"after": after}}):
        print(f"  {line}")
    sets = (after.get("calibration") or {}).get("score_sets") or {}
    if held_out := sets.get("held_out"):
        print(f"Score sets: asked to hold the human score {sets['coverage']:.0%} of the time, they held it {held_out['coverage']:.0%} "
              f"on held-out folds, with {held_out['mean_size']:.2f} levels on average")
    else:
        print(f"Score sets: none ({sets.get('reason', 'no calibration')})")
    print(format_reliance(reliance))
