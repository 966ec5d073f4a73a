"""judge-demo: the whole toolkit end to end on a tiny random judge, in a minute or two on a CPU.

    1. write a tiny InternVL2-style judge and a synthetic annotated MMIE-style dataset (real images),
       split by id into train, validation and test
    2. judge-score the test split with the untrained judge
    3. judge-train the judge on the train split; at every checkpoint it scores the validation split and
       keeps the best checkpoint
    4. judge-score the test and validation splits with the trained judge, and again with the answers'
       images blanked (--probe_images blank: does the judge look at them?)
    5. judge-calibrate both against the test split's human scores, on the judges' expected scores: their
       agreement, conformal score sets, and each evaluated model's benchmark score by PPI++, which adds the
       validation ids that only the judge scored to the test ids that people scored too; report/calibrator.json
       is the trained judge's map (judge-score --calibrator refuses it for another judge)
    6. pairwise: synthetic pairs whose people prefer the answer with the better quality word (a tie where
       both say the same; no rationale), split likewise; the untrained judge judges the test pairs in both orders,
       judge-train teaches the base judge people's verdicts (both orders of every pair), the trained judge
       judges them again, and judge-calibrate compares both with people: accuracy, and how often the answer
       shown first wins (position bias)
    7. a reward model: judge-train --objective bradley_terry trains a reward head on the base judge from the same
       training pairs (ties out), each answer shown alone under a pointwise rubric; judge-score judges the test
       pairs by the two answers' rewards (a prefill each, no review written), and judge-calibrate compares its
       verdicts with people's beside the generative judges'

The test split is seen by neither training nor checkpoint selection, so the before/after figures are not
flattered by the choice of checkpoint; the validation split's human scores are used by no figure here.
Each step runs the real command a user would type (judge-score, judge-train, judge-calibrate), as a subprocess
whose output (its progress, a line every few seconds) shows in the terminal as it comes and goes to its log (this package only reads the commands'
outputs, with their own formatters); the demo stops with that command's exit code if one fails. Steps 2-5
and 6-7 run side by side (Steps.side_by_side). The
settings are configs/demo.yaml's, each overridden by the flag of its name. The figures a reader quotes
(Pearson before and after, each step's time, the machine, the commit) go to figures.json.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import random
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import BinaryIO

from mmjudge.calibration.benchmark import summary_lines
from mmjudge.infer.probe import format_reliance
from mmjudge.judge.cli import (CommandParser, add_common_flags, add_settings_flags, config_given, config_values, run, setting_problems,
                               settings_from_config)
from mmjudge.judge.data import UsageError, write_json_atomically
from mmjudge.configs import CONFIG_DIR, by_name
from mmjudge.train.config import TrainConfig

DEFAULT_CONFIG = CONFIG_DIR / "demo.yaml"
SPLITS = ("train", "validation", "test")
FIGURES = "figures.json"
# The pairwise part's judges, by the name judge-calibrate reports them under, and the folder of their verdicts.
PAIR_JUDGES = {"before": "pairs-before", "after": "pairs-after", "reward": "pairs-reward"}


def _setting(help: str, minimum: float | None = None):
    """A DemoSettings field; `minimum`, the least value judge-train takes, is checked before step 1 (setting_problems)."""
    return field(metadata={"help": help, "minimum": minimum})


@dataclass(frozen=True)
class DemoSettings:
    """Every setting of judge-demo: configs/demo.yaml sets these keys and each has a flag of its name."""

    samples: int = _setting("synthetic samples (one id each), split by id into train, validation and test")
    validation_share: float = _setting("share of the ids that judge-train scores at every checkpoint to keep the best")
    test_share: float = _setting("share of the ids for the before/after figures, seen by neither training nor selection")
    family: str = _setting("the tiny judge's backbone family (python -m mmjudge.judge.testing checkpoint --family NAME)")
    system_message: str = _setting("the tiny InternVL2-4B judge's system message (its config.json), in place of InternVL2's default")
    batch_size: int = _setting("judge-train's batch size, on the samples and the pairs", minimum=1)
    max_steps: int | None = _setting("judge-train's optimizer steps on the samples (none: the epochs of the bundled training preset tiny)", minimum=1)
    learning_rate: float = _setting("judge-train's peak learning rate on the samples", minimum=0)
    save_steps: int = _setting("on the samples, judge-train scores the validation split every this many steps and keeps the best checkpoint", minimum=1)
    pairs: int = _setting("synthetic pairs (one id each) of the pairwise part, split as the samples are")
    pair_steps: int = _setting("judge-train's optimizer steps on the pairs", minimum=1)
    pair_learning_rate: float = _setting("judge-train's peak learning rate on the pairs", minimum=0)
    pair_save_steps: int = _setting("on the pairs, judge-train judges the validation pairs every this many steps and keeps the best checkpoint",
                                    minimum=1)
    reward_epochs: int = _setting("judge-train's epochs of the Bradley-Terry reward model on the pairs (ties out)", minimum=1)
    seed: int = _setting("seed of the judge, the dataset and the split")


def split_sizes(settings: DemoSettings, count: int | None = None) -> dict[str, int]:
    """The number of ids in each split of the samples (or of `count` pairs); every split needs one at least."""
    count = settings.samples if count is None else count
    test = round(count * settings.test_share)
    validation = round(count * settings.validation_share)
    sizes = {"train": count - validation - test, "validation": validation, "test": test}
    if empty := [name for name, size in sizes.items() if size < 1]:
        flag = "--samples" if count == settings.samples else "--pairs"
        raise UsageError(f"{flag} {count}, --validation_share {settings.validation_share} and --test_share "
                         f"{settings.test_share} leave no sample for {' and '.join(empty)}")
    return sizes


def split(data_dir: Path, sizes: dict[str, int], seed: int, source: str = "data.json") -> dict[str, Path]:
    """train.json, validation.json and test.json of `source`: the ids in a seeded random order, cut to the
    sizes. A sample's (or pair's) annotators share its id, so they stay in one split."""
    records = json.loads((data_dir / source).read_text())
    ids = sorted({r["id"] for r in records})
    random.Random(seed).shuffle(ids)
    paths, start = {}, 0
    for name in SPLITS:
        chosen = set(ids[start:start + sizes[name]])
        start += sizes[name]
        paths[name] = data_dir / f"{name}.json"
        paths[name].write_text(json.dumps([r for r in records if r["id"] in chosen], indent=1))
    return paths


def script(name: str) -> str:
    """This installation's console script `name` (judge-score, ...), which sits beside its Python."""
    return str(Path(sys.executable).parent / name)


class Steps:
    """The demo's commands, each a subprocess, in order within a part. The samples part (steps 2-5) and the
    pairs part (6-7) share nothing but the base judge, and a tiny judge's step keeps one core busy, not two:
    the two parts run side by side, one shown as it runs, the other's output kept until the first is done.
    The first step to fail stops the other part's command too, and the demo stops with its exit code."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.seconds: dict[str, float] = {}
        self._running: set[subprocess.Popen] = set()
        self._failed: int | None = None
        self._lock = threading.Lock()

    def run(self, title: str, args: list[str], shown: BinaryIO) -> None:
        """Run one step's command, its output (its progress lines and all) written to `shown` as it comes and kept
        in its log, and record its seconds. The command is shown as a user types it: `judge-score ...`, `python -m ...`."""
        typed = "python" if args[0] == sys.executable else Path(args[0]).name
        shown.write(f"\n== {title}\n$ {shlex.join([typed, *args[1:]])}\n".encode())
        shown.flush()
        log = self.log_dir / f"{title.split(':')[0].strip().replace(' ', '_')}.log"
        start = time.perf_counter()
        with self._lock:
            if self._failed is not None:  # the other part failed while this one ran its last step
                raise SystemExit(self._failed)
            command = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self._running.add(command)
        with log.open("wb") as kept, command:
            # Bytes as they come: what a step writes shows at once. Its output is a pipe, not a terminal, so its
            # progress bars write a whole line every few seconds (infer/progress.py), in the terminal and the log alike.
            while chunk := command.stdout.read1(65536):
                shown.write(chunk)
                shown.flush()
                kept.write(chunk)
        seconds = time.perf_counter() - start
        with self._lock:
            self._running.discard(command)
            stopped = command.returncode != 0 and self._failed is not None  # by the other part's failure
            if command.returncode != 0 and not stopped:
                self._failed = command.returncode
                self.stop()
        verdict = "ok" if command.returncode == 0 else "stopped: a step beside it failed" if stopped else "FAILED"
        shown.write(f"   {verdict} in {seconds:.0f}s (log: {log})\n".encode())
        shown.flush()
        if command.returncode != 0:
            raise SystemExit(self._failed)
        self.seconds[title] = round(seconds, 1)

    def stop(self) -> None:
        """Stop every command still running (the other part's, when one step failed or the demo was interrupted)."""
        for command in self._running:
            command.terminate()

    def side_by_side(self, shown_part: Callable[[BinaryIO], None], kept_part: Callable[[BinaryIO], None]) -> dict[str, float]:
        """Run the two parts at once: `shown_part`'s output as it comes, `kept_part`'s after it; each part's seconds."""
        kept, seconds = io.BytesIO(), {}

        def timed(part: Callable[[BinaryIO], None], shown: BinaryIO) -> None:
            start = time.perf_counter()
            part(shown)
            seconds[part.__name__] = round(time.perf_counter() - start, 1)

        with ThreadPoolExecutor(1) as pool:
            beside = pool.submit(timed, kept_part, kept)
            try:
                timed(shown_part, sys.stdout.buffer)
            except BaseException:  # a failed step, or Ctrl-C: the other part stops too
                with self._lock:
                    self._failed = 1 if self._failed is None else self._failed
                    self.stop()
                raise
            finally:
                wait([beside])
                sys.stdout.buffer.write(kept.getvalue())
                sys.stdout.buffer.flush()
            beside.result()
        return seconds


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
    if problems := setting_problems(DemoSettings, asdict(settings)):  # inf and NaN: found before step 1, not in the middle
        raise UsageError("; ".join(problems))
    sizes = split_sizes(settings)
    split_sizes(settings, settings.pairs)  # refused here, before any step
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
    max_steps = [] if settings.max_steps is None else ["--max_steps", str(settings.max_steps)]
    batches = ["--per_device_batch_size", str(settings.batch_size)]
    start, steps, live = time.perf_counter(), Steps(logs), sys.stdout.buffer

    # InternVL2-4B's own layout, with a short system message; any other family in its released layout, as released
    judge = (["--format", "original", "--system_message", settings.system_message] if settings.family == "internvl2-4b"
             else ["--family", settings.family])
    steps.run("1a: write a tiny judge", [py, "-m", "mmjudge.judge.testing", "checkpoint", *judge, "--seed", seed, str(out / "base-judge")], live)
    steps.run("1b: write a dataset", [py, "-m", "mmjudge.judge.testing", "dataset", "--samples", str(settings.samples), "--annotated", "--seed", seed,
                                      str(out / "data")], live)
    files = split(out / "data", sizes, settings.seed)
    # What the trained judge scores: the test ids, whose human scores judge-calibrate reads, and the
    # validation ids, which stand for the bulk of a benchmark that no person scores.
    files["judged"] = out / "data" / "judged.json"
    files["judged"].write_text(json.dumps(json.loads(files["test"].read_text()) + json.loads(files["validation"].read_text()), indent=1))
    pair_sizes = split_sizes(settings, settings.pairs)

    def samples(shown: BinaryIO) -> None:
        """Steps 2-5: the samples, before and after training."""
        steps.run("2: score before training", [script("judge-score"), "--model_path", str(out / "base-judge"), "--input_dir", str(out / "data"),
                                               "--input_file", "test.json", "--output_dir", str(out / "scores-before"), *score], shown)
        shown.write(b"   (as expected: an untrained judge writes no score; its expected score, read after a forced '### Score', is what is compared)\n")
        shutil.rmtree(out / "trained-judge", ignore_errors=True)  # judge-train starts only in an empty directory: a rerun replaces the judge
        steps.run("3: train", [script("judge-train"), "--model_path", str(out / "base-judge"), "--train_file", str(files["train"]),
                               "--eval_file", str(files["validation"]), "--input_dir", str(out / "data"), "--output_dir", str(out / "trained-judge"),
                               "--config", "tiny", *max_steps, "--save_steps", str(settings.save_steps), *batches,
                               "--learning_rate", str(settings.learning_rate), *rubric], shown)
        steps.run("4: score after training", [script("judge-score"), "--model_path", str(out / "trained-judge"), "--input_dir", str(out / "data"),
                                              "--input_file", "judged.json", "--output_dir", str(out / "scores-after"), "--probe_images", "blank", *score],
                  shown)
        # calibrator.json is the trained judge's map: the one a user goes on to apply (judge-score --calibrator), to that judge
        steps.run("5: calibrate", [script("judge-calibrate"), "--predictions", str(out / "scores-before" / "eval_result.json"),
                                   str(out / "scores-after" / "eval_result.json"), "--names", "before", "after", "--calibrator_of", "after",
                                   "--human", str(files["test"]), "--overall", "expected_score", "--output_dir", str(out / "report")], shown)

    def pairs(shown: BinaryIO) -> None:
        """Steps 6-7: the pairs, by a generative judge before and after training and by a reward model."""
        # People's preferences alone: with a rationale naming both markers to write first, the tiny judge learnt no
        # verdict at all (docs/pairwise.md, "The demo's pairwise part").
        steps.run("6a: write pairs", [py, "-m", "mmjudge.judge.testing", "pairs", "--pairs", str(settings.pairs), "--annotated", "--text_only",
                                      "--no_rationale", "--seed", seed, str(out / "pairs")], shown)
        pair_files = split(out / "pairs", pair_sizes, settings.seed, "pairs.json")
        # Both judges are read by their verdict distributions (the untrained judge writes no verdict), in both orders.
        judge_pairs = ["--input_dir", str(out / "pairs"), "--input_file", "test.json", "--pair_rule", "mean_probability", *score]
        steps.run("6b: judge pairs before training", [script("judge-score"), "--model_path", str(out / "base-judge"),
                                                      "--output_dir", str(out / "pairs-before"), *judge_pairs], shown)
        shutil.rmtree(out / "pairwise-judge", ignore_errors=True)
        steps.run("6c: train on pairs", [script("judge-train"), "--model_path", str(out / "base-judge"), "--train_file", str(pair_files["train"]),
                                         "--eval_file", str(pair_files["validation"]), "--input_dir", str(out / "pairs"), "--output_dir", str(out / "pairwise-judge"),
                                         "--config", "tiny", "--max_steps", str(settings.pair_steps), "--save_steps", str(settings.pair_save_steps),
                                         *batches, "--learning_rate", str(settings.pair_learning_rate), *rubric], shown)
        steps.run("6d: judge pairs after training", [script("judge-score"), "--model_path", str(out / "pairwise-judge"),
                                                     "--output_dir", str(out / "pairs-after"), *judge_pairs], shown)
        # A reward model of the same pairs: one number per answer from one prefill, each answer shown alone under the
        # bundled pointwise rubric of the pairs' category (tiny-reward); pairs are judged by the rewards' difference.
        reward = ["--rubric", "tiny-reward"]
        shutil.rmtree(out / "reward-model", ignore_errors=True)
        steps.run("7a: train a reward model", [script("judge-train"), "--model_path", str(out / "base-judge"), "--train_file", str(pair_files["train"]),
                                               "--eval_file", str(pair_files["validation"]), "--input_dir", str(out / "pairs"), "--output_dir", str(out / "reward-model"),
                                               "--config", "tiny", "--objective", "bradley_terry", "--num_epochs", str(settings.reward_epochs), *batches,
                                               *reward], shown)
        steps.run("7b: judge pairs by reward", [script("judge-score"), "--model_path", str(out / "reward-model"), "--input_dir", str(out / "pairs"),
                                                "--input_file", "test.json", "--output_dir", str(out / "pairs-reward"), "--no_resume", *reward], shown)
        steps.run("7c: calibrate the verdicts", [script("judge-calibrate"), "--predictions",
                                                 *(str(out / name / "eval_result.json") for name in PAIR_JUDGES.values()),
                                                 "--names", *PAIR_JUDGES, "--human", str(pair_files["test"]), "--output_dir", str(out / "pairs-report")], shown)

    print("\n== Steps 2-5 (the samples) and 6-7 (the pairs) share only the base judge and run side by side; "
          "the output of 6-7 follows that of 2-5 (their logs: logs/6a.log ...)", flush=True)
    parts = steps.side_by_side(samples, pairs)

    report = json.loads((out / "report" / "report.json").read_text())
    total = time.perf_counter() - start
    print_headline(report, total, sizes)
    print_trust(report["judges"]["after"], json.loads((out / "scores-after" / "summary.json").read_text())["image_reliance"], sizes)
    pairs_report = json.loads((out / "pairs-report" / "report.json").read_text())
    print_pairs(pairs_report, pair_sizes)
    # the titles ("1a: ...", "2: ...", "6a: ...") sort in the steps' order, whichever part ended first
    seconds = {"total": round(total, 1), "steps": dict(sorted(steps.seconds.items())), "side_by_side": parts}
    write_json_atomically(out / FIGURES, figures(report, settings, sizes, seconds, out, pairs_report, pair_sizes))
    print(f"\nTrained judge: {out / 'trained-judge'}\nScores: {out / 'scores-before'}, {out / 'scores-after'} "
          f"(image reliance: {out / 'scores-after' / 'probe_blank.png'})\nReport: {out / 'report' / 'report.html'}\n"
          f"Pairwise judge: {out / 'pairwise-judge'}\nReward model: {out / 'reward-model'}\n"
          f"Verdicts: {', '.join(str(out / folder) for folder in PAIR_JUDGES.values())}\n"
          f"Pairwise report: {out / 'pairs-report' / 'report.html'}\nFigures (for the docs): {out / FIGURES}")
    return 0


def print_pairs(report: dict, sizes: dict[str, int]) -> None:
    """The pairwise part's figures: agreement with people's verdicts and position bias, before and after
    training, and the reward model's."""
    print(f"\nPairwise: the verdicts on the {sizes['test']} test pairs against people's (trained on {sizes['train']}); the generative judges "
          "judged both orders (the likeliest of their verdict distributions), the reward model each answer once:")
    for name in PAIR_JUDGES:
        judge = report["judges"][name]
        value = lambda stat: "undefined" if stat["value"] is None else f"{stat['value']:.3f}"  # noqa: E731
        print(f"  {name:>6}: accuracy {value(judge['accuracy_with_ties'])} with ties (n = {judge['n_with_ties']}), "
              f"{value(judge['accuracy_without_ties'])} without (n = {judge['n_without_ties']}){_first_shown(judge)}")


def _first_shown(judge: dict) -> str:
    """How often the answer shown first wins; nothing for a judge that saw no pair in both orders (the reward model)."""
    bias = judge["position_bias"]["both"]
    if bias["n"] == 0:
        return ""
    share = "undefined" if bias["share"] is None else f"{bias['share']:.3f} of {bias['n']}"
    return f"; first shown wins {share}"


def figures(report: dict, settings: DemoSettings, sizes: dict[str, int], seconds: dict, out: Path,
            pairs_report: dict, pair_sizes: dict[str, int]) -> dict:
    """What a reader of the docs is told of this run, in one file, so that the docs quote a run rather than
    copies typed by hand: the Pearsons before and after training, its times, and where and from what it ran."""
    pearson = {}
    for name in ("before", "after"):
        table = report["judges"][name]["criteria"]["overall"]["all"]
        r, interval = table["pearson"], table["pearson"].get("fisher_95") or {}
        pearson[name] = {"value": r["value"], "fisher_95": [interval.get("low"), interval.get("high")], "n": table["n"]["value"],
                         "reason": r.get("reason")}
    history = json.loads((out / "trained-judge" / "eval_history.json").read_text())
    measured = [h["overall"]["pearson"] for h in history if h["overall"].get("pearson") is not None]
    return {
        "source": source(),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(), "torch": _version("torch"),
                    "transformers": _version("transformers")},
        "settings": asdict(settings),
        "splits": sizes,
        "pearson": pearson,  # of the expected score with the human overall score, on the test split
        "validation_pearson_best": max(measured) if measured else None,  # judge-train's checkpoint choice
        "training_steps": history[-1]["step"] if history else None,
        "seconds": seconds,  # the whole demo's, each step's, and each of the two parts run side by side
        "report": {"html": "report/report.html", "plots": sorted(f"report/plots/{p.name}" for p in (out / "report" / "plots").glob("*.png"))},
        # the pairwise part: agreement with people's verdicts on the test pairs, and how often the answer shown first wins
        "pairs": {"splits": pair_sizes, **{name: {"accuracy_with_ties": j["accuracy_with_ties"]["value"], "accuracy_without_ties": j["accuracy_without_ties"]["value"],
                                                  "first_shown_wins": j["position_bias"]["both"]["share"]}
                                           for name, j in pairs_report["judges"].items()}},
    }


def source() -> dict:
    """The package's version, and the commit of the checkout it runs from (None when installed from a wheel)."""
    here = Path(__file__).resolve()
    git = lambda *args: subprocess.run(["git", "-C", str(here.parent), *args], capture_output=True, text=True)  # noqa: E731
    top = git("rev-parse", "--show-toplevel")
    commit = None
    if top.returncode == 0 and (Path(top.stdout.strip()) / "demo" / "cli.py").resolve() == here:  # this checkout, not a repository around a venv
        commit = git("rev-parse", "HEAD").stdout.strip() + ("-dirty" if git("status", "--porcelain", "--untracked-files=no").stdout.strip() else "")
    return {"version": _version("mmjudge"), "commit": commit}


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the system gives none): what else ran beside a timed demo."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")] if cpuinfo.exists() else []
    return names[0] if names else platform.processor() or platform.machine()


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


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
