"""The scheduler: which requests run and how (the decoder's first part, infer/decoding.py): requests and the
rows they run as, the lookahead that loads their images as their turn nears, the lanes (caches of slots of one
size) they are cut into, the prefill groups, and the chunks a long prompt is prefilled in.

Lanes: requests come longest first, and every slot of a cache holds its longest request, so one cache for a
whole benchmark would size every slot for its single longest prompt: the requests are cut into segments, a new
one (and a new cache, a "lane") wherever the slots would at least double.

Prefill groups: prompts of similar length run as one right-padded batch of at most PREFILL_TOKENS tokens,
longest first. A deterministic decoder prefills each prompt in a group of its own, so that its prefill's kernels
see the same shapes whatever runs beside it.

Chunked prefill (a server's: `prefill_budget`, vLLM's max_num_batched_tokens): an engine step prefills at
most that many prompt tokens beside its decoding step. Whole prompts are grouped within it; a longer one is
prefilled into its slot a chunk per step, so that the other rows go on decoding meanwhile and a cancelled
prompt leaves at the next step. A chunk attends to every token before it, so a chunk of the budget's size costs
more the further into its prompt it starts (at 60,000 tokens, a 512-token chunk held each decoding step beside
it for seconds on a CPU): a chunk is cut so that its cost, its linear layers' and its attention's counted in
multiply-adds from the model's config (`chunk_size`), stays within what the budget's tokens cost at the
prompt's start, or twice their linear layers' where attention costs less; the decoding steps between chunks
then wait no longer deep into a long prompt than at its start. A deterministic decoder cuts a chunked prompt
at the same places whatever else a step holds.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from mmjudge.infer.cache import PREFILL_TOKENS, SlotCache, StepGraphs
from mmjudge.infer.grammar import Grammar, Matcher
from mmjudge.infer.sampler import Sampling, generator, seeded

# SDPA decoding attends to the slots' first `width` positions, rounded up to this step.
WIDTH_STEP = 512
# Slots of a lane opened for a request that arrived while the others run (a server's): room for those after it.
JOIN_SLOTS = 8


@dataclass
class Request:
    index: int
    input_ids: torch.Tensor  # 1-D prompt
    pixels: Future | None = None  # -> its images' Pixels in prompt order, or None; set when its turn nears
    max_new_tokens: int | None = None  # its own limit (cut to the context less the prompt); None: generate's
    sampling: Sampling = Sampling()
    n: int = 1  # independent answers ("choices"); the prompt is prefilled once, into n slots
    # Called after each written token but the stop token, with (choice, token); False ends that choice there.
    on_token: Callable[[int, int], bool] | None = None
    # Checked before the request is admitted and before each step; True ends every choice, computing nothing more.
    cancelled: Callable[[], bool] | None = None
    grammar: Grammar | None = None  # what every choice's text must follow (structured outputs)
    # Tokens of its prompt shared with others (a judge prompt's part before its first answer: rubric, question,
    # images), prefilled apart and kept in the decoder's prefix cache (infer/prefix_cache.py); 0: none.
    prefix: int = 0


Loader = Callable[[Request], Future]  # starts loading a request's tiles in the background
Joining = Callable[[Callable[[Request], bool]], None]  # generate's `joining`


def cancelled(request: Request) -> bool:
    return request.cancelled is not None and request.cancelled()


@dataclass
class Row:
    """One choice of a request, in its slot."""

    request: Request
    position: int  # where its next input token goes in the slot
    choice: int = 0
    slot: int = 0
    limit: int = 0  # its new tokens at most
    generator: torch.Generator | None = None  # a sampling row's own
    matcher: Matcher | None = None  # where its text stands in its request's grammar
    uniform: float = 0.0  # what its next token is drawn with
    finish_reason: str = "length"
    delta: int = 0  # its rotary position less its place, for the tokens it writes (M-RoPE; 0 otherwise)
    tokens: list[int] = field(default_factory=list)
    logits: list[list[float]] = field(default_factory=list)  # each written token's recorded columns
    top: list[tuple[list[float], list[int]]] = field(default_factory=list)  # each step's (log-probabilities, ids)
    pending: list[int] = field(default_factory=list)  # follow-up tokens still to feed
    following: bool = False
    follow_up_logits: list[float] | None = None
    # its prompt's tokens, as an int: every engine step asks each slot whether it is still prefilling, and len() of
    # a tensor cost more host time than the rest of that question
    prompt: int = field(init=False)

    def __post_init__(self) -> None:
        self.prompt = len(self.request.input_ids)

    def draw(self) -> None:
        """The number its next token is drawn with: the next of its own generator's sequence."""
        if self.generator is not None:
            self.uniform = torch.rand((), generator=self.generator).item()

    @property
    def prefill_left(self) -> int:
        """Prompt tokens still to prefill (in chunks)."""
        return max(0, self.prompt - self.position)

    @property
    def prefilling(self) -> bool:
        """Its prompt is being prefilled in chunks: no token of its own yet."""
        return self.prefill_left > 0


class Lookahead:
    """Requests pulled from an iterable a few at a time, so that only those near their turn have their
    images loading (20,000 samples' tiles would not fit in host memory)."""

    def __init__(self, requests: list[Request], ahead: int, load: Loader):
        self.source, self.ahead, self.load = iter(requests), ahead, load
        self.buffer: deque[Request] = deque()
        self.started = 0  # choices of the first request already in slots (a request of n takes n slots)
        self.choices = sum(request.n for request in requests)  # choices not started yet, of every request to come
        self._fill()

    def _fill(self) -> None:
        while len(self.buffer) < self.ahead and (request := next(self.source, None)) is not None:
            request.pixels = self.load(request)
            self.buffer.append(request)

    def __bool__(self) -> bool:
        return bool(self.buffer)

    def peek(self) -> Request:
        return self.buffer[0]

    def extend(self, requests: list[Request]) -> None:
        """Requests that arrived while others are decoded: they go after those waiting, loading at once."""
        for request in requests:
            request.pixels = self.load(request)
            self.buffer.append(request)
            self.choices += request.n

    def take(self, most: int) -> tuple[Request, range]:
        """The first request and up to `most` of its choices not started yet; it leaves once all have."""
        request = self.buffer[0]
        choices = range(self.started, min(request.n, self.started + most))
        self.started = choices.stop
        self.choices -= len(choices)
        if self.started == request.n:
            self.started = 0
            self.buffer.popleft()
            self._fill()
        return request, choices


@dataclass
class ChunkedPrompt:
    """A prompt prefilled in chunks, as its chunks take it: embedded once, with its rotary positions (axes,
    prompt), its DeepStack features (if its backbone has them) and where its image tokens are."""

    embeds: torch.Tensor  # (1, prompt, hidden)
    positions: torch.Tensor
    deepstack: list[torch.Tensor] | None
    images: torch.Tensor  # (prompt,) bool


@dataclass
class Lane:
    """A cache of slots of `capacity` tokens, the rows in them, and the requests waiting for them (its
    segment's, and a server's that arrived since and fit)."""

    cache: SlotCache
    capacity: int
    waiting: Lookahead
    slots: list[Row | None]
    tokens: list[int]  # each slot's next input token (a tensor is made of it once a step: an element written per row cost more)
    graphs: StepGraphs  # its decoding steps' CUDA graphs, which live and die with its cache
    prompt: ChunkedPrompt | None = None  # the prompt being prefilled in chunks

    def active(self) -> bool:
        return bool(self.waiting) or any(self.slots)

    def freed_within(self, steps: int) -> int:
        """Slots free now or within `steps` engine steps at the latest (a row's prompt still to prefill counted
        a step a token: at most)."""
        return sum(row is None or row.prefill_left + row.limit - len(row.tokens) <= steps for row in self.slots)

    def chunking(self) -> list[Row]:
        """The rows of the request whose prompt is being prefilled in chunks (one at a time), if any."""
        return [row for row in self.slots if row is not None and row.prefilling]


def segments(requests: list[Request], need: Callable[[Request], int]) -> Iterator[list[Request]]:
    """Runs of the (longest-first) requests, a new run where a slot for the next request would take at
    most half the tokens of the run's largest so far (`need`: a request's tokens in a slot): its cache then
    holds at least twice the slots."""
    start, largest = 0, 0
    for i, request in enumerate(requests):
        if 2 * need(request) <= largest:
            yield requests[start:i]
            start, largest = i, 0
        largest = max(largest, need(request))
    if requests:
        yield requests[start:]


def attention_weight(config) -> float:
    """What attending to one more key costs a token, in units of what the token's linear layers cost (per
    layer, multiply-adds): QK^T and AV over every head, against the q, k, v and o projections and the gated
    MLP's three matrices (a mixture of experts': those of the experts a token runs through, and its shared expert)."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if hasattr(config, "moe_intermediate_size"):
        mlp = config.num_experts_per_tok * config.moe_intermediate_size + getattr(config, "shared_expert_intermediate_size", 0)
    else:
        mlp = config.intermediate_size
    linear = config.hidden_size * head_dim * (2 * heads + 2 * kv_heads) + 3 * config.hidden_size * mlp
    return 2 * heads * head_dim / linear


def chunk_cost(tokens: int, start: int, weight: float) -> float:
    """A chunk's cost in linear-layer tokens (attention_weight): each of its tokens attends to at most every
    token before the chunk's end."""
    return tokens * (1 + weight * (start + tokens))


def chunk_size(room: int, start: int, weight: float) -> int:
    """The most tokens, `room` at most and one at least, of a chunk from `start` whose chunk_cost stays within
    `room` tokens' at a prompt's start, or within twice their linear layers' cost where their attention costs
    less (a model whose attention is cheap beside its linear layers keeps whole chunks longer)."""
    allowed = max(chunk_cost(room, 0, weight), 2 * room)
    b = 1 + weight * start  # the largest c with weight * c^2 + b * c <= allowed
    tokens = int((-b + math.sqrt(b * b + 4 * weight * allowed)) / (2 * weight))
    while tokens > 1 and chunk_cost(tokens, start, weight) > allowed:  # float rounding
        tokens -= 1
    return max(1, min(room, tokens))


class Scheduler:
    """The decoder's choices of what runs next (module docstring), for one model's config. `prefixed(request)`:
    whether a prompt is prefilled in two pieces, its shared part and the rest (infer/runner.py); such prompts are
    grouped with each other only."""

    def __init__(self, config, *, context: int, token_budget: int | None, prefill_budget: int | None, deterministic: bool,
                 prefixed: Callable[[Request], bool], ragged: bool = True):
        self.context = context  # prompt and new tokens together, at most
        self.token_budget = token_budget
        self.prefill_budget = prefill_budget  # prompt tokens an engine step prefills at most; None: whole prompts, no chunks
        self.deterministic = deterministic
        self.prefixed = prefixed
        self.ragged = ragged  # a prefill group into the cache may mix prompt lengths (infer/cache.py's `ragged`)
        self.attention_weight = attention_weight(config)  # what cuts a chunked prompt's chunks (chunk_size)

    def limit(self, request: Request, max_new_tokens: int) -> int:
        """A request's new tokens at most: its own limit or generate's, within the context after its prompt
        (one, to read the prompt's answer at all, where the prompt fills the context)."""
        return max(1, min(request.max_new_tokens or max_new_tokens, self.context - len(request.input_ids)))

    def rows(self, request: Request, choices: range, free: list[int], position: int, max_new_tokens: int) -> list[Row]:
        """A row per choice of the request, each in a slot taken from `free`, its next input at `position`."""
        request.sampling = seeded(request.sampling)  # once: its choices may start in several admissions
        limit = self.limit(request, max_new_tokens)
        return [Row(request, position, c, free.pop(0), limit, generator(request.sampling, c),
                    request.grammar.matcher() if request.grammar is not None else None) for c in choices]

    def group(self, waiting: Lookahead, slots: int, tokens: int | None = None, cached: bool = True) -> list[tuple[Request, range]]:
        """The next requests that fit in one prefill group of at most `tokens` (padding included; the first is
        taken whatever its length), each with the choices it starts, in at most `slots` slots: longest first,
        so the first sets the width. A deterministic decoder's groups hold one request; prompts with a shared part
        are grouped with each other only, prefilled in their two pieces; prompts prefilled into a cache that is not
        `ragged` (`cached`), with those of their length only."""
        budget = min(PREFILL_TOKENS, self.token_budget or PREFILL_TOKENS, tokens or PREFILL_TOKENS)
        group = [waiting.take(slots)]
        width = len(group[0][0].input_ids)
        slots -= len(group[0][1])
        prefixed = self.prefixed(group[0][0])
        while not self.deterministic and waiting and slots and self.prefixed(waiting.peek()) == prefixed \
                and (self.ragged or not cached or len(waiting.peek().input_ids) == width) \
                and (len(group) + 1) * max(width, len(waiting.peek().input_ids)) <= budget:
            group.append(waiting.take(slots))
            slots -= len(group[-1][1])
        return group

    def prefill_room(self, chunking: bool) -> int | None:
        """The prompt tokens new prompts may take this step: the whole budget (None: no limit), but leaving a quarter to
        a prompt being prefilled in chunks where there is one, which takes the rest (a short prompt never waits behind
        a long one's chunks)."""
        if self.prefill_budget is None or not chunking:
            return self.prefill_budget
        return self.prefill_budget - self.prefill_budget // 4

    def chunk_tokens(self, prompt_left: int, room: int, start: int) -> int | None:
        """The tokens of a chunked prompt's next chunk from `start`, with `prompt_left` of it still to prefill and
        `room` left of the step's budget, cut to cost no more than `room` tokens at a prompt's start
        (chunk_size); None: no chunk this step. A deterministic decoder cuts every prompt at the same places,
        chunks of a quarter of the budget so cut, whatever else the step holds, so that a chunked prompt is the
        same bits alone and beside others; a chunk waits for a step with room for it (an ongoing chunk always
        has a quarter: new prompts take three at most)."""
        if not self.deterministic:
            return min(prompt_left, chunk_size(room, start, self.attention_weight)) if room > 0 else 0
        chunk = min(prompt_left, chunk_size(max(1, self.prefill_budget // 4), start, self.attention_weight))
        return chunk if room >= chunk else None

    def fitting(self, request: Request, lanes: list[Lane], need: int, limit: int) -> Lane | None:
        """The lane a request that arrived joins: one that fits it (`need` tokens a slot) where slots for it are free, or
        free up within its own answer's length (`limit` steps: waiting longer would more than double its time), the
        fullest (its steps shared with the most rows); None: it needs a lane of its own (size_class)."""
        fitting = [lane for lane in lanes if lane.capacity >= need and lane.freed_within(limit) >= lane.waiting.choices + request.n]
        if not fitting:
            return None
        return max(fitting, key=lambda lane: (len(lane.slots) - lane.slots.count(None) + lane.waiting.choices, -lane.capacity))

    def size_class(self, request: Request, need: int) -> int:
        """The slots' tokens of a lane of its own for a request that arrived (`need` tokens a slot): WIDTH_STEP times a
        power of two, so that requests of similar lengths share it, within the context."""
        size = WIDTH_STEP * 2 ** math.ceil(math.log2(-(-need // WIDTH_STEP)))
        return min(size, self.context + need - len(request.input_ids))
