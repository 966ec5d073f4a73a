"""DeepSpeed ZeRO-2 for real: two CPU processes under torchrun (gloo), LoRA on the tiny judge, with the
shipped config; the saved adapter must load and score in judge-score.

ZeRO-3 is not tested here because it does not work yet: when one rank's batch has no image it skips the
vision tower, and ZeRO-3's collective weight gathering falls out of step between ranks (see README)."""

import json
import os
import subprocess
import sys

import pytest

from infer.cli import main as score_main
from judge.model import load_judge
from judge.prompts import CONFIG_DIR
from judge.testing import write_dataset, write_original_checkpoint

@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    base = write_original_checkpoint(root / "base", seed=0)
    records = json.loads(write_dataset(root / "data", 8, seed=4, annotated=True).read_text())
    (root / "data" / "train.json").write_text(json.dumps(records))
    return base, root / "data"


def test_zero2_trains_on_two_cpu_processes_and_the_adapter_scores(setup, tmp_path):
    stage = "zero2"
    base, data = setup
    out = tmp_path / "judge"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29607",
           "-m", "train.cli", "--model_path", str(base), "--train_file", str(data / "train.json"), "--input_dir", str(data),
           "--output_dir", str(out), "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", str(CONFIG_DIR / "rubrics" / "tiny"),
           "--no-full_finetune", "--max_steps", "2", "--per_device_batch_size", "1", "--save_steps", "2", "--dataloader_workers", "0",
           "--deepspeed", str(CONFIG_DIR / "deepspeed" / f"{stage}.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    judge = load_judge(out)
    assert judge.source_format == "adapter"
    assert score_main(["--model_path", str(out), "--input_dir", str(data), "--input_file", "train.json", "--output_dir", str(tmp_path / "s"),
                       "--max_new_tokens", "2", "--limit", "2", "--rubric", str(CONFIG_DIR / "rubrics" / "tiny")]) == 0
