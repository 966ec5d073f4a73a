"""Batched scoring: prompts -> token-budget batches -> one vision pass per batch -> batched greedy
decoding (or one forward pass in logits mode) -> parsed results.

Why it is fast: samples are sorted by length so padding stays small, a batch is as large as the token
budget allows instead of one sample, image decoding and tiling run in background threads while the
model works, and the vision tower sees every tile of a batch in one call.

Score distributions (the probability of each score value, on scales whose scores are one token each;
other scales have none):
- logits mode: read right after the prompt plus a forced `### Score` heading; `score` is its argmax.
- generate mode, score parsed: read at the token where the judge wrote its score.
- generate mode, parse failure (`parse_error` set, `score` null): read right after a forced
  `\\n### Score\\n` appended to everything the judge wrote, in one extra forward pass over the batch's
  failures. `score` stays null; `expected_score` comes from this forced distribution. So a record with
  both `parse_error` and `score_distribution` carries a forced reading.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from infer.options import ScoreOptions
from judge.cli import UsageError
from judge.data import JudgeResult, Sample
from judge.model import Judge, with_max_tiles
from judge.parsing import SCORE_HEADING, ScoreScale, parse_judgement
from judge.prompts import IMAGE_TOKENS, PlannedImage, Rubric, build_prompt, encode_prompt
from judge.templates import get_template
from judge.tiling import load_tiles


@dataclass
class Prepared:
    """A sample ready for the model. The prompt's text is not kept: its token ids say the same, and the
    text, with 256 `<IMG_CONTEXT>` spelled out per tile, would be the largest thing held per sample."""

    index: int  # position in the input file
    sample: Sample
    images: list[PlannedImage]  # the images shown, in prompt order
    truncated: list[str]
    input_ids: torch.Tensor  # 1-D int32: a list of Python ints takes 9x the memory (GiBs for 20k long prompts)

    @property
    def n_tiles(self) -> int:
        return sum(image.n_tiles for image in self.images)


def prepare(judge: Judge, samples: Iterable[tuple[int, Sample]], rubrics: dict[str, Rubric], image_root: Path, options: ScoreOptions) -> list[Prepared]:
    """Prompts and token ids for every sample; cheap per sample (image headers only, no pixel decoding),
    but minutes for tens of thousands: callers pass `samples` through a progress bar."""
    settings = with_max_tiles(judge.settings, options.max_tiles)
    template = get_template(settings.template)
    count_tokens = lambda text: len(judge.tokenizer(text, add_special_tokens=False).input_ids)  # noqa: E731
    prepared = []
    for index, sample in samples:
        prompt = build_prompt(
            sample, rubrics[sample.category], template, settings.system_message, image_root,
            settings.tiling, settings.tokens_per_tile, options.image_token_budget, options.prompt_token_budget, count_tokens,
        )
        text = prompt.text + (f"{SCORE_HEADING}\n" if options.mode == "logits" else "")
        ids = torch.tensor(encode_prompt(judge.tokenizer, text, prompt.controls), dtype=torch.int32)
        prepared.append(Prepared(index, sample, prompt.images, prompt.truncated, ids))
    return prepared


def plan_batches(lengths: list[int], new_tokens: int, token_budget: int) -> list[list[int]]:
    """Group sample positions, longest first, so that batch size x (longest + new tokens) stays within
    the budget. A sample longer than the budget alone still gets a batch of its own: none is dropped."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * (lengths[batches[-1][0]] + new_tokens) <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def continuation_ids(tokenizer, text: str) -> list[int]:
    """The token ids `text` adds after other text. Tokenized alone, a SentencePiece tokenizer would start
    it with a word-start marker that it does not get in the middle of a text."""
    before = tokenizer("x", add_special_tokens=False).input_ids
    after = tokenizer(f"x{text}", add_special_tokens=False).input_ids
    if after[: len(before)] != before:
        raise ValueError(f"{text!r} merges with the text before it into other tokens")
    return after[len(before):]


def score_token_ids(tokenizer, scale: ScoreScale) -> dict[int, int]:
    """Token id of each score value as the judge writes it right after the score heading."""
    if not scale.integral:
        raise ValueError(f"scores on the scale {scale} are written with a decimal point, in several tokens")
    heading = continuation_ids(tokenizer, f"\n{SCORE_HEADING}\n")
    ids = {}
    for value in scale.levels:
        full = continuation_ids(tokenizer, f"\n{SCORE_HEADING}\n{value}")
        if full[: len(heading)] != heading or len(full) != len(heading) + 1:
            raise ValueError(f"score {value} is not a single token after '{SCORE_HEADING}'")
        ids[value] = full[-1]
    return ids


def expected_score(distribution: dict[str, float] | None) -> float | None:
    return sum(int(k) * p for k, p in distribution.items()) if distribution else None


def _load_pixels(item: Prepared) -> torch.Tensor | None:
    tiles = [load_tiles(image.path, image.tiling) for image in item.images]
    for image, t in zip(item.images, tiles):
        if t.shape[0] != image.n_tiles:
            raise RuntimeError(f"{image.path}: planned {image.n_tiles} tiles, tiling produced {t.shape[0]}")
    return torch.cat(tiles) if tiles else None


def _batch_tensors(sequences: list[torch.Tensor], pixels: list[torch.Tensor | None], pad_id: int, device, dtype):
    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, ids in enumerate(sequences):  # left padding: every prompt ends at the last column
        input_ids[row, width - len(ids):] = ids
        attention_mask[row, width - len(ids):] = 1
    inputs = {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device)}
    # Only when there are images: generate() runs the image encoder on any pixel_values, None included.
    if present := [p for p in pixels if p is not None]:
        inputs["pixel_values"] = torch.cat(present).to(device, dtype)
    return inputs


class ScoreTokenLogits(LogitsProcessor):
    """Records the logits of the score tokens alone at every generation step: a few numbers per sequence
    and step, where generate's output_logits would keep the whole vocabulary of every step.

    generate runs its own processors before this one; under greedy decoding they touch the stop token
    only (min_new_tokens), unless a checkpoint's generation_config.json asks for penalties, which
    InternVL2's does not. So these are the model's raw logits, as output_logits would give them."""

    def __init__(self, token_ids: torch.Tensor):
        self.token_ids = token_ids
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.steps.append(scores[:, self.token_ids])  # indexing copies: later processors cannot change it
        return scores

    def logits(self) -> torch.Tensor:
        """(batch, steps, score tokens)"""
        return torch.stack(self.steps, dim=1)


class Scorer:
    """Runs prepared samples through one judge; `run` yields (Prepared, JudgeResult) pairs batch by batch."""

    def __init__(self, judge: Judge, rubrics: dict[str, Rubric], options: ScoreOptions, device: str):
        self.judge, self.rubrics, self.options, self.device = judge, rubrics, options, device
        self.dtype = next(judge.model.parameters()).dtype
        tokenizer = judge.tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_id = tokenizer.convert_tokens_to_ids(get_template(judge.settings.template).stop_token)
        self.image_token_ids = tokenizer.convert_tokens_to_ids(list(IMAGE_TOKENS))
        # A score distribution is read from the one token the judge writes its score with; scales whose
        # scores take several tokens (0.7, or 10 with a digit-splitting tokenizer) have none.
        self.score_ids: dict[ScoreScale, dict[int, int] | None] = {}
        for rubric in rubrics.values():
            try:
                self.score_ids[rubric.score_scale] = score_token_ids(tokenizer, rubric.score_scale)
            except ValueError as err:
                self.score_ids[rubric.score_scale] = None
                if options.mode == "logits":
                    raise UsageError(f"--mode logits reads the score from one token, but rubric {rubric.category!r}: {err}; "
                                     "use --mode generate") from None
        self.forced_heading = continuation_ids(tokenizer, f"\n{SCORE_HEADING}\n")
        # Only these vocabulary columns are ever read ("score logits"); each scale's score tokens are a subset.
        tokens = sorted({t for ids in self.score_ids.values() if ids for t in ids.values()})
        self.score_tokens = torch.tensor(tokens, dtype=torch.long, device=device)
        self.score_columns = {scale: [tokens.index(t) for t in ids.values()] for scale, ids in self.score_ids.items() if ids}

    def run(self, items: list[Prepared]) -> Iterator[list[tuple[Prepared, JudgeResult]]]:
        new_tokens = 0 if self.options.mode == "logits" else self.options.max_new_tokens
        batches = plan_batches([len(i.input_ids) for i in items], new_tokens, self.options.token_budget)
        with ThreadPoolExecutor(self.options.workers) as pool:
            pending: list[list[Future]] = []
            for b in range(len(batches) + self.options.prefetch):
                if b < len(batches):
                    pending.append([pool.submit(_load_pixels, items[i]) for i in batches[b]])
                if b >= self.options.prefetch:
                    done = b - self.options.prefetch
                    batch = [items[i] for i in batches[done]]
                    yield self._score_batch(batch, [f.result() for f in pending[done]])
                    pending[done] = []

    def _score_batch(self, batch: list[Prepared], pixels: list[torch.Tensor | None]) -> list[tuple[Prepared, JudgeResult]]:
        """Score a batch; if the device runs out of memory anyway (the budget is an estimate), split it in
        halves and retry, down to one sample, so that no sample is lost to a too-large batch. A sample that
        does not fit alone stops the run with what to change (its finished batches stay in the journal)."""
        try:
            return self._forward(batch, pixels)
        except torch.OutOfMemoryError:
            if len(batch) == 1:
                item = batch[0]
                raise UsageError(f"sample {item.sample.id!r} (record {item.index}: {len(item.input_ids)} prompt tokens, {item.n_tiles} tiles) "
                                 f"does not fit in {self.device} memory even alone; lower --max_tiles or set --image_token_budget") from None
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            half = len(batch) // 2
            return self._score_batch(batch[:half], pixels[:half]) + self._score_batch(batch[half:], pixels[half:])

    @torch.no_grad()
    def _forward(self, batch: list[Prepared], pixels: list[torch.Tensor | None]) -> list[tuple[Prepared, JudgeResult]]:
        inputs = _batch_tensors([item.input_ids for item in batch], pixels, self.pad_id, self.device, self.dtype)
        if self.options.mode == "logits":
            logits = self._last_score_logits(inputs)
            return [(item, self._logits_result(item, logits[row])) for row, item in enumerate(batch)]
        sequences, step_logits = self.generate(inputs)
        written = [self._written(tokens) for tokens in sequences[:, inputs["input_ids"].shape[1]:].tolist()]
        results = [self._generate_result(item, written[row], step_logits[row]) for row, item in enumerate(batch)]
        if not self.options.ignore_stop:  # benchmarks compare equal generation work: no extra pass there
            self._force_score_heading(batch, pixels, written, results)
        return list(zip(batch, results))

    def _last_score_logits(self, inputs: dict) -> torch.Tensor:
        """One forward pass: the score logits at each sequence's last position, (batch, score tokens)."""
        return self.judge.model(**inputs, logits_to_keep=1, use_cache=False).logits[:, -1, self.score_tokens]

    def generate(self, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy generation: the sequences (prompt and new tokens) and the score logits of every step."""
        config = GenerationConfig(
            max_new_tokens=self.options.max_new_tokens,
            min_new_tokens=self.options.max_new_tokens if self.options.ignore_stop else 0,
            do_sample=False,
            eos_token_id=None if self.options.ignore_stop else self.stop_id,
            pad_token_id=self.pad_id,
            # A judge writes text: an image token it wrote would stand for no image, and break any pass
            # that reads its output back (the forced score heading).
            suppress_tokens=self.image_token_ids,
        )
        recorder = ScoreTokenLogits(self.score_tokens)
        sequences = self.judge.model.generate(**inputs, generation_config=config, logits_processor=LogitsProcessorList([recorder]))
        return sequences, recorder.logits()

    def _distribution(self, scale: ScoreScale, score_logits: torch.Tensor) -> dict[str, float] | None:
        """The probability of each score value, from one position's score logits."""
        if scale not in self.score_columns:
            return None
        probs = score_logits[self.score_columns[scale]].float().softmax(-1).tolist()
        return {str(value): p for value, p in zip(self.score_ids[scale], probs)}

    def _written(self, tokens: list[int]) -> list[int]:
        """What the judge wrote: the new tokens up to its stop token included (the rest is padding)."""
        if self.stop_id in tokens and not self.options.ignore_stop:
            return tokens[: tokens.index(self.stop_id) + 1]
        return tokens

    def _generate_result(self, item: Prepared, tokens: list[int], logits: torch.Tensor) -> JudgeResult:
        text = self.judge.tokenizer.decode([t for t in tokens if t != self.stop_id], skip_special_tokens=True)
        rubric = self.rubrics[item.sample.category]
        judgement = parse_judgement(text, rubric.criteria, rubric.score_scale)
        distribution = None
        if judgement.error is None and (step := self._score_step(tokens, rubric.score_scale)) is not None:
            distribution = self._distribution(rubric.score_scale, logits[step])
        return self._result(item, text, judgement.score, judgement.criteria, judgement.error, distribution, len(tokens))

    def _force_score_heading(self, batch: list[Prepared], pixels: list[torch.Tensor | None], written: list[list[int]],
                             results: list[JudgeResult]) -> None:
        """Give each parse failure on a one-token scale the distribution read right after `\\n### Score\\n`
        appended to what the judge wrote (see the module docstring): one forward pass for all of them."""
        rows = [row for row, result in enumerate(results)
                if result.parse_error is not None and self.rubrics[result.category].score_scale in self.score_columns]
        if not rows:
            return
        sequences = [torch.cat([batch[row].input_ids, torch.tensor(
            [t for t in written[row] if t != self.stop_id] + self.forced_heading, dtype=torch.int32)]) for row in rows]
        logits = self._last_score_logits(_batch_tensors(sequences, [pixels[row] for row in rows], self.pad_id, self.device, self.dtype))
        for k, row in enumerate(rows):
            distribution = self._distribution(self.rubrics[results[row].category].score_scale, logits[k])
            results[row].score_distribution = distribution
            results[row].expected_score = expected_score(distribution)

    def _score_step(self, tokens: list[int], scale: ScoreScale) -> int | None:
        """The generation step that wrote the overall score: the first score token after the heading."""
        ids = set((self.score_ids[scale] or {}).values())
        for step, token in enumerate(tokens):
            if token in ids and SCORE_HEADING in self.judge.tokenizer.decode(tokens[:step]):
                return step
        return None

    def _logits_result(self, item: Prepared, logits: torch.Tensor) -> JudgeResult:
        rubric = self.rubrics[item.sample.category]
        distribution = self._distribution(rubric.score_scale, logits)
        score = int(max(distribution, key=distribution.get))  # logits mode runs on integral scales only
        return self._result(item, "", score, {name: None for name in rubric.criteria}, None, distribution, 0)

    def _result(self, item, feedback, score, criteria, error, distribution, generated_tokens) -> JudgeResult:
        return JudgeResult(
            id=item.sample.id,
            model=item.sample.model,
            category=item.sample.category,
            feedback=feedback,
            score=score,
            criteria=criteria,
            score_distribution=distribution,
            expected_score=expected_score(distribution),
            parse_error=error,
            truncated=item.truncated,
            n_images=len(item.sample.images()),
            n_tiles=item.n_tiles,
            prompt_tokens=len(item.input_ids),
            generated_tokens=generated_tokens,
        )
