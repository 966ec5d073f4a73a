"""judge-train --objective bradley_terry: a reward head learnt from pairs (ties kept out, annotators merged),
refused before the model loads where it cannot learn, exported in transformers' sequence-classification
layout that AutoModelForSequenceClassification reads back to the same rewards, trained to separate the
synthetic pairs, and resumed to the run it resumes."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.data import load_pairs
from mmjudge.judge.model import Judge, load_judge, save_native
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.reward_model import load_reward_model, reward_classifier, rewards
from mmjudge.judge.testing import write_dataset, write_pairs
from mmjudge.judge.testing.families import write_family_checkpoint
from mmjudge.judge.testing.synthetic import marker_of
from mmjudge.train.bradley_terry import PairCollator, build_pair_dataset, pair_loss
from mmjudge.train.cli import main as train_main
from mmjudge.train.config import TrainConfig
from mmjudge.train.data import Collator
from mmjudge.train.recipe import apply_lora

# Each answer alone under a pointwise rubric of the pairs' category, as judge-score scores a pair with a pointwise judge.
REWARD_RUBRIC = "category: general\ninstructions: Rate the answer.\ntemplate: \"{instructions}\\n### Question\\n{question}\\n### Answer\\n{answer}\\n\"\n"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    records = json.loads(write_pairs(root, 24, seed=1, annotated=True, text_only=True, rationale=False).read_text())
    ids = sorted({r["id"] for r in records})
    # 10 held out: 5 of them decisive (the others ties), and 8 decisive pairs to train on
    (root / "train.json").write_text(json.dumps([r for r in records if r["id"] not in ids[:10]]))
    (root / "heldout.json").write_text(json.dumps([r for r in records if r["id"] in ids[:10]]))
    (root / "general.yaml").write_text(REWARD_RUBRIC)
    return root


def train_args(base, data, out, *extra):
    return ["--model_path", str(base), "--train_file", str(data / "train.json"), "--input_dir", str(data), "--output_dir", str(out),
            "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", str(data / "general.yaml"), "--objective", "bradley_terry",
            "--dataloader_workers", "0", "--logging_steps", "1", *extra]


def test_the_loss_is_bradley_terry_s_with_its_margin_and_centring():
    reward = torch.tensor([2.0, -1.0, 0.5, 1.0])  # chosen 2, -1; rejected 0.5, 1
    expected = -(math.log(1 / (1 + math.exp(-(1.5 - 0.25)))) + math.log(1 / (1 + math.exp(-(-2 - 0.25))))) / 2 + 0.1 * (2.5 ** 2 + 0 ** 2) / 2
    assert pair_loss(reward, margin=0.25, centering=0.1).item() == pytest.approx(expected, rel=1e-6)
    assert pair_loss(torch.tensor([3.0, 0.0]), 0.0, 0.0) < pair_loss(torch.tensor([0.0, 3.0]), 0.0, 0.0)  # the chosen one's reward must rise


def test_each_row_holds_the_preferred_answer_first_and_ties_teach_nothing(checkpoint, data):
    judge = load_judge(checkpoint)
    pairs = load_pairs(data / "train.json", data, preferred=True)
    dataset = build_pair_dataset(judge, pairs, load_rubrics([data / "general.yaml"]), data, 8192, None, "train.json")
    decisive = {p.id: p.preference for p in pairs if p.preference != "tie"}
    assert sorted(dataset["id"]) == sorted(decisive) and len(decisive) < len({p.id for p in pairs})  # one row a pair, ties out
    rank = {"poor": 0, "average": 1, "excellent": 2}
    for row in dataset:
        chosen, rejected = (judge.tokenizer.decode(row[f"{name}_input_ids"]) for name in ("chosen", "rejected"))
        assert rank[marker_of(chosen.split("### Answer")[1].split("\n")[1])] > rank[marker_of(rejected.split("### Answer")[1].split("\n")[1])]


def test_what_a_reward_head_cannot_learn_is_refused_before_the_model_loads(data, annotated, tmp_path, capsys):
    args = train_args(tmp_path / "no-model", data, tmp_path / "out")
    pairwise = [*args[:args.index("--rubric") + 1], str(CONFIG_DIR / "rubrics" / "tiny"), *args[args.index("--rubric") + 2:]]
    assert train_main(pairwise) == 2
    assert "the rubric of category general is of kind pairwise; judge-train learns a reward head (bradley_terry)" in capsys.readouterr().err
    samples = [*args[:3], str(annotated / "train.json"), *args[4:]]
    assert train_main(samples) == 2
    assert "objective bradley_terry learns from pairs with a preference" in capsys.readouterr().err
    ties = tmp_path / "ties.json"
    ties.write_text(json.dumps([r | {"preference": "tie"} for r in json.loads((data / "heldout.json").read_text())]))
    assert train_main([*args, "--eval_file", str(ties)]) == 2
    assert f"{ties}: no pair with a preference other than tie" in capsys.readouterr().err
    sft = [*args[:args.index("--objective")], *args[args.index("--objective") + 2:], "--reward_margin", "0.5"]
    assert train_main(sft) == 2
    assert "--reward_margin 0.5: a reward head's setting, but this run trains by sft" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        train_main([*args, "--reward_head", "deep"])
    assert exit.value.code == 2 and "--reward_head/--reward-head: invalid choice: 'deep'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("head", ["linear", "mlp"])
def test_the_export_is_read_back_by_transformers_auto_class_with_the_same_rewards(tmp_path, head):
    """A Qwen2.5-VL reward model trained with LoRA (its adapters moved off their zero start), merged and saved,
    scores image-bearing prompts as the model in training does, read by AutoModelForSequenceClassification and
    by mmjudge's own loader."""
    base = write_family_checkpoint("qwen2.5-vl-3b", tmp_path / "base")
    root = tmp_path / "data"
    write_pairs(root, 2, seed=0, annotated=True)
    pairs = load_pairs(root / "pairs.json", root, preferred=True)
    (root / "general.yaml").write_text(REWARD_RUBRIC)
    judge = load_judge(base)
    dataset = build_pair_dataset(judge, pairs, load_rubrics([root / "general.yaml"]), root, 8192, None, "pairs.json")
    batch = PairCollator(Collator(judge.pad_id, judge.backbone, judge.settings.images))([dataset[i] for i in range(len(dataset))])
    assert "pixel_values" in batch and batch["attention_mask"].sum(1).unique().numel() > 1  # images, and rows of several lengths
    model = reward_classifier(judge.model, judge.pad_id, head)
    judge.model = model
    model = apply_lora(judge, TrainConfig(lora_r=4, lora_targets=["q_proj", "v_proj"], seed=3))
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.normal_(std=0.05)
    model.eval()
    with torch.no_grad():
        trained = rewards(model, batch)
        save_native(Judge(model, judge.tokenizer, judge.settings, "training"), tmp_path / "out")
        config = json.loads((tmp_path / "out" / "config.json").read_text())
        assert config["architectures"] == ["Qwen2_5_VLForSequenceClassification"] and config["id2label"] == {"0": "LABEL_0"}
        assert {"score.weight"} <= set(load_file(tmp_path / "out" / "model.safetensors")) if head == "linear" else True
        assert not any(name.startswith("lm_head") for name in load_file(tmp_path / "out" / "model.safetensors"))
        for loaded in (AutoModelForSequenceClassification.from_pretrained(tmp_path / "out", dtype=torch.float32), load_reward_model(tmp_path / "out", torch.float32)):
            torch.testing.assert_close(rewards(loaded.eval(), batch), trained, rtol=0, atol=1e-5)
    assert trained.std() > 0  # the rewards differ from answer to answer: the comparison compares something


@pytest.mark.slow
def test_a_short_run_separates_the_held_out_pairs_and_saves_a_reward_model(checkpoint, data, tmp_path, capsys):
    out = tmp_path / "out"
    assert train_main([*train_args(checkpoint, data, out, "--eval_file", str(data / "heldout.json"), "--max_steps", "9", "--save_steps", "9",
                                   "--num_epochs", "100", "--learning_rate", "5e-3")]) == 0
    history = json.loads((out / "eval_history.json").read_text())
    assert [(h["step"], h["pairs"]) for h in history] == [(9, 5)] and history[-1]["accuracy_without_ties"] >= 0.9
    assert "best pairwise accuracy of the rewards, ties out" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["architectures"] == ["InternVLForSequenceClassification"]
    assert (out / "judge_config.json").is_file() and load_reward_model(out, torch.float32) is not None


# judge-train killed (SIGKILL: no handler runs, as when the OOM killer or a pre-empted node ends a run) as step N starts.
KILLED_AT = """import os, signal, sys
from mmjudge.train.cli import main
from mmjudge.train.recipe import JudgeTrainer
step = JudgeTrainer.training_step
def killed(self, *args, **kwargs):
    if self.state.global_step == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
    return step(self, *args, **kwargs)
JudgeTrainer.training_step = killed
sys.exit(main(sys.argv[2:]))
"""


def held_out_rewards(model_dir, data) -> torch.Tensor:
    """The saved reward model's rewards of the held-out pairs' answers."""
    judge = load_judge(model_dir)
    pairs = build_pair_dataset(judge, load_pairs(data / "heldout.json", data, preferred=True), load_rubrics([data / "general.yaml"]), data, 8192, None,
                               "heldout.json")
    with torch.no_grad():
        return rewards(judge.model, PairCollator(Collator(judge.pad_id, judge.backbone, judge.settings.images))(list(pairs)))


@pytest.mark.slow
def test_a_run_killed_and_resumed_ends_where_an_unkilled_run_ends(checkpoint, data, tmp_path, capsys):
    """Killed as step 5 of 8 starts (step 4's checkpoint saved), in the second epoch's first half: --resume trains the
    steps left on the same batches, with the same optimizer and schedule, to the same weights and rewards."""
    args = ["--max_steps", "8", "--save_steps", "4", "--per_device_batch_size", "3"]
    assert train_main(train_args(checkpoint, data, tmp_path / "whole", *args)) == 0
    # the finished run, resumed as it was, is refused: the Trainer ran step 9 of 8 and changed the saved judge
    saved = (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert train_main(train_args(checkpoint, data, tmp_path / "whole", *args, "--resume")) == 2
    assert (tmp_path / "whole" / "model.safetensors").read_bytes() == saved
    assert "--resume: the run is finished: checkpoint-8 is its last step (8 of 8" in capsys.readouterr().err
    threads = str(torch.get_num_threads())  # the killed run's sums in the same order as this process's
    killed = subprocess.run([sys.executable, "-c", KILLED_AT, "5", *train_args(checkpoint, data, tmp_path / "stopped", *args)],
                            env={**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (tmp_path / "stopped" / "checkpoints" / "checkpoint-4").is_dir() and not (tmp_path / "stopped" / "model.safetensors").exists()
    assert train_main(train_args(checkpoint, data, tmp_path / "stopped", *args, "--resume")) == 0
    whole, resumed = (load_file(tmp_path / d / "model.safetensors") for d in ("whole", "stopped"))
    assert whole.keys() == resumed.keys() and "score.weight" in whole
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=0, atol=1e-6)
    torch.testing.assert_close(held_out_rewards(tmp_path / "stopped", data), held_out_rewards(tmp_path / "whole", data), rtol=0, atol=1e-6)
    shutil.rmtree(tmp_path / "whole")
