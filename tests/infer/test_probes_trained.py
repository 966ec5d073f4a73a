"""The bias suite's must-show (issue 55): two tiny judges trained by the demo's recipe, one on data whose human
scores follow the colour an answer's image shows, one on its twin whose scores follow the colour the answer's
text claims (judge/testing/synthetic.py, `dataset --rating image|text`). judge-score --probe blank shuffle and
judge-calibrate --probes must flag the text-only judge on both probes (its scores do not move when the images are
blanked or swapped) and pass the one that looks at the image.

Each judge is the real commands as a user types them, run side by side (a tiny judge's step keeps one core busy,
as in the demo): judge-train with the demo's batch size, learning rate, system message and the bundled preset
tiny, for fewer steps on fewer samples; judge-score as the demo scores (a generated review, the expected score).
Trained afresh on every run: nothing is cached across runs."""

import argparse
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mmjudge.calibration.cli import main as calibrate
from mmjudge.configs import CONFIG_DIR
from mmjudge.demo.cli import DemoSettings, script
from mmjudge.judge.cli import settings_from_config
from mmjudge.judge.testing import HANG_S, write_dataset

# 90 training samples, 90 steps of 8 (8 epochs), 30 test samples of another seed: both judges learnt their rule on
# seeds 0-2 (60 steps left the text-only judge at Pearson 0.60 on seed 0) and the suite told them apart with margin
# (docs/calibration.md, "Does the suite tell a judge that looks from one that reads?"). The same commands are that page's.
TRAIN, TEST, STEPS = 90, 30, 90


def train_and_probe(rating: str, base: Path, root: Path, demo: DemoSettings) -> Path:
    """Write the rating's training and test datasets (the test's of the next seed), train a judge on the first, score
    the second with --probe blank shuffle; the run's folder."""
    write_dataset(root / "train", TRAIN, seed=demo.seed, annotated=True, rating=rating)
    write_dataset(root / "test", TEST, seed=demo.seed + 1, annotated=True, rating=rating)
    commands = [
        [script("judge-train"), "--model_path", str(base), "--train_file", str(root / "train" / "data.json"), "--input_dir", str(root / "train"),
         "--output_dir", str(root / "judge"), "--config", "tiny", "--max_steps", str(STEPS), "--save_steps", str(STEPS),
         "--per_device_batch_size", str(demo.batch_size), "--learning_rate", str(demo.learning_rate), "--rubric", "tiny"],
        [script("judge-score"), "--model_path", str(root / "judge"), "--input_dir", str(root / "test"), "--input_file", "data.json",
         "--output_dir", str(root / "run"), "--max_new_tokens", "48", "--max_tiles", "1", "--no_resume", "--rubric", "tiny",
         "--probe", "blank", "shuffle"],
    ]
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, timeout=HANG_S)
        assert done.returncode == 0, f"{rating}: {Path(command[0]).name} failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return root / "run"


@pytest.mark.slow
def test_the_suite_flags_the_judge_that_reads_the_text_only_and_passes_the_one_that_looks(tmp_path):
    from mmjudge.judge.testing import write_original_checkpoint  # torch loads here, not when pytest starts

    demo = settings_from_config(DemoSettings, CONFIG_DIR / "demo.yaml", argparse.Namespace())
    base = write_original_checkpoint(tmp_path / "base", seed=demo.seed, system_message=demo.system_message)
    with ThreadPoolExecutor(2) as pool:
        runs = dict(zip(("image", "text"), pool.map(lambda rating: train_and_probe(rating, base, tmp_path / rating, demo), ("image", "text"))))
    reports = {}
    for rating, run in runs.items():
        assert calibrate(["--predictions", str(run / "eval_result.json"), "--human", str(tmp_path / rating / "test" / "data.json"),
                          "--overall", "expected_score", "--output_dir", str(tmp_path / rating / "report"), "--bootstrap", "200",
                          "--probes", str(run / "probe_blank.json"), str(run / "probe_shuffle.json")]) == 0
        reports[rating] = json.loads((tmp_path / rating / "report" / "report.json").read_text())
    for rating, report in reports.items():  # each learnt its rule: the suite's verdict is about judges that work
        pearson = report["judges"]["eval_result"]["criteria"]["overall"]["all"]["pearson"]["value"]
        assert pearson > 0.9, f"the {rating} judge did not learn its rule (Pearson {pearson})"
    looks, reads = reports["image"]["probes"], reports["text"]["probes"]
    for kind in ("blank", "shuffle"):
        assert looks[kind]["n"] == reads[kind]["n"] == TEST
        assert looks[kind]["passed"] is True, f"{kind}: the judge that looks at the image was flagged: {looks[kind]}"
        assert reads[kind]["passed"] is False, f"{kind}: the judge that reads the text only passed: {reads[kind]}"
        # with margin: the one that looks moves on well over the threshold, the other on well under it
        assert looks[kind]["share_changed"]["value"] >= 2 * looks[kind]["threshold"]
        assert reads[kind]["share_changed"]["value"] <= reads[kind]["threshold"] / 2
