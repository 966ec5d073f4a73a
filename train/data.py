"""Annotations -> training examples: the prompt judge-score builds, and as target the text judge-score
parses, with the loss only on the target and its stop token.

    [BOS] <|system|>..<|end|><|user|>\\n{rubric, question, answer}<|end|><|assistant|>\\n | {target}<|end|> [pad...]
    labels: -100 ...................................................................... | target ids + stop | -100

Prompt and target are tokenized separately, exactly as at inference time, where the prompt is
tokenized alone and the judge continues it.

Several annotators of one id are merged into one judgement: the critique is the first annotator's
`feedback` (the first who wrote one), and each criterion's score is the mean of the annotators who rated it,
at the rubric's nearest level; a mean half-way between two levels goes to the level on that critic's side.
MMIE's rounding (half-way to even) would round the criteria of one judgement apart: annotators at overall 3
and 4, coherence 2 and 3, would give overall 4 (3.5) beside coherence 2 (2.5), a pair neither wrote and
that the answer cannot predict. The individual ratings stay in the file for `judge-calibrate`, and the
evaluation compares with their mean.

Pairs with a preference are learnt the same way under a pairwise rubric: each pair in both orders (swap
augmentation, as JudgeLM and IntJudge train), the target the rubric's verdict format writing people's
verdict in the order shown (their majority, and each criterion's), after their rationale when they gave one
(in the reverse order, its "Answer A" and "Answer B" change places, as the answers do).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

import torch
from datasets import Dataset
from transformers.trainer_pt_utils import LengthGroupedSampler

from mmjudge.infer.progress import Bar, counted
from mmjudge.judge.backbones import Backbone
from mmjudge.judge.data import Annotation, InputError, Pair, Problem, UsageError, holds_pairs, load_annotations, load_pairs, majority
from mmjudge.judge.model import Judge
from mmjudge.judge.parsing import ScoreScale, format_judgement
from mmjudge.judge.preferences import in_pair_terms
from mmjudge.judge.prompts import Rubric, build_pair_prompt, build_prompt, encode_prompt, rubric_problems
from mmjudge.judge.templates import join_parts
from mmjudge.judge.verdicts import VERDICT_FORMATS
from mmjudge.judge.vision import ImageProcessing, Pixels, load_pixels

IGNORE_INDEX = -100  # labels the loss skips (torch's cross_entropy default)


def read_annotations(train_file: Path, eval_file: Path | None, image_root: Path, rubrics: dict[str, Rubric],
                     scale: tuple[float, float], objective: str = "sft") -> tuple[list[Annotation], list[Annotation]] | tuple[list[Pair], list[Pair]]:
    """The training and held-out annotations (none without an eval file), or pairs with a preference where
    the training file holds pairs, with every problem of both files in one error: a record that cannot work,
    or a category no rubric judges, or one whose rubric judges the other kind (found before the model loads).
    A reward head (objective bradley_terry) learns from pairs only, each answer under a pointwise rubric: it
    scores one answer at a time, as judge-score scores a pair with a pointwise judge. GRPO learns from pairs
    only too, under their pairwise rubric."""
    pairs = holds_pairs(train_file)
    if objective in ("bradley_terry", "grpo") and not pairs:
        raise InputError([Problem(str(train_file), f"objective {objective} learns from pairs with a preference (answer_a, answer_b, "
                                                   "preference: docs/formats.md); this file holds samples")])
    wanted = "pointwise" if objective == "bradley_terry" else "pairwise"
    loaded, problems = {}, []
    for file in filter(None, (train_file, eval_file)):
        try:
            loaded[file] = load_pairs(file, image_root, preferred=True) if pairs else load_annotations(file, image_root, scale)
        except InputError as err:
            problems += err.problems
            continue
        problems += rubric_problems(loaded[file], rubrics, file)
        if pairs:  # a pair under a pointwise rubric has no verdict to learn; a reward head has no verdict to write
            other = sorted({p.category for p in loaded[file] if p.category in rubrics and rubrics[p.category].kind != wanted})
            if objective == "bradley_terry" and all(r.preference == "tie" for r in merge_pair_annotators(loaded[file])):
                problems.append(Problem(str(file), "no pair with a preference other than tie: a reward head learns (and is measured) by "
                                                   "which answer people preferred, and ties are kept out"))
            problems += [Problem(str(file), f"the rubric of category {c} is of kind {rubrics[c].kind}; judge-train learns "
                                            + ("pairs' verdicts with a pairwise rubric" if wanted == "pairwise" else
                                               "a reward head (bradley_terry) on each answer under a pointwise rubric")
                                            + ": give one with --rubric") for c in other]
    if problems:
        raise InputError(problems)
    return loaded[train_file], loaded.get(eval_file, [])


def check_scales(annotations: list[Annotation], rubrics: dict[str, Rubric], scale: tuple[float, float]) -> None:
    """The rubrics that judge `annotations` must score on their scale: the targets are written on the
    rubric's, where a human 8 of 0-10 is no 0-6 score at all ('### Score None'). Pairs have no scale."""
    if annotations and isinstance(annotations[0], Pair):
        return
    low, high = scale
    used = [rubrics[c] for c in sorted({a.category for a in annotations})]
    if other := [r for r in used if r.score_scale.bounds != (low, high)]:
        named = ", ".join(f"{r.category!r} ({r.score_scale.low:g}-{r.score_scale.high:g})" for r in other)
        raise UsageError(f"the annotations' scale {low:g}-{high:g} (--scale, or the config's scale) is not that of rubric {named}; "
                         f"give the rubrics' scale with --scale, or rubrics that score {low:g}-{high:g}")


@dataclass(frozen=True)
class RatedSample:
    """One id with its annotators merged into the training target (module docstring)."""

    annotation: Annotation  # the first record of the id (question, answer, images)
    index: int  # that record's place in the annotations: its record number in the file, for messages
    scores: dict[str, float]  # each criterion's mean over the annotators who rated it
    feedback: str | None
    critic_scores: dict[str, float]  # the scores of the annotator whose feedback the target carries


def merge_annotators(annotations: list[Annotation]) -> list[RatedSample]:
    by_id: dict[str, list[Annotation]] = {}
    first_index: dict[str, int] = {}
    for index, a in enumerate(annotations):
        by_id.setdefault(a.id, []).append(a)
        first_index.setdefault(a.id, index)
    merged = []
    for sample_id, group in by_id.items():
        names = {name for a in group for name in a.human_scores.given()}
        scores = {name: mean(a.human_scores.given()[name] for a in group if name in a.human_scores.given()) for name in sorted(names)}
        critic = next((a for a in group if a.feedback), group[0])
        merged.append(RatedSample(group[0], first_index[sample_id], scores, critic.feedback, critic.human_scores.given()))
    return merged


def target_text(rated: RatedSample, rubric: Rubric) -> str:
    scale = rubric.score_scale
    levels = {name: consensus_level(rated.scores[name], rated.critic_scores.get(name), scale) for name in rated.scores}
    criteria = {name: levels[name] for name in rubric.criteria if name in levels}
    return format_judgement(levels.get("overall"), criteria, rubric.criteria, rated.feedback, scale)


def consensus_level(mean_score: float, critic: float | None, scale: ScoreScale) -> float:
    """The annotators' mean at the scale's nearest level; half-way between two, the level on the critic's side
    (module docstring), or MMIE's rounding where the critic gave no score or the mean itself."""
    below = scale.low + math.floor(round((mean_score - scale.low) / scale.step, 9)) * scale.step
    if critic is None or critic == mean_score or not math.isclose(mean_score - below, scale.step / 2):
        return mean_score
    return below if critic < mean_score else below + scale.step


def encode(judge: Judge, rated: RatedSample, rubric: Rubric, image_root: Path, image_token_budget: int | None) -> dict:
    """One example as plain lists, ready for a datasets.Dataset."""
    settings = judge.settings
    prompt = build_prompt(rated.annotation, rubric, settings.template, settings.system_message, image_root, settings.images, image_token_budget)
    return _example(judge, rated.annotation.id, prompt, target_text(rated, rubric))


def _example(judge: Judge, example_id: str, prompt, target: str) -> dict:
    prompt_ids = encode_prompt(judge.tokenizer, prompt.text, prompt.controls)
    target_ids = encode_prompt(judge.tokenizer, *join_parts(judge.settings.template.target_parts(target)), add_special_tokens=False)
    return {
        "id": example_id,
        "input_ids": prompt_ids + target_ids,
        "labels": [IGNORE_INDEX] * len(prompt_ids) + target_ids,
        "length": len(prompt_ids) + len(target_ids),
        "image_paths": [str(image.path) for image in prompt.images],
        # each image's processing as the image-token budget left it (fewer tiles, fewer pixels)
        "image_settings": [json.dumps(image.processing.stored()) for image in prompt.images],
        "n_tiles": prompt.n_tiles,
        "truncated": prompt.truncated,
    }


def build_dataset(
    judge: Judge, annotations: list[Annotation] | list[Pair], rubrics: dict[str, Rubric], image_root: Path,
    max_length: int, image_token_budget: int | None, source: str,
) -> Dataset:
    """Encode every rated sample (every rated pair, in both orders); any that is still longer than max_length,
    or whose verdict its rubric's format cannot write, is an error naming it."""
    with Bar("encoding", len({a.id for a in annotations}), rank=int(os.environ.get("RANK", "0"))) as bar:  # every rank encodes them all
        if annotations and isinstance(annotations[0], Pair):
            rows, places = _encoded_pairs(judge, annotations, rubrics, image_root, image_token_budget, source, bar)
        else:
            rated = merge_annotators(annotations)
            rows = [encode(judge, r, rubrics[r.annotation.category], image_root, image_token_budget) for r in counted(rated, bar)]
            places = [(r.index, r.annotation.id) for r in rated]
    too_long = [Problem(source, f"{row['length']} tokens after image-token budgeting exceed max_length {max_length}; "
                                "raise max_length or lower image_token_budget / max_tiles", index, record_id)
                for (index, record_id), row in zip(places, rows) if row["length"] > max_length]
    if too_long:
        raise InputError(too_long)
    return Dataset.from_list(rows)


def _encoded_pairs(judge: Judge, pairs: list[Pair], rubrics: dict[str, Rubric], image_root: Path, image_token_budget: int | None,
                   source: str, bar: Bar) -> tuple[list[dict], list[tuple[int, str]]]:
    """Both orders of every rated pair as examples, and each one's (record number, id) for messages."""
    rows, places, problems = [], [], []
    for r in counted(merge_pair_annotators(pairs), bar):
        rubric = rubrics[r.pair.category]
        try:
            pair_target(r, rubric, "A")
        except ValueError as err:
            problems.append(Problem(source, f"{err}: the {rubric.verdict_format} rubric of category {r.pair.category} cannot learn this "
                                            "pair's preference", r.index, r.pair.id, "preference"))
            continue
        for first in ("A", "B"):
            rows.append(encode_pair(judge, r, rubric, first, image_root, image_token_budget))
            places.append((r.index, r.pair.id))
    if problems:
        raise InputError(problems)
    return rows, places


@dataclass(frozen=True)
class RatedPair:
    """One pair with its annotators merged into the training target."""

    pair: Pair  # the first record of the id
    index: int  # its record number in the file, for messages
    preference: str  # people's majority (a tie where they split)
    criteria: dict[str, str]  # each criterion's majority, where people gave one
    rationale: str | None


def merge_pair_annotators(pairs: list[Pair]) -> list[RatedPair]:
    by_id: dict[str, list[tuple[int, Pair]]] = {}
    for index, pair in enumerate(pairs):
        by_id.setdefault(pair.id, []).append((index, pair))
    merged = []
    for group in by_id.values():
        records = [pair for _, pair in group]
        names = sorted({name for pair in records for name in pair.criteria})
        criteria = {name: majority([pair.criteria.get(name) for pair in records if name in pair.criteria]) for name in names}
        rationale = next((pair.rationale for pair in records if pair.rationale), None)
        merged.append(RatedPair(records[0], group[0][0], majority([pair.preference for pair in records]), criteria, rationale))
    return merged


# "Answer A", "response B", "Assistant A" in a rationale: the answers as the order shown names them.
_NAMED = re.compile(r"\b(answer|response|assistant|output)(\s+)([AB])\b", re.IGNORECASE)


def in_order(rationale: str | None, first: str) -> str | None:
    """People's rationale as the judge must write it with answer `first` shown first: in the reverse order the
    answers change places, and so do their names in it ("Answer A is vague" is about the answer now shown as B).
    A rationale that names them otherwise ("the first one") is kept as it is."""
    if rationale is None or first == "A":
        return rationale
    return _NAMED.sub(lambda m: m.group(1) + m.group(2) + {"A": "B", "B": "A"}[m.group(3).upper()], rationale)


def pair_target(rated: RatedPair, rubric: Rubric, first: str) -> str:
    """What the judge should write with answer `first` shown first: people's rationale and verdict in the
    order shown."""
    criteria = {name: in_pair_terms(rated.criteria[name], first) for name in rubric.criteria if name in rated.criteria}
    return VERDICT_FORMATS[rubric.verdict_format].write(in_pair_terms(rated.preference, first), criteria, rubric.criteria, in_order(rated.rationale, first))


def encode_pair(judge: Judge, rated: RatedPair, rubric: Rubric, first: str, image_root: Path, image_token_budget: int | None) -> dict:
    """One order of one pair as an example, as `encode` makes one of a sample."""
    settings = judge.settings
    prompt = build_pair_prompt(rated.pair, first, rubric, settings.template, settings.system_message, image_root, settings.images,
                               image_token_budget)
    return _example(judge, f"{rated.pair.id}#{'forward' if first == 'A' else 'reverse'}", prompt, pair_target(rated, rubric, first))


class Collator:
    """Right-pads a batch and loads its images (decoding happens in DataLoader workers). Each row's rotary
    positions are its own, by its backbone's rule (1-D, or Qwen-VL's 3-D M-RoPE over its own image grids),
    its pads repeating its last position: a row's long-rope regime then comes from its own length, not the
    batch's width (judge/rope.py), and its loss is the loss it has alone."""

    def __init__(self, pad_id: int, backbone: Backbone, images: ImageProcessing):
        self.pad_id, self.backbone, self.images = pad_id, backbone, images

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(r["input_ids"]) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        positions, loaded = [], []
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            input_ids[i, :n], labels[i, :n], attention_mask[i, :n] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"]), 1
            images = [load_pixels(path, self.images.restored(json.loads(stored))) for path, stored in zip(r["image_paths"], r["image_settings"])]
            pixels = Pixels.cat(images)
            row, _ = self.backbone.positions(input_ids[i, :n], None if pixels is None else pixels.grids)
            positions.append(row[:, torch.minimum(torch.arange(width), torch.tensor(n - 1))])
            loaded += images
        position_ids = torch.stack(positions, dim=1)  # (axes, batch, width)
        batch = {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask,
                 "position_ids": position_ids if self.backbone.mrope else position_ids[0]}
        if pixels := Pixels.cat(loaded):
            batch |= self.backbone.model_inputs(pixels)
        return batch


class EpochOrder(LengthGroupedSampler):
    """The Trainer's `group_by_length` order, drawn as its own sampler draws it (from the global RNG, at the
    start of each epoch), remembering the RNG state each epoch's order was drawn from: `drawn`, which a
    checkpoint carries (train/checkpoints.py), so that a run resumed part-way through epoch e draws epoch
    e's order again.

    Why: the Trainer skips the batches already trained of the resumed epoch, but draws its order from the
    RNG as seeded afresh, and restores the checkpoint's RNG states only after. That is the first epoch's
    order, so a resume in the first epoch was exact; in any later epoch the rest of the epoch came in
    another order (a resume at step 9 of 12, in the second epoch, ended 4.4e-4 away from the run it resumed).
    `epoch` says which epoch a draw is for (the Trainer's state: the checkpoint's epoch on resume)."""

    def __init__(self, batch_size: int, lengths: list[int], epoch: Callable[[], int], drawn: tuple[int, torch.Tensor] | None = None):
        super().__init__(batch_size, lengths=lengths)
        self.epoch = epoch
        self.drawn = drawn  # (epoch, the RNG state its order was drawn from)

    def __iter__(self):
        epoch = self.epoch()
        if self.drawn is not None and self.drawn[0] == epoch:  # resumed part-way through this epoch
            torch.set_rng_state(self.drawn[1])  # the Trainer restores the checkpoint's own states after this draw
        self.drawn = (epoch, torch.get_rng_state())
        return super().__iter__()
