"""DeepSpeed for real: two CPU processes under torchrun (gloo), LoRA on the tiny judge, with the shipped
ZeRO-2, ZeRO-3 and ZeRO-3-offload configs; the saved adapter must hold every trained weight whole, and
load and score in judge-score.

Every run covers one step in which one rank's batch has no image while the other's has (ZeRO-3 needs the
vision tower run on both). The ZeRO-3 runs partition every weight, and one of them also trains the
projector with gradient checkpointing on and evaluates (generation on every rank) at every step. The ZeRO-2
run, two epochs long, is resumed part-way through its second epoch, once with an object planted in its
checkpoint (refused, never run) and once as saved (the run it resumes, to the last bit)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file

from mmjudge.infer.cli import main as score_main
from mmjudge.judge.data import load_annotations
from mmjudge.judge.model import Judge, load_judge
from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.reward_model import load_reward_model, reward_classifier
from mmjudge.judge.testing import HANG_S, Planted, write_dataset, write_original_checkpoint, write_pairs
from mmjudge.train.data import merge_annotators
from mmjudge.train.config import TrainConfig
from mmjudge.train.recipe import apply_lora
from tests.train.test_bradley_terry import REWARD_RUBRIC

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    base = write_original_checkpoint(root / "base", seed=0)
    records = json.loads(write_dataset(root / "data", 8, seed=4, annotated=True).read_text())
    # Four training ids, PBL_0005 the only one without any image; the rest is held out.
    train_ids = {"SA_0001", "PBL_0002", "MSR_0003", "PBL_0005"}
    (root / "data" / "train.json").write_text(json.dumps([r for r in records if r["id"] in train_ids]))
    (root / "data" / "heldout.json").write_text(json.dumps([r for r in records if r["id"] not in train_ids]))
    return base, root / "data"


# --standalone: torchrun's rendezvous takes a free port and holds it, so that test runs side by side never collide
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def deepspeed_config(stage: str, tmp_path) -> str:
    """The shipped config, except that under ZeRO-3 every weight is partitioned: the tiny judge's weights
    are all below DeepSpeed's default persistence threshold (1e5 elements), under which ZeRO-3 keeps a
    weight whole on every rank, and the save would have nothing to gather."""
    shipped = CONFIG_DIR / "deepspeed" / f"{stage}.json"
    config = json.loads(shipped.read_text())
    if config["zero_optimization"]["stage"] != 3:
        return str(shipped)
    config["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    (tmp_path / "ds.json").write_text(json.dumps(config))
    return str(tmp_path / "ds.json")


# thorough: also train the projector, with gradient checkpointing, and evaluate at every step; resume: see below
@pytest.mark.parametrize("stage, thorough, resume", [("zero2", False, True), ("zero3", True, False), ("zero3_offload", False, False)])
def test_deepspeed_trains_on_two_cpu_processes_and_the_adapter_scores(setup, tmp_path, stage, thorough, resume):
    base, data = setup
    rated = merge_annotators(load_annotations(data / "train.json", data))
    assert len(rated) == 4 and [not r.annotation.images() for r in rated].count(True) == 1
    out = tmp_path / "judge"
    extra = ["--train_projector", "--gradient_checkpointing", "--eval_file", str(data / "heldout.json"), "--eval_max_new_tokens", "4"] if thorough else []
    # Seed 3 orders the two epochs so that their second steps train other samples: [2, 0 | 1, 3], then [2, 1 | 3, 0].
    extra += ["--seed", "3"] if resume else []
    args = ["-m", "mmjudge.train.cli", "--model_path", str(base), "--train_file", str(data / "train.json"), "--input_dir", str(data),
            "--output_dir", str(out), "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", str(CONFIG_DIR / "rubrics" / "tiny"),
            "--no-full_finetune", "--max_steps", "4" if resume else "2", "--per_device_batch_size", "1", "--save_steps", "1", "--warmup_ratio", "0",
            "--dataloader_workers", "0", "--deepspeed", deepspeed_config(stage, tmp_path), *extra]
    done = subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, timeout=HANG_S, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())
    # Two steps of one sample on each of two ranks is exactly one epoch of the four: the image-less sample
    # was in a step where the other rank's sample had images.
    assert state["global_step"] == 2 and state["epoch"] == 1.0
    if thorough:
        assert [h["step"] for h in json.loads((out / "eval_history.json").read_text())] == [1, 2]
    assert_trained_adapter(out, base)
    judge = load_judge(out)
    assert judge.source_format == "adapter"
    assert score_main(["--model_path", str(out), "--input_dir", str(data), "--input_file", "heldout.json", "--output_dir", str(tmp_path / "s"),
                       "--max_new_tokens", "2", "--limit", "2", "--rubric", str(CONFIG_DIR / "rubrics" / "tiny")]) == 0
    if resume:
        resume_refuses_a_planted_object_and_resumes_the_real_checkpoint(out, args, tmp_path)


def resume_refuses_a_planted_object_and_resumes_the_real_checkpoint(out, args, tmp_path):
    """An object planted in DeepSpeed's model states (which DeepSpeed unpickles with any global) ran code on
    --resume, and the run exited 0: it is refused, with the file and the reason, before any model loads.
    The same checkpoint, clean, resumes under the process-wide weights-only loading: DeepSpeed's own types
    (its loss scaler, ZeRO stage, fragment addresses) are allowed, nothing else. Resumed from checkpoint-3,
    half-way through the second epoch, it is the run it resumes: before, that epoch's rest came in another
    order, from every rank."""
    stopped = tmp_path / "stopped"
    shutil.copytree(out / "checkpoints" / "checkpoint-3", stopped / "checkpoints" / "checkpoint-3")
    states = stopped / "checkpoints" / "checkpoint-3" / "global_step3" / "mp_rank_00_model_states.pt"
    clean = states.read_bytes()
    with torch.serialization.safe_globals([]):
        state = torch.load(states, weights_only=True)
    torch.save({**state, "planted": Planted(tmp_path / "ran")}, states)
    resumed = [*TORCHRUN, *args[:args.index("--output_dir") + 1], str(stopped), *args[args.index("--output_dir") + 2:], "--resume"]
    done = subprocess.run(resumed, capture_output=True, text=True, timeout=HANG_S, env=ENV)
    assert done.returncode != 0 and not (tmp_path / "ran").exists()
    refused = (f"error: --resume: {states}: holds pickled io.open, which no checkpoint of judge-train holds; "
               "refused, since unpickling it could run any code (was it planted?)")
    # torchrun ends the other rank once one exits, maybe before it printed: how many ranks print depends on
    # process timing, so only what every rank that printed printed, and the exit code torchrun saw, is asserted.
    printed = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert printed and set(printed) == {refused}, done.stderr[-3000:]
    assert re.search(r"exitcode\s*: 2 \(pid", done.stderr), done.stderr[-3000:]
    states.write_bytes(clean)
    done = subprocess.run(resumed, capture_output=True, text=True, timeout=HANG_S, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((stopped / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and state["epoch"] == 2.0 and not (tmp_path / "ran").exists()
    whole, resumed_weights = (load_file(d / "adapter_model.safetensors") for d in (out, stopped))
    assert whole.keys() == resumed_weights.keys()
    for name in whole:
        torch.testing.assert_close(resumed_weights[name], whole[name], rtol=0, atol=0)


def assert_trained_adapter(out, base):
    """The adapter holds each trainable weight at its full shape (not a rank's partition) and trained."""
    cfg = TrainConfig(**json.loads((out / "train_config.json").read_text()))
    untrained = get_peft_model_state_dict(apply_lora(load_judge(base), cfg))
    saved = load_file(out / "adapter_model.safetensors")
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in untrained.items()}
    lora_b = [k for k in saved if "lora_B" in k]
    assert lora_b and all(saved[k].abs().sum() > 0 for k in lora_b)  # LoRA B starts at zero
    projector = [k for k in saved if "multi_modal_projector" in k]
    assert bool(projector) == cfg.train_projector
    assert all(not torch.equal(saved[k], untrained[k]) for k in projector)


def test_a_reward_head_trained_under_zero3_is_exported_whole_from_its_best_checkpoint(tmp_path):
    """judge-train --objective bradley_terry under ZeRO-3, every weight partitioned: its export, written by rank 0,
    held rank 0's partitions (empty tensors), which no loader takes, and the best checkpoint's adapter, loaded
    into those partitions, failed the run after training. Both are done on whole weights now: the export is the
    best checkpoint's adapter merged into the base, with its head."""
    base = write_original_checkpoint(tmp_path / "base", seed=0)
    records = json.loads(write_pairs(tmp_path / "data", 12, seed=1, annotated=True, text_only=True, rationale=False).read_text())
    ids = sorted({r["id"] for r in records})
    for name, kept in (("train.json", lambda i: i not in ids[:4]), ("heldout.json", lambda i: i in ids[:4])):
        (tmp_path / "data" / name).write_text(json.dumps([r for r in records if kept(r["id"])]))
    (tmp_path / "data" / "general.yaml").write_text(REWARD_RUBRIC)
    out = tmp_path / "reward"
    args = ["-m", "mmjudge.train.cli", "--model_path", str(base), "--train_file", str(tmp_path / "data" / "train.json"), "--input_dir",
            str(tmp_path / "data"), "--output_dir", str(out), "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric",
            str(tmp_path / "data" / "general.yaml"), "--objective", "bradley_terry", "--no-full_finetune", "--max_steps", "2",
            "--per_device_batch_size", "1", "--save_steps", "1", "--warmup_ratio", "0", "--dataloader_workers", "0",
            "--eval_file", str(tmp_path / "data" / "heldout.json"), "--deepspeed", deepspeed_config("zero3", tmp_path)]
    done = subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, timeout=HANG_S, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    exported = load_reward_model(out, torch.float32).state_dict()  # refused where a weight does not fill the model
    best = Path(json.loads((out / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())["best_model_checkpoint"])
    judge = load_judge(base)
    model = apply_lora(Judge(reward_classifier(judge.model, judge.pad_id, "linear"), judge.tokenizer, judge.settings, judge.source_format),
                       TrainConfig(**json.loads((out / "train_config.json").read_text())))
    set_peft_model_state_dict(model, load_file(best / "adapter_model.safetensors"))
    expected = model.merge_and_unload().state_dict()
    assert exported.keys() == expected.keys() and exported["score.weight"].abs().sum() > 0
    for name in expected:
        torch.testing.assert_close(exported[name], expected[name], rtol=0, atol=1e-6)
    untrained = load_judge(base).model.state_dict()  # (the model above shares its weights, merged into)
    assert any(not torch.equal(exported[name], untrained[name]) for name in exported if "language_model" in name)  # the adapter in


def test_grpo_trains_under_zero2_on_two_cpu_processes(tmp_path):
    """judge-train --objective grpo through TRL's GRPOTrainer under DeepSpeed ZeRO-2, two ranks each sampling both
    orders of its pairs: the judge is trained and saved whole and finite, every step's rewards recorded. ZeRO-2's
    optimizer gives the Trainer no gradient norm, which each step's line said as "gradient norm nan"."""
    from tests.train.test_grpo import RUBRIC

    base = write_original_checkpoint(tmp_path / "base", seed=0)
    (tmp_path / "data").mkdir()
    write_pairs(tmp_path / "data", 8, seed=1, annotated=True, text_only=True, rationale=False)
    (tmp_path / "data" / "general.yaml").write_text(RUBRIC)
    out = tmp_path / "grpo"
    args = ["-m", "mmjudge.train.cli", "--model_path", str(base), "--train_file", str(tmp_path / "data" / "pairs.json"), "--input_dir",
            str(tmp_path / "data"), "--output_dir", str(out), "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric",
            str(tmp_path / "data" / "general.yaml"), "--objective", "grpo", "--num_generations", "2", "--per_device_batch_size", "4",
            "--max_completion_length", "8", "--learning_rate", "1e-2", "--logging_steps", "1", "--max_steps", "2", "--deepspeed", "zero2"]
    done = subprocess.run([*TORCHRUN, *args], capture_output=True, text=True, timeout=HANG_S, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 2/2" in done.stderr and "gradient norm nan" not in done.stderr
    assert [entry["step"] for entry in json.loads((out / "reward_history.json").read_text())] == [1, 2]
    trained, untrained = load_judge(out).model.state_dict(), load_judge(base).model.state_dict()
    assert trained.keys() == untrained.keys() and all(torch.isfinite(weight).all() for weight in trained.values())
    assert any(not torch.equal(trained[name], untrained[name]) for name in trained if "language_model" in name)


def test_deepspeeds_cpu_ops_are_compiled_at_the_first_deepspeed_run_saying_so(tmp_path, monkeypatch, capsys):
    """issue 56, item 6: `make setup` compiled them for every user (16 minutes of a busy machine); the first --deepspeed
    run does, with a line that says why it waits, and a later run loads them silently."""
    import torch.utils.cpp_extension as extensions
    from deepspeed.ops import op_builder

    from mmjudge.train.run import deepspeed_ops

    loaded = []

    class Built:
        def __init__(self, name):
            self.name = name

        def load(self, verbose=True):
            (tmp_path / self.name).mkdir(exist_ok=True)
            (tmp_path / self.name / f"{self.name}.so").touch()
            loaded.append(self.name)

    monkeypatch.setattr(op_builder, "CPUAdamBuilder", lambda: Built("cpu_adam"))
    monkeypatch.setattr(op_builder, "ShareMemCommBuilder", lambda: Built("deepspeed_shm_comm"))
    monkeypatch.setattr(extensions, "_get_build_directory", lambda name, verbose: str(tmp_path / name))
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    deepspeed_ops()
    assert capsys.readouterr().err == (f"compiling DeepSpeed's CPU ops (cpu_adam, deepspeed_shm_comm) for --deepspeed: once, minutes, "
                                       f"then kept in {tmp_path}\n")
    deepspeed_ops()
    assert capsys.readouterr().err == "" and loaded == ["cpu_adam", "deepspeed_shm_comm"] * 2
