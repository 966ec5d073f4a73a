"""judge-demo: the whole toolkit end to end on a tiny random judge, in a few minutes on a CPU.

    1. write a tiny InternVL2-style judge and a synthetic annotated MMIE-style dataset (real images)
    2. judge-score the held-out split with the untrained judge
    3. judge-train the judge on the training split
    4. judge-score the held-out split with the trained judge
    5. judge-calibrate both against the human scores

Each step runs the real command a user would type, as a subprocess (this module imports none of the
command packages), and the demo stops with that command's exit code if one fails.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from judge.cli import add_common_flags, run
from judge.prompts import CONFIG_DIR


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


def split(data_dir: Path, heldout_share: float) -> tuple[Path, Path]:
    """Train and held-out files, split by id so that no sample's annotators straddle the two."""
    records = json.loads((data_dir / "data.json").read_text())
    ids = sorted({r["id"] for r in records})
    heldout = set(ids[:: round(1 / heldout_share)])
    train, test = data_dir / "train.json", data_dir / "heldout.json"
    train.write_text(json.dumps([r for r in records if r["id"] not in heldout], indent=1))
    test.write_text(json.dumps([r for r in records if r["id"] in heldout], indent=1))
    return train, test


def main(argv=None) -> int:
    return run(_main, argv)


def _main(argv) -> int:
    p = argparse.ArgumentParser(prog="judge-demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", default="demo_outputs", help="where everything is written (default: demo_outputs)")
    p.add_argument("--samples", type=int, default=100, help="synthetic samples, a quarter held out (default: 100)")
    p.add_argument("--seed", type=int, default=0, help="seed of the judge and the dataset (default: 0)")
    add_common_flags(p)
    args = p.parse_args(argv)
    out = Path(args.output_dir).resolve()
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    rubric = ["--rubric", str(CONFIG_DIR / "rubrics" / "tiny")]
    score = ["--max_new_tokens", "48", "--max_tiles", "1", "--no_resume", *rubric]
    start = time.perf_counter()

    step("1a: write a tiny judge", [py, "-m", "judge.testing", "checkpoint", "--format", "original", "--seed", str(args.seed), str(out / "base-judge")], logs)
    step("1b: write a dataset", [py, "-m", "judge.testing", "dataset", "--samples", str(args.samples), "--annotated", "--seed", str(args.seed), str(out / "data")], logs)
    train_file, heldout_file = split(out / "data", 0.25)
    step("2: score before training", [py, "-m", "infer.cli", "--model_path", str(out / "base-judge"), "--input_dir", str(out / "data"),
                                       "--input_file", "heldout.json", "--output_dir", str(out / "scores-before"), *score], logs)
    step("3: train", [py, "-m", "train.cli", "--model_path", str(out / "base-judge"), "--train_file", str(train_file), "--eval_file", str(heldout_file),
                      "--input_dir", str(out / "data"), "--output_dir", str(out / "trained-judge"), "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), *rubric], logs)
    step("4: score after training", [py, "-m", "infer.cli", "--model_path", str(out / "trained-judge"), "--input_dir", str(out / "data"),
                                      "--input_file", "heldout.json", "--output_dir", str(out / "scores-after"), *score], logs)
    step("5: calibrate", [py, "-m", "calibration.cli", "--predictions", str(out / "scores-before" / "eval_result.json"),
                          str(out / "scores-after" / "eval_result.json"), "--names", "before", "after", "--human", str(heldout_file),
                          "--output_dir", str(out / "report")], logs)

    report = json.loads((out / "report" / "report.json").read_text())
    print(f"\nDone in {time.perf_counter() - start:.0f}s. Held-out agreement with the human scores (overall):")
    for name in ("before", "after"):
        entry = report["judges"][name]["criteria"].get("overall", {})
        r, n = entry.get("all", {}).get("pearson", {}), entry.get("all", {}).get("n", {}).get("value", 0)
        why = entry.get("undefined") or r.get("reason")
        value = "undefined" if r.get("value") is None else f"{r['value']:.3f}"
        print(f"  {name:>6}: Pearson {value}, n = {n:.0f}{f'  ({why})' if why else ''}")
    print(f"\nTrained judge: {out / 'trained-judge'}\nScores: {out / 'scores-before'}, {out / 'scores-after'}\nReport: {out / 'report' / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
