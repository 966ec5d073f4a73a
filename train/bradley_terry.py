"""judge-train --objective bradley_terry: a reward head (judge/reward_model.py) learnt from pairs, beside the SFT
recipe (train/recipe.py), whose setup it shares: the judge, LoRA or full, the Trainer and DeepSpeed, the data
order and resume, the checkpoint chosen by the held-out evaluation.

    pairs -> each answer's prompt under its category's pointwise rubric -> reward = head(last token's
    hidden state) -> loss -log sigmoid(r_chosen - r_rejected - margin) + centring (r_chosen + r_rejected)^2

Ties teach no order and are kept out of training and of the held-out accuracy (how often the answer people
preferred gets the higher reward). A pair that several people annotated counts once, with their majority
(a split majority is a tie). The saved judge is the merged reward model in its layout (judge/reward_model.py).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import set_seed
from transformers.integrations import is_deepspeed_zero3_enabled

from mmjudge.infer.progress import Bar, counted
from mmjudge.judge.data import InputError, Pair, Problem, write_json_atomically
from mmjudge.judge.hub import Checkpoint
from mmjudge.judge.kernels import use_fused_kernels
from mmjudge.judge.model import Judge, load_judge, save_native, with_max_tiles
from mmjudge.judge.prompts import Rubric, build_prompt, encode_prompt
from mmjudge.judge.reward_model import load_reward_model, reward_classifier, rewards
from mmjudge.train.checkpoints import allow_checkpoint_types
from mmjudge.train.config import CHECKPOINTS_DIR, TrainConfig
from mmjudge.train.data import Collator, merge_pair_annotators
from mmjudge.train.recipe import JudgeTrainer, append_history, apply_lora, quiet_known_noise, ranked_by, resumed_checkpoint, run_vision_in_every_batch, \
    training_arguments

MEASURE = "accuracy_without_ties"


def answer_row(judge: Judge, pair: Pair, side: str, rubric: Rubric, image_root: Path, image_token_budget: int | None) -> dict:
    """One answer of a pair as the reward head reads it: its prompt under the pointwise rubric, as judge-score
    builds it for a pointwise judge of the pair, in the Collator's fields."""
    settings = judge.settings
    prompt = build_prompt(pair.as_sample(side), rubric, settings.template, settings.system_message, image_root, settings.images, image_token_budget)
    return {"input_ids": encode_prompt(judge.tokenizer, prompt.text, prompt.controls), "image_paths": [str(image.path) for image in prompt.images],
            "image_settings": [json.dumps(image.processing.stored()) for image in prompt.images]}


def decisive_pairs(pairs: list[Pair]) -> list[tuple[int, Pair, str]]:
    """(record number, pair, the answer people preferred) of every pair whose annotators' majority is no tie."""
    return [(r.index, r.pair, r.preference) for r in merge_pair_annotators(pairs) if r.preference != "tie"]


def build_pair_dataset(judge: Judge, pairs: list[Pair], rubrics: dict[str, Rubric], image_root: Path, max_length: int,
                       image_token_budget: int | None, source: str) -> Dataset:
    """A row per decisive pair: the chosen and the rejected answer's prompts; one longer than max_length is an
    error naming its pair."""
    rows, problems = [], []
    decisive = decisive_pairs(pairs)  # read_annotations refused a file of ties alone
    with Bar("encoding", len(decisive), rank=int(os.environ.get("RANK", "0"))) as bar:
        for index, pair, preferred in counted(decisive, bar):
            rubric = rubrics[pair.category]
            chosen, rejected = (answer_row(judge, pair, side, rubric, image_root, image_token_budget) for side in (preferred, "B" if preferred == "A" else "A"))
            if (longest := max(len(chosen["input_ids"]), len(rejected["input_ids"]))) > max_length:
                problems.append(Problem(source, f"{longest} tokens after image-token budgeting exceed max_length {max_length}; raise max_length "
                                                "or lower image_token_budget / max_tiles", index, pair.id))
            rows.append({"id": pair.id, "length": len(chosen["input_ids"]) + len(rejected["input_ids"]),
                         **{f"chosen_{key}": value for key, value in chosen.items()}, **{f"rejected_{key}": value for key, value in rejected.items()}})
    if problems:
        raise InputError(problems)
    return Dataset.from_list(rows)


class PairCollator:
    """A batch of pairs as one right-padded batch of answers: the chosen ones, then the rejected ones."""

    def __init__(self, answers: Collator):
        self.answers = answers

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        answers = [{"input_ids": r[f"{name}_input_ids"], "labels": r[f"{name}_input_ids"], "image_paths": r[f"{name}_image_paths"],
                    "image_settings": r[f"{name}_image_settings"]} for name in ("chosen", "rejected") for r in rows]
        batch = self.answers(answers)
        del batch["labels"]  # no token is predicted
        return batch


def pair_loss(reward: torch.Tensor, margin: float, centering: float) -> torch.Tensor:
    """Bradley-Terry's loss over a batch of rewards, the chosen answers' first (module docstring)."""
    chosen, rejected = reward.chunk(2)
    return -F.logsigmoid(chosen - rejected - margin).mean() + centering * ((chosen + rejected) ** 2).mean()


class RewardTrainer(JudgeTrainer):
    """JudgeTrainer (its data order, resume and checkpoint choice) with the pairwise loss, and an evaluation
    by held-out pairwise accuracy."""

    def __init__(self, *args, eval_pairs: Dataset | None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_pairs = eval_pairs

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = pair_loss(rewards(model, inputs), self.cfg.reward_margin, self.cfg.reward_centering)
        return (loss, None) if return_outputs else loss

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """A checkpoint's adapter and head (PEFT's loading), or its full weights, every one restored."""
        model = self.model if model is None else model
        if hasattr(model, "peft_config"):  # JudgeTrainer's: PEFT loads the adapter and the head (modules_to_save), all checked
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        saved = load_reward_model(Path(resume_from_checkpoint), model.dtype)
        with torch.no_grad():
            model.load_state_dict(saved.state_dict(), strict=True)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        if self._evaluated and self._evaluated[0] == self.state.global_step:
            return self._evaluated[1]
        metrics = {"pairs": len(self.eval_pairs), MEASURE: pairwise_accuracy(self.model, self.eval_pairs, self.data_collator,
                                                                             self.args.per_device_eval_batch_size, self.args.device)}
        flat = {f"{metric_key_prefix}_{MEASURE}": metrics[MEASURE], f"{metric_key_prefix}_{ranked_by(MEASURE)}": metrics[MEASURE]}
        if self.is_world_process_zero():
            append_history(self.history_file, {"step": self.state.global_step, "epoch": self.state.epoch, **metrics})
            tqdm.write(f"evaluation at step {self.state.global_step}: pairwise accuracy {metrics[MEASURE]:.3f} on {metrics['pairs']} "
                       "held-out pairs (ties out)", file=sys.stderr)
        self.log(flat)
        self._evaluated = (self.state.global_step, flat)
        return flat


@torch.no_grad()
def pair_rewards(model: torch.nn.Module, pairs: Dataset, collate: PairCollator, batch_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The rewards of every pair's chosen and rejected answers, in eval mode (every rank scores them all)."""
    was_training = model.training
    model.eval()
    chosen, rejected = [], []
    for start in range(0, len(pairs), batch_size):
        batch = collate([pairs[i] for i in range(start, min(start + batch_size, len(pairs)))])
        c, r = rewards(model, {name: value.to(device) for name, value in batch.items()}).chunk(2)
        chosen.append(c.cpu())
        rejected.append(r.cpu())
    model.train(was_training)
    return torch.cat(chosen), torch.cat(rejected)


def pairwise_accuracy(model: torch.nn.Module, pairs: Dataset, collate: PairCollator, batch_size: int, device) -> float:
    """How often the answer people preferred gets the higher reward."""
    chosen, rejected = pair_rewards(model, pairs, collate, batch_size, device)
    return (chosen > rejected).float().mean().item()


def whole_weights(model: torch.nn.Module):
    """Every weight of the model whole on every rank for as long as the context lasts: under DeepSpeed ZeRO-3 each
    rank holds a partition of each weight (rank 0's alone exported empty tensors), gathered here by every rank
    together; a change made meanwhile (the adapter merged in) is dropped at the end. Elsewhere, nothing to do."""
    if not is_deepspeed_zero3_enabled():
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)


def train_reward_head(base: Checkpoint, annotations: tuple[list[Pair], list[Pair]], train_file: Path, image_root: Path, output_dir: Path,
                      rubrics: dict[str, Rubric], cfg: TrainConfig, deepspeed: str | None, resume: bool, eval_file: Path | None = None) -> dict:
    """Train a reward head on `base` from the (training, held-out) pairs; the result says how the saved weights
    were chosen, as train/recipe.py's `train` does."""
    train_pairs, eval_pairs = annotations
    quiet_known_noise()
    output_dir.mkdir(parents=True, exist_ok=True)
    judge = load_judge(base.path, "cpu", torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    use_fused_kernels(judge.model, "cuda" if torch.cuda.is_available() else "cpu")
    judge.settings = with_max_tiles(judge.settings, cfg.max_tiles)
    dataset = build_pair_dataset(judge, train_pairs, rubrics, image_root, cfg.max_length, cfg.image_token_budget, str(train_file))
    held_out = build_pair_dataset(judge, eval_pairs, rubrics, image_root, cfg.max_length, cfg.image_token_budget, str(eval_file)) if eval_pairs else None
    run_vision_in_every_batch(judge.model)
    set_seed(cfg.seed)  # the head's random start (apply_lora seeds the adapter's after it)
    reward_judge = Judge(reward_classifier(judge.model, judge.pad_id, cfg.reward_head), judge.tokenizer, judge.settings, judge.source_format)
    model = apply_lora(reward_judge, cfg)
    trainer = RewardTrainer(
        model=model,
        args=training_arguments(cfg, output_dir / CHECKPOINTS_DIR, deepspeed, held_out is not None, MEASURE),
        train_dataset=dataset,
        eval_dataset=held_out,
        eval_pairs=held_out,
        data_collator=PairCollator(Collator(judge.pad_id, judge.backbone, judge.settings.images)),
        judge=reward_judge, rubrics=rubrics, image_root=image_root, cfg=cfg,
        history_file=output_dir / "eval_history.json",
    )
    allow_checkpoint_types()
    trainer.train(resume_from_checkpoint=resumed_checkpoint(output_dir / CHECKPOINTS_DIR) if resume else None)
    best = trainer.state.best_model_checkpoint
    with whole_weights(trainer.model):  # the best checkpoint loads into whole weights (ZeRO-3's partitions take none)
        if trainer.is_world_process_zero():
            if best:
                trainer._load_from_checkpoint(best)
            save_native(Judge(trainer.model, judge.tokenizer, judge.settings, "training"), output_dir)  # the adapter merged in
            write_json_atomically(output_dir / "train_config.json", asdict(cfg))
    measured = any(f"eval_{MEASURE}" in entry for entry in trainer.state.log_history)
    return {"global_step": trainer.state.global_step, "best": trainer.state.best_metric if measured else None,
            "measure": "pairwise accuracy of the rewards, ties out"}

