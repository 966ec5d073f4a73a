"""judge-train's settings: the keys of configs/train/*.yaml, each also a flag of its name. Free of torch,
so that the command line can be built and checked before any model code loads."""

from __future__ import annotations

from dataclasses import dataclass, field


def _opt(default, help: str):
    factory = (lambda: list(default)) if isinstance(default, list) else None
    return field(default_factory=factory, metadata={"help": help}) if factory else field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    """Every setting of judge-train: configs/train/*.yaml set these keys and each has a flag of its name."""

    max_length: int = _opt(4096, "longest training sequence in tokens (prompt + image tokens + target)")
    max_tiles: int = _opt(6, "tiles per image before the thumbnail (InternVL2-4B's fine-tuning uses 6)")
    image_token_budget: int | None = _opt(None, "image tokens per sample before tiles and images are cut (none: no limit)")
    scale: tuple[int, int] = _opt((0, 6), "the human score scale, LOW HIGH")
    full_finetune: bool = _opt(False, "train all language-model weights instead of LoRA (small models)")
    lora_r: int = _opt(16, "LoRA rank")
    lora_alpha: int = _opt(32, "LoRA alpha")
    lora_dropout: float = _opt(0.05, "LoRA dropout")
    lora_targets: list[str] = _opt(["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], "language-model linear layers that get LoRA")
    train_projector: bool = _opt(False, "also train the vision-language projector")
    learning_rate: float = _opt(4e-5, "peak learning rate")
    weight_decay: float = _opt(0.01, "AdamW weight decay")
    warmup_ratio: float = _opt(0.03, "share of steps spent warming the learning rate up")
    lr_scheduler: str = _opt("cosine", "learning-rate schedule (transformers' names)")
    num_epochs: float = _opt(1.0, "passes over the training set")
    max_steps: int = _opt(-1, "stop after this many optimizer steps (-1: num_epochs decides)")
    per_device_batch_size: int = _opt(1, "sequences per device per micro-step")
    gradient_accumulation_steps: int = _opt(8, "micro-steps per optimizer step")
    gradient_checkpointing: bool = _opt(True, "recompute activations in backward to save memory")
    save_steps: int = _opt(100, "checkpoint (and evaluate, with --eval_file) every this many steps")
    logging_steps: int = _opt(10, "log the loss every this many steps")
    eval_max_new_tokens: int = _opt(128, "longest judge output generated during evaluation")
    eval_token_budget: int = _opt(65536, "tokens per evaluation batch")
    dataloader_workers: int = _opt(2, "processes that decode and tile images")
    seed: int = _opt(42, "seed for initialisation and data order")

    def __post_init__(self):
        self.scale = tuple(self.scale)  # YAML and flags give a list
