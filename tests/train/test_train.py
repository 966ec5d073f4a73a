"""judge-train on the tiny judge: the loss mask token by token, a real short run whose output judge-score
loads, resume at the right step, merge, and LoRA placement."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from mmjudge.infer.cli import main as score_main
from mmjudge.infer.engine import prepare
from mmjudge.judge.data import SCORE_FIELDS, InputError, load_annotations
from mmjudge.judge.model import load_judge, save_native, with_max_tiles
from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import HANG_S, write_dataset, write_hub_cache, write_original_checkpoint
from mmjudge.judge.testing.checkpoints import SIZES
from mmjudge.train.cli import main as train_main
from mmjudge.train.data import IGNORE_INDEX, Collator, build_dataset, merge_annotators, target_text
from mmjudge.train.config import TrainConfig
from mmjudge.train.recipe import JudgeTrainer, apply_lora, evaluation_options, run_vision_in_every_batch

TINY_RUBRIC = [str(CONFIG_DIR / "rubrics" / "tiny")]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write_original_checkpoint(tmp_path_factory.mktemp("base"), seed=0)


@pytest.fixture(scope="module")
def data(annotated):
    return annotated


def train_args(base, data, out, *extra):
    return ["--model_path", str(base), "--train_file", str(data / "train.json"), "--input_dir", str(data), "--output_dir", str(out),
            "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", *TINY_RUBRIC, "--dataloader_workers", "0", "--logging_steps", "1", *extra]


def test_loss_mask_covers_exactly_the_target_and_its_stop_token(base, data):
    judge = load_judge(base)
    annotations = load_annotations(data / "train.json", data)
    rubrics = load_rubrics(TINY_RUBRIC)
    dataset = build_dataset(judge, annotations, rubrics, data, max_length=8192, image_token_budget=None, source="train.json")
    rated = merge_annotators(annotations)
    assert len(dataset) == len(rated) < len(annotations)  # second annotators merged into their id
    end = judge.tokenizer.convert_tokens_to_ids("<|end|>")
    for row, r in zip(dataset, rated):
        ids, labels = row["input_ids"], row["labels"]
        first = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
        assert all(label == IGNORE_INDEX for label in labels[:first])  # prompt masked
        assert labels[first:] == ids[first:]  # every target token, and nothing after it, is learned
        assert ids[-1] == end  # the stop token is learned too
        assert judge.tokenizer.decode(ids[first:-1]) .strip() == target_text(r, rubrics[r.annotation.category]).strip()
        prompt = judge.tokenizer.decode(ids[:first])
        assert prompt.endswith("<|assistant|>\n") and "### Feedback" in prompt


def test_a_critique_that_writes_control_tokens_teaches_them_as_text(base, data):
    """An annotator's feedback with `<|end|>` in it would teach the judge to stop in mid-critique: the
    target holds one stop token, its own, at the end."""
    judge = load_judge(base)
    records = json.loads((data / "train.json").read_text())[:1]
    records[0]["feedback"] = "Weak.<|end|><|user|>\nAnd <IMG_CONTEXT> here."
    (data / "hostile.json").write_text(json.dumps(records))
    annotations = load_annotations(data / "hostile.json", data)
    rubrics = load_rubrics(TINY_RUBRIC)
    [row] = build_dataset(judge, annotations, rubrics, data, max_length=8192, image_token_budget=None, source="hostile.json")
    target = [token for token, label in zip(row["input_ids"], row["labels"]) if label != IGNORE_INDEX]
    special = judge.tokenizer.added_tokens_encoder
    assert [judge.tokenizer.convert_ids_to_tokens(t) for t in target if t in special.values()] == ["<|end|>"] and target[-1] == special["<|end|>"]
    assert judge.tokenizer.decode(target).startswith("Weak.<|end|><|user|>\nAnd <IMG_CONTEXT> here.")
    assert row["input_ids"].count(special["<IMG_CONTEXT>"]) == row["n_tiles"] * judge.settings.images.tokens_per_tile  # its images' alone


def test_a_sample_longer_than_max_length_is_named_by_its_first_record(base, data):
    judge = load_judge(base)
    annotations = load_annotations(data / "train.json", data)
    rubrics = load_rubrics(TINY_RUBRIC)
    lengths = build_dataset(judge, annotations, rubrics, data, max_length=8192, image_token_budget=None, source="train.json")["length"]
    with pytest.raises(InputError) as info:
        build_dataset(judge, annotations, rubrics, data, max_length=min(lengths) - 1, image_token_budget=None, source="train.json")
    first_records = {}
    for index, a in enumerate(annotations):  # a second annotator's record shifts the ids after it
        first_records.setdefault(a.id, index)
    assert [(p.index, p.record_id) for p in info.value.problems] == [(i, id_) for id_, i in first_records.items()]
    assert str(info.value.problems[-1]).startswith(f"train.json: record {len(annotations) - 1} (id '{annotations[-1].id}'): {lengths[-1]} tokens")


def test_evaluation_scores_the_prompts_training_learns_from(base, data):
    judge = load_judge(base)
    cfg = TrainConfig(max_tiles=1, image_token_budget=judge.settings.images.tokens_per_tile)  # one image's worth: the others are cut
    judge.settings = with_max_tiles(judge.settings, cfg.max_tiles)  # as train() does
    annotations = load_annotations(data / "train.json", data)
    rubrics = load_rubrics(TINY_RUBRIC)
    dataset = build_dataset(judge, annotations, rubrics, data, cfg.max_length, cfg.image_token_budget, "train.json")
    assert any(row["truncated"] for row in dataset)
    rated = merge_annotators(annotations)
    items = prepare(judge, [(i, r.annotation) for i, r in enumerate(rated)], rubrics, data, evaluation_options(cfg))
    for row, item in zip(dataset, items, strict=True):
        prompt_length = next(i for i, label in enumerate(row["labels"]) if label != IGNORE_INDEX)
        assert item.input_ids.tolist() == row["input_ids"][:prompt_length]


@pytest.mark.slow
def test_a_padded_micro_batch_has_the_loss_of_its_sequences_alone(base, data, tmp_path):
    """On a judge whose long rope switches between the shortest and the longest training sequence: the loss
    of one right-padded micro-batch is the loss of its sequences alone (the Trainer averages over target
    tokens, so each sequence weighs by its number of targets)."""
    rubrics = load_rubrics(TINY_RUBRIC)
    annotations = load_annotations(data / "train.json", data)
    lengths = build_dataset(load_judge(base), annotations, rubrics, data, 8192, None, "train.json")["length"]
    switch = sorted(lengths)[len(lengths) // 2]
    judge = load_judge(write_original_checkpoint(tmp_path / "long-rope", original_max_position_embeddings=switch))
    rows = list(build_dataset(judge, annotations, rubrics, data, 8192, None, "train.json"))
    assert min(len(r["input_ids"]) for r in rows) <= switch < max(len(r["input_ids"]) for r in rows)
    collate = Collator(judge.tokenizer.pad_token_id, judge.backbone, judge.settings.images)
    with torch.no_grad():
        batched = judge.model(**collate(rows)).loss
        alone = [judge.model(**collate([row])).loss for row in rows]
    targets = [sum(label != IGNORE_INDEX for label in row["labels"][1:]) for row in rows]
    assert batched.item() == pytest.approx(sum(loss.item() * n for loss, n in zip(alone, targets)) / sum(targets), abs=1e-5)


def test_merged_annotators_average_each_criterion(data):
    annotations = load_annotations(data / "train.json", data)
    for r in merge_annotators(annotations):
        ratings = [a.human_scores.given() for a in annotations if a.id == r.annotation.id]
        assert r.scores["overall"] == pytest.approx(sum(x["overall"] for x in ratings) / len(ratings))


@pytest.mark.parametrize("critic", [0, 1])
def test_two_annotators_one_level_apart_merge_into_the_judgement_of_the_one_whose_critique_it_carries(data, tmp_path, critic):
    """Annotators at overall 3 and 4, coherence 2 and 3: MMIE's rounding of the means (3.5, 2.5) gave overall 4
    beside coherence 2, a pair neither wrote. Half-way means go to the side of the annotator whose feedback the
    target carries; a mean that is not half-way is rounded as MMIE rounds (three annotators)."""
    record = {k: v for k, v in json.loads((data / "train.json").read_text())[0].items() if k not in ("feedback", "human_scores")}
    ratings = [{"overall": 3, "text_image_coherence": 2, "text_quality": 3}, {"overall": 4, "text_image_coherence": 3, "text_quality": 4}]
    records = [{**record, "annotator": f"ann-{i}", "human_scores": scores, **({"feedback": "Fine."} if i == critic else {})}
               for i, scores in enumerate(ratings)]
    third = {**record, "id": "SA_9999", "annotator": "ann-2", "human_scores": {"overall": 4, "text_image_coherence": 3, "text_quality": 4}}
    (tmp_path / "two.json").write_text(json.dumps(records + [{**r, "id": "SA_9999"} for r in records] + [third]))
    [two, three] = merge_annotators(load_annotations(tmp_path / "two.json", data))
    rubric = load_rubrics(TINY_RUBRIC)[two.annotation.category]
    expected = ratings[critic]
    assert target_text(two, rubric) == (f"Fine.\nText quality: {expected['text_quality']}\nText-image coherence: "
                                        f"{expected['text_image_coherence']}\n### Score\n{expected['overall']}")
    assert target_text(three, rubric).endswith("Text quality: 4\nText-image coherence: 3\n### Score\n4")  # 3.67, 2.67 and 4
    assert two.scores["overall"] == 3.5  # the evaluation still compares with the annotators' mean


def test_lora_wraps_only_language_model_layers(base):
    model = apply_lora(load_judge(base), TrainConfig())
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "language_model" in n for n in trainable)
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n in trainable} == {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"}


@pytest.mark.slow
@pytest.mark.parametrize("full_finetune", [False, True])
def test_the_vision_tower_trains_only_when_asked_and_its_weights_reach_the_saved_judge(base, data, tmp_path, full_finetune):
    frozen = apply_lora(load_judge(base), TrainConfig(full_finetune=full_finetune))
    assert not any(p.requires_grad for n, p in frozen.named_parameters() if "vision_tower" in n)
    out = tmp_path / "judge"
    mode = "--full_finetune" if full_finetune else "--no-full_finetune"
    assert train_main(train_args(base, data, out, mode, "--train_vision_tower", "--max_steps", "2", "--save_steps", "2",
                                 "--per_device_batch_size", "2", "--learning_rate", "1e-2")) == 0
    tiles = torch.randn(2, 3, SIZES.image_size, SIZES.image_size, generator=torch.Generator().manual_seed(0))
    features = []
    for judge in (load_judge(base), load_judge(out)):  # the saved judge, adapter or full, sees with the trained tower
        model = judge.model  # an adapter is merged into its base as it loads
        with torch.no_grad():
            features.append(model.model.vision_tower(pixel_values=tiles).last_hidden_state)
    assert not torch.allclose(features[0], features[1])


def test_lora_initialisation_follows_the_seed(base):
    def lora_a(seed):
        model = apply_lora(load_judge(base), TrainConfig(full_finetune=False, seed=seed))
        return torch.cat([p.detach().flatten() for n, p in model.named_parameters() if "lora_A" in n])

    assert torch.equal(lora_a(7), lora_a(7))
    assert not torch.equal(lora_a(7), lora_a(8))


@pytest.mark.slow
def test_an_image_less_training_batch_runs_the_vision_tower_and_keeps_its_loss(base):
    judge = load_judge(base)
    model = judge.model.train()
    ids = judge.tokenizer("<|user|>\nhello<|end|><|assistant|>\nfine<|end|>", return_tensors="pt").input_ids
    plain = model(input_ids=ids, labels=ids).loss
    run_vision_in_every_batch(model)
    calls = []
    model.model.vision_tower.register_forward_hook(lambda *_: calls.append("vision"))
    loss = model(input_ids=ids, labels=ids).loss
    assert calls == ["vision"] and torch.equal(loss, plain)
    loss.backward()  # the projector is in the graph, with a zero gradient: the same backward as a batch with images
    projector = model.model.multi_modal_projector.linear_2.weight.grad
    assert projector is not None and not projector.any()
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
    assert calls == ["vision"]  # evaluation runs no blank tile


@pytest.mark.slow
def test_train_save_score_and_merge(base, data, tmp_path):
    out = tmp_path / "judge"
    args = train_args(base, data, out, "--max_steps", "4", "--save_steps", "2", "--no-full_finetune", "--per_device_batch_size", "2",
                      "--eval_file", str(data / "heldout.json"), "--eval_max_new_tokens", "8")
    assert train_main(args) == 0
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer_config.json", "judge_config.json"} <= {p.name for p in out.iterdir()}
    history = json.loads((out / "eval_history.json").read_text())
    assert [h["step"] for h in history] == [2, 4] and "pearson" in history[0]["overall"]
    judge = load_judge(out)
    assert judge.source_format == "adapter"
    assert score_main(["--model_path", str(out), "--input_dir", str(data), "--input_file", "heldout.json", "--output_dir", str(tmp_path / "s"),
                       "--max_new_tokens", "4", "--rubric", *TINY_RUBRIC]) == 0
    adapter_files = {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()}
    assert train_main(["merge", "--adapter", str(out), "--output_dir", str(out)]) == 2  # would write over the adapter's files
    assert {f.name: f.read_bytes() for f in out.iterdir() if f.is_file()} == adapter_files
    merged = tmp_path / "merged"
    assert train_main(["merge", "--adapter", str(out), "--output_dir", str(merged)]) == 0
    standalone = load_judge(merged)
    assert standalone.source_format == "native"
    ids = judge.tokenizer("<|user|>\nhello<|end|><|assistant|>\n", return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(standalone.model(input_ids=ids).logits, judge.model(input_ids=ids).logits, rtol=1e-4, atol=1e-5)


# 80 id sequences and the text transformers 4.37's slow SentencePiece tokenizer gave them on the tiny tokenizer
# (MMIE's reference decoding; docs/exactness.md).
RECORDED_DECODING = Path(__file__).parents[1] / "judge" / "reference" / "decode_transformers_4.37.json"


@pytest.mark.slow
def test_a_trained_judge_is_read_and_written_by_its_base_tokenizer_rules(base, data, tmp_path):
    """The tiny tokenizer says `"legacy": false`, as InternVL2-4B's does: the reference reads every prompt with
    a word-start token after BOS. A LoRA adapter, a full fine-tune and the adapter merged are each scored
    on the prompt ids training learnt from and decode the judge's tokens to the reference's text; so is an
    adapter written before, holding transformers' rewrite of the tokenizer files."""
    assert json.loads((base / "tokenizer_config.json").read_text())["legacy"] is False
    rubrics = load_rubrics(TINY_RUBRIC)
    annotations = load_annotations(data / "heldout.json", data)
    judge = load_judge(base)
    judge.settings = with_max_tiles(judge.settings, 1)  # tiny.yaml's, as train() sets it
    training_ids = [row["input_ids"][:len(row["labels"]) - sum(x != IGNORE_INDEX for x in row["labels"])]
                    for row in build_dataset(judge, annotations, rubrics, data, 8192, None, "heldout.json")]
    steps = ["--max_steps", "2", "--save_steps", "2", "--per_device_batch_size", "2"]
    assert train_main(train_args(base, data, tmp_path / "adapter", *steps, "--no-full_finetune")) == 0
    assert train_main(train_args(base, data, tmp_path / "full", *steps)) == 0
    assert train_main(["merge", "--adapter", str(tmp_path / "adapter"), "--output_dir", str(tmp_path / "merged")]) == 0
    earlier = tmp_path / "earlier-adapter"
    shutil.copytree(tmp_path / "adapter", earlier)
    for name in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"):
        (earlier / name).unlink(missing_ok=True)
    load_judge(base).tokenizer.save_pretrained(earlier)  # what judge-train wrote before: no tokenizer.model, no "legacy"
    cases = json.loads(RECORDED_DECODING.read_text())["cases"]
    for judge_dir in ("adapter", "full", "merged", "earlier-adapter"):
        out = tmp_path / f"scores-{judge_dir}"
        assert score_main(["--model_path", str(tmp_path / judge_dir), "--input_dir", str(data), "--input_file", "heldout.json",
                           "--output_dir", str(out), "--max_new_tokens", "2", "--max_tiles", "1", "--rubric", *TINY_RUBRIC]) == 0
        scored = {r["id"]: r["prompt_tokens"] for r in json.loads((out / "eval_result.json").read_text())}
        assert [scored[r.annotation.id] for r in merge_annotators(annotations)] == [len(ids) for ids in training_ids], judge_dir
        judge = load_judge(tmp_path / judge_dir)
        judge.settings = with_max_tiles(judge.settings, 1)
        items = prepare(judge, [(i, r.annotation) for i, r in enumerate(merge_annotators(annotations))], rubrics, data, evaluation_options(TrainConfig(max_tiles=1)))
        assert [item.input_ids.tolist() for item in items] == training_ids, judge_dir
        assert all(judge.decode(case["ids"]) == case["text"] for case in cases), judge_dir
    for judge_dir in ("adapter", "full", "merged"):  # a trained judge carries its base's files, to train on or hand on
        assert all((tmp_path / judge_dir / f).read_bytes() == (base / f).read_bytes() for f in ("tokenizer.model", "tokenizer_config.json"))


def train_interrupted_after(steps: int, args: list[str], monkeypatch) -> int:
    """judge-train's exit code when Ctrl-C comes after `steps` steps."""
    step = JudgeTrainer.training_step

    def interrupted(self, *a, **k):
        if self.state.global_step == steps:
            raise KeyboardInterrupt
        return step(self, *a, **k)

    monkeypatch.setattr(JudgeTrainer, "training_step", interrupted)
    try:
        return train_main(args)
    finally:
        monkeypatch.setattr(JudgeTrainer, "training_step", step)


@pytest.mark.slow
def test_a_run_interrupted_and_resumed_ends_where_an_uninterrupted_run_ends(base, data, tmp_path, monkeypatch):
    """Ctrl-C at step 5 of 6, after the checkpoint of step 4: --resume trains steps 5 and 6 on the same
    batches, with the same optimizer and schedule, as the run that was never stopped."""
    args = ["--max_steps", "6", "--save_steps", "2", "--per_device_batch_size", "2", "--no-full_finetune"]
    assert train_main(train_args(base, data, tmp_path / "whole", *args)) == 0
    assert train_interrupted_after(4, train_args(base, data, tmp_path / "stopped", *args), monkeypatch) == 130
    assert not (tmp_path / "stopped" / "adapter_model.safetensors").exists()
    assert train_main(train_args(base, data, tmp_path / "stopped", *args, "--resume")) == 0
    whole, resumed = (load_file(tmp_path / d / "adapter_model.safetensors") for d in ("whole", "stopped"))
    assert whole.keys() == resumed.keys()
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=0, atol=1e-6)
    state = json.loads((tmp_path / "stopped" / "checkpoints" / "checkpoint-6" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3, 4, 5, 6]  # none trained twice


def logged_losses(out, step):
    state = json.loads((out / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").read_text())
    return {e["step"]: e["loss"] for e in state["log_history"] if "loss" in e}


@pytest.mark.slow
def test_a_run_resumed_part_way_through_any_epoch_is_the_run_it_resumes(base, data, tmp_path):
    """Eight training samples in batches of 2: four steps an epoch. Resumed from checkpoint-6, half-way
    through the second epoch, the rest of that epoch came in another order (step 7's loss 5.506 where the
    run logs 5.521); from the first epoch (checkpoint-2) it was exact. Each resume
    here, from an epoch's middle, from its end, and from a resumed run's own checkpoint in the third epoch,
    logs the run's losses and ends on its weights."""
    args = ["--max_steps", "12", "--save_steps", "2", "--per_device_batch_size", "2"]
    assert train_main(train_args(base, data, tmp_path / "whole", *args)) == 0
    whole = logged_losses(tmp_path / "whole", 12)
    assert len(merge_annotators(load_annotations(data / "train.json", data))) == 8  # the epochs this test's steps fall in

    def resumed_from(run, step):
        out = tmp_path / f"from-{run.name}-{step}"
        shutil.copytree(run / "checkpoints" / f"checkpoint-{step}", out / "checkpoints" / f"checkpoint-{step}")
        assert train_main(train_args(base, data, out, *args, "--resume")) == 0
        assert {s: loss for s, loss in logged_losses(out, 12).items() if s > step} == {s: loss for s, loss in whole.items() if s > step}
        resumed, uninterrupted = (load_file(d / "model.safetensors") for d in (out, tmp_path / "whole"))
        for name in uninterrupted:
            torch.testing.assert_close(resumed[name], uninterrupted[name], rtol=0, atol=0)
        return out

    resumed_from(resumed_from(tmp_path / "whole", 6), 10)
    resumed_from(tmp_path / "whole", 4)


@pytest.mark.slow
def test_a_full_finetune_interrupted_and_resumed_ends_where_an_uninterrupted_run_ends(base, data, tmp_path, monkeypatch, capsys):
    """The same for a full fine-tune (configs/train/tiny.yaml), whose checkpoint transformers saves under other
    key names than the model's own: --resume restarted from the base weights, with a warning and exit 0.
    A checkpoint whose weights do not fill the model is refused, naming it."""
    args = ["--max_steps", "4", "--save_steps", "2", "--per_device_batch_size", "2"]
    assert train_main(train_args(base, data, tmp_path / "whole", *args)) == 0
    assert train_interrupted_after(2, train_args(base, data, tmp_path / "stopped", *args), monkeypatch) == 130
    checkpoint = tmp_path / "stopped" / "checkpoints" / "checkpoint-2"
    for copy in ("bumped", "damaged"):
        shutil.copytree(tmp_path / "stopped", tmp_path / copy)
    assert train_main(train_args(base, data, tmp_path / "stopped", *args, "--resume")) == 0
    whole, resumed = (load_file(tmp_path / d / "model.safetensors") for d in ("whole", "stopped"))
    assert whole.keys() == resumed.keys()
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=0, atol=1e-6)
    # Every weight of the checkpoint is what the resumed run starts from: moved by 0.5, the result moves with it.
    bumped_checkpoint = tmp_path / "bumped" / "checkpoints" / "checkpoint-2" / "model.safetensors"
    saved = load_file(bumped_checkpoint)
    save_file({name: tensor + 0.5 for name, tensor in saved.items()}, bumped_checkpoint, metadata={"format": "pt"})
    assert train_main(train_args(base, data, tmp_path / "bumped", *args, "--resume")) == 0
    bumped = load_file(tmp_path / "bumped" / "model.safetensors")
    assert min((bumped[name] - resumed[name]).abs().min().item() for name in resumed) > 0.4
    # A weight missing from the checkpoint: refused, not left at the base's value.
    damaged_checkpoint = tmp_path / "damaged" / "checkpoints" / "checkpoint-2"
    save_file({name: tensor for name, tensor in saved.items() if "lm_head" not in name}, damaged_checkpoint / "model.safetensors",
              metadata={"format": "pt"})
    capsys.readouterr()
    assert train_main(train_args(base, data, tmp_path / "damaged", *args, "--resume")) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"error: {damaged_checkpoint}: config.json describes a model of ") and "Traceback" not in err  # after the encoding bar
    # A LoRA run resuming a full fine-tune's checkpoint: refused, naming it.
    assert train_main(train_args(base, data, tmp_path / "stopped", *args, "--resume", "--no-full_finetune")) == 2
    assert f"{checkpoint.parent / 'checkpoint-4'}: --resume: the checkpoint holds fully fine-tuned weights, but this run trains a LoRA adapter" in capsys.readouterr().err


@pytest.mark.slow
def test_resume_after_a_kill_while_saving_takes_the_newest_whole_checkpoint_and_says_which_it_skipped(base, data, tmp_path, capsys):
    """A kill while checkpoint-2 was being saved left it without trainer_state.json (written last) and with
    half its weights: --resume failed on it every time, and a fresh run is refused in a non-empty directory."""
    out = tmp_path / "judge"
    args = ["--max_steps", "2", "--save_steps", "1", "--per_device_batch_size", "2", "--no-full_finetune"]
    assert train_main(train_args(base, data, out, *args)) == 0
    torn = out / "checkpoints" / "checkpoint-2"
    (torn / "trainer_state.json").unlink()
    adapter = torn / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:100])
    capsys.readouterr()
    assert train_main(train_args(base, data, out, *args, "--resume")) == 0
    assert "note: checkpoint-2 was not saved whole (no trainer_state.json: a run stopped while saving it); resuming from checkpoint-1" in capsys.readouterr().err
    state = json.loads((torn / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2]
    load_judge(out)  # the saved judge is whole again
    for checkpoint in (out / "checkpoints").iterdir():
        (checkpoint / "trainer_state.json").write_text('{"global_step": ')  # torn mid-write: none left whole
    assert train_main(train_args(base, data, out, *args, "--resume")) == 2
    assert "no checkpoint saved whole" in capsys.readouterr().err


@pytest.mark.slow
def test_an_adapter_trained_over_a_native_base_loads_and_merges(base, data, tmp_path, capsys):
    native = tmp_path / "native"
    save_native(load_judge(base), native)
    out = tmp_path / "judge"
    assert train_main(train_args(native, data, out, "--max_steps", "2", "--save_steps", "2", "--per_device_batch_size", "2",
                                 "--no-full_finetune", "--learning_rate", "1e-2")) == 0
    adapter = load_judge(out)
    assert adapter.source_format == "adapter"
    assert train_main(["merge", "--adapter", str(out), "--output_dir", str(tmp_path / "merged")]) == 0
    assert train_main(["merge", "--adapter", str(out), "--output_dir", str(tmp_path / "exported"), "--format", "original"]) == 2
    assert f"{native}: the adapter's base is a native checkpoint; the original format takes its config.json" in capsys.readouterr().err
    ids = adapter.tokenizer("<|user|>\nhello<|end|><|assistant|>\n", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = [judge.model(input_ids=ids).logits for judge in (load_judge(native), adapter, load_judge(tmp_path / "merged"))]
    assert not torch.allclose(logits[0], logits[1])  # the adapter is applied over the native base
    torch.testing.assert_close(logits[2], logits[1], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_an_adapter_over_a_hub_base_names_it_by_id_at_its_commit_and_loads_offline(base, data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    snapshot = write_hub_cache(tmp_path / "hub", "org/tiny-base", base)
    out = tmp_path / "judge"
    assert train_main(train_args("org/tiny-base", data, out, "--max_steps", "2", "--save_steps", "2", "--per_device_batch_size", "2",
                                 "--no-full_finetune", "--learning_rate", "1e-2")) == 0
    config = json.loads((out / "adapter_config.json").read_text())
    # The id, not the cache path, so that the adapter travels; the commit, so that it applies to the weights it was trained over.
    assert (config["base_model_name_or_path"], config["revision"]) == ("org/tiny-base", snapshot.name)
    adapter = load_judge(out)
    ids = adapter.tokenizer("<|user|>\nhello<|end|><|assistant|>\n", return_tensors="pt").input_ids
    assert train_main(["merge", "--adapter", str(out), "--output_dir", str(tmp_path / "merged")]) == 0
    with torch.no_grad():
        logits = [judge.model(input_ids=ids).logits for judge in (load_judge(base), adapter, load_judge(tmp_path / "merged"))]
    assert not torch.allclose(logits[0], logits[1])  # the adapter is applied over the Hub base
    torch.testing.assert_close(logits[2], logits[1], rtol=1e-4, atol=1e-5)
    assert score_main(["--model_path", str(out), "--input_dir", str(data), "--input_file", "heldout.json", "--output_dir", str(tmp_path / "s"),
                       "--max_new_tokens", "4", "--rubric", *TINY_RUBRIC]) == 0
    capsys.readouterr()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "another-cache"))  # a machine where the base was never fetched
    assert score_main(["--model_path", str(out), "--input_dir", str(data), "--input_file", "heldout.json", "--output_dir", str(tmp_path / "t"),
                       "--max_new_tokens", "4", "--rubric", *TINY_RUBRIC]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note:")]  # the input's repeated samples
    assert len(err) == 1 and err[0].startswith(f"error: {out}/adapter_config.json: base_model_name_or_path: org/tiny-base: no local directory "
                                                f"of that name, and revision {snapshot.name} of that Hub id is not (fully) in the Hugging Face cache")


def test_a_hub_base_missing_from_the_offline_cache_stops_before_any_output(data, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    assert train_main(train_args("org/missing", data, tmp_path / "judge")) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: --model_path org/missing: no local directory of that name, and revision main")
    assert not (tmp_path / "judge").exists()


REMOTE_CODE = {  # what InternVL2-4B ships for trust_remote_code; the export copies them as files and must never run them
    "modeling_internvl_chat.py": "raise SystemExit('remote code must never run here')\n",
    "configuration_internvl_chat.py": "raise SystemExit('remote code must never run here')\n",
    "conversation.py": "raise SystemExit('never run')\nregister_conv_template(Conversation(name='phi3-chat', system_message='Judge carefully.'))\n",
}


def headers(path):
    """Each tensor's shard, dtype and shape, as the safetensors headers give them."""
    layout = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(file, framework="pt") as weights:
            layout |= {k: (file.name, weights.get_slice(k).get_dtype(), weights.get_slice(k).get_shape()) for k in weights.keys()}
    return layout


def trained_over(base, data, out, *extra):
    for name, text in REMOTE_CODE.items():
        (base / name).write_text(text)
    assert train_main(train_args(base, data, out, "--max_steps", "2", "--save_steps", "2", "--per_device_batch_size", "2",
                                 "--no-full_finetune", "--learning_rate", "1e-2", *extra)) == 0
    return out


@pytest.fixture(scope="module")
def exportable(data, tmp_path_factory):
    """A LoRA judge (projector trained too) over a sharded original base that ships remote code."""
    root = tmp_path_factory.mktemp("exportable")
    base = write_original_checkpoint(root / "base", seed=4, shards=3)
    return base, trained_over(base, data, root / "judge", "--train_projector")


@pytest.mark.slow
def test_the_original_format_export_loads_with_the_merged_logits_in_the_base_layout(exportable, tmp_path, capsys):
    base, adapter = exportable
    assert train_main(["merge", "--adapter", str(adapter), "--output_dir", str(tmp_path / "native")]) == 0
    assert train_main(["merge", "--adapter", str(adapter), "--output_dir", str(tmp_path / "exported"), "--format", "original"]) == 0
    assert f"merged checkpoint (original format): {tmp_path / 'exported'}" in capsys.readouterr().out
    exported, native = load_judge(tmp_path / "exported"), load_judge(tmp_path / "native")
    assert exported.source_format == "original" and exported.settings == load_judge(adapter).settings
    ids = exported.tokenizer("<|user|>\n<img>" + "<IMG_CONTEXT>" * SIZES.tokens_per_tile + "</img>\nhello<|end|><|assistant|>\n",
                             return_tensors="pt").input_ids
    pixels = torch.randn(1, 3, SIZES.image_size, SIZES.image_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = [j.model(input_ids=ids, pixel_values=pixels).logits for j in (exported, native, load_judge(base))]
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-5)
    assert not torch.allclose(logits[0], logits[2])  # the trained weights, not the base's
    assert headers(tmp_path / "exported") == headers(base)  # names, shards, dtypes, shapes
    assert json.loads((tmp_path / "exported" / "model.safetensors.index.json").read_text())["weight_map"] == \
        json.loads((base / "model.safetensors.index.json").read_text())["weight_map"]
    copied = [*REMOTE_CODE, "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "generation_config.json"]
    assert all((tmp_path / "exported" / f).read_bytes() == (base / f).read_bytes() for f in copied)
    config, base_config = (json.loads((d / "config.json").read_text()) for d in (tmp_path / "exported", base))
    assert config == {**base_config, "max_dynamic_patch": 1}  # the tile limit the judge was trained with (tiny.yaml)


@pytest.mark.slow
def test_a_bfloat16_base_exports_in_bfloat16(data, tmp_path, capsys):
    base = write_original_checkpoint(tmp_path / "base", seed=5, dtype="bfloat16")
    adapter = trained_over(base, data, tmp_path / "judge")
    (base / "configuration_internvl_chat.py").unlink()
    assert train_main(["merge", "--adapter", str(adapter), "--output_dir", str(tmp_path / "native")]) == 0
    assert train_main(["merge", "--adapter", str(adapter), "--output_dir", str(tmp_path / "exported"), "--format", "original"]) == 0
    assert (f"note: {base} lacks configuration_internvl_chat.py, which its config.json's auto_map names: the export, like its base, "
            "loads with this toolkit but not with trust_remote_code") in capsys.readouterr().err
    assert headers(tmp_path / "exported") == headers(base)
    exported, merged = load_judge(tmp_path / "exported").model.state_dict(), load_judge(tmp_path / "native").model.state_dict()
    assert exported.keys() == merged.keys()
    assert all(torch.equal(exported[k], merged[k].to(torch.bfloat16).float()) for k in merged)  # the merged weights, rounded once


@pytest.mark.slow
def test_an_adapter_is_scored_as_its_export_bit_for_bit(data, tmp_path):
    """Scored unmerged, a LoRA adapter over a bfloat16 base kept precision its export rounds away: of a 3-step
    adapter's 24 texts, 2 parted from the reference's on the export (docs/exactness.md). Loaded, an adapter is
    its merge rounded as the export is (its LoRA layers and the projector it trains whole): the same logits,
    the same weights and the same scores as the original-format export."""
    base = write_original_checkpoint(tmp_path / "base", seed=5, dtype="bfloat16")
    adapter = trained_over(base, data, tmp_path / "judge", "--train_projector")
    assert train_main(["merge", "--adapter", str(adapter), "--output_dir", str(tmp_path / "exported"), "--format", "original"]) == 0
    judge, exported = load_judge(adapter), load_judge(tmp_path / "exported")
    ids = exported.tokenizer("<|user|>\n<img>" + "<IMG_CONTEXT>" * SIZES.tokens_per_tile + "</img>\nhello<|end|><|assistant|>\n",
                             return_tensors="pt").input_ids
    pixels = torch.randn(1, 3, SIZES.image_size, SIZES.image_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(judge.model(input_ids=ids, pixel_values=pixels).logits, exported.model(input_ids=ids, pixel_values=pixels).logits)
    weights, exported_weights = judge.model.state_dict(), exported.model.state_dict()
    assert weights.keys() == exported_weights.keys() and all(torch.equal(weights[k], exported_weights[k]) for k in weights)
    scored = []
    for name in ("judge", "exported"):
        assert score_main(["--model_path", str(tmp_path / name), "--input_dir", str(data), "--input_file", "heldout.json", "--output_dir",
                           str(tmp_path / f"scores-{name}"), "--max_new_tokens", "8", "--rubric", *TINY_RUBRIC]) == 0
        scored.append([(r["feedback"], r["score_distribution"]) for r in json.loads((tmp_path / f"scores-{name}" / "eval_result.json").read_text())])
    assert scored[0] == scored[1]


@pytest.mark.slow
def test_what_the_original_format_cannot_hold_is_refused(exportable, tmp_path, capsys):
    base, adapter = exportable
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.json").write_text("{}")
    assert train_main(["merge", "--adapter", str(adapter), "--output_dir", str(tmp_path / "taken"), "--format", "original"]) == 2
    assert f"--output_dir {tmp_path / 'taken'} is not an empty directory" in capsys.readouterr().err
    assert (tmp_path / "taken" / "config.json").read_text() == "{}"
    grown = tmp_path / "grown"
    shutil.copytree(adapter, grown)
    tokenizer = load_judge(grown).tokenizer
    tokenizer.add_tokens(["<verdict>"])
    tokenizer.save_pretrained(grown)
    assert train_main(["merge", "--adapter", str(grown), "--output_dir", str(tmp_path / "out"), "--format", "original"]) == 2
    assert "the judge's tokenizer has another vocabulary than the base's" in capsys.readouterr().err
    assert not (tmp_path / "out" / "config.json").exists()


@pytest.mark.slow
def test_resume_continues_at_the_saved_step(base, data, tmp_path, capsys):
    out = tmp_path / "judge"
    assert train_main(train_args(base, data, out, "--max_steps", "2", "--save_steps", "2", "--per_device_batch_size", "2")) == 0
    (out / "checkpoints" / "checkpoint-2" / "data_order.json").unlink()  # as judge-train saved checkpoints before it kept one
    capsys.readouterr()
    assert train_main(train_args(base, data, out, "--max_steps", "4", "--save_steps", "2", "--per_device_batch_size", "2", "--resume")) == 0
    err = capsys.readouterr().err
    assert "note: checkpoint-2 holds no data_order.json (saved before judge-train kept one)" in err
    assert f"resuming from {out / 'checkpoints' / 'checkpoint-2'}" in err
    assert re.search(r"trained 2 steps \(resumed at step 2, now at 4\) in", err), err  # this run's steps, not the whole run's
    state = json.loads((out / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    logged = [e["step"] for e in state["log_history"] if "loss" in e]
    assert logged == sorted(set(logged))  # no step trained twice


def test_bad_annotations_are_reported_before_training(base, tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps([{"id": "SA_1", "question": "q", "answer": "a", "human_scores": {"overall": 11}}]))
    code = train_main(["--model_path", str(base), "--train_file", str(tmp_path / "bad.json"), "--input_dir", str(tmp_path), "--output_dir", str(tmp_path / "o")])
    assert code == 2 and "record 0 (id 'SA_1'): human_scores.overall: 11 is outside the scale 0-6" in capsys.readouterr().err


def test_problems_of_both_files_and_categories_without_a_rubric_are_reported_together_before_loading(data, tmp_path, capsys):
    (tmp_path / "heldout.json").write_text(json.dumps([{"id": "SA_1", "question": "q", "answer": "a", "human_scores": {"overall": 9}}]))
    only_sa = ["--rubric", str(CONFIG_DIR / "rubrics" / "tiny" / "sa.yaml")]
    code = train_main([*train_args(tmp_path / "no-model", data, tmp_path / "out", "--eval_file", str(tmp_path / "heldout.json")), *only_sa])
    err = capsys.readouterr().err
    assert code == 2 and f"--model_path {tmp_path / 'no-model'}: not a local directory" in err  # with the inputs' problems
    for category in ("MSR", "PBL"):
        assert f"{data / 'train.json'}: no rubric for category {category} (" in err
    assert f"{tmp_path / 'heldout.json'}: record 0 (id 'SA_1'): human_scores.overall: 9 is outside the scale 0-6" in err


def test_a_scale_other_than_the_rubrics_is_refused_before_loading(data, tmp_path, capsys):
    # The targets are written on the rubric's scale: a human 8 of 0-10 would be learned as '### Score None'.
    assert train_main(train_args(tmp_path / "no-model", data, tmp_path / "out", "--scale", "0", "10")) == 2
    assert ("\n  the annotations' scale 0-10 (--scale, or the config's scale) is not that of rubric 'MSR' (0-6), 'PBL' (0-6), 'SA' (0-6); "
            "give the rubrics' scale with --scale, or rubrics that score 0-10\n") in capsys.readouterr().err


def test_lora_targets_that_name_no_layer_are_refused(base, data, tmp_path, capsys):
    # qkv_proj matches; the misspelt one alone would otherwise be skipped without a word
    assert train_main(train_args(base, data, tmp_path / "out", "--no-full_finetune", "--lora_targets", "qkv_proj", "o_prj")) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("error: --lora_targets o_prj: no language-model layer of that name; "
                                                                "its linear layers are down_proj, gate_up_proj, o_proj, qkv_proj")  # after the encoding bar


@pytest.mark.parametrize("pearsons, said, best_step", [
    ([0.2, 0.7, 0.5], "best overall Pearson: 0.700", 4),
    # -1 ranks an undefined Pearson for the Trainer; it must not be reported as measured
    ([None, None, None], "best overall Pearson: undefined at every evaluation", 2),
])
@pytest.mark.slow
def test_the_saved_judge_is_the_best_evaluated_checkpoint(base, data, tmp_path, monkeypatch, capsys, pearsons, said, best_step):
    measured = iter(pearsons)
    monkeypatch.setattr("mmjudge.train.recipe.evaluate_judge", lambda *_: {"parse_failures": 0, **{name: {"pearson": None} for name in SCORE_FIELDS},
                                                                    "overall": {"pearson": next(measured)}})
    out = tmp_path / "judge"
    assert train_main(train_args(base, data, out, "--max_steps", "6", "--save_steps", "2", "--no-full_finetune",
                                 "--eval_file", str(data / "heldout.json"))) == 0
    assert said in capsys.readouterr().out
    history = json.loads((out / "eval_history.json").read_text())
    assert [h["overall"]["pearson"] for h in history] == pearsons
    if any(pearsons):
        assert max(history, key=lambda h: h["overall"]["pearson"])["step"] == best_step
    saved = (out / "adapter_model.safetensors").read_bytes()
    checkpoints = out / "checkpoints"
    assert [step for step in (2, 4, 6) if (checkpoints / f"checkpoint-{step}" / "adapter_model.safetensors").read_bytes() == saved] == [best_step]


def test_resume_refuses_inputs_kept_in_the_output_dir(data, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "checkpoints" / "checkpoint-2").mkdir(parents=True)
    (out / "train.json").write_bytes((data / "train.json").read_bytes())  # the run's checkpoints and judge are written here
    args = train_args(tmp_path / "no-model", data, out, "--resume")
    args[args.index("--train_file") + 1] = str(out / "train.json")
    assert train_main(args) == 2
    assert f"--train_file {out / 'train.json'}: this run would overwrite {out / 'train.json'}, one of its inputs" in capsys.readouterr().err


def test_a_second_training_run_on_an_output_dir_in_use_is_refused(base, data, tmp_path, capsys, monkeypatch):
    from mmjudge.judge.outputs import locked

    monkeypatch.setattr("mmjudge.train.recipe.load_judge", lambda *a, **k: pytest.fail("the model loaded"))
    with locked(tmp_path / "out", "judge-train"):
        assert train_main(train_args(base, data, tmp_path / "out")) == 2
    assert f"--output_dir {tmp_path / 'out'} is in use by judge-train" in capsys.readouterr().err


def test_an_evaluation_line_spells_undefined_and_never_minus_one():
    from mmjudge.train.recipe import evaluation_line

    nothing = {"samples": 80, "parse_failures": 80, **{name: {"n": 0, "pearson": None, "mse": None} for name in SCORE_FIELDS}}
    assert evaluation_line(10, 0.333, nothing) == ("evaluation at step 10 (epoch 0.33): overall Pearson, MSE, quadratic κ and exact "
                                                   "agreement undefined; outputs parsed: 0 of 80")
    some = {"samples": 80, "parse_failures": 2, "overall": {"n": 78, "pearson": 0.98966, "mse": 0.08125, "quadratic_kappa": None,
                                                            "exact_agreement": 0.85}}
    assert evaluation_line(240, 8.0, some) == ("evaluation at step 240 (epoch 8.00): overall Pearson 0.990, MSE 0.081, quadratic κ "
                                               "undefined, exact agreement 85%; outputs parsed: 78 of 80")


@pytest.mark.slow
def test_a_run_prints_short_lines_and_no_known_harmless_warning(base, data, tmp_path):
    """judge-train as a user runs it, in a process of its own (DeepSpeed warns once per process): a named bar
    for training and one for each evaluation, a line per log and per evaluation, and none of the Trainer's
    dicts of strings, of its -1 for an undefined Pearson, or of the library warnings known to be harmless."""
    import subprocess
    import sys

    args = train_args(base, data, tmp_path / "judge", "--max_steps", "2", "--save_steps", "1", "--eval_file", str(data / "heldout.json"),
                      "--eval_max_new_tokens", "4", "--no-full_finetune")  # LoRA: PEFT's path too
    done = subprocess.run([sys.executable, "-m", "mmjudge.train.cli", *args], capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.replace("\r", "\n").splitlines() if line.strip()]
    assert [line for line in lines if line.startswith("step ")] == [line for line in lines if re.match(r"step [12]/2 \(epoch", line)]
    assert len([line for line in lines if line.startswith("step ")]) == 2
    evaluations = [line for line in lines if line.startswith("evaluation at step")]
    assert [re.sub(r"epoch [\d.]+", "epoch E", e.split(":")[0]) for e in evaluations] == ["evaluation at step 1 (epoch E)", "evaluation at step 2 (epoch E)"]
    assert all(re.search(r"undefined; outputs parsed: 0 of [1-9]$", e) for e in evaluations), evaluations  # a random judge writes no score
    assert any(line.startswith("training: 100%") for line in lines) and any(line.startswith("evaluating: ") for line in lines)
    assert any(line.startswith("trained 2 steps in ") for line in lines)
    everything = done.stdout + done.stderr
    # a -1 standing alone, not inside a path (pytest's temporary folders are numbered: pytest-1NN)
    assert "{'" not in everything and not re.search(r"(?<![\w/.-])-1(?!\w)", everything)
    assert "Setting accelerator to CPU" not in everything and "is_gradient_checkpointing" not in everything and "Warning" not in everything
