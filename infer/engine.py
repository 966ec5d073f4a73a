"""Scoring: prompts -> the decoder (infer/decoding.py: length-grouped prefill, a slot per sequence,
rows leaving as they finish) -> parsed results, each computed as it would be alone.

Why it is fast: prompts of similar length are prefilled together without padding masks, image decoding
and tiling run in background threads while the model works, decoding keeps every slot of a preallocated
KV cache busy, and on a GPU each decoding step is a CUDA graph.

Pairs go through the same engine. Under a pairwise rubric a pair is two prompts, one per order (A shown
first: "forward"; B first: "reverse"), or 2k with k sampled judgements, each seeded by the pair, the order
and the sample so that it is the same alone or in a batch; under a pointwise rubric it is two samples, one
per answer. `judge_pairs` gathers a pair's judgements into its PairResult (judge/preferences.py decides the
verdict). A verdict's distribution (over A, B and, where the rubric's verdict format has one, tie) is read as
a score's is: at the token that wrote the verdict, or after the format's forced heading where the verdict did
not parse, or, in logits mode, right after the prompt and that heading.

Score distributions (the probability of each score value, on scales whose scores are one token each;
other scales have none):
- logits mode: read right after the prompt plus a forced `### Score` heading; `score` is its argmax.
- generate mode, score parsed: read at the token where the judge wrote its score.
- generate mode, parse failure (`parse_error` set, `score` null): read right after a forced
  `\\n### Score\\n` fed after everything the judge wrote, as if it had written the heading itself.
  `score` stays null; `expected_score` comes from this forced distribution. So a record with both
  `parse_error` and `score_distribution` carries a forced reading.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from pathlib import Path

import torch

from mmjudge.infer.decoding import Completion, Decoder, OutOfMemory
from mmjudge.infer.grammar import Grammar, GrammarError, Vocabulary, score_lines
from mmjudge.infer.options import ScoreOptions
from mmjudge.infer.prefix_cache import pixel_digest
from mmjudge.infer.sampler import Sampling
from mmjudge.infer.scheduler import Request
from mmjudge.judge.data import VERDICTS, InputError, JudgeResult, OrderJudgement, Pair, PairResult, Problem, Sample, UsageError
from mmjudge.judge.model import Judge, with_max_tiles
from mmjudge.judge.parsing import SCORE_HEADING, ScoreScale, parse_judgement
from mmjudge.judge.preferences import ORDERS, POINTWISE_RULE, in_pair_terms, likeliest, pairwise_verdict, pointwise_verdict
from mmjudge.judge.prompts import JudgePrompt, PlannedImage, Rubric, build_pair_prompt, build_prompt, encode_prompt
from mmjudge.judge.reward_model import is_reward_model
from mmjudge.judge.templates import Span
from mmjudge.judge.verdicts import VERDICT_FORMATS, Reading, VerdictFormat
from mmjudge.judge.vision import Pixels, load_pixels


STRUCTURED_PAIRS = ("--structured holds a judge to its rubric's score lines, and a pairwise rubric asks for a verdict: "
                    "leave --structured out for pairs judged by a pairwise rubric")


@dataclass
class Prepared:
    """A sample, or one view of a pair, ready for the model. The prompt's text is not kept: its token ids say
    the same, and the text, with each image token spelled out (256 `<IMG_CONTEXT>` per InternVL tile), would be
    the largest thing held per sample."""

    index: int  # position in the input file
    sample: Sample | Pair  # what the prompt shows: a sample (a pair's answer, for a pointwise rubric), or a pair
    images: list[PlannedImage]  # the images shown, in prompt order
    truncated: list[str]
    input_ids: torch.Tensor  # 1-D int32: a list of Python ints takes 9x the memory (GiBs for 20k long prompts)
    pair: Pair | None = None  # the pair this is a view of
    view: str | None = None  # "forward" or "reverse" (a pairwise rubric's order), or the answer "A" or "B" (a pointwise rubric's)
    sampling: Sampling = Sampling()
    prefix: int = 0  # tokens before its first answer, prefilled apart through the prefix cache (shared_tokens); 0: none
    loaded: list[Pixels] | None = None  # each image's pixels, made ahead (judge-serve's preparing thread); None: made by the loaders

    @property
    def n_tiles(self) -> int:
        return sum(image.n_tiles for image in self.images)

    @property
    def first(self) -> str:
        """The answer a pairwise view shows first."""
        return ORDERS[self.view]


def prepare(judge: Judge, samples: Iterable[tuple[int, Sample | Pair]], rubrics: dict[str, Rubric], image_root: Path,
            options: ScoreOptions) -> list[Prepared]:
    """Prompts and token ids for every sample and pair (a pair's views: module docstring); cheap per sample
    (image headers only, no pixel decoding), but minutes for tens of thousands: callers pass `samples`
    through a progress bar."""
    settings = with_max_tiles(judge.settings, options.max_tiles)
    count_tokens = lambda text: len(judge.tokenizer(text, add_special_tokens=False).input_ids)  # noqa: E731
    budgets = (settings.images, options.image_token_budget, options.prompt_token_budget, count_tokens)
    template = settings.template
    # A reward model reads its head at the prompt's last token, as it was trained: no score heading after it.
    reads_logits = options.mode == "logits" and not is_reward_model(judge.model)

    def encoded(prompt, logits_prefix: str) -> tuple[torch.Tensor, int]:
        text = prompt.text + (logits_prefix if reads_logits else "")
        ids = encode_prompt(judge.tokenizer, text, prompt.controls)
        return torch.tensor(ids, dtype=torch.int32), shared_tokens(judge.tokenizer, prompt, ids) if options.prefix_cache else 0

    prepared = []
    for index, item in samples:
        rubric = rubrics[item.category]
        if isinstance(item, Sample):
            prompt = build_prompt(item, rubric, template, settings.system_message, image_root, *budgets)
            ids, prefix = encoded(prompt, f"{SCORE_HEADING}\n")
            prepared.append(Prepared(index, item, prompt.images, prompt.truncated, ids, prefix=prefix))
        elif rubric.kind == "pointwise":
            for side in ("A", "B"):
                sample = item.as_sample(side)
                prompt = build_prompt(sample, rubric, template, settings.system_message, image_root, *budgets)
                ids, prefix = encoded(prompt, f"{SCORE_HEADING}\n")
                prepared.append(Prepared(index, sample, prompt.images, prompt.truncated, ids, item, side, prefix=prefix))
        else:
            logits_prefix = VERDICT_FORMATS[rubric.verdict_format].logits_prefix
            for view, first in ORDERS.items():
                prompt = build_pair_prompt(item, first, rubric, template, settings.system_message, image_root, *budgets)
                ids, prefix = encoded(prompt, logits_prefix)
                for k in range(options.samples):
                    prepared.append(Prepared(index, item, prompt.images, prompt.truncated, ids, item, view, sampled(options, item.id, view, k), prefix))
    return prepared


def shared_tokens(tokenizer, prompt: JudgePrompt, input_ids: list[int]) -> int:
    """The tokens of a prompt before its first answer (JudgePrompt.shared): those its text's shared part
    encodes to that the whole prompt's ids begin with (a token that the answer's first characters merge into
    is the answer's). Found from the prompt alone, so that it is cut at the same place alone and in any batch."""
    head = shared_ids(tokenizer, prompt.text[: prompt.shared], tuple(span for span in prompt.controls if span[1] <= prompt.shared))
    same = 0
    for mine, whole in zip(head, input_ids):
        if mine != whole:
            break
        same += 1
    return same


@lru_cache(maxsize=256)  # a server's questions in flight at once; each entry a few thousand token ids
def shared_ids(tokenizer, text: str, controls: tuple[Span, ...]) -> tuple[int, ...]:
    """The token ids of a prompt's shared part: the same for every answer to a question, so the one-sample
    requests of an RL group tokenize it once, not once an answer (it was a fifth of a reward's preparing)."""
    return tuple(encode_prompt(tokenizer, text, controls))


def past_context(items: Iterable[Prepared], context: int) -> dict[int, Prepared]:
    """The prompts that leave their answer no room in a context of `context` tokens (the prompt and its answer
    together), one per record (its longest view), by the record's index. Every door refuses them before the model
    runs (judge-score before the weights load, the Python API, judge-serve): scored, they were read past the
    context without a word (771 tokens against a context of 256)."""
    long: dict[int, Prepared] = {}
    for item in items:
        if len(item.input_ids) >= context and (item.index not in long or len(item.input_ids) > len(long[item.index].input_ids)):
            long[item.index] = item
    return long


def refuse_past_context(items: Iterable[Prepared], context: int, source: str) -> None:
    """An InputError naming each record of `source` (the input's file, or what the samples were given as)
    whose prompt is past the context (past_context)."""
    if long := past_context(items, context):
        raise InputError([Problem(source, f"its prompt is {len(item.input_ids):,} tokens, and the judge's context of {context:,} tokens holds "
                                          f"the prompt and its answer together; give --prompt_token_budget (below {context:,}) to cut the "
                                          "question's oldest context, recorded as truncated", index, item.sample.id)
                          for index, item in long.items()])


def sampled(options: ScoreOptions, pair_id: str, view: str, k: int) -> Sampling:
    """Greedy for one judgement per order; the k-th sampled judgement's own settings otherwise, its seed from
    the run's, the pair, the order and k, so that it draws the same alone or in any batch."""
    if options.samples == 1:
        return Sampling()
    digest = hashlib.sha256(f"{options.seed} {pair_id} {view} {k}".encode()).digest()
    return Sampling(temperature=options.temperature, top_p=options.top_p, seed=int.from_bytes(digest[:8], "little") >> 1)


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


def verdict_token_ids(tokenizer, fmt: VerdictFormat) -> dict[str, int] | None:
    """The token each verdict of the format starts with right after its context (judge/verdicts.py); None
    where two verdicts start with the same token, or the context does not tokenize apart from them: that
    format's verdicts then have no distribution."""
    try:
        base = continuation_ids(tokenizer, fmt.context)
        ids = {}
        for verdict, option in fmt.options.items():
            full = continuation_ids(tokenizer, fmt.context + option)
            if full[: len(base)] != base or len(full) == len(base):
                return None
            ids[verdict] = full[len(base)]
    except ValueError:
        return None
    return ids if len(set(ids.values())) == len(ids) else None


def expected_score(distribution: dict[str, float] | None) -> float | None:
    return sum(int(k) * p for k, p in distribution.items()) if distribution else None


def unwritable_tokens(judge: Judge) -> list[int]:
    """What a judge never writes: the output layer's rows beyond the tokenizer (Phi-3 has 32,064 for 32,011
    tokens), which stand for no token, so no text (MMIE's `main.py` stops with an IndexError where one comes
    first). Every token of the tokenizer is written where it comes first, the image tokens included, as
    InternVL's `generate` writes them: `<IMG_CONTEXT>` or `</img>` is then text of the answer, read back by
    its embedding as the reference reads it (docs/exactness.md)."""
    return list(range(len(judge.tokenizer), judge.model.config.get_text_config().vocab_size))


class _Counted:
    """Each item's share of the progress counted so far: a token's worth per token written, until it finishes.
    What is counted is reported once per as many tokens as there are items (a decoding step of a batch that holds
    every item) and as items finish: reported token by token, the progress bar's calls took a tenth of the
    engine's host time per step (benchmarks/host_overhead.py)."""

    def __init__(self, progress: Callable[[float], None] | None, items: int, max_new_tokens: int | None):
        self.progress, self.shares = progress, [0.0] * items
        self.per_token = 1 / max_new_tokens if max_new_tokens else 0.0
        self.unreported, self.tokens, self.report_every = 0.0, 0, items

    def token(self, index: int) -> Callable[[int, int], None] | None:
        """The item's on_token callback (the decoder calls it for every token but the stop token)."""
        if self.progress is None or not self.per_token:
            return None

        def wrote(choice: int, token: int) -> None:
            if self.shares[index] + self.per_token < 1:  # the last part waits for the item to finish
                self.shares[index] += self.per_token
                self.unreported += self.per_token
                self.tokens += 1
                if self.tokens >= self.report_every:
                    self.progress(self.unreported)
                    self.unreported, self.tokens = 0.0, 0
        return wrote

    def finished(self, indices: Iterable[int]) -> None:
        if self.progress is None:
            return
        rest, self.unreported, self.tokens = self.unreported, 0.0, 0
        for i in indices:
            rest, self.shares[i] = rest + 1 - self.shares[i], 1.0
        self.progress(rest)


def _load_pixels(item: Prepared, dtype: torch.dtype, pin: bool, image_token_id: int | None = None) -> Pixels | None:
    """The sample's pixels in the model's dtype; pinned for a GPU, so that the copy overlaps compute. With
    `image_token_id` (a decoder with a prefix cache), the digest of the images in its shared part comes with
    them: hashed here, in a loading thread, so that the model thread never waits on it."""
    loaded = item.loaded if item.loaded is not None else [load_pixels(image.path, image.processing) for image in item.images]
    for image, pixels in zip(item.images, loaded):
        if pixels.tokens != image.tokens:
            raise RuntimeError(f"{image.path}: planned {image.tokens} image tokens, its processing made {pixels.tokens}")
    if not loaded:
        return None
    pixels = Pixels.cat(loaded)
    pixels = Pixels(pixels.values.to(dtype), pixels.tokens, pixels.grids)
    digest = None
    if image_token_id is not None and item.prefix:
        shared, _ = pixels.split(int((item.input_ids[:item.prefix] == image_token_id).sum()))
        digest = None if shared is None else pixel_digest(shared)
    return replace(pixels.pin_memory() if pin else pixels, shared_digest=digest)


def judge_vocabulary(judge: Judge) -> Vocabulary:
    """The judge's tokens as its grammars read them (infer/grammar.py): every row of its output layer, and its
    template's stop token as the end of an answer."""
    return Vocabulary.of(judge.tokenizer, judge.model.config.get_text_config().vocab_size, judge.stop_ids[0])


def judge_decoder(judge: Judge, device: str, token_budget: int | None, columns: list[int], stop: bool = True,
                  prefill_budget: int | None = None, deterministic: bool | None = False, prefix_cache: int = 0) -> Decoder:
    """A decoder of the judge's text: padded with its pad token, never writing its unwritable tokens, and
    stopping at its template's stop token unless `stop` is False; `columns` are the logits it records;
    `prefill_budget`: prompt tokens prefilled per engine step at most, longer prompts in chunks (None: none);
    `deterministic`: each row the same bits in any batch (infer/decoding.py); None: where its kernels run;
    `prefix_cache`: tokens of prompts' shared parts kept (infer/prefix_cache.py); 0: none."""
    return Decoder(judge.model, device=device, pad_id=judge.pad_id, stop_ids=judge.stop_ids if stop else (), suppress=unwritable_tokens(judge),
                   columns=torch.tensor(columns, dtype=torch.long), token_budget=token_budget, prefill_budget=prefill_budget,
                   deterministic=deterministic, prefix_cache=prefix_cache)


def read_tokens(tokenizer, rubrics: dict[str, Rubric], mode: str) -> tuple[dict[ScoreScale, dict[int, int] | None], dict[str, dict[str, int] | None]]:
    """The tokens each score scale's distribution and each verdict format's are read from, None where there
    is no such token; refused (UsageError) where --mode logits must read one. judge-score asks before the
    model loads, with the judge's tokenizer alone."""
    # A score distribution is read from the one token the judge writes its score with; scales whose
    # scores take several tokens (0.7, or 10 with a digit-splitting tokenizer) have none.
    score_ids: dict[ScoreScale, dict[int, int] | None] = {}
    for rubric in rubrics.values():
        try:
            score_ids[rubric.score_scale] = score_token_ids(tokenizer, rubric.score_scale)
        except ValueError as err:
            score_ids[rubric.score_scale] = None
            if mode == "logits":
                raise UsageError(f"--mode logits reads the score from one token, but rubric {rubric.category!r}: {err}; "
                                 "use --mode generate") from None
    # A verdict distribution is read likewise from the token a verdict starts with (judge/verdicts.py).
    formats = [VERDICT_FORMATS[name] for name in sorted({r.verdict_format for r in rubrics.values() if r.kind == "pairwise"})]
    verdict_ids = {fmt.name: verdict_token_ids(tokenizer, fmt) for fmt in formats}
    if mode == "logits" and (unread := sorted(name for name, ids in verdict_ids.items() if ids is None)):
        raise UsageError(f"--mode logits reads the verdict from one token, but the verdicts of the {', '.join(unread)} verdict format "
                         "do not start with distinct tokens for this judge's tokenizer; use --mode generate")
    return score_ids, verdict_ids


class Scorer:
    """Runs prepared samples through one judge; `run` yields (Prepared, JudgeResult) pairs as they finish."""

    def __init__(self, judge: Judge, rubrics: dict[str, Rubric], options: ScoreOptions, device: str):
        self.judge, self.rubrics, self.options, self.device = judge, rubrics, options, device
        tokenizer = judge.tokenizer
        self.score_ids, self.verdict_ids = read_tokens(tokenizer, rubrics, options.mode)
        self.forced_heading = continuation_ids(tokenizer, f"\n{SCORE_HEADING}\n")
        formats = [VERDICT_FORMATS[name] for name in self.verdict_ids]
        self.forced_verdict = {fmt.name: continuation_ids(tokenizer, fmt.forced) for fmt in formats if fmt.forced and self.verdict_ids[fmt.name]}
        # Only these vocabulary columns are ever read ("score logits"); each scale's score tokens and each
        # format's verdict tokens are a subset.
        tokens = sorted({t for ids in [*self.score_ids.values(), *self.verdict_ids.values()] if ids for t in ids.values()})
        self.score_columns = {scale: [tokens.index(t) for t in ids.values()] for scale, ids in self.score_ids.items() if ids}
        self.verdict_columns = {name: {v: tokens.index(t) for v, t in ids.items()} for name, ids in self.verdict_ids.items() if ids}
        self.follow_up_tokens = max(map(len, [self.forced_heading, *self.forced_verdict.values()]))
        self.decoder = judge_decoder(judge, device, options.token_budget, tokens, stop=not options.ignore_stop,
                                     deterministic=options.deterministic, prefix_cache=options.prefix_cache or 0)
        self.grammars = self._grammars() if options.structured else {}
        # The threads that load images, for the scorer's life: a server's scorer runs once per round of requests, and
        # starting its threads again each round cost more than the round's prefills of a few one-sample requests.
        self.loaders = ThreadPoolExecutor(options.workers, thread_name_prefix="judge-load")

    def _grammars(self) -> dict[str, Grammar]:
        """judge-score --structured: each category's answer layout (infer/grammar.py's score_lines)."""
        try:
            vocabulary = judge_vocabulary(self.judge)
        except GrammarError as err:
            raise UsageError(f"--structured: {err}") from None
        # A pairwise rubric among them is no matter until a pair comes to be scored (run refuses it).
        return {category: score_lines(vocabulary, tuple(rubric.criteria.values()), tuple(str(level) for level in rubric.score_scale.levels))
                for category, rubric in self.rubrics.items() if rubric.kind != "pairwise"}

    def run(self, items: list[Prepared], cancelled: Callable[[Prepared], bool] | None = None,
            progress: Callable[[float], None] | None = None) -> Iterator[list[tuple[Prepared, JudgeResult]]]:
        """Results as they finish. An item that `cancelled` says True for (its client has gone) is dropped
        before its prefill or at the next decoding step, and has no result. `progress(samples)` is told of
        the work as it goes, in parts of samples: a sample's 1 / max_new_tokens per token the judge writes,
        and the rest of its 1 when it finishes (infer/progress.py)."""
        if self.options.structured and any(isinstance(item.sample, Pair) for item in items):
            raise UsageError(STRUCTURED_PAIRS)
        counted = _Counted(progress, len(items), self.options.max_new_tokens if self.options.mode == "generate" else None)
        # Longest first: prefill groups of similar lengths, and a freed slot always has room for the next.
        requests = [Request(i, items[i].input_ids.long(), sampling=items[i].sampling, cancelled=partial(cancelled, items[i]) if cancelled else None,
                            on_token=counted.token(i), grammar=self.grammars.get(items[i].sample.category), prefix=items[i].prefix)
                    for i in sorted(range(len(items)), key=lambda i: -len(items[i].input_ids))]
        pin = torch.device(self.device).type == "cuda"
        runner = self.decoder.runner
        image_token_id = runner.backbone.image_token_id if runner.prefix_cache is not None else None

        def load(request: Request):
            return self.loaders.submit(_load_pixels, items[request.index], runner.dtype, pin, image_token_id)

        try:
            if self.options.mode == "logits":
                for group in self.decoder.logits(requests, load):
                    counted.finished(i for i, _ in group)
                    yield [(items[i], self._logits_result(items[i], recorded)) for i, recorded in group]
            else:
                follow_up = lambda index, tokens: self._follow_up(items[index], tokens)  # noqa: E731
                for done in self.decoder.generate(requests, load, self.options.max_new_tokens, follow_up, self.follow_up_tokens):
                    counted.finished(c.index for c in done)
                    yield [(items[c.index], self._generate_result(items[c.index], c)) for c in done if c.finish_reason != "cancelled"]
        except OutOfMemory as err:
            item = items[err.request.index]
            raise UsageError(f"sample {item.sample.id!r} (record {item.index}: {len(item.input_ids)} prompt tokens, {item.n_tiles} tiles) "
                             f"does not fit in {self.device} memory even alone; lower --max_tiles or set --image_token_budget") from None

    def judged(self, items: list[Prepared], cancelled: Callable[[Prepared], bool] | None = None,
               progress: Callable[[float], None] | None = None) -> Iterator[list[tuple[int, JudgeResult | PairResult]]]:
        """(index, result) of every sample and pair as it finishes: a sample's JudgeResult, or a pair's
        PairResult once all its views are in. `progress`, as `run` tells it, in parts of inputs (a pair's
        views share its 1)."""
        expected = Counter(item.index for item in items if item.pair is not None)
        views: dict[int, list[tuple[Prepared, JudgeResult | OrderJudgement]]] = defaultdict(list)
        inputs = len({item.index for item in items})
        per_input = None if progress is None or not items else (lambda done: progress(done * inputs / len(items)))
        for batch in self.run(items, cancelled, per_input):
            done = []
            for item, result in batch:
                if item.pair is None:
                    done.append((item.index, result))
                    continue
                views[item.index].append((item, result))
                if len(views[item.index]) == expected[item.index]:
                    done.append((item.index, pair_result(views.pop(item.index), self.options)))
            if done:
                yield done

    def _follow_up(self, item: Prepared, tokens: list[int]) -> list[int]:
        """The forced score heading (or verdict heading) for an output that does not parse, where a
        distribution can be read (module docstring); nothing otherwise, and nothing where benchmarks compare
        equal work."""
        if self.options.ignore_stop:
            return []
        rubric = self.rubrics[item.sample.category]
        if item.view in ORDERS:
            fmt = VERDICT_FORMATS[rubric.verdict_format]
            forced = self.forced_verdict.get(fmt.name, [])
            return list(forced) if forced and fmt.read(self._feedback(tokens), rubric.criteria).verdict is None else []
        if rubric.score_scale not in self.score_columns:
            return []
        judgement = parse_judgement(self._feedback(tokens), rubric.criteria, rubric.score_scale)
        return list(self.forced_heading) if judgement.error is not None else []

    def _distribution(self, scale: ScoreScale, score_logits: torch.Tensor) -> dict[str, float] | None:
        """The probability of each score value, from one position's score logits."""
        if scale not in self.score_columns:
            return None
        probs = score_logits[self.score_columns[scale]].float().softmax(-1).tolist()
        return {str(value): p for value, p in zip(self.score_ids[scale], probs)}

    def _feedback(self, tokens: list[int]) -> str:
        """The judge's text as its backbone's reference writes it (MMIE: decoded and finished as InternVL's chat() does)."""
        return self.judge.answer(tokens)

    def _verdict_distribution(self, fmt: VerdictFormat, logits: torch.Tensor, first: str) -> dict[str, float] | None:
        """The probability of each verdict, in the pair's terms, from one position's recorded logits."""
        columns = self.verdict_columns.get(fmt.name)
        if columns is None:
            return None
        probs = dict(zip(columns, logits[list(columns.values())].float().softmax(-1).tolist()))
        return {verdict: probs[in_pair_terms(verdict, first)] for verdict in VERDICTS if verdict in probs}

    def _verdict_step(self, tokens: list[int], offset: int, fmt: VerdictFormat) -> int | None:
        """The generation step that wrote the verdict's character at `offset` of the judge's text (which
        starts where the decoded output's leading whitespace ends): the first step whose decoded prefix
        reaches past it, found by bisection; None unless that step wrote one of the format's verdict tokens."""
        written = [t for t in tokens if t not in self.judge.stop_ids]
        whole = self.judge.decode(written)
        target = len(whole) - len(whole.lstrip()) + offset
        low, high = 0, len(written)
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if len(self.judge.decode(written[:middle + 1])) > target else (middle + 1, high)
        ids = (self.verdict_ids.get(fmt.name) or {}).values()
        return low if low < len(written) and written[low] in ids else None

    def _order_result(self, item: Prepared, text: str, reading: Reading, distribution, generated_tokens: int) -> OrderJudgement:
        first = item.first
        return OrderJudgement(
            first=first, feedback=text, verdict=in_pair_terms(reading.verdict, first), label=reading.label,
            criteria={name: in_pair_terms(v, first) for name, v in reading.criteria.items()}, verdict_distribution=distribution,
            parse_error=reading.error, truncated=item.truncated, n_tiles=item.n_tiles, prompt_tokens=len(item.input_ids),
            generated_tokens=generated_tokens,
        )

    def _generate_order(self, item: Prepared, completion: Completion) -> OrderJudgement:
        rubric = self.rubrics[item.sample.category]
        fmt = VERDICT_FORMATS[rubric.verdict_format]
        text = self._feedback(completion.tokens)
        reading = fmt.read(text, rubric.criteria)
        distribution = None
        if completion.follow_up_logits is not None:
            distribution = self._verdict_distribution(fmt, completion.follow_up_logits, item.first)
        elif reading.offset is not None and (step := self._verdict_step(completion.tokens, reading.offset, fmt)) is not None:
            distribution = self._verdict_distribution(fmt, completion.logits[step], item.first)
        return self._order_result(item, text, reading, distribution, len(completion.tokens))

    def _generate_result(self, item: Prepared, completion: Completion) -> JudgeResult | OrderJudgement:
        if item.view in ORDERS:
            return self._generate_order(item, completion)
        tokens = completion.tokens
        text = self._feedback(tokens)
        rubric = self.rubrics[item.sample.category]
        judgement = parse_judgement(text, rubric.criteria, rubric.score_scale)
        if completion.follow_up_logits is not None:
            distribution = self._distribution(rubric.score_scale, completion.follow_up_logits)
        elif judgement.error is None and (step := self._score_step(tokens, rubric.score_scale)) is not None:
            distribution = self._distribution(rubric.score_scale, completion.logits[step])
        else:
            distribution = None
        return self._result(item, text, judgement.score, judgement.criteria, judgement.error, distribution, len(tokens))

    def _score_step(self, tokens: list[int], scale: ScoreScale) -> int | None:
        """The generation step that wrote the overall score: the first score token after the heading.
        The heading's end is found by bisection over decoded prefixes (a prefix that holds it is followed
        only by longer ones that do), so a 1,000-token feedback costs ten decodes, not a thousand."""
        ids = set((self.score_ids[scale] or {}).values())
        decode = self.judge.decode
        low, high = 0, len(tokens) + 1  # the shortest prefix holding the heading is tokens[:k], low < k <= high
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if SCORE_HEADING in decode(tokens[:middle]) else (middle, high)
        return next((step for step in range(high, len(tokens)) if tokens[step] in ids), None)

    def _logits_result(self, item: Prepared, logits: torch.Tensor) -> JudgeResult | OrderJudgement:
        rubric = self.rubrics[item.sample.category]
        if item.view in ORDERS:
            fmt = VERDICT_FORMATS[rubric.verdict_format]
            distribution = self._verdict_distribution(fmt, logits, item.first)
            verdict = likeliest(distribution)  # logits mode runs only where every verdict has its token
            written = in_pair_terms(verdict, item.first)  # the verdict as the judge would have written it, in its positions
            reading = Reading(written, fmt.options[written].strip(), criteria={name: None for name in rubric.criteria})
            return self._order_result(item, "", reading, distribution, 0)
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


def pair_result(views: list[tuple[Prepared, JudgeResult | OrderJudgement]], options: ScoreOptions) -> PairResult:
    """A pair's result from all its views' (judge/preferences.py decides its verdict)."""
    views = sorted(views, key=lambda view: (view[0].view, view[0].sampling.seed or 0))  # the same order however they finished
    pair = views[0][0].pair
    common = dict(id=pair.id, model_a=pair.model_a, model_b=pair.model_b, category=pair.category, group=pair.group, n_images=len(pair.images()))
    if views[0][0].view in ORDERS:
        forward = [result for item, result in views if item.view == "forward"]
        reverse = [result for item, result in views if item.view == "reverse"]
        verdict, distribution, consistent = pairwise_verdict(forward, reverse, options.pair_rule)
        return PairResult(**common, verdict=verdict, verdict_distribution=distribution, rule=options.pair_rule, swap_consistent=consistent,
                          forward=forward, reverse=reverse)
    scores = {item.view: result for item, result in views}
    verdict, distribution = pointwise_verdict(scores["A"], scores["B"], options.tie_margin)
    return PairResult(**common, verdict=verdict, verdict_distribution=distribution, rule=POINTWISE_RULE, scores=scores)
