"""The fine-tuning recipe behind judge-train, top to bottom:

    config -> annotations -> judge -> LoRA (or full) -> datasets -> HF Trainer (+ DeepSpeed) -> evaluation
    with the scoring engine at every interval -> best checkpoint by overall Pearson -> saved judge

Evaluation scores the held-out annotations with the same engine as judge-score (generate mode) and
compares with the human scores using the calibration package's statistics, so the numbers in
eval_history.json are the ones judge-calibrate would report. Trained on pairs, the judge judges the
held-out pairs in both orders, and the best checkpoint is the one whose final verdicts (agree rule) most
often match people's, ties counted as a verdict.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from tqdm.auto import tqdm
from transformers import Trainer, TrainingArguments, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.utils import logging as transformers_logging

from mmjudge.calibration.stats import agreement_table
from mmjudge.infer.engine import Scorer, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.infer.progress import Bar, progress_bar
from mmjudge.judge.backbones import backbone_of
from mmjudge.judge.data import SCORE_FIELDS, Annotation, JudgeResult, Pair, UsageError, write_json_atomically
from mmjudge.judge.hub import Checkpoint
from mmjudge.judge.kernels import use_fused_kernels
from mmjudge.judge.checkpoint import CheckpointError, save_tokenizer
from mmjudge.judge.model import Judge, check_adapter_weights, check_finite, load_judge, load_native, with_max_tiles, write_settings
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.preferences import ORDERS, first_wins, order_verdict
from mmjudge.judge.prompts import Rubric
from mmjudge.train.checkpoints import DATA_ORDER, allow_checkpoint_types, kind_problem, read_data_order, resume_point, write_data_order
from mmjudge.train.config import CHECKPOINTS_DIR, TrainConfig
from mmjudge.train.data import Collator, EpochOrder, build_dataset, merge_annotators, merge_pair_annotators

# transformers 5.23 renamed TrainingArguments' gradient_checkpointing(_kwargs) to activation_checkpointing(_kwargs)
# (the old names warn there, until 6 removes them): the names the installed version declares.
CHECKPOINTING = "activation_checkpointing" if "activation_checkpointing" in TrainingArguments.__dataclass_fields__ else "gradient_checkpointing"


def apply_lora(judge: Judge, cfg: TrainConfig) -> torch.nn.Module:
    """LoRA on the language model only; the vision tower and projector stay frozen unless asked. The
    adapter's random start follows cfg.seed (the Trainer seeds only later, for the data order)."""
    set_seed(cfg.seed)
    for p in judge.model.parameters():
        p.requires_grad = False
    # Trained in full when asked (LoRA's modules_to_save), whichever way the language model is trained.
    backbone = judge.backbone
    whole = [*(backbone.vision_tower,) * cfg.train_vision_tower, *backbone.projector * cfg.train_projector]
    whole = [name for name in whole if not any(name.startswith(f"{other}.") for other in whole)]  # Qwen-VL's merger is in its tower
    # A reward model (judge/reward_model.py) has a head where a generative judge has its output layer: trained either way.
    output = "score" if hasattr(judge.model, "score") else "lm_head"
    if cfg.full_finetune:
        trainable = [judge.model.model.language_model, judge.model.get_submodule(output)] + [judge.model.model.get_submodule(name) for name in whole]
        for module in trainable:
            for p in module.parameters():
                p.requires_grad = True
        return judge.model
    targets = cfg.lora_targets or language_model_linears(judge.model)
    check_lora_targets(judge.model, targets)
    lora = LoraConfig(
        r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules=lora_pattern(targets),
        modules_to_save=whole + [output] * (output == "score") or None,  # LoRA leaves lm_head as it is, a new head learns in full
    )
    return get_peft_model(judge.model, lora)


def language_model_linears(model: torch.nn.Module) -> list[str]:
    """The names of the linear layers in the language model's blocks: LoRA's default targets, whatever the
    family calls them (InternVL's official recipe for Phi-3 targets exactly these four)."""
    blocks = model.model.language_model.layers
    return sorted({name.rsplit(".", 1)[-1] for name, module in blocks.named_modules() if isinstance(module, torch.nn.Linear)})


def lora_pattern(targets: list[str]) -> str:
    # anchored on the language model: the vision tower has its own projections
    return rf".*language_model.*\.({'|'.join(targets)})"


def check_lora_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Each target must name a layer, as PEFT matches them: PEFT refuses only when none does (in its own
    words), and a misspelt one beside a right one would silently train without it."""
    names = [name for name, _ in model.named_modules()]
    if unmatched := [t for t in targets if not any(re.fullmatch(lora_pattern([t]), name) for name in names)]:
        raise UsageError(f"--lora_targets {' '.join(unmatched)}: no language-model layer of that name; its linear layers are "
                         f"{', '.join(language_model_linears(model))}")


def run_vision_in_every_batch(model: torch.nn.Module) -> None:
    """In training, an image-less batch runs the vision tower and projector too, once, on a blank tile whose
    features are added to the input embeddings times zero: the loss is unchanged.

    Why: ZeRO-3 gathers each module's weights collectively when it runs, so every rank must run the same
    modules in the same order; a rank whose batch has no image would skip the vision tower that another
    rank runs (a collective mismatch, then a hang). The zero-weighted term keeps the backward the same on
    every rank too, which a trainable projector's gradient reduction needs. Evaluation needs none of this:
    every rank scores the same batches.

    The forward itself is wrapped so the blank tile runs where the native forward runs images, after the
    token embedding and before the language model; a forward pre-hook would run it before the model's own
    call and ZeRO-3 would see the modules in another order."""
    inner = model.model  # the native model under the output layer: InternVLModel, Qwen2_5_VLModel, ...
    backbone = backbone_of(model.config)
    forward = inner.forward

    def forward_with_vision(input_ids=None, pixel_values=None, inputs_embeds=None, **kwargs):
        if inner.training and pixel_values is None:
            inputs_embeds = inner.get_input_embeddings()(input_ids)
            features, deepstack = backbone.features(inner, backbone.blank_pixels(inner.config, inputs_embeds.dtype, inputs_embeds.device))
            unused = features.sum() + sum(layer.sum() for layer in deepstack or [])
            inputs_embeds, input_ids = inputs_embeds + unused * 0, None
        return forward(input_ids=input_ids, pixel_values=pixel_values, inputs_embeds=inputs_embeds, **kwargs)

    inner.forward = forward_with_vision


class JudgeTrainer(Trainer):
    """HF Trainer whose evaluation is judge-score on the held-out annotations."""

    def __init__(self, *args, judge: Judge, rubrics: dict[str, Rubric], image_root: Path, cfg: TrainConfig, history_file: Path, **kwargs):
        super().__init__(*args, **kwargs)  # eval_dataset: the held-out annotations themselves
        # Short lines instead of the Trainer's dicts of every logged value as strings
        self.remove_callback(ProgressCallback)
        self.remove_callback(PrinterCallback)
        self.add_callback(TrainingLines())
        self.judge, self.rubrics = judge, rubrics
        self.image_root, self.cfg, self.history_file = image_root, cfg, history_file
        self._evaluated: tuple[int, dict] | None = None  # (step, metrics): the Trainer may ask twice per step
        self.resumed_from: str | None = None
        self.data_order: EpochOrder | None = None

    def train(self, resume_from_checkpoint: str | None = None, **kwargs):
        self.resumed_from = resume_from_checkpoint
        return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    def _get_train_sampler(self, train_dataset=None) -> EpochOrder:
        """The group_by_length order, resumed with the checkpoint's (EpochOrder says why). Every rank draws
        from rank 0's saved state: the ranks' shards of one order must be of the same order."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        drawn = read_data_order(Path(self.resumed_from)) if self.resumed_from else None
        self.data_order = EpochOrder(self.args.train_batch_size * self.args.gradient_accumulation_steps, dataset["length"],
                                     epoch=lambda: int(self.state.epoch), drawn=drawn)
        return self.data_order

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        if self.args.should_save and self.data_order is not None and self.data_order.drawn is not None:
            write_data_order(Path(output_dir), self.data_order.drawn)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        """The checkpoint's trained weights, every one restored or the resume refused. The Trainer's own
        loading is not strict: a full fine-tune's weights, which transformers saves under the legacy key
        names that only from_pretrained maps back, all missed the model with a warning, and the run went on
        from the base weights."""
        model = self.model if model is None else model
        checkpoint = Path(resume_from_checkpoint)
        if (kind := kind_problem(checkpoint, not hasattr(model, "peft_config"))) is not None:
            raise CheckpointError(kind)
        if hasattr(model, "peft_config"):
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            check_adapter_weights(checkpoint, model)
            return
        saved = load_native(checkpoint, model.dtype)
        check_finite(checkpoint, saved.named_parameters())
        with torch.no_grad():
            model.load_state_dict(saved.state_dict(), strict=True)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        if self._evaluated and self._evaluated[0] == self.state.global_step:
            return self._evaluated[1]
        held_out = eval_dataset or self.eval_dataset
        evaluate = evaluate_pairs if isinstance(held_out[0], Pair) else evaluate_judge
        metrics = evaluate(Judge(self.model, self.judge.tokenizer, self.judge.settings, "training"), held_out, self.rubrics, self.image_root,
                           self.cfg, self.args.device)
        flat = {f"{metric_key_prefix}_{k}": v for k, v in flat_metrics(metrics).items()}
        if self.is_world_process_zero():
            append_history(self.history_file, {"step": self.state.global_step, "epoch": self.state.epoch, **metrics})
            tqdm.write(evaluation_line(self.state.global_step, self.state.epoch, metrics), file=sys.stderr)
        self.log(flat)
        self._evaluated = (self.state.global_step, flat)
        return flat


def judged_held_out(judge: Judge, items: list[Annotation] | list[Pair], rubrics, image_root: Path, cfg: TrainConfig, device) -> dict[int, object]:
    """The held-out samples (or pairs) judged by the scoring engine, as judge-score judges them, by position.

    Every rank scores the whole set, in the same batches: under ZeRO-3 every forward gathers weights
    collectively, so the ranks must make the same calls. generate keeps them in step when one rank's
    sequences end first (synced_gpus, which transformers turns on by itself under ZeRO-3)."""
    model = judge.model
    was_training = model.training
    model.eval()
    options = evaluation_options(cfg)
    prepared = prepare(judge, list(enumerate(items)), rubrics, image_root, options)
    # Every rank scores every item: rank 0's bar is the whole evaluation.
    with Bar("evaluating", len(items), rank=int(os.environ.get("RANK", "0")), leave=False) as bar:
        results = {index: result for batch in Scorer(judge, rubrics, options, device).judged(prepared, progress=bar.update) for index, result in batch}
    model.train(was_training)
    return results


def evaluate_judge(judge: Judge, annotations: list[Annotation], rubrics, image_root: Path, cfg: TrainConfig, device) -> dict:
    """Score the held-out set and compare with the (merged) human scores."""
    rated = merge_annotators(annotations)
    results = judged_held_out(judge, [r.annotation for r in rated], rubrics, image_root, cfg, device)
    metrics = {"samples": len(results), "parse_failures": sum(r.score is None for r in results.values())}
    for name in SCORE_FIELDS:
        pairs = [(_judge_value(results[i], name), r.scores[name]) for i, r in enumerate(rated) if name in r.scores]
        pairs = [(j, h) for j, h in pairs if j is not None]
        table = agreement_table([j for j, _ in pairs], [h for _, h in pairs], ScoreScale(*cfg.scale))
        metrics[name] = {stat: value.value for stat, value in table.items()}
    return metrics


def evaluate_pairs(judge: Judge, pairs: list[Pair], rubrics, image_root: Path, cfg: TrainConfig, device) -> dict:
    """Judge the held-out pairs in both orders and compare the final verdicts with people's (their majority)."""
    rated = merge_pair_annotators(pairs)
    results = judged_held_out(judge, [r.pair for r in rated], rubrics, image_root, cfg, device)
    compared = [(results[i].verdict, r.preference) for i, r in enumerate(rated) if results[i].verdict is not None]
    decisive = [(j, h) for j, h in compared if "tie" not in (j, h)]
    consistent = [r.swap_consistent for r in results.values() if r.swap_consistent is not None]
    first = [w for r in results.values() for order, shown in ORDERS.items() if (w := first_wins(order_verdict(getattr(r, order), r.rule), shown)) is not None]
    rate = lambda values: sum(values) / len(values) if values else None  # noqa: E731
    return {"pairs": len(rated), "parse_failures": sum(j.parse_error is not None for r in results.values() for j in r.forward + r.reverse),
            "accuracy_with_ties": rate([j == h for j, h in compared]), "accuracy_without_ties": rate([j == h for j, h in decisive]),
            "swap_consistency": rate(consistent), "first_shown_wins": rate(first)}


def evaluation_options(cfg: TrainConfig) -> ScoreOptions:
    """judge-score's options for the held-out set, cut to the training examples' image-token budget: the
    judge is measured on prompts like those it learns from. (Tiles per image need no option: cfg.max_tiles
    is already in the judge's settings, which both use.)"""
    return ScoreOptions(max_new_tokens=cfg.eval_max_new_tokens, token_budget=cfg.eval_token_budget,
                        image_token_budget=cfg.image_token_budget, workers=1)


def _judge_value(result: JudgeResult, name: str):
    return result.score if name == "overall" else result.criteria.get(name)


# The Trainer keeps the best checkpoint by this key, which every evaluation must log: the overall Pearson
# (trained on pairs, the accuracy with ties), or -1 where it is undefined (e.g. nothing parsed yet), the
# lowest rank. The measure itself is logged only where measured, so that -1 is never reported as a measurement.
MEASURES = {"pearson_overall": "overall Pearson", "accuracy_with_ties": "pairwise accuracy, ties counted as a verdict"}


def ranked_by(measure: str) -> str:
    return f"ranking_{measure}"


def evaluation_line(step: int, epoch: float | None, metrics: dict) -> str:
    """One evaluation in a line: the overall agreement (on pairs, the accuracy) that chooses the checkpoint,
    and how much parsed."""
    when = f"step {step}" + (f" (epoch {epoch:.2f})" if epoch is not None else "")
    if "pairs" in metrics:
        shown = lambda key: "undefined" if metrics.get(key) is None else f"{metrics[key]:.3f}"  # noqa: E731
        return (f"evaluation at {when}: pairwise accuracy {shown('accuracy_with_ties')} with ties, {shown('accuracy_without_ties')} without; "
                f"swap consistency {shown('swap_consistency')}, first shown wins {shown('first_shown_wins')}; "
                f"judgements unparsed: {metrics['parse_failures']} of {2 * metrics['pairs']}")
    overall = metrics.get("overall", {})
    shown = [("Pearson", "pearson", "{:.3f}"), ("MSE", "mse", "{:.3f}"), ("quadratic κ", "quadratic_kappa", "{:.3f}"),
             ("exact agreement", "exact_agreement", "{:.0%}")]
    if all(overall.get(key) is None for _, key, _ in shown):
        figures = "Pearson, MSE, quadratic κ and exact agreement undefined"
    else:
        figures = ", ".join(f"{label} {'undefined' if overall.get(key) is None else form.format(overall[key])}" for label, key, form in shown)
    samples = metrics.get("samples")
    parsed = f"{samples - metrics['parse_failures']} of {samples}" if samples is not None else f"{metrics['parse_failures']} failed"
    return f"evaluation at {when}: overall {figures}; outputs parsed: {parsed}"


class TrainingLines(ProgressCallback):
    """The Trainer's bar, named, with a short line per log instead of the dict of every value: loss, learning
    rate and gradient norm while training, the run's time and mean loss at its end. Evaluations are
    JudgeTrainer.evaluate's own line."""

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.training_bar = progress_bar(total=state.max_steps, desc="training", unit="step", dynamic_ncols=True)
        self.current_step = 0
        self.first_step = state.global_step  # past 0 where --resume restored a checkpoint's state

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.training_bar is None:
            return
        if "loss" in logs:
            # DeepSpeed's ZeRO-2 optimizer gives the Trainer no gradient norm: none is said, rather than "nan", which
            # reads as a diverged run
            norm = f", gradient norm {logs['grad_norm']:.3f}" if logs.get("grad_norm") is not None else ""
            # GRPO's loss says little of how it goes (near 0 whatever the rewards): its mean reward does
            reward = f", reward {logs['reward']:.3f}" if "reward" in logs else ""
            self.training_bar.write(f"step {state.global_step}/{state.max_steps} (epoch {logs.get('epoch', state.epoch):.2f}): loss {logs['loss']:.4f}, "
                                    f"learning rate {logs.get('learning_rate', float('nan')):.2e}{norm}{reward}", file=sys.stderr)
        elif "train_runtime" in logs:
            resumed = f" (resumed at step {self.first_step}, now at {state.global_step})" if self.first_step else ""
            self.training_bar.write(f"trained {state.global_step - self.first_step} steps{resumed} in {logs['train_runtime']:.0f}s "
                                    f"({logs.get('train_steps_per_second', 0):.2f} steps/s), mean loss {logs.get('train_loss', float('nan')):.4f}",
                                    file=sys.stderr)


# Library messages that every run printed and that say nothing about it: each silenced by its own words, so
# that any other message of the same library still shows.
HARMLESS_LOGS = {
    # DeepSpeed's accelerator detection, when the Trainer imports it on a machine without CUDA: a CPU run is a
    # CPU run by choice (training_arguments' use_cpu), not a GPU that went unseen.
    "DeepSpeed": "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.",
}
HARMLESS_WARNINGS = [
    # PEFT's get_peft_model (every LoRA run) reads transformers' `is_gradient_checkpointing`, which transformers 5
    # deprecates: PEFT's to change, nothing a user of judge-train can do or needs to know.
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
    # PEFT 0.20's save_pretrained looks for the base's config.json by the model's name_or_path, to tell whether
    # the vocabulary grew and the embeddings must be saved too; a judge converted from the original format has
    # no such path, and judge-train adds no token, so its assumption (not modified) is right. PEFT 0.21 says nothing.
    (UserWarning, r"Could not find a config file in .* will assume that the vocabulary was not modified"),
]


class _Harmless(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != HARMLESS_LOGS.get(record.name)


HARMLESS = _Harmless()


def quiet_known_noise() -> None:
    """Silence HARMLESS_LOGS and HARMLESS_WARNINGS, and transformers' own progress bars ("Writing model shards"
    at every checkpoint, "Loading weights"): a second bar for seconds of work, drawn under the training bar."""
    for name in HARMLESS_LOGS:
        logging.getLogger(name).addFilter(HARMLESS)  # once: a logger keeps one of each filter
    for category, message in HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    transformers_logging.disable_progress_bar()


def append_history(history_file: Path, evaluation: dict) -> None:
    """eval_history.json with one more evaluation, replaced whole: a crash while writing it leaves the
    evaluations before, which a rerun with --resume reads and extends."""
    history = json.loads(history_file.read_text()) if history_file.exists() else []
    write_json_atomically(history_file, [*history, evaluation])


def flat_metrics(metrics: dict) -> dict[str, float]:
    if "accuracy_with_ties" in metrics:  # pairs
        flat = {name: float(value) for name, value in metrics.items() if value is not None}
        flat[ranked_by("accuracy_with_ties")] = flat.get("accuracy_with_ties", -1.0)
        return flat
    flat = {"parse_failures": float(metrics["parse_failures"])}
    for name in SCORE_FIELDS:
        flat |= {f"{stat}_{name}": value for stat, value in metrics[name].items() if value is not None}
    flat[ranked_by("pearson_overall")] = flat.get("pearson_overall", -1.0)
    return flat


def training_arguments(cfg: TrainConfig, output_dir: Path, deepspeed: str | None, has_eval: bool, measure: str = "pearson_overall",
                       kind: type[TrainingArguments] = TrainingArguments, **more) -> TrainingArguments:
    """The Trainer's arguments from the settings; `kind` and `more`: a trainer's own subclass of them and its
    settings (TRL's GRPOConfig, train/grpo.py)."""
    on_gpu = torch.cuda.is_available()
    return kind(
        output_dir=str(output_dir),
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        warmup_steps=cfg.warmup_ratio,  # a float below 1 is a share of all steps
        lr_scheduler_type=cfg.lr_scheduler,
        num_train_epochs=cfg.num_epochs,
        max_steps=cfg.max_steps,
        bf16=on_gpu,
        **{CHECKPOINTING: cfg.gradient_checkpointing, f"{CHECKPOINTING}_kwargs": {"use_reentrant": False}},
        save_strategy="steps",
        save_steps=cfg.save_steps,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=cfg.save_steps,
        metric_for_best_model=ranked_by(measure) if has_eval else None,
        greater_is_better=True,
        logging_steps=cfg.logging_steps,
        remove_unused_columns=False,
        dataloader_num_workers=cfg.dataloader_workers,
        deepspeed=deepspeed,
        seed=cfg.seed,
        data_seed=cfg.seed,
        report_to=[],
        use_cpu=not on_gpu,
        # Many CPU processes (tests, a laptop) talk over gloo; one process needs no backend at all.
        ddp_backend="gloo" if not on_gpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        **more,
    )


def train(base: Checkpoint, annotations: tuple[list[Annotation], list[Annotation]], train_file: Path, image_root: Path,
          output_dir: Path, rubrics: dict[str, Rubric], cfg: TrainConfig, deepspeed: str | None, resume: bool) -> dict:
    """Fine-tune `base` on the (training, held-out) annotations read from train_file and the eval file (or
    pairs with a preference); the result says how the saved weights were chosen."""
    train_annotations, eval_annotations = annotations
    measure = "accuracy_with_ties" if isinstance(train_annotations[0], Pair) else "pearson_overall"
    quiet_known_noise()
    output_dir.mkdir(parents=True, exist_ok=True)
    judge = load_judge(base.path, "cpu", torch.bfloat16 if torch.cuda.is_available() else torch.float32)
    use_fused_kernels(judge.model, "cuda" if torch.cuda.is_available() else "cpu")  # the Trainer moves it to the GPU
    judge.settings = with_max_tiles(judge.settings, cfg.max_tiles)  # nothing to cut for a backbone without tiles (Qwen-VL)
    judge.model.config.use_cache = False
    dataset = build_dataset(judge, train_annotations, rubrics, image_root, cfg.max_length, cfg.image_token_budget, str(train_file))
    run_vision_in_every_batch(judge.model)
    model = apply_lora(judge, cfg)
    judge = Judge(model, judge.tokenizer, judge.settings, judge.source_format)
    trainer = JudgeTrainer(
        model=model,
        args=training_arguments(cfg, output_dir / CHECKPOINTS_DIR, deepspeed, bool(eval_annotations), measure),
        train_dataset=dataset,
        eval_dataset=eval_annotations or None,
        data_collator=Collator(judge.pad_id, judge.backbone, judge.settings.images),
        judge=judge, rubrics=rubrics, image_root=image_root, cfg=cfg,
        history_file=output_dir / "eval_history.json",
    )
    allow_checkpoint_types()  # on every rank, before DeepSpeed reads its shards weights-only
    trainer.train(resume_from_checkpoint=resumed_checkpoint(output_dir / CHECKPOINTS_DIR) if resume else None)
    save_judge(trainer, judge, base, output_dir, cfg)
    # The log history, restored on --resume, covers every evaluation of the run.
    measured = any(f"eval_{measure}" in entry for entry in trainer.state.log_history)
    return {"global_step": trainer.state.global_step, "best": trainer.state.best_metric if measured else None, "measure": MEASURES[measure]}


def resumed_checkpoint(checkpoints: Path) -> str:
    """The newest checkpoint saved whole (judge-train checked there is one), saying which newer ones it skips."""
    checkpoint, skipped = resume_point(checkpoints)
    if int(os.environ.get("RANK", "0")) == 0:
        for line in skipped:
            print(f"note: {line}; resuming from {checkpoint.name}", file=sys.stderr)
        print(f"resuming from {checkpoint}", file=sys.stderr)
        if not (checkpoint / DATA_ORDER).is_file():
            print(f"note: {checkpoint.name} holds no {DATA_ORDER} (saved before judge-train kept one): resumed part-way through "
                  "an epoch after the first, the rest of that epoch comes in another order than the run it resumes", file=sys.stderr)
    return str(checkpoint)


# What a Trainer checkpoint holds of the model itself: a LoRA adapter, or the full native weights.
MODEL_FILES = ("adapter_model.safetensors", "adapter_config.json", "config.json", "generation_config.json",
               "model.safetensors", "model.safetensors.index.json")


def save_judge(trainer: Trainer, judge: Judge, base: Checkpoint, output_dir: Path, cfg: TrainConfig) -> None:
    """What judge-score --model_path OUT needs: the best checkpoint's adapter (or full weights), the
    tokenizer and the judge settings. The best checkpoint's files are copied as they are: reloading them
    through the Trainer would go through key renames that InternVL's saved names do not survive.

    Every rank calls this: without a best checkpoint the weights are saved by the Trainer, which under
    ZeRO-3 gathers the partitioned weights from all ranks (the model's own save_pretrained would write
    rank 0's empty partitions). Only rank 0 writes."""
    best = trainer.state.best_model_checkpoint
    if not best:
        trainer.save_model(str(output_dir))
    if not trainer.is_world_process_zero():
        return
    if best:
        for file in Path(best).iterdir():
            if file.name in MODEL_FILES or (file.name.startswith("model-") and file.suffix == ".safetensors"):
                shutil.copy2(file, output_dir / file.name)
    adapter_config = output_dir / "adapter_config.json"
    if adapter_config.exists():  # point the adapter at its base wherever the run started from
        config = json.loads(adapter_config.read_text())
        # A Hub base by its id, pinned to the commit trained over: its cache path would not travel, and main may move on.
        where = {"base_model_name_or_path": base.hub_id, "revision": base.commit} if base.hub_id else {"base_model_name_or_path": str(base.path.resolve())}
        write_json_atomically(adapter_config, {**config, **where})
    save_tokenizer(judge.tokenizer, output_dir)  # an adapter's too, for the tools that read it beside the adapter (vLLM's LoRA)
    write_settings(judge.settings, output_dir)
    write_json_atomically(output_dir / "train_config.json", asdict(cfg))
