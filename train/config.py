"""judge-train's settings: each declared once, here, with its default; configs/train/*.yaml presets hold
only the settings that differ from these, and each setting is also a flag of its name. Free of torch, so
that the command line can be built and checked before any model code loads.

The defaults live in the dataclass rather than in a preset because code builds a TrainConfig too (tests,
benchmarks): a preset that repeated them could drift from them unseen, and `--help` shows them as they are.
They are InternVL's official LoRA recipe for InternVL2-4B (r 16, alpha 32, lr 4e-5, cosine, 3% warmup,
1 epoch, max length 4096, 6 tiles per image); global batch = GPUs x per_device_batch_size x
gradient_accumulation_steps (official: 16)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from mmjudge.judge.cli import setting_problems
from mmjudge.judge.parsing import ScoreScale
from mmjudge.train.grpo_rewards import REWARDS

CHECKPOINTS_DIR = "checkpoints"  # the Trainer's checkpoints, inside --output_dir
Objective = Literal["sft", "bradley_terry", "grpo"]
RewardHead = Literal["linear", "mlp"]  # judge/reward_model.py builds them


def _opt(default, help: str, minimum: float | None = None, below: float | None = None, above: bool = False):
    """A TrainConfig field. `help` is also its flag's; `minimum` is the least value that works (with `above`,
    a bound the value must stay over) and `below` a bound the value must stay under (checked by `config_problems`)."""
    metadata = {"help": help, "minimum": minimum, "below": below, "above": above}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class TrainConfig:
    """Every setting of judge-train (module docstring): configs/train/*.yaml set these keys and each has a flag
    of its name."""

    max_length: int = _opt(4096, "longest training sequence in tokens (prompt + image tokens + target)", minimum=1)
    max_tiles: int = _opt(6, "tiles per image before the thumbnail (InternVL2-4B's fine-tuning uses 6; a Qwen-VL image is one "
                             "tile, resized whole)", minimum=1)
    image_token_budget: int | None = _opt(None, "image tokens per sample before tiles and images are cut (none: no limit)", minimum=0)
    scale: tuple[int, int] = _opt((ScoreScale.low, ScoreScale.high), "the human score scale, LOW HIGH")
    full_finetune: bool = _opt(False, "train all language-model weights instead of LoRA (small models)")
    lora_r: int = _opt(16, "LoRA rank", minimum=1)
    lora_alpha: int = _opt(32, "LoRA alpha", minimum=1)
    lora_dropout: float = _opt(0.05, "LoRA dropout", minimum=0, below=1)
    lora_targets: list[str] | None = _opt(None, "language-model linear layers that get LoRA (none: every linear layer of its "
                                                "blocks, e.g. Phi-3's qkv_proj o_proj gate_up_proj down_proj, Qwen's and Llama's "
                                                "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj)")
    train_projector: bool = _opt(False, "also train the vision-language projector (InternVL's mlp1, Qwen-VL's patch merger)")
    train_vision_tower: bool = _opt(False, "also train the vision tower (InternViT, Qwen-VL's ViT) in full; with LoRA the adapter then holds a copy of it")
    learning_rate: float = _opt(4e-5, "peak learning rate", minimum=0)
    weight_decay: float = _opt(0.01, "AdamW weight decay", minimum=0)
    warmup_ratio: float = _opt(0.03, "share of steps spent warming the learning rate up", minimum=0, below=1)
    lr_scheduler: str = _opt("cosine", "learning-rate schedule (transformers' names)")
    num_epochs: float = _opt(1.0, "passes over the training set", minimum=0)
    max_steps: int = _opt(-1, "stop after this many optimizer steps (-1: num_epochs decides)", minimum=-1)
    per_device_batch_size: int = _opt(1, "sequences per device per micro-step", minimum=1)
    gradient_accumulation_steps: int = _opt(8, "micro-steps per optimizer step", minimum=1)
    gradient_checkpointing: bool = _opt(False, "recompute activations in backward to save memory, at a third more compute: "
                                               "for when max_length tokens' activations do not fit (about 29 GB at 4096 on InternVL2-4B)")
    save_steps: int = _opt(100, "checkpoint (and evaluate, with --eval_file) every this many steps", minimum=1)
    logging_steps: int = _opt(10, "log the loss every this many steps", minimum=1)
    eval_max_new_tokens: int = _opt(128, "longest judge output generated during evaluation", minimum=1)
    eval_token_budget: int = _opt(65536, "tokens per evaluation batch", minimum=1)
    dataloader_workers: int = _opt(2, "processes that decode and tile images", minimum=0)
    seed: int = _opt(42, "seed for initialisation and data order", minimum=0)
    objective: Objective = _opt("sft", "what the judge learns: sft (to write the judgement people gave), bradley_terry (a reward head on the "
                                 "last prompt token, from pairs: docs/reward-models.md) or grpo (a judge from judge-train, on pairs, by "
                                 "TRL's GRPO and the rewards below: docs/grpo.md)")
    reward_head: RewardHead = _opt("linear", "bradley_terry: the head on the last hidden state, linear or mlp (hidden -> SiLU -> 1)")
    reward_margin: float = _opt(0.0, "bradley_terry: the margin in -log sigmoid(r_chosen - r_rejected - margin)", minimum=0)
    reward_centering: float = _opt(0.0, "bradley_terry: weight of the centring term (r_chosen + r_rejected)^2 that keeps rewards near 0", minimum=0)

    rewards: list[str] = _opt(list(REWARDS), "grpo: the rewards summed per completion, of verdict, format, swap_consistency "
                                             "(train/grpo_rewards.py)")
    num_generations: int = _opt(4, "grpo: completions sampled per prompt, the group each reward is compared within", minimum=2)
    max_completion_length: int = _opt(256, "grpo: longest completion sampled, in tokens", minimum=1)
    # Above 0: GRPO learns from the differences within a group of samples, and at 0 there is no sampling (transformers refuses it)
    temperature: float = _opt(1.0, "grpo: sampling temperature of the completions", minimum=0, above=True)
    min_p: float = _opt(0.0, "grpo: leave out of the sampling every token less likely than min_p times the likeliest one (0: none), "
                             "so that a near-certain token (the verdict's format) is kept and only a close choice (the verdict) is "
                             "sampled both ways", minimum=0, below=1)
    kl_beta: float = _opt(0.0, "grpo: weight of the KL term to the starting judge (0: none, and no reference copy of the judge kept)", minimum=0)

    def __post_init__(self):
        self.scale = tuple(self.scale)  # YAML and flags give a list


def config_problems(cfg: TrainConfig) -> list[str]:
    """Every setting of `cfg` that cannot work, each with what would: found here, before the model loads,
    rather than deep in the Trainer (or not at all: a warmup_ratio of 1.5 would be read as 1 step)."""
    from transformers import SchedulerType  # here, not above: --help and a bad flag's message need no transformers

    problems = setting_problems(TrainConfig, asdict(cfg))
    schedulers = [s.value for s in SchedulerType]
    if cfg.lr_scheduler not in schedulers:
        problems.append(f"lr_scheduler must be one of {', '.join(schedulers)}, got {cfg.lr_scheduler!r}")
    try:
        ScoreScale(*cfg.scale)
    except ValueError as err:  # [0, 0], or [0, false] (YAML's false reads as 0): no annotation would fit
        problems.append(f"scale: {err}")
    if cfg.objective == "grpo":
        problems += grpo_problems(cfg)
    return problems


def grpo_problems(cfg: TrainConfig) -> list[str]:
    """GRPO's batch shape: the completions one process generates at once hold whole pairs, both orders each
    num_generations times, so that swap consistency sees a pair's two orders (train/grpo_rewards.py)."""
    problems = [f"rewards: unknown reward {name!r}; the rewards are {', '.join(REWARDS)}" for name in cfg.rewards if name not in REWARDS]
    if not cfg.rewards:
        problems.append(f"rewards: give at least one of {', '.join(REWARDS)}")
    generated = cfg.per_device_batch_size * cfg.gradient_accumulation_steps
    if cfg.num_generations >= 2 and generated % (2 * cfg.num_generations):  # fewer: setting_problems names num_generations
        problems.append(f"per_device_batch_size x gradient_accumulation_steps = {generated} completions per process per step must be a "
                        f"multiple of 2 x num_generations = {2 * cfg.num_generations} (both orders of each pair, num_generations times each)")
    return problems


LORA_SETTINGS = ("lora_r", "lora_alpha", "lora_dropout", "lora_targets")  # an adapter's: a full fine-tune has none
REWARD_SETTINGS = ("reward_head", "reward_margin", "reward_centering")  # a reward head's: SFT has none
GRPO_SETTINGS = ("rewards", "num_generations", "max_completion_length", "temperature", "min_p", "kl_beta")


def unused_settings(cfg: TrainConfig, given: dict) -> list[str]:
    """The settings given by flag (or keyword) that the run would not use: a LoRA setting in a full fine-tune,
    or a reward head's in an SFT run, where each was silently ignored. A preset may hold both modes' settings
    (tiny's lora_dropout)."""
    shown = {name: " ".join(map(str, value)) if isinstance(value, list) else value for name, value in given.items()}
    unused = []
    if cfg.full_finetune:
        unused += [f"--{name} {shown[name]}: a LoRA setting, but this run trains every language-model weight (full_finetune); "
                   "drop it, or give --no-full_finetune to train a LoRA adapter" for name in LORA_SETTINGS if given.get(name) is not None]
    if cfg.objective != "bradley_terry":
        unused += [f"--{name} {shown[name]}: a reward head's setting, but this run trains by {cfg.objective}; drop it, or give "
                   "--objective bradley_terry" for name in REWARD_SETTINGS if given.get(name) is not None]
    if cfg.objective != "grpo":
        unused += [f"--{name} {shown[name]}: a GRPO setting, but this run trains by {cfg.objective}; drop it, or give --objective grpo"
                   for name in GRPO_SETTINGS if given.get(name) is not None]
    return unused
