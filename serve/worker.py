"""The one thread that runs the model: requests queue up, and each round takes every request waiting (the
first one waits up to --batch_wait_ms for others), so that concurrent requests share forward passes.

    request threads --submit--> queue --round--> /v1/score samples: the scoring engine (Scorer.run)
                                                 chat prompts: the same decoder (infer/decoding.py), with
                                                 each prompt's own max_tokens, sampling, choices and top
                                                 log-probabilities

Either way each answer is the one its request gets alone: the decoder computes every row as it would be
alone, whatever is batched beside it (a sampled answer draws from its own seeded generator).

A chat prompt that arrives while a round's chat answers are being written joins them at once when it asks
for no more top log-probabilities than the round: in a free slot of a lane (a cache of slots) that fits
it, or in a lane of its own where the token budget has room (infer/decoding.py); otherwise (and behind any
/v1/score request, which runs next) it waits for the next round. Chat prompts are prefilled at most
--max_num_batched_tokens tokens per engine step, a long one in chunks, so that one long prompt does not
stall the answers being written beside it.

A chat prompt may be cancelled (its client is gone): it is dropped before its turn, or leaves its slot at
the next step, and its future still gets its choices, finish_reason "cancelled".

A round that fails runs its requests again one at a time, so that only the request at fault gets the
error; nothing a request does stops the thread. A prompt run again writes the same tokens (its seed is
fixed when it is submitted), and its on_token is not told the tokens it was already told.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

import torch

from mmjudge.infer.decoding import Completion, OutOfMemory
from mmjudge.infer.sampler import Sampling, seeded
from mmjudge.infer.scheduler import Request
from mmjudge.infer.engine import Prepared, Scorer, judge_decoder
from mmjudge.infer.grammar import Grammar
from mmjudge.infer.options import ScoreOptions
from mmjudge.infer.reward_model import scorer_for
from mmjudge.judge.data import JudgeResult, UsageError
from mmjudge.judge.model import Judge
from mmjudge.judge.prompts import Rubric
from mmjudge.judge.reward_model import is_reward_model
from mmjudge.judge.rope import context_length
from mmjudge.judge.vision import Pixels


@dataclass
class ChatPrompt:
    input_ids: torch.Tensor  # 1-D: the rendered prompt, image tokens expanded
    pixels: Pixels | None  # every image's pixels, in prompt order
    max_new_tokens: int  # cut to the model's context less the prompt (finish_reason "length")
    logprobs: int  # how many of each step's likeliest tokens to return with their log-probabilities (0: none)
    sampling: Sampling = Sampling()
    n: int = 1  # independent answers, from one prefill
    # Called in the model thread after each written token but the stop token, with (choice, token); False
    # ends that choice there (finish_reason "ended"): streaming and stop sequences.
    on_token: Callable[[int, int], bool] | None = None
    # Set by the HTTP layer when the client is gone: every choice ends before the next step (finish_reason "cancelled").
    cancelled: Callable[[], bool] | None = None
    grammar: Grammar | None = None  # structured outputs: what each choice's text must follow


@dataclass
class ScoreJob:
    items: list[Prepared]
    future: Future  # -> list[JudgeResult], in the items' order; Abandoned when its client left first
    scorer: Scorer  # /v1/score's, or the reward endpoints' (their mode may differ)
    cancelled: Callable[[], bool] | None = None  # True once its client has gone: nothing more is computed for it


class Abandoned(Exception):
    """A request whose client left before its answer was ready; it was not computed to the end."""


@dataclass
class ChatJob:
    prompt: ChatPrompt
    future: Future  # -> list[Completion], one per choice in choice order: the tokens written, the stop token included


@dataclass
class _Told:
    """A prompt's on_token, told each choice's tokens once: a round that fails runs the prompt again, from
    its first token, and it writes the same tokens."""

    on_token: Callable[[int, int], bool]
    answers: dict[int, list[bool]] = field(default_factory=lambda: defaultdict(list))  # choice -> what on_token said, token by token
    written: Counter[int] = field(default_factory=Counter)  # choice -> tokens written in the current run

    def __call__(self, choice: int, token: int) -> bool:
        step = self.written[choice]
        self.written[choice] += 1
        if step == len(self.answers[choice]):
            self.answers[choice].append(self.on_token(choice, token))
        return self.answers[choice][step]


class Worker:
    def __init__(self, judge: Judge, rubrics: dict[str, Rubric], options: ScoreOptions, device: str, batch_wait_s: float,
                 prefill_budget: int | None = None, max_model_len: int | None = None,
                 reward: tuple[ScoreOptions, Rubric] | None = None):
        self.options, self.device, self.batch_wait_s = options, device, batch_wait_s
        self.scorer = scorer_for(judge, rubrics, options, device)
        # The reward endpoints' scorer, of the reward's rubric alone: their options (serve/rewards.py's reward_options) may
        # ask for logits mode where the server's --mode is generate.
        self.reward_scorer = self.scorer
        if reward is not None and reward[0] != options:
            self.reward_scorer = scorer_for(judge, {reward[1].category: reward[1]}, reward[0], device)
        # A chat answer ends at the stop token whatever --ignore_stop says (a benchmarking switch), and records no score logits.
        # It is deterministic where asked only: what that costs a server under load is not measured yet (docs/serving.md).
        # A reward model writes no text: no chat decoder (serve/app.py refuses its chat requests), and its scorer prefills alone.
        self.chat_decoder = None if is_reward_model(judge.model) else judge_decoder(
            judge, device, options.token_budget, columns=[], prefill_budget=prefill_budget, deterministic=options.deterministic is True)
        # each decoder of the model thread once: /v1/score's, the reward endpoints' where they have their own, chat's
        self.decoders = list({id(d): d for d in (self.scorer.decoder, self.reward_scorer.decoder, self.chat_decoder) if d is not None}.values())
        self.context = min(context_length(judge.model.config.get_text_config()), max_model_len or sys.maxsize)  # the prompt and its answer together
        for decoder in self.decoders:  # --max_model_len: answers end there
            decoder.scheduler.context = min(decoder.scheduler.context, self.context)
        self.counts: Counter[str] = Counter()  # the metrics endpoint's counters; written by this thread only
        self._queue: queue.Queue[ScoreJob | ChatJob] = queue.Queue()
        self._held: list[ScoreJob | ChatJob] = []  # arrived during a round and not joined to it: the next round's first
        self._thread = threading.Thread(target=self._serve, name="judge-model", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def waiting(self) -> int:
        return self._queue.qsize() + len(self._held)

    def forward_passes(self) -> dict[str, int]:
        """Prefill groups (or chunks) and decoding steps run so far, the prompt tokens prefilled, scoring and chat
        together, the prefix caches' hits and misses, and the tokens they may hold and hold."""
        runners = [d.runner for d in self.decoders]
        caches = [r.prefix_cache for r in runners if r.prefix_cache is not None]
        return {"prefill": sum(r.prefills for r in runners), "step": sum(r.steps for r in runners),
                "prefill_tokens": sum(r.prefill_tokens for r in runners),
                "prefix_hits": sum(c.hits for c in caches), "prefix_misses": sum(c.misses for c in caches),
                "prefix_limit": sum(c.limit for c in caches), "prefix_tokens": sum(c.tokens for c in caches)}

    def score(self, items: list[Prepared], cancelled: Callable[[], bool] | None = None, reward: bool = False) -> Future:
        """The items' records, by /v1/score's scorer or (`reward`) the reward endpoints'."""
        return self._submit(ScoreJob(items, Future(), self.reward_scorer if reward else self.scorer, cancelled))

    def chat(self, prompt: ChatPrompt) -> Future:
        # The seed is fixed now, so that a run again after another request's failure writes the same answer.
        on_token = _Told(prompt.on_token) if prompt.on_token is not None else None
        prompt = replace(prompt, sampling=seeded(prompt.sampling), on_token=on_token)
        return self._submit(ChatJob(prompt, Future()))

    @staticmethod
    def _request(index: int, prompt: ChatPrompt) -> Request:
        if prompt.on_token is not None:
            prompt.on_token.written.clear()  # a new run, from the first token
        return Request(index, prompt.input_ids.long(), max_new_tokens=prompt.max_new_tokens, sampling=prompt.sampling, n=prompt.n,
                       on_token=prompt.on_token, cancelled=prompt.cancelled, grammar=prompt.grammar)

    def _submit(self, job: ScoreJob | ChatJob) -> Future:
        self._queue.put(job)
        return job.future

    def _serve(self) -> None:
        while True:
            jobs = self._round()
            self.counts["rounds"] += 1
            for scorer in (self.scorer, self.reward_scorer) if self.reward_scorer is not self.scorer else (self.scorer,):
                self._run(self._score, [job for job in jobs if isinstance(job, ScoreJob) and job.scorer is scorer])
            self._run(self._chat, [job for job in jobs if isinstance(job, ChatJob)], join=True)

    def _round(self) -> list[ScoreJob | ChatJob]:
        """The jobs held back from the last round, or else the next to come and those that arrive within
        batch_wait of it; and every job waiting."""
        jobs, self._held = self._held, []
        deadline = time.monotonic() + (0.0 if jobs else self.batch_wait_s)
        jobs = jobs or [self._queue.get()]
        while True:
            try:
                jobs.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                return jobs

    def _run(self, work, jobs: list, **options) -> None:
        """work(jobs, **options); where it fails, each job not answered again alone (no options: a chat job
        run again takes no others in)."""
        if not jobs:
            return
        try:
            work(jobs, **options)
        except Exception as err:  # noqa: BLE001 - a request's failure is its own, never the thread's
            if len(jobs) == 1:
                jobs[0].future.set_exception(err)
                self.counts["failed_requests"] += 1
                return
            for job in jobs:  # with the chat jobs that joined the round
                if not job.future.done():
                    self._run(work, [job])

    def _score(self, jobs: list[ScoreJob]) -> None:
        """Score jobs of one scorer together."""
        items = [item for job in jobs for item in job.items]
        left = {id(item): job.cancelled for job in jobs if job.cancelled is not None for item in job.items}  # whether each one's client left
        results: dict[int, JudgeResult] = {}  # by id() of the Prepared: samples of two requests may share an id
        for batch in jobs[0].scorer.run(items, cancelled=lambda item: id(item) in left and left[id(item)]()):
            results.update((id(item), result) for item, result in batch)
        self.counts["samples"] += len(results)
        for job in jobs:
            if all(id(item) in results for item in job.items):
                job.future.set_result([results[id(item)] for item in job.items])
            else:
                job.future.set_exception(Abandoned())

    def _chat(self, jobs: list[ChatJob], join: bool = False) -> None:
        """The round's chat prompts through the decoder, longest first as it takes them; each job answered
        as its row finishes. With `join`, prompts that arrive meanwhile and fit join the round (appended to
        `jobs`)."""
        logprobs = max(job.prompt.logprobs for job in jobs)
        requests = [self._request(k, jobs[k].prompt) for k in sorted(range(len(jobs)), key=lambda k: -len(jobs[k].prompt.input_ids))]

        def load(request: Request) -> Future:  # the tiles were made in the request's own thread
            future = Future()
            future.set_result(jobs[request.index].prompt.pixels)
            return future

        def joining(take) -> None:
            while not self._held:  # once one waits for the next round, those after it wait too
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(job, ChatJob) and job.prompt.logprobs <= logprobs:
                    jobs.append(job)  # first: take() starts loading its tiles, found by its index
                    if take(self._request(len(jobs) - 1, job.prompt)):
                        continue
                    jobs.pop()
                self._held.append(job)
                break

        choices: dict[int, list[Completion]] = defaultdict(list)
        try:
            for done in self.chat_decoder.generate(requests, load, self.options.max_new_tokens, top_logprobs=logprobs,
                                                   joining=joining if join else None):
                for completion in done:
                    answered = choices[completion.index]
                    answered.append(completion)
                    self.counts["completions"] += 1
                    if len(answered) == jobs[completion.index].prompt.n:
                        jobs[completion.index].future.set_result(sorted(answered, key=lambda c: c.choice))
        except OutOfMemory as err:
            prompt = jobs[err.request.index].prompt
            raise UsageError(f"the prompt ({len(prompt.input_ids)} tokens, {0 if prompt.pixels is None else prompt.pixels.tiles} tiles) "
                             f"with up to {prompt.max_new_tokens} new tokens does not fit in {self.device} memory even alone; "
                             "send fewer or smaller images, or ask for fewer tokens") from None
