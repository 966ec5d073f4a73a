"""judge-score with a reward model (judge-train --objective bradley_terry): each answer's reward is the one the
model gave it in training, a pair's verdict is the reward difference against the tie margin, and a pairwise
rubric, which a reward model cannot follow, is refused naming its category; judge-calibrate takes its records; a sample's record carries its reward."""

import json

import pytest
import torch

from mmjudge.calibration.cli import main as calibrate_main
from mmjudge.infer.cli import main as score_main
from mmjudge.judge.data import load_pairs
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.reward_model import rewards
from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.testing import write_dataset, write_pairs
from mmjudge.judge.testing.families import write_reward_checkpoint
from mmjudge.train.bradley_terry import PairCollator, build_pair_dataset
from mmjudge.train.data import Collator

RUBRIC = "category: general\ninstructions: Rate the answer.\ntemplate: \"{instructions}\\n### Question\\n{question}\\n### Answer\\n{answer}\\n\"\n"


@pytest.mark.slow
def test_judge_score_gives_each_answer_its_training_reward_and_the_pair_its_difference(tmp_path, capsys):
    reward_dir = write_reward_checkpoint(tmp_path, seed=0)  # over the tiny Qwen2.5-VL: its 3-D positions and pixels on both paths
    root = tmp_path / "data"
    write_pairs(root, 3, seed=0, annotated=True)
    (root / "general.yaml").write_text(RUBRIC)
    reloaded = load_judge(reward_dir)  # load_judge reads a reward model as judge-score does
    pairs = load_pairs(root / "pairs.json", root, preferred=True)
    rubrics = load_rubrics([root / "general.yaml"])
    dataset = build_pair_dataset(reloaded, pairs, rubrics, root, 8192, None, "pairs.json")
    with torch.no_grad():
        chosen, rejected = rewards(reloaded.model, PairCollator(Collator(reloaded.pad_id, reloaded.backbone, reloaded.settings.images))(list(dataset))).chunk(2)
    trained = {}
    for row, c, r in zip(dataset, chosen.tolist(), rejected.tolist()):
        preferred = next(p.preference for p in pairs if p.id == row["id"])
        trained[row["id"]] = {preferred: c, {"A": "B", "B": "A"}[preferred]: r}

    args = ["--model_path", str(reward_dir), "--input_dir", str(root), "--input_file", "pairs.json", "--output_dir", str(tmp_path / "out"),
            "--rubric", str(root / "general.yaml"), "--tie_margin", "0.1"]
    assert score_main(args) == 0
    records = {r["id"]: r for r in json.loads((tmp_path / "out" / "eval_result.json").read_text())}
    assert trained and set(trained) <= set(records)
    for pair_id, by_side in trained.items():
        scored = {side: records[pair_id]["scores"][side]["reward"] for side in "AB"}
        assert scored == pytest.approx(by_side, abs=1e-5)
        gap = scored["A"] - scored["B"]
        assert records[pair_id]["verdict"] == ("A" if gap > 0.1 else "B" if gap < -0.1 else "tie")
        assert all(records[pair_id]["scores"][side]["generated_tokens"] == 0 for side in "AB")  # a prefill, nothing decoded

    # judge-calibrate takes the records as a pointwise judge's: each pair's verdict against people's
    assert calibrate_main(["--predictions", str(tmp_path / "out" / "eval_result.json"), "--human", str(root / "pairs.json"),
                           "--output_dir", str(tmp_path / "calibrated"), "--bootstrap", "10"]) == 0
    agreed = sum(records[p.id]["verdict"] == p.preference for p in {p.id: p for p in pairs}.values())
    assert f"accuracy {agreed / len(records):.3f} with ties (n {len(records)})" in capsys.readouterr().out

    # the pairs' default rubric is pairwise: refused before the weights load
    assert score_main(["--model_path", str(reward_dir), "--input_dir", str(root), "--input_file", "pairs.json",
                       "--output_dir", str(tmp_path / "pairwise")]) == 2
    assert "a reward model scores one answer at a time, under a pointwise rubric; the rubric of category general is pairwise" in capsys.readouterr().err

    # samples: each record carries its reward, the summary their mean; an unused pairwise rubric is no matter
    samples = tmp_path / "samples"
    write_dataset(samples, 3, seed=0)
    assert score_main(["--model_path", str(reward_dir), "--input_dir", str(samples), "--input_file", "data.json",
                       "--output_dir", str(tmp_path / "scored"), "--rubric", str(CONFIG_DIR / "rubrics" / "tiny")]) == 0
    scored = json.loads((tmp_path / "scored" / "eval_result.json").read_text())
    assert len(scored) == 3 and all(isinstance(r["reward"], float) and r["score"] is None and r["generated_tokens"] == 0 for r in scored)
    out = "".join(capsys.readouterr())
    assert f"Mean reward: {sum(r['reward'] for r in scored) / 3:.3f} (n=3" in out and "NONE of" not in out
