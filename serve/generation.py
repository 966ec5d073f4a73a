"""Free-form greedy generation with log-probabilities, for /v1/chat/completions.

Kept to one function, `generate_greedy`, over transformers' `generate`: the scoring engine's own decoder
(infer/engine.py) is to take this work over, and then only this function changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from judge.model import Judge
from judge.prompts import IMAGE_TOKENS
from judge.templates import get_template


@dataclass
class ChatPrompt:
    input_ids: torch.Tensor  # 1-D: the rendered prompt, image tokens expanded
    pixels: torch.Tensor | None  # every tile of every image, in prompt order
    max_new_tokens: int
    top_logprobs: int


@dataclass
class Generated:
    tokens: list[int]  # what the judge wrote, its stop token included when it wrote one
    logprobs: list[float]  # of each token
    top: list[list[tuple[int, float]]]  # each step's `top_logprobs` likeliest tokens, with their log-probabilities


class StepLogprobs(LogitsProcessor):
    """Keeps the top-k log-probabilities of each step (after generate's own processors, which under greedy
    decoding only suppress the image tokens), not the whole vocabulary of every step."""

    def __init__(self, k: int):
        self.k, self.values, self.ids = k, [], []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        values, ids = scores.float().log_softmax(-1).topk(self.k, dim=-1)
        self.values.append(values.cpu())
        self.ids.append(ids.cpu())
        return scores


@torch.no_grad()
def generate_greedy(judge: Judge, prompts: list[ChatPrompt]) -> list[Generated]:
    """Greedy answers of a batch of prompts (left-padded, one `generate` call), each cut at its own stop
    token and max_new_tokens. The first of each step's top tokens is the one written: greedy decoding
    writes the likeliest."""
    tokenizer, model = judge.tokenizer, judge.model
    parameter = next(model.parameters())
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stop_id = tokenizer.convert_tokens_to_ids(get_template(judge.settings.template).stop_token)
    width = max(len(p.input_ids) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, prompt in enumerate(prompts):  # left padding: every prompt ends at the last column
        input_ids[row, width - len(prompt.input_ids):] = prompt.input_ids
        attention_mask[row, width - len(prompt.input_ids):] = 1
    inputs = {"input_ids": input_ids.to(parameter.device), "attention_mask": attention_mask.to(parameter.device)}
    if pixels := [p.pixels for p in prompts if p.pixels is not None]:
        inputs["pixel_values"] = torch.cat(pixels).to(parameter.device, parameter.dtype)
    config = GenerationConfig(max_new_tokens=max(p.max_new_tokens for p in prompts), do_sample=False, eos_token_id=stop_id,
                              pad_token_id=pad_id, suppress_tokens=tokenizer.convert_tokens_to_ids(list(IMAGE_TOKENS)))
    steps = StepLogprobs(max(1, *(p.top_logprobs for p in prompts)))
    written = model.generate(**inputs, generation_config=config, logits_processor=LogitsProcessorList([steps]))[:, width:].tolist()
    answers = []
    for row, (prompt, tokens) in enumerate(zip(prompts, written)):
        tokens = tokens[: prompt.max_new_tokens]
        if stop_id in tokens:
            tokens = tokens[: tokens.index(stop_id) + 1]
        answers.append(Generated(
            tokens=tokens,
            logprobs=[steps.values[step][row, 0].item() for step in range(len(tokens))],
            top=[list(zip(steps.ids[step][row, : prompt.top_logprobs].tolist(), steps.values[step][row, : prompt.top_logprobs].tolist()))
                 for step in range(len(tokens))],
        ))
    return answers
