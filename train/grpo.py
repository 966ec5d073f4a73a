"""judge-train --objective grpo: a judge from judge-train (the SFT cold start) trained further by TRL's
GRPOTrainer on pairs with a preference, rewarded by train/grpo_rewards.py. The RL loop is TRL's; what is the
judge's is here: the prompts, both orders of each pair drawn together, the judge's own tokenization and stop
token, and the setup shared with SFT (LoRA or full, DeepSpeed, the Trainer's checkpoints and --resume).

    pairs -> each pair's forward and reverse prompts under its pairwise rubric -> num_generations completions of
    each, sampled -> rewards (verdict, format, swap consistency) -> GRPO's group-relative advantages -> update

The saved judge is the merged judge in its native layout, as a full fine-tune's, and reward_history.json holds
the mean of each reward at every logged step.

What TRL's trainer does not take here: images (its generation and log-probability passes hand one image's
pixels per prompt to the model, where InternVL tiles an image and a pair shows several; text-only pairs are
trained, a pair with images is refused by name), and a held-out evaluation during the run (score the saved
judge with judge-score, as benchmarks/grpo_seeds.py does).
"""

from __future__ import annotations

import copy
import os
from dataclasses import asdict
from pathlib import Path

import torch
from datasets import Dataset
from torch.utils.data import Sampler
from trl import GRPOConfig, GRPOTrainer
from trl.models import prepare_deepspeed
from trl.trainer.utils import RepeatSampler, add_fused_lm_head, disable_dropout_in_model

from mmjudge.infer.progress import Bar, counted
from mmjudge.judge.data import InputError, Pair, Problem, write_json_atomically
from mmjudge.judge.hub import Checkpoint
from mmjudge.judge.kernels import use_fused_kernels
from mmjudge.judge.model import Judge, load_judge, save_native, with_max_tiles
from mmjudge.judge.prompts import Rubric, build_pair_prompt, encode_prompt
from mmjudge.train.checkpoints import allow_checkpoint_types
from mmjudge.train.config import CHECKPOINTS_DIR, TrainConfig
from mmjudge.train.data import merge_pair_annotators
from mmjudge.train.grpo_rewards import trl_rewards
from mmjudge.train.recipe import JudgeTrainer, apply_lora, quiet_known_noise, resumed_checkpoint, training_arguments

REWARD_HISTORY = "reward_history.json"


def build_prompt_dataset(judge: Judge, pairs: list[Pair], rubrics: dict[str, Rubric], image_root: Path, cfg: TrainConfig,
                         source: str) -> tuple[Dataset, dict[str, list[int]]]:
    """Two rows per pair (its annotators merged), its forward then its reverse prompt, with what the rewards read;
    and each prompt's token ids as the judge's own encoding gives them. A pair with images, or whose prompt
    leaves no room for max_completion_length tokens within max_length, is an error naming it."""
    rows, prompt_ids, problems = [], {}, []
    rated = merge_pair_annotators(pairs)
    settings = judge.settings
    with Bar("encoding", len(rated), rank=int(os.environ.get("RANK", "0"))) as bar:
        for r in counted(rated, bar):
            rubric = rubrics[r.pair.category]
            for first in ("A", "B"):
                prompt = build_pair_prompt(r.pair, first, rubric, settings.template, settings.system_message, image_root, settings.images,
                                           cfg.image_token_budget)
                if prompt.images:
                    problems.append(Problem(source, f"shows {len(prompt.images)} image(s): objective grpo trains on text-only pairs (TRL's "
                                                    "trainer passes one image per prompt; docs/grpo.md)", r.index, r.pair.id))
                    break
                ids = encode_prompt(judge.tokenizer, prompt.text, prompt.controls)
                if len(ids) + cfg.max_completion_length > cfg.max_length:
                    problems.append(Problem(source, f"{len(ids)} prompt tokens + max_completion_length {cfg.max_completion_length} exceed "
                                                    f"max_length {cfg.max_length}", r.index, r.pair.id))
                    break
                prompt_ids[prompt.text] = ids
                rows.append({"prompt": prompt.text, "pair_id": r.pair.id, "first": first, "preference": r.preference, "category": r.pair.category})
    if problems:
        raise InputError(problems)
    return Dataset.from_list(rows), prompt_ids


class BothOrders(Sampler):
    """TRL's sampler drawn over pairs, each pair given as its forward row then its reverse row (rows 2p and
    2p + 1), each num_generations times: the completions rewarded together hold both orders of every pair in
    them (train/grpo_rewards.py's swap consistency)."""

    def __init__(self, pairs: RepeatSampler, generations: int):
        self.pairs, self.generations = pairs, generations

    def __iter__(self):
        drawn = list(self.pairs)  # each pair's index num_generations times in a row
        for at in range(0, len(drawn), self.generations):
            pair = drawn[at]
            yield from [2 * pair] * self.generations + [2 * pair + 1] * self.generations

    def __len__(self) -> int:
        return 2 * len(self.pairs)


class GRPOJudgeTrainer(JudgeTrainer, GRPOTrainer):
    """TRL's GRPOTrainer on a judge: JudgeTrainer's checkpoint loading (every weight restored or the resume
    refused) and progress lines, the prompts encoded as the judge encodes them, its own stop token, and both
    orders of a pair drawn together, and the KL term's reference the starting judge itself."""

    def __init__(self, *args, prompt_ids: dict[str, list[int]], stop_ids: tuple[int, ...], **kwargs):
        model, grpo_args = kwargs["model"], kwargs["args"]
        # With kl_beta, TRL keeps a LoRA run's reference by switching the adapter off; for a full fine-tune it loads one
        # again from the model's config._name_or_path, which a judge loaded by load_judge does not have ('', "Repo id
        # must use alphanumeric chars"), and which could not be loaded that way where the judge was converted from
        # InternVL's original layout. The reference is the judge as it starts, copied before any step (and before
        # --resume restores a checkpoint), with TRL building none.
        reference = copy.deepcopy(model).requires_grad_(False).eval() if grpo_args.beta and not hasattr(model, "peft_config") else None
        beta = grpo_args.beta
        if reference is not None:
            grpo_args.beta = 0.0
        try:
            super().__init__(*args, **kwargs)
        finally:
            grpo_args.beta = beta
        if reference is not None:
            self.beta, self.ref_model = beta, self._prepared_reference(reference)
        self.prompt_ids = prompt_ids
        self.eos_token_id = stop_ids[0]  # where TRL ends a completion's loss mask; generation stops at any of stop_ids

    def _prepared_reference(self, reference: torch.nn.Module) -> torch.nn.Module:
        """The reference as TRL prepares the one it loads: without dropout where the run has none, with TRL's fused
        output layer (its per-token log-probabilities come from it), under DeepSpeed or on the run's device for
        evaluation."""
        if self.args.disable_dropout:
            disable_dropout_in_model(reference)
        add_fused_lm_head(reference, temperature=self.temperature, cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(reference, self.accelerator)
        return self.accelerator.prepare_model(reference, evaluation_mode=True)

    def _tokenize_prompts(self, prompts: list[str]):
        # TRL would tokenize the text whole, reading any special token an answer spells as one (encode_prompt says why not)
        return [self.prompt_ids[prompt] for prompt in prompts], None, {}

    def _get_train_sampler(self, dataset=None) -> BothOrders:
        dataset = self.train_dataset if dataset is None else dataset
        pairs = RepeatSampler(range(len(dataset) // 2), mini_repeat_count=self.num_generations,
                              batch_size=self.args.generation_batch_size // self.num_generations // 2,
                              repeat_count=self.num_iterations * self.args.steps_per_generation, shuffle=self.shuffle_dataset, seed=self.args.seed)
        return BothOrders(pairs, self.num_generations)


def reward_history(log_history: list[dict]) -> list[dict]:
    """Each logged step's reward means, from the Trainer's log."""
    return [{"step": entry["step"], **{k: v for k, v in entry.items() if k.startswith("rewards/") and k.endswith("/mean") or k == "reward"}}
            for entry in log_history if "reward" in entry]


def grpo_arguments(cfg: TrainConfig, output_dir: Path, deepspeed: str | None, stop_ids: tuple[int, ...]) -> GRPOConfig:
    """TRL's settings of the run: the Trainer's as for SFT, and the sampling (generation stops at any of the
    judge's stop tokens)."""
    return training_arguments(cfg, output_dir, deepspeed, False, kind=GRPOConfig, num_generations=cfg.num_generations,
                              max_completion_length=cfg.max_completion_length, temperature=cfg.temperature, min_p=cfg.min_p or None,
                              beta=cfg.kl_beta, generation_kwargs={"eos_token_id": list(stop_ids)})


def train_grpo(base: Checkpoint, annotations: tuple[list[Pair], list[Pair]], train_file: Path, image_root: Path, output_dir: Path,
               rubrics: dict[str, Rubric], cfg: TrainConfig, deepspeed: str | None, resume: bool) -> dict:
    """GRPO on the judge `base` from the training pairs; the result says how the saved weights were chosen, as
    train/recipe.py's `train` does (here: the last step's)."""
    train_pairs, _ = annotations  # run.py refuses an eval file: TRL's trainer evaluates by its own loss
    quiet_known_noise()
    output_dir.mkdir(parents=True, exist_ok=True)
    judge = load_judge(base.path, "cpu", torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    use_fused_kernels(judge.model, "cuda" if torch.cuda.is_available() else "cpu")
    judge.settings = with_max_tiles(judge.settings, cfg.max_tiles)
    dataset, prompt_ids = build_prompt_dataset(judge, train_pairs, rubrics, image_root, cfg, str(train_file))
    model = apply_lora(judge, cfg)
    args = grpo_arguments(cfg, output_dir / CHECKPOINTS_DIR, deepspeed, judge.stop_ids)
    trainer = GRPOJudgeTrainer(
        model=model, reward_funcs=trl_rewards(rubrics, cfg.rewards), args=args, train_dataset=dataset, processing_class=judge.tokenizer,
        judge=Judge(model, judge.tokenizer, judge.settings, "training"), rubrics=rubrics, image_root=image_root, cfg=cfg,
        history_file=output_dir / "eval_history.json", prompt_ids=prompt_ids, stop_ids=judge.stop_ids,
    )
    allow_checkpoint_types()
    trainer.train(resume_from_checkpoint=resumed_checkpoint(output_dir / CHECKPOINTS_DIR) if resume else None)
    if trainer.is_world_process_zero():
        save_native(Judge(trainer.model, judge.tokenizer, judge.settings, "training"), output_dir)  # the adapter merged in
        write_json_atomically(output_dir / "train_config.json", asdict(cfg))
        write_json_atomically(output_dir / REWARD_HISTORY, reward_history(trainer.state.log_history))
    return {"global_step": trainer.state.global_step, "best": None, "measure": "the last step's weights"}
