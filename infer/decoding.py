"""Decoding of many prompts at once, greedy or sampled, each computed as it would be alone.

    requests (longest first) -> prefill groups -> slots of a preallocated cache -> decoding steps
                                                  ^ a slot freed by a finished row takes the next request

The decoder is four parts, as vLLM separates them, and this module's Decoder, which runs an engine step
after another with them:
- the scheduler (infer/scheduler.py) picks what runs: requests into lanes (caches of slots of one size),
  prefill groups, the chunks of a long prompt, the lane a server's new request joins;
- the cache (infer/cache.py) holds each row's state between passes in its slot (keys and values);
- the runner (infer/runner.py) steps the model: a prefill group, chunks, a decoding step of every slot (a CUDA
  graph on a GPU), and the prefix cache's two-piece prefill;
- the sampler (infer/sampler.py) turns each pass's logits into each row's token: argmax or a draw of the row's
  own, with penalties and grammar masks.

An engine step: cancelled requests leave; a server's new requests join a lane; waiting prompts are prefilled
into free slots, whole, within the step's prefill budget, and a prompt longer than it continues its chunks; then
every lane's rows that have their prompt in full decode one token. A row that finishes leaves its slot at once
and the next prompt is prefilled into it, so the batch stays full instead of waiting for its longest answer.

A request may carry its own limit on new tokens (a chat request's `max_tokens`), anything up to the
model's context less its prompt (a longer one is cut there); the slots of a cache are sized for the
largest its requests need. Asked for `top_logprobs`, each step also returns the log-probabilities of its
k likeliest tokens over the whole vocabulary (the output layer's rows that stand for no token
excluded), computed per row like everything else; scoring asks for none and computes none. A request for n
answers prefills its prompt once, its state written into n slots.

A request may be ended early: `on_token` returning False ends a choice after that token, and `cancelled()`
ends every choice of its request before admission or at the next step; a freed slot takes the next prompt.

A finished row may be given follow-up tokens (the forced `### Score` heading of a judge whose output did
not parse): they are fed after what it wrote, in the same slot, and the logits after the last one are
read, as if the judge had written them itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from mmjudge.infer.cache import SlotCache, StepGraphs, empty_cache, kv_bytes_per_token, memory_budget
from mmjudge.infer.runner import Runner
from mmjudge.infer.sampler import RowStep, Sampler, Step, draws_of, masks_of, penalties_of
from mmjudge.infer.scheduler import (JOIN_SLOTS, WIDTH_STEP, Joining, Lane, Loader, Lookahead, Request, Row, Scheduler, cancelled,
                                     segments)
from mmjudge.judge.rope import context_length


@dataclass
class Completion:
    index: int
    tokens: list[int]  # what was written, the stop token included when it stopped
    logits: torch.Tensor  # (len(tokens), columns): the recorded columns of the logits that chose each token
    follow_up_logits: torch.Tensor | None = None  # (columns,) after the follow-up tokens, when there were some
    top_logprobs: torch.Tensor | None = None  # (len(tokens), k): each step's k largest log-probabilities, when asked
    top_ids: torch.Tensor | None = None  # (len(tokens), k): their tokens, the written one first
    choice: int = 0
    # "stop": the stop token; "length": its limit; "ended": on_token said False; "cancelled": cancelled() said True;
    # "grammar": the stop token, the only one its grammar allowed after text no continuation of satisfies it
    finish_reason: str = "length"
    grammar_error: str = ""  # why, when finish_reason is "grammar" (llguidance's words)


class OutOfMemory(Exception):
    """A single prompt whose prefill, or whose cache slot (prompt and new tokens), does not fit in the
    device's memory."""

    def __init__(self, request: Request):
        super().__init__(f"request {request.index} does not fit in memory")
        self.request = request


class Decoder:
    """Decoding (module docstring) with one model: its scheduler, runner and sampler, and the lanes' caches. `columns`
    are the vocabulary entries whose logits are recorded at every written token (a judge's score tokens); `suppress`
    are never written; `token_budget`: tokens of cache its lanes hold at most (None: what memory holds);
    `prefill_budget`: prompt tokens an engine step prefills at most (None: whole prompts, no chunks)."""

    def __init__(self, model: torch.nn.Module, *, device, pad_id: int, stop_ids: tuple[int, ...], suppress: list[int],
                 columns: torch.Tensor, token_budget: int | None, prefill_budget: int | None = None, cuda_graphs: bool = True,
                 deterministic: bool | None = False, prefix_cache: int = 0):
        device = torch.device(device)
        self.stop_ids = frozenset(stop_ids)
        self.sampler = Sampler(columns.to(device), torch.tensor(suppress, dtype=torch.long, device=device))
        self.runner = Runner(model, device=device, pad_id=pad_id, sampler=self.sampler, cuda_graphs=cuda_graphs,
                             deterministic=deterministic, prefix_cache=prefix_cache)
        self.scheduler = Scheduler(self.runner.config, context=context_length(self.runner.config), token_budget=token_budget,
                                   prefill_budget=prefill_budget, deterministic=self.runner.deterministic, prefixed=self.runner.prefixed,
                                   ragged=self.runner.ragged)

    # -- logits mode ------------------------------------------------------------------------------------

    def logits(self, requests: list[Request], load: Loader) -> Iterator[list[tuple[int, torch.Tensor]]]:
        """The recorded columns at each prompt's last position, group by group (no cache, no decoding); a
        request cancelled before its group runs has none."""
        waiting = Lookahead(requests, 64, load)
        while waiting:
            group = [(r, choices) for r, choices in self.scheduler.group(waiting, len(waiting.buffer), cached=False) if not cancelled(r)]
            if not group:  # every client of the group has gone: nothing is computed for them
                continue
            recorded = self._prefill_splitting([[Row(r, len(r.input_ids))] for r, _ in group], None, 0).recorded
            yield [(r.index, recorded[row].cpu()) for row, (r, _) in enumerate(group)]

    def _prefill_splitting(self, group: list[list[Row]], cache: SlotCache | None, logprobs: int) -> Step:
        """The runner's prefill, split in halves when the device runs out of memory; OutOfMemory for a lone prompt."""
        try:
            return self.runner.prefill(group, cache, logprobs)
        except torch.OutOfMemoryError:
            if len(group) == 1:
                raise OutOfMemory(group[0][0].request) from None
        empty_cache(self.runner.device)
        half = len(group) // 2
        first = self._prefill_splitting(group[:half], cache, logprobs)
        second = self._prefill_splitting(group[half:], cache, logprobs)
        return Step(*(torch.cat(halves) for halves in zip(first, second)))

    # -- generate mode ----------------------------------------------------------------------------------

    def generate(self, requests: list[Request], load: Loader, max_new_tokens: int,
                 follow_up: Callable[[int, list[int]], list[int]] | None = None, follow_up_tokens: int = 0,
                 top_logprobs: int = 0, joining: Joining | None = None) -> Iterator[list[Completion]]:
        """Completions of up to max_new_tokens (or a request's own limit), one per choice, yielded as rows
        finish. `follow_up(index, tokens)` returns the tokens to feed after a finished row's output (at most
        follow_up_tokens), or []. With top_logprobs k > 0, each written token comes with the k likeliest
        tokens of its step and their log-probabilities. `joining(take)`, asked at every engine step (a
        server's), hands each request that arrived since to take(request), which places it and says whether
        it found room.

        Requests come longest first. Every slot of a cache holds its longest request, so one cache for a
        whole benchmark would size every slot for its single longest prompt: the requests are cut into
        segments, a new one (and a new cache, a "lane") wherever the slots would at least double. The lanes
        run one after another; a server's run side by side, a step of each per engine step, so that a long
        prompt in a lane of its own does not hold up the short ones, and a request that arrives goes to a
        lane with a free slot that fits it, or to a new lane where the token budget has room."""
        def need(request: Request) -> int:  # the tokens of its slot
            return len(request.input_ids) + self.scheduler.limit(request, max_new_tokens) + follow_up_tokens + 1

        queued = deque(segments(requests, need))
        lanes: list[Lane] = []
        while queued or lanes:
            # a segment's lane opens once the lanes before it are done, or (a server's) at once where the budget has room
            while queued and (not lanes or (joining is not None and self._room(lanes) >= max(map(need, queued[0])))):
                segment = queued.popleft()
                lanes.append(self._lane(segment, max(map(need, segment)), sum(r.n for r in segment), load, lanes, need))
            finished = [c for lane in lanes for c in self._cancel(lane)]  # first, so that their slots take waiting requests at once
            if joining is not None:
                joining(lambda request: self._take(request, lanes, need, load, self.scheduler.limit(request, max_new_tokens)))
            # the step's prompt tokens: new prompts first, whole, then the prompts being prefilled in chunks
            ongoing, used = [lane for lane in lanes if lane.chunking()], 0
            admitted = self.scheduler.prefill_room(bool(ongoing))
            for lane in lanes:
                done, tokens = self._admit(lane, None if admitted is None else admitted - used, max_new_tokens, follow_up, top_logprobs)
                finished, used = finished + done, used + tokens
            for lane in sorted(ongoing, key=lambda lane: lane.chunking()[0].prefill_left):  # the nearest to done first
                row = lane.chunking()[0]
                if (tokens := self.scheduler.chunk_tokens(row.prefill_left, self.scheduler.prefill_budget - used, row.position)) is None:
                    continue
                finished += self._chunk(lane, tokens, follow_up, top_logprobs)
                used += tokens
            for lane in lanes:
                finished += self._decode(lane, follow_up, top_logprobs)
            lanes = [lane for lane in lanes if lane.active()]
            if finished:
                yield finished

    def _lane(self, requests: list[Request], capacity: int, slots: int, load: Loader, lanes: list[Lane], need) -> Lane:
        """A lane for `requests` with up to `slots` slots of `capacity` tokens, as the budget left beside
        `lanes` allows (one at least, where it is the only lane)."""
        try:
            cache = self._allocate(capacity, slots, self._room(lanes) if lanes else None)
        except torch.OutOfMemoryError:  # not even one slot: a long prompt, or a long answer asked for
            raise OutOfMemory(max(requests, key=need)) from None
        slots = cache.rows.numel()
        return Lane(cache, capacity, Lookahead(requests, 2 * slots, load), [None] * slots, [self.runner.pad_id] * slots, StepGraphs())

    def _take(self, request: Request, lanes: list[Lane], need, load: Loader, limit: int) -> bool:
        """Place a request that arrived: in the lane the scheduler finds for it (Scheduler.fitting), or else in a lane of
        its own, where the token budget has room: JOIN_SLOTS slots (for those that come after it) of its size class."""
        if (lane := self.scheduler.fitting(request, lanes, need(request), limit)) is not None:
            lane.waiting.extend([request])
            return True
        capacity = self.scheduler.size_class(request, need(request))
        if lanes and self._room(lanes) < capacity:
            return False
        lanes.append(self._lane([request], capacity, max(JOIN_SLOTS, request.n), load, lanes, need))
        return True

    def _admit(self, lane: Lane, tokens: int | None, max_new_tokens, follow_up, logprobs) -> tuple[list[Completion], int]:
        """Prefill waiting requests into the lane's free slots, a slot per choice, in groups of whole prompts
        within `tokens` (None: no limit); a prompt longer than the prefill budget starts its chunks with what
        is left. Returns the choices of requests cancelled before their turn and rows that finished at their
        first token, and the prompt tokens prefilled."""
        finished, used = [], 0
        while lane.waiting and (free := [s for s, row in enumerate(lane.slots) if row is None]):
            left = None if tokens is None else tokens - used
            head = len(lane.waiting.peek().input_ids)
            if left is not None and head > left:
                if head > self.scheduler.prefill_budget and not lane.chunking() and (first := self.scheduler.chunk_tokens(head, left, 0)):
                    done, started = self._start_chunks(lane, free, first, max_new_tokens, follow_up, logprobs)
                    finished, used = finished + done, used + started
                break
            group = []
            for request, choices in self.scheduler.group(lane.waiting, len(free), left):
                if cancelled(request):
                    finished += cancelled_choices(request, choices, len(self.sampler.columns))
                    continue
                group.append(self.scheduler.rows(request, choices, free, len(request.input_ids), max_new_tokens))
            if not group:
                continue
            rows = [row for choices in group for row in choices]
            for row in rows:
                row.draw()
            used += len(group) * max(len(rows[0].request.input_ids) for rows in group)
            outputs = self._prefill_splitting(group, lane.cache, logprobs).cpu().rows()
            for row, output in zip(rows, outputs):
                if self._accept(row, output, lane.tokens, follow_up):
                    finished.append(completion(row))
                else:
                    lane.slots[row.slot] = row
        return finished, used

    def _start_chunks(self, lane: Lane, free: list[int], tokens: int, max_new_tokens, follow_up, logprobs) -> tuple[list[Completion], int]:
        """The lane's next request into free slots, its prompt embedded once, and its first chunk of `tokens`."""
        request, choices = lane.waiting.take(len(free))
        if cancelled(request):
            return cancelled_choices(request, choices, len(self.sampler.columns)), 0
        for row in self.scheduler.rows(request, choices, free, 0, max_new_tokens):
            lane.slots[row.slot] = row
        lane.prompt = self.runner.chunked_prompt(lane.chunking())
        return self._chunk(lane, tokens, follow_up, logprobs), tokens

    def _chunk(self, lane: Lane, tokens: int, follow_up, logprobs) -> list[Completion]:
        """The next chunk, of up to `tokens`, of the prompt the lane prefills in chunks; after the last, each of
        its rows takes its first token (returned where that ends it)."""
        rows = lane.chunking()
        prompt = len(rows[0].request.input_ids)
        end = min(prompt, rows[0].position + max(1, tokens))
        hidden = self.runner.prefill_chunk(rows, lane.cache, lane.prompt, end)
        for row in rows:
            row.position = end
        if end < prompt:
            return []
        lane.prompt = None
        for row in rows:
            row.draw()
        draws, masks = draws_of(rows), masks_of(rows, self.runner.vocab_size)
        outputs = self.runner.head(hidden.expand(len(rows), -1), logprobs, None if draws is None else draws.to(self.runner.device),
                                   None if masks is None else masks.to(self.runner.device)).cpu().rows()
        finished = []
        for row, output in zip(rows, outputs):
            if self._accept(row, output, lane.tokens, follow_up):
                finished.append(completion(row))
                lane.slots[row.slot] = None
        return finished

    def _decode(self, lane: Lane, follow_up, logprobs) -> list[Completion]:
        """One decoding step of the lane's rows that have their prompt in full; the rows it finishes."""
        rows = [row if row is not None and not row.prefilling else None for row in lane.slots]
        if not any(rows):
            return []
        # split-KV attention reads each row's own length whatever the width: the whole slot, one graph per lane
        width = lane.capacity if self.runner.split_kv else min(lane.capacity, -(-max(row.position + 1 for row in rows if row) // WIDTH_STEP) * WIDTH_STEP)
        lane.cache.plan_step([row.position if row else 0 for row in lane.slots], [row.delta if row else 0 for row in lane.slots],
                             [row is not None for row in rows])
        vocabulary = self.runner.vocab_size
        outputs = self.runner.run_step(lane.cache, torch.tensor(lane.tokens), draws_of(rows), masks_of(rows, vocabulary), penalties_of(rows, vocabulary),
                                       width, lane.graphs, logprobs).rows()
        finished = []
        for slot, row in enumerate(rows):
            if row is None:
                continue
            row.position += 1
            if self._accept(row, outputs[slot], lane.tokens, follow_up):
                finished.append(completion(row))
                lane.slots[slot] = None
        return finished

    def _cancel(self, lane: Lane) -> list[Completion]:
        """The rows of cancelled requests, out of their slots before the next step (a prompt being prefilled
        in chunks included: no further chunk is run)."""
        slots = lane.slots
        gone = {id(row.request) for row in slots if row and cancelled(row.request)}
        finished = []
        for slot, row in enumerate(slots):
            if row and id(row.request) in gone:
                row.finish_reason = "cancelled"
                # a row still being prefilled in chunks has written nothing
                finished += [completion(row)] if row.tokens else cancelled_choices(row.request, range(row.choice, row.choice + 1), len(self.sampler.columns))
                slots[slot] = None
        if not lane.chunking():
            lane.prompt = None
        return finished

    def _accept(self, row: Row, step: RowStep, tokens: list[int], follow_up) -> bool:
        """Take a step's output for one row and set its next input; True when the row is done."""
        if row.following:
            if not row.pending:
                row.follow_up_logits = step.recorded
                return True
        else:
            token = step.chosen
            if row.matcher is not None and token not in self.stop_ids:
                row.matcher.accept(token)
            row.tokens.append(token)
            row.logits.append(step.recorded)
            if len(step.top_ids):
                row.top.append((step.top_logprobs, step.top_ids))
            on_token = row.request.on_token
            if token in self.stop_ids:
                # a grammar that admits text it cannot complete allows the stop token alone at the dead end
                row.finish_reason = "grammar" if row.matcher is not None and row.matcher.failed() else "stop"
            elif on_token is not None and on_token(row.choice, token) is False:
                row.finish_reason = "ended"
                return True  # nothing more computed for it, no follow-up either
            elif len(row.tokens) < row.limit:
                row.draw()
                tokens[row.slot] = token
                return False
            row.pending = follow_up(row.request.index, row.tokens) if follow_up else []
            if not row.pending:
                return True
            row.following = True
            if token not in self.stop_ids:  # the last written token is not in the cache yet
                row.pending.insert(0, token)
        tokens[row.slot] = row.pending.pop(0)
        return False

    def _room(self, lanes: list[Lane]) -> int:
        """KV-cache tokens a new lane may take beside `lanes`: the token budget (on a CPU without one, 65536)
        less what they hold; a lane whose one slot is larger than the whole budget (a prompt too long for it
        gets that slot all the same) is not counted, so that it does not keep every other request out. On a
        GPU without a budget, what free memory holds, beside room for prefill."""
        if self.scheduler.token_budget is None and (free := memory_budget(self.runner.device, kv_bytes_per_token(self.runner.config, self.runner.dtype))) is not None:
            prefix_cache = self.runner.prefix_cache
            return max(0, free - (prefix_cache.limit - prefix_cache.tokens if prefix_cache else 0))  # room for it to fill
        budget = self.scheduler.token_budget or 65536
        return budget - sum((lane.capacity + self.runner.state_tokens) * len(lane.slots) for lane in lanes if lane.capacity <= budget)

    def _allocate(self, capacity: int, requests: int, room: int | None = None) -> SlotCache:
        """A cache of as many slots of `capacity` tokens (and the fixed state a hybrid's slot keeps) as `room` (by default
        the whole budget: _room) allows, one at least, and no more than there are requests."""
        slots = max(1, min(requests, (self._room([]) if room is None else room) // (capacity + self.runner.state_tokens)))
        while True:
            try:
                return self.runner.new_cache(capacity, slots)
            except torch.OutOfMemoryError:
                if slots == 1:
                    raise
                slots //= 2
                empty_cache(self.runner.device)


def cancelled_choices(request: Request, choices: range, columns: int) -> list[Completion]:
    return [Completion(request.index, [], torch.empty(0, columns), choice=c, finish_reason="cancelled") for c in choices]


def completion(row: Row) -> Completion:
    top_logprobs = torch.tensor([logprobs for logprobs, _ in row.top], dtype=torch.float32) if row.top else None
    top_ids = torch.tensor([ids for _, ids in row.top], dtype=torch.long) if row.top else None
    follow_up_logits = None if row.follow_up_logits is None else torch.tensor(row.follow_up_logits, dtype=torch.float32)
    return Completion(row.request.index, row.tokens, torch.tensor(row.logits, dtype=torch.float32), follow_up_logits, top_logprobs, top_ids,
                      row.choice, row.finish_reason, row.matcher.error() if row.finish_reason == "grammar" else "")
