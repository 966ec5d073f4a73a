"""The one thread that runs the model: requests queue up, and each round takes every request waiting (the
first one waits up to --batch_wait_ms for others), so that concurrent requests share forward batches.

    request threads --submit--> queue --round--> /v1/score samples: the scoring engine, whose token budget
                                                 plans the batches (Scorer.run)
                                                 chat prompts: batches in arrival order within the same
                                                 token budget (generate_greedy)

A round that fails runs its requests again one at a time, so that only the request at fault gets the
error; nothing a request does stops the thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass

from infer.engine import Prepared, Scorer
from infer.options import ScoreOptions
from judge.data import JudgeResult
from judge.model import Judge
from judge.prompts import Rubric
from serve.generation import ChatPrompt, Generated, generate_greedy


@dataclass
class ScoreJob:
    items: list[Prepared]
    future: Future  # -> list[JudgeResult], in the items' order


@dataclass
class ChatJob:
    prompt: ChatPrompt
    future: Future  # -> Generated


class Worker:
    def __init__(self, judge: Judge, rubrics: dict[str, Rubric], options: ScoreOptions, device: str, batch_wait_s: float):
        self.judge, self.options, self.batch_wait_s = judge, options, batch_wait_s
        self.scorer = Scorer(judge, rubrics, options, device)
        self.counts: Counter[str] = Counter()  # the metrics endpoint's counters; written by this thread only
        self._queue: queue.Queue[ScoreJob | ChatJob] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="judge-model", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def waiting(self) -> int:
        return self._queue.qsize()

    def score(self, items: list[Prepared]) -> Future:
        return self._submit(ScoreJob(items, Future()))

    def chat(self, prompt: ChatPrompt) -> Future:
        return self._submit(ChatJob(prompt, Future()))

    def _submit(self, job: ScoreJob | ChatJob) -> Future:
        self._queue.put(job)
        return job.future

    def _serve(self) -> None:
        while True:
            jobs = self._round()
            self.counts["rounds"] += 1
            self._run(self._score, [job for job in jobs if isinstance(job, ScoreJob)])
            self._run(self._chat, [job for job in jobs if isinstance(job, ChatJob)])

    def _round(self) -> list[ScoreJob | ChatJob]:
        """Every job waiting, and those that arrive within batch_wait of the first."""
        jobs = [self._queue.get()]
        deadline = time.monotonic() + self.batch_wait_s
        while True:
            try:
                jobs.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                return jobs

    def _run(self, work, jobs: list) -> None:
        if not jobs:
            return
        try:
            work(jobs)
        except Exception as err:  # noqa: BLE001 - a request's failure is its own, never the thread's
            if len(jobs) == 1:
                jobs[0].future.set_exception(err)
                self.counts["failed_requests"] += 1
                return
            for job in jobs:
                if not job.future.done():
                    self._run(work, [job])

    def _score(self, jobs: list[ScoreJob]) -> None:
        items = [item for job in jobs for item in job.items]
        results: dict[int, JudgeResult] = {}  # by id() of the Prepared: samples of two requests may share an id
        for batch in self.scorer.run(items):
            self.counts["forward_batches"] += 1
            results.update((id(item), result) for item, result in batch)
        self.counts["samples"] += len(items)
        for job in jobs:
            job.future.set_result([results[id(item)] for item in job.items])

    def _chat(self, jobs: list[ChatJob]) -> None:
        for batch in chat_batches(jobs, self.options.token_budget):
            answers: list[Generated] = generate_greedy(self.judge, [job.prompt for job in batch])
            self.counts["forward_batches"] += 1
            self.counts["completions"] += len(batch)
            for job, answer in zip(batch, answers):
                job.future.set_result(answer)


def chat_batches(jobs: list[ChatJob], token_budget: int) -> list[list[ChatJob]]:
    """Consecutive jobs while batch size x (longest prompt + most new tokens) stays within the budget; a
    job over the budget alone still gets a batch of its own."""
    batches: list[list[ChatJob]] = []
    for job in jobs:
        batch = batches[-1] if batches else []
        longest = max((len(j.prompt.input_ids) for j in batch + [job]))
        new_tokens = max(j.prompt.max_new_tokens for j in batch + [job])
        if batch and (len(batch) + 1) * (longest + new_tokens) <= token_budget:
            batch.append(job)
        else:
            batches.append([job])
    return batches
