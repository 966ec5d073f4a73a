"""judge-score with a reward model (judge-train --objective bradley_terry, judge/reward_model.py): each prompt is one
prefill and its reward the head's output at its last token; nothing is decoded. A sample's record carries
`reward` (no score, feedback or criteria: the model writes none); a pair is scored answer by answer under a
pointwise rubric, and its verdict is the reward difference against the tie margin (judge/preferences.py), the
same in either order since each answer is scored alone. The prompts are the engine's (`prepare`), and the
pairs are collected by the engine's Scorer.judged, as a pointwise judge's are."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from mmjudge.infer.engine import Prepared, Scorer, _load_pixels
from mmjudge.judge.preferences import ORDERS
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import JudgeResult, UsageError
from mmjudge.judge.model import Judge, read_json_object
from mmjudge.judge.prompts import Rubric
from mmjudge.judge.reward_model import HEAD_KEY, is_reward_model, rewards


def pairwise_refusal(categories: set[str]) -> list[str]:
    """A reward model cannot judge a pair as a pairwise rubric asks, in both orders: why, naming the categories."""
    return [f"--rubric: a reward model scores one answer at a time, under a pointwise rubric; the rubric of category "
            f"{', '.join(sorted(categories))} is pairwise: give a pointwise rubric of that category"] if categories else []


def is_reward_checkpoint(model_dir: Path) -> bool:
    """Whether a checkpoint is a reward model, read from its config.json alone (before the weights load)."""
    config = model_dir / "config.json"
    return not (model_dir / "adapter_config.json").is_file() and config.is_file() and HEAD_KEY in read_json_object(config)


class RewardScorer(Scorer):
    """The engine's Scorer with a prefill in place of decoding (module docstring)."""

    decoder = None  # nothing is decoded

    def __init__(self, judge: Judge, rubrics: dict[str, Rubric], options: ScoreOptions, device: str):
        self.judge, self.rubrics, self.options, self.device = judge, rubrics, options, device

    def run(self, items: list[Prepared], cancelled: Callable[[Prepared], bool] | None = None,
            progress: Callable[[float], None] | None = None) -> Iterator[list[tuple[Prepared, JudgeResult]]]:
        model = self.judge.model
        if refused := pairwise_refusal({item.sample.category for item in items if item.view in ORDERS}):
            raise UsageError(refused[0])
        for item in items:
            if cancelled and cancelled(item):
                continue
            with torch.no_grad():
                reward = rewards(model, self._inputs(item)).item()
            if progress:
                progress(1)
            yield [(item, self._reward_result(item, reward))]

    def _inputs(self, item: Prepared) -> dict[str, torch.Tensor]:
        """One prompt as the model's inputs: its rotary positions by its backbone's rule, and its images."""
        backbone = self.judge.backbone
        ids = item.input_ids.long()
        pixels = _load_pixels(item, next(self.judge.model.parameters()).dtype, pin=False)
        positions, _ = backbone.positions(ids, None if pixels is None else pixels.grids)
        inputs = {"input_ids": ids[None], "attention_mask": torch.ones_like(ids)[None],
                  "position_ids": positions[:, None] if backbone.mrope else positions}
        if pixels is not None:
            inputs |= backbone.model_inputs(pixels)
        return {name: value.to(self.device) for name, value in inputs.items()}

    def _reward_result(self, item: Prepared, reward: float) -> JudgeResult:
        result = self._result(item, "", None, {}, None, None, 0)
        result.reward = reward
        return result


def scorer_for(judge: Judge, rubrics: dict[str, Rubric], options: ScoreOptions, device: str) -> Scorer:
    """The engine's Scorer for a generative judge, a RewardScorer for a reward model."""
    return (RewardScorer if is_reward_model(judge.model) else Scorer)(judge, rubrics, options, device)
