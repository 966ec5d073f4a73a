"""judge-train on Qwen3.5 (Gated DeltaNet layers between gated attention; tiny, in its released layout), beside what
tests/test_backbone_commands.py runs on it (LoRA merged back and scored, a full fine-tune): a Bradley-Terry reward
head, whose export transformers' own Qwen3_5ForSequenceClassification reads; GRPO, whose completions transformers'
generate samples; ZeRO-3 on two CPU processes; the mixture of experts with LoRA, merged back expert by expert. Each
a step or two: that the family trains, saves and loads as the others do, not that it learns (the demo shows that)."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.model import load_judge
from mmjudge.judge.testing import HANG_S, write_pairs
from mmjudge.judge.testing.families import write_family_checkpoint
from mmjudge.train.cli import main as train_main
from mmjudge.train.data import Collator
from tests.train.test_bradley_terry import REWARD_RUBRIC
from tests.train.test_grpo import RUBRIC as GRPO_RUBRIC

pytestmark = pytest.mark.slow
TINY_RUBRIC = str(CONFIG_DIR / "rubrics" / "tiny")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write_family_checkpoint("qwen3.5-4b", tmp_path_factory.mktemp("qwen35") / "base")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    write_pairs(root, 8, seed=1, annotated=True, text_only=True, rationale=False)
    (root / "reward.yaml").write_text(REWARD_RUBRIC)
    (root / "grpo.yaml").write_text(GRPO_RUBRIC)
    return root


def sft_args(base, data, out, *extra):
    return ["--model_path", str(base), "--train_file", str(data / "train.json"), "--input_dir", str(data), "--output_dir", str(out),
            "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", TINY_RUBRIC, "--dataloader_workers", "0", "--logging_steps", "1",
            "--max_steps", "2", "--save_steps", "2", "--per_device_batch_size", "2", "--learning_rate", "1e-2", *extra]


def logits_of(judge, rows) -> torch.Tensor:
    batch = Collator(judge.pad_id, judge.backbone, judge.settings.images)(rows)
    with torch.no_grad():
        return judge.model(**{name: value for name, value in batch.items() if name != "labels"}).logits


def test_a_bradley_terry_head_trains_and_transformers_own_classifier_reads_its_export(base, pairs, tmp_path):
    from transformers import Qwen3_5ForSequenceClassification

    from mmjudge.judge.data import load_pairs
    from mmjudge.judge.prompts import load_rubrics
    from mmjudge.judge.reward_model import load_reward_model, rewards
    from mmjudge.train.bradley_terry import PairCollator, build_pair_dataset

    out = tmp_path / "reward"
    assert train_main(["--model_path", str(base), "--train_file", str(pairs / "pairs.json"), "--input_dir", str(pairs), "--output_dir", str(out),
                       "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", str(pairs / "reward.yaml"), "--objective", "bradley_terry",
                       "--dataloader_workers", "0", "--max_steps", "2", "--save_steps", "2", "--learning_rate", "1e-2"]) == 0
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3_5ForSequenceClassification"]
    judge = load_judge(out)
    dataset = build_pair_dataset(judge, load_pairs(pairs / "pairs.json", pairs, preferred=True), load_rubrics([pairs / "reward.yaml"]), pairs,
                                 8192, None, "pairs.json")
    batch = PairCollator(Collator(judge.pad_id, judge.backbone, judge.settings.images))([dataset[i] for i in range(len(dataset))])
    with torch.no_grad():
        ours = rewards(load_reward_model(out, torch.float32).eval(), batch)
        theirs = rewards(Qwen3_5ForSequenceClassification.from_pretrained(out, dtype=torch.float32).eval(), batch)
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
    assert ours.std() > 0


def test_grpo_samples_with_transformers_generate_and_saves_the_judge(base, pairs, tmp_path):
    out = tmp_path / "grpo"
    assert train_main(["--model_path", str(base), "--train_file", str(pairs / "pairs.json"), "--input_dir", str(pairs), "--output_dir", str(out),
                       "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", str(pairs / "grpo.yaml"), "--objective", "grpo",
                       "--num_generations", "2", "--per_device_batch_size", "4", "--max_completion_length", "8", "--learning_rate", "1e-2",
                       "--max_steps", "1", "--save_steps", "1", "--logging_steps", "1", "--warmup_ratio", "0"]) == 0
    # The tiny random judge's 16 completions rarely hold an A or a B: the rewards, and so the advantages, may all be 0.
    assert [h["step"] for h in json.loads((out / "reward_history.json").read_text())] == [1]
    logged = json.loads((out / "checkpoints" / "checkpoint-1" / "trainer_state.json").read_text())["log_history"][0]
    assert logged["completions/mean_length"] > 0 and logged["entropy"] > 0  # transformers' generate sampled the completions
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert type(load_judge(out).model).__name__ == "Qwen3_5ForConditionalGeneration"


def test_zero3_on_two_cpu_processes(base, annotated, tmp_path):
    """Every weight partitioned (the persistence threshold at 0) and gathered as each module runs, the Gated
    DeltaNet layers' A_log and dt_bias among them."""
    config = json.loads((CONFIG_DIR / "deepspeed" / "zero3.json").read_text())
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    (tmp_path / "ds.json").write_text(json.dumps(config))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "mmjudge.train.cli",
               *sft_args(base, annotated, tmp_path / "judge", "--no-full_finetune", "--per_device_batch_size", "1", "--max_steps", "1",
                         "--save_steps", "1", "--deepspeed", str(tmp_path / "ds.json"))]
    run = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=HANG_S)
    assert run.returncode == 0, run.stderr[-3000:]
    with safe_open(tmp_path / "judge" / "adapter_model.safetensors", "pt") as f:
        assert any(".linear_attn." in key for key in f.keys()) and all(f.get_tensor(k).numel() > 0 for k in f.keys())


def test_the_mixture_of_experts_layout_trains_and_merges_back_expert_by_expert(annotated, tmp_path):
    """Qwen3.5's MoE (the same adapter): transformers holds the routed experts fused and the files hold them one by one;
    LoRA trains its linear layers (the shared expert and the router among them), and the merge writes the released
    per-expert layout back, which loads to the adapter's logits."""
    from mmjudge.judge.data import load_annotations
    from mmjudge.judge.prompts import load_rubrics
    from mmjudge.train.data import build_dataset

    moe = write_family_checkpoint("qwen3.5-35b-a3b", tmp_path / "base")
    assert train_main(sft_args(moe, annotated, tmp_path / "lora", "--no-full_finetune", "--max_steps", "1", "--save_steps", "1",
                                 "--warmup_ratio", "0")) == 0
    assert train_main(["merge", "--adapter", str(tmp_path / "lora"), "--output_dir", str(tmp_path / "merged"), "--format", "native"]) == 0
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    assert "model.language_model.layers.0.mlp.experts.3.down_proj.weight" in merged and not any(".experts.gate_up_proj" in k for k in merged)
    before = load_file(moe / "model.safetensors")
    assert not torch.equal(merged["model.language_model.layers.0.mlp.shared_expert.up_proj.weight"],
                           before["model.language_model.layers.0.mlp.shared_expert.up_proj.weight"])
    adapter, judge = load_judge(tmp_path / "lora"), load_judge(tmp_path / "merged")
    rows = list(build_dataset(judge, load_annotations(annotated / "train.json", annotated)[:2], load_rubrics([TINY_RUBRIC]), annotated,
                              8192, None, "train.json"))
    torch.testing.assert_close(logits_of(judge, rows), logits_of(adapter, rows), rtol=0, atol=0)
