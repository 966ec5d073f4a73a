"""Decoding of many prompts at once, greedy or sampled, each computed as it would be alone.

    requests (longest first) -> prefill groups -> slots of a preallocated KV cache -> decoding steps
                                                  ^ a slot freed by a finished row takes the next request

Prefill: a group of prompts of similar length runs as one right-padded batch. Right padding puts every
pad after its row's last token, so causal attention alone keeps the pads out of every real token's view:
no padding mask is needed, and attention runs its causal flash kernel. Each row's rotary positions are its
own, by its backbone's rule (judge/backbones/: 1-D places for InternVL, 3-D M-RoPE for Qwen-VL; pads repeat
the row's last position), so each row gets its own long-rope regime (judge/rope.py) and its own image grid.
The group's keys and values go straight into the rows' slots.

Chunked prefill (a server's: `prefill_budget`, vLLM's max_num_batched_tokens): an engine step prefills at
most that many prompt tokens beside its decoding step. Whole prompts are grouped within it; a longer one is
prefilled into its slot a chunk per step, each chunk attending to the chunks before it through the slot,
so that the other rows go on decoding meanwhile and a cancelled prompt leaves at the next step. A chunk
attends to every token before it, so a chunk of the budget's size costs more the further into its prompt it
starts (at 60,000 tokens, a 512-token chunk held each decoding step beside it for seconds on a CPU): a chunk
is cut so that its cost, its linear layers' and its attention's counted in multiply-adds from the model's
config (`chunk_size`), stays within what the budget's tokens cost at the prompt's start, or twice their linear
layers' where attention costs less; the decoding steps between chunks then wait no longer deep into a long
prompt than at its start. A chunk's
rotary positions take the regime of the whole prompt (its last position rides along with the chunk's), so
a chunked prompt is encoded as its unchunked prefill encodes it, on either side of a long-rope switch.

Decoding: one token per busy slot and step, each row at its own place in its slot (and at its own rotary
position: the place plus the row's M-RoPE delta), attending to its own slot up to that place. On a GPU each
step is a CUDA graph, so a step costs the kernels' time rather than Python's, and its attention is
split-KV attention (infer/split_kv.py), which reads each row's keys and values up to its own place only:
one graph per cache. Elsewhere attention is SDPA through a mask over the slots' first `width` positions
(the longest row's place rounded up to `WIDTH_STEP`). A row that finishes leaves its slot at once and the
next prompt is prefilled into it, so the batch stays full instead of waiting for its longest answer.

A request may carry its own limit on new tokens (a chat request's `max_tokens`), anything up to the
model's context less its prompt (a longer one is cut there); the slots of a cache are sized for the
largest its requests need. Asked for `top_logprobs`, each step also returns the log-probabilities of its
k likeliest tokens over the whole vocabulary (the output layer's rows that stand for no token
excluded), computed per row like everything else; scoring asks for none and computes none.

Sampling (a request with a temperature above 0) keeps every row its own: each answer ("choice") draws one
uniform number per token on the host from its own generator, seeded from the request's seed and the choice's
index, and the token is read off the inverse CDF of the row's filtered distribution. So a seeded answer is
the same whatever is batched beside it, and a step's shapes stay fixed for its CUDA graph. A request for n
answers prefills its prompt once, its keys and values written into n slots.

Penalties (OpenAI's presence_penalty and frequency_penalty, greedy or sampled) are taken off a row's logits
before its token is chosen: presence * (count > 0) + frequency * count, counted over the tokens the row has
written. Each step builds them on the host, a (rows, vocabulary) input of fixed shape like the draws, so a
step with penalized rows is a CUDA graph too; log-probabilities stay the model's own.

A request may carry a grammar (structured outputs, infer/grammar.py): each of its rows has its own matcher,
which masks the tokens the grammar does not allow before the row's token is chosen or drawn, in the same
batched step as every other row (a row without a grammar allows every token). The mask is one more input
of fixed shape, so a step with constrained rows is a CUDA graph too; log-probabilities stay the model's
own, before the mask (vLLM's default, `raw_logprobs`).

Deterministic (`judge-score --deterministic`): each row's tokens and logits are the same bits in a batch of
any size as alone. Each prompt is prefilled in a group of its own, and a chunked one in chunks cut at the
same places whatever else a step holds, so that its prefill's kernels see the same shapes whatever runs
beside it; on a GPU the steps' linear layers run batch-invariant matrix products (infer/batch_invariant.py)
beside split-KV attention, which already is; both are Triton kernels.

Prefix cache (infer/prefix_cache.py): a request may name the tokens its prompt shares with others (`prefix`: a
judge prompt's rubric, question and images, before its first answer). Such a prompt is prefilled in two pieces
cut there, each as a chunk into its slots: the shared part, whose keys and values are copied from the cache where
it holds them and kept there where not, then the rest attending to it. The pieces are the same whether the shared
part is cached or not, so a cached part gives the same bits as a fresh one; only the rest's images go through the
vision tower where the part is cached. Such prompts are grouped with each other (a deterministic decoder's
alone): one right-padded pass prefills the shared parts the cache lacks, each distinct one once, and one more
every prompt's rest, each row attending to its own slot, so that many one-sample requests cost two passes, not
one or two each.

A request may be ended early: `on_token` returning False ends a choice after that token, and `cancelled()`
ends every choice of its request before admission or at the next step; a freed slot takes the next prompt.

A finished row may be given follow-up tokens (the forced `### Score` heading of a judge whose output did
not parse): they are fed after what it wrote, in the same slot, and the logits after the last one are
read, as if the judge had written them itself.

The model is driven through its own modules (embeddings, decoder layers, norm, output layer), so PEFT
adapters and DeepSpeed's hooks apply as in its own forward; the key/value cache is this module's.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import random
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch

from mmjudge.infer.batch_invariant import batch_invariant, deterministic_on, triton_runs_on, use_batch_invariant_linears
from mmjudge.infer.grammar import Grammar, Matcher, allowed_tokens, token_masks
from mmjudge.infer.prefix_cache import Entry, PrefixCache, prefix_key
from mmjudge.infer.split_kv import ATTENTION
from mmjudge.judge.backbones import backbone_of
from mmjudge.judge.rope import context_length, frequencies_of
from mmjudge.judge.vision import Pixels

# Prefill groups hold at most this many tokens, padding included: enough rows for the matrix units to run
# at full rate, few enough that the group's activations stay small beside the KV cache.
PREFILL_TOKENS = 16384
# SDPA decoding attends to the slots' first `width` positions, rounded up to this step.
WIDTH_STEP = 512
# Slots of a lane opened for a request that arrived while the others run (a server's): room for those after it.
JOIN_SLOTS = 8


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy, the argmax (the default)
    top_p: float = 1.0  # draw from the fewest likeliest tokens whose probability reaches top_p
    top_k: int = 0  # draw from the k likeliest tokens; 0: no cut
    seed: int | None = None  # None: a fresh random seed per request
    # OpenAI's penalties on a token's logit, by how often the answer has written it: presence * (count > 0) +
    # frequency * count (greedy rows too: they change which token is likeliest)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0


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


class Draws(NamedTuple):
    """Each row's sampling settings and the uniform number its next token is drawn with; greedy rows have
    temperature 0 and take the argmax."""

    temperature: torch.Tensor  # (rows,) float
    top_p: torch.Tensor  # (rows,) float
    top_k: torch.Tensor  # (rows,) long, 0: no cut
    uniform: torch.Tensor  # (rows,) float in [0, 1)

    def to(self, device) -> Draws:
        return Draws(*(t.to(device) for t in self))


class Step(NamedTuple):
    """What the model gives for each row of a forward pass, at the row's last position."""

    chosen: torch.Tensor  # (rows,) the written token: the argmax, or the draw of a sampling row
    recorded: torch.Tensor  # (rows, columns) the recorded columns of the logits
    top_logprobs: torch.Tensor  # (rows, k) the k largest log-probabilities (k = 0 unless asked)
    top_ids: torch.Tensor  # (rows, k) their tokens

    def cpu(self) -> Step:
        return Step(*(t.cpu() for t in self))

    def rows(self) -> list[RowStep]:
        """Each row's outputs as Python values: one call per output rather than one per row and output, and no tensor
        per row and step (a float32 goes to a Python float and back to the same bits)."""
        return [RowStep(*row) for row in zip(self.chosen.tolist(), self.recorded.tolist(), self.top_logprobs.tolist(), self.top_ids.tolist())]


class RowStep(NamedTuple):
    """One row's outputs of a forward pass (Step.rows)."""

    chosen: int
    recorded: list[float]
    top_logprobs: list[float]
    top_ids: list[int]


@dataclass
class _Row:
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


class SlotCache:
    """Keys and values of `slots` sequences of up to `capacity` tokens, for every layer. Passed to the
    decoder layers as their cache: `update`, with the signature of transformers' public `Cache.update`,
    stores a step's (or a prefill's) keys and values and returns what attention reads."""

    def __init__(self, layers: int, slots: int, heads: int, capacity: int, head_dim: int, dtype, device, zeroed: bool = True):
        # zeroed: attention reads a slot past its row's tokens (masked, but a NaN there would still spread);
        # not zeroed: its user writes every place attention reads (_prefill_prefixed)
        shape = (layers, slots, heads, capacity, head_dim)
        self.keys = (torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=device)
        self.values = (torch.zeros if zeroed else torch.empty)(shape, dtype=dtype, device=device)
        self.rows = torch.arange(slots, device=device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=device)  # decoding: each slot's write position
        self.deltas = torch.zeros(slots, dtype=torch.long, device=device)  # decoding: each slot's rotary position less its place
        self.width = capacity
        # while prefilling: (row of the group, slot, start, length) of what each slot takes
        self.prefill: list[tuple[int, int, int, int]] | None = None
        # chunks' (slots, end): each attends to its slot up to that end (a mask keeps it to its own part)
        self.chunk: tuple[list[int], int] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        # Cache.update's parameters, by its names (a caller may pass them by keyword). Whatever else attention
        # passes (from transformers 5.24, `kwargs=` its own keyword arguments; in some models rotary tables or
        # cache positions) is not needed: keys come rotated, and the positions are ours.
        key, value, layer = key_states, value_states, layer_idx
        if self.prefill is not None:
            for row, slot, start, length in self.prefill:
                self.keys[layer, slot, :, start:start + length] = key[row, :, :length]
                self.values[layer, slot, :, start:start + length] = value[row, :, :length]
            if self.chunk is None:
                return key, value  # the group attends to itself
            slots, end = self.chunk  # each chunk's slot: the chunks before it, and itself
            return self.keys[layer, slots, :, :end], self.values[layer, slots, :, :end]
        self.keys[layer, self.rows, :, self.positions] = key[:, :, 0]
        self.values[layer, self.rows, :, self.positions] = value[:, :, 0]
        return self.keys[layer, :, :, : self.width], self.values[layer, :, :, : self.width]


class Decoder:
    """Decoding (module docstring) with one model. `columns` are the vocabulary entries whose logits
    are recorded at every written token (a judge's score tokens); `suppress` are never written."""

    def __init__(self, model: torch.nn.Module, *, device, pad_id: int, stop_ids: tuple[int, ...], suppress: list[int],
                 columns: torch.Tensor, token_budget: int | None, prefill_budget: int | None = None, cuda_graphs: bool = True,
                 deterministic: bool | None = False, prefix_cache: int = 0):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.vlm, self.lm_head = base.model, base.lm_head
        self.lm = self.vlm.language_model
        self.config = self.lm.config
        self.backbone = backbone_of(base.config)
        self.device = torch.device(device)
        self.dtype = self.lm.embed_tokens.weight.dtype
        self.pad_id, self.stop_ids = pad_id, frozenset(stop_ids)
        self.suppress = torch.tensor(suppress, dtype=torch.long, device=self.device)
        self.columns = columns.to(self.device)
        self.vocab_size = self.config.vocab_size  # the output layer's rows (its weight may be partitioned, under ZeRO-3)
        self.token_budget = token_budget
        self.prefill_budget = prefill_budget  # prompt tokens an engine step prefills at most; None: whole prompts, no chunks
        self.context = context_length(self.config)  # prompt and new tokens together, at most
        self.attention_weight = attention_weight(self.config)  # what cuts a chunked prompt's chunks (chunk_size)
        self.cache_argument = _cache_argument(self.lm.layers[0])
        # Graphs need every weight in place: not under ZeRO-3, whose hooks gather weights as each layer runs.
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda" and not any(hasattr(p, "ds_id") for p in model.parameters())
        # Decoding steps' attention: split-KV on a GPU (Triton comes with PyTorch's CUDA builds), SDPA elsewhere.
        self.split_kv = triton_runs_on(self.device)
        # Deterministic: each row's tokens and logits the same bits in any batch (module docstring); None:
        # wherever its kernels run.
        self.deterministic = deterministic_on(self.device, deterministic)
        self.batch_invariant = self.deterministic and self.split_kv
        if self.deterministic:
            use_batch_invariant_linears(self.lm)
            use_batch_invariant_linears(self.lm_head)
        # The shared parts of prompts, at most `prefix_cache` tokens of them (infer/prefix_cache.py); None: off.
        self.prefix_cache = PrefixCache(prefix_cache) if prefix_cache else None
        # The shared parts the last prefill group made and the cache refused (_prefill_prefixed): a server's round sorts
        # a GRPO group's answers among others of like length, so its part may be asked again by the next prefill group.
        self.refused: dict[bytes, Entry] = {}
        # Forward passes run, for a server's metrics: prefill groups (or chunks) and decoding steps (one for all
        # busy slots); and the prompt tokens prefilled.
        self.prefills = self.steps = self.prefill_tokens = 0

    # -- the model, driven by hand --------------------------------------------------------------------

    def _embed(self, input_ids: torch.Tensor, pixels: Pixels | None) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The prompts' input embeddings, the image tokens' replaced by the vision tower's features, and the
        backbone's DeepStack features for the image tokens, if it has them."""
        embeds = self.lm.embed_tokens(input_ids)
        if pixels is None:
            return embeds, None
        features, deepstack = self.backbone.features(self.vlm, pixels)
        placeholders = (input_ids == self.backbone.image_token_id).unsqueeze(-1)
        return embeds.masked_scatter(placeholders, features.to(embeds.dtype)), deepstack

    def _layers(self, hidden: torch.Tensor, places: torch.Tensor, rotary: torch.Tensor, mask: torch.Tensor | None,
                cache: SlotCache | None, deepstack: list[torch.Tensor] | None = None, images: torch.Tensor | None = None,
                reach: torch.Tensor | None = None, slot_lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder layers and the final norm over `hidden` at `places` (batch, length) with the rotary
        positions `rotary` ((batch, length), or (3, batch, length) for M-RoPE); DeepStack features are added to
        the image tokens (`images`, a mask) after the early layers, as the native model adds them. `reach`:
        rotary positions that ride along with `rotary` for the rotary embedding alone (a chunk's prompt's last
        position: judge/rope.py picks a row's regime by its largest position), their embeddings dropped.
        `slot_lengths`: a decoding step's split-KV attention, each row reading its slot up to that length (the
        mask is then not read)."""
        attention = {} if slot_lengths is None else {"slot_lengths": slot_lengths}
        cos, sin = self.lm.rotary_emb(hidden, position_ids=rotary if reach is None else torch.cat([rotary, reach], dim=-1))
        position_embeddings = (cos[..., : hidden.shape[1], :], sin[..., : hidden.shape[1], :])
        for index, layer in enumerate(self.lm.layers[: self.config.num_hidden_layers]):
            hidden = layer(hidden, attention_mask=mask, position_ids=places, position_embeddings=position_embeddings,
                           **{self.cache_argument: cache}, **attention)
            if deepstack is not None and index < len(deepstack):
                hidden = hidden.clone()
                hidden[images] = hidden[images] + deepstack[index].to(hidden.dtype)
        return self.lm.norm(hidden)

    def _head(self, hidden: torch.Tensor, logprobs: int, draws: Draws | None, masks: torch.Tensor | None,
              penalties: torch.Tensor | None = None) -> Step:
        """A step's outputs from last-position hidden states (rows, hidden); each of fixed shape, so that a
        CUDA graph can return them. Without draws (no row samples) every row takes the argmax; without masks
        (no row has a grammar) every token may be written; `penalties` (rows, vocabulary) are taken off the
        logits the token is chosen from (none: no row has a penalty)."""
        logits = self.lm_head(hidden).float()
        recorded = logits[:, self.columns]
        if len(self.suppress):
            logits.index_fill_(1, self.suppress, float("-inf"))
        writable = logits if penalties is None else logits - penalties
        writable = writable if masks is None else writable.masked_fill(~allowed_tokens(masks, logits.shape[1]), float("-inf"))
        chosen = writable.argmax(-1)
        if draws is not None:
            chosen = torch.where(draws.temperature > 0, _sample(writable, draws), chosen)
        if not logprobs:
            return Step(chosen, recorded, logits[:, :0], chosen[:, None][:, :0])
        # The model's own log-probabilities, whatever the temperature and penalties (as OpenAI reports them).
        log_softmax = logits.log_softmax(-1)
        # The written token first even where a tie lets topk put another first (bf16 logits tie often), or a draw
        # wrote a less likely one.
        top_logprobs, top_ids = log_softmax.scatter(1, chosen[:, None], float("inf")).topk(logprobs, dim=-1)
        top_logprobs = torch.cat([log_softmax.gather(1, chosen[:, None]), top_logprobs[:, 1:]], dim=1)
        return Step(chosen, recorded, top_logprobs, top_ids)

    @torch.no_grad()
    def _prefill(self, group: list[list[_Row]], cache: SlotCache | None, logprobs: int) -> Step:
        """One right-padded forward over the group's prompts (module docstring), each given as the rows of its
        choices: its keys and values go to each row's slot, and each row gets its own output. A prompt with a
        shared part (`_prefixed`) is a group of its own, prefilled in two pieces (_prefill_prefixed)."""
        if self._prefixed(group[0][0].request):
            return self._prefill_prefixed(group, cache, logprobs)
        requests = [rows[0].request for rows in group]
        lengths = torch.tensor([len(r.input_ids) for r in requests])
        width = int(lengths.max())
        input_ids = torch.full((len(group), width), self.pad_id, dtype=torch.long)
        for sequence, request in enumerate(requests):
            input_ids[sequence, : len(request.input_ids)] = request.input_ids
        # pads repeat their row's last position, so that no row's largest position is another's
        places = torch.minimum(torch.arange(width), (lengths - 1)[:, None])
        images = [r.pixels.result() for r in requests]
        rotary = []
        for rows, request, pixels in zip(group, requests, images):
            positions, delta = self.backbone.positions(request.input_ids, None if pixels is None else pixels.grids)
            rotary.append(positions[:, places[len(rotary)]])  # (axes, width): pads repeat the last position
            for row in rows:
                row.delta = delta
        rotary = torch.stack(rotary, dim=1)  # (axes, batch, width)
        rotary = rotary if self.backbone.mrope else rotary[0]
        input_ids, places, rotary = input_ids.to(self.device), places.to(self.device), rotary.to(self.device)
        # each copied from its own pinned buffer (a concatenation on the host would not be pinned)
        pixels = Pixels.cat([p.to(self.device, self.dtype, non_blocking=True) for p in images if p is not None])
        if cache is not None:
            cache.prefill = [(sequence, row.slot, 0, int(lengths[sequence])) for sequence, rows in enumerate(group) for row in rows]
        try:
            embeds, deepstack = self._embed(input_ids, pixels)
            hidden = self._layers(embeds, places, rotary, None, cache, deepstack, input_ids == self.backbone.image_token_id)
        finally:
            if cache is not None:
                cache.prefill = None
        self.prefills += 1
        self.prefill_tokens += int(lengths.sum())
        sequences = torch.tensor([sequence for sequence, rows in enumerate(group) for _ in rows])
        rows = [row for rows in group for row in rows]
        draws, masks = _draws(rows), self._masks(rows)
        return self._head(hidden[sequences.to(self.device), (lengths[sequences] - 1).to(self.device)], logprobs,
                          None if draws is None else draws.to(self.device), None if masks is None else masks.to(self.device))

    def _prefixed(self, request: Request) -> bool:
        """Whether the request's prompt is prefilled in two pieces, its shared part from the prefix cache or kept there."""
        if self.prefix_cache is None or not 0 < request.prefix < len(request.input_ids):
            return False
        # never a cut within an image's tokens (ints: asked of every request a prefill group might take)
        return not int(request.input_ids[request.prefix - 1]) == int(request.input_ids[request.prefix]) == self.backbone.image_token_id

    @torch.no_grad()
    def _prefill_prefixed(self, group: list[list[_Row]], cache: SlotCache | None, logprobs: int) -> Step:
        """Prompts prefilled in two pieces each, their shared parts and then the rest, as chunks (_prefill_chunks)
        into their rows' slots: one pass for the shared parts the prefix cache lacks (each distinct part once, kept
        there after), their keys and values copied into the slots of the prompts that share them or that the cache
        holds, then one pass for every prompt's rest. The same two pieces either way, so that a cached shared part
        gives the same bits as a fresh one (infer/prefix_cache.py); those the cache refused are kept for the next group
        alone (`refused`: at most a prefill group's). Logits mode (no cache) prefills into slots of
        its own, one per prompt, of which only what the shared parts do not fill is zeroed (the rest is written)."""
        own_slots = cache is None
        if own_slots:
            cache = self._slots(max(len(rows[0].request.input_ids) for rows in group), len(group), zeroed=False)
            for slot, rows in enumerate(group):
                for row in rows:
                    row.slot = slot
        prompts = [self._prefixed_prompt(rows) for rows in group]
        if own_slots:
            for prompt in prompts:
                cache.keys[:, prompt.rows[0].slot, :, prompt.shared:] = 0
                cache.values[:, prompt.rows[0].slot, :, prompt.shared:] = 0
        parts: dict[bytes, Entry] = {}  # each shared part of the group by its key, from the cache or prefilled now
        fresh: dict[bytes, _PrefixedPrompt] = {}  # the first prompt of each shared part the cache lacks, by its key
        for prompt in prompts:
            if prompt.key in parts or prompt.key in fresh:
                self.prefix_cache.shared(prompt.key)  # an earlier prompt of the group brings it
            elif prompt.key in self.refused and torch.equal(self.refused[prompt.key].input_ids, prompt.input_ids[:prompt.shared]):
                self.prefix_cache.shared(prompt.key)  # the last group made it
                parts[prompt.key] = self.refused[prompt.key]
            elif (entry := self.prefix_cache.get(prompt.key, prompt.input_ids[:prompt.shared])) is not None:
                parts[prompt.key] = entry
            else:
                fresh[prompt.key] = prompt
        if fresh:
            for prompt in fresh.values():
                for row in prompt.rows:
                    row.position = 0
            self._prefill_chunks([(p.rows, self._piece(p.input_ids, p.positions, p.shared_pixels, 0, p.shared), p.shared) for p in fresh.values()], cache)
            for key, prompt in fresh.items():
                slot, shared = prompt.rows[0].slot, prompt.shared
                parts[key] = Entry(prompt.input_ids[:shared].clone(), cache.keys[:, slot, :, :shared].clone(), cache.values[:, slot, :, :shared].clone())
                self.prefix_cache.put(key, parts[key])
        self.refused = {key: entry for key, entry in parts.items() if key not in self.prefix_cache.entries}
        for prompt in prompts:
            if fresh.get(prompt.key) is not prompt:  # its slots hold no shared part yet
                for row in prompt.rows:
                    cache.keys[:, row.slot, :, :prompt.shared] = parts[prompt.key].keys
                    cache.values[:, row.slot, :, :prompt.shared] = parts[prompt.key].values
            for row in prompt.rows:
                row.position = prompt.shared
        hidden = self._prefill_chunks([(p.rows, self._piece(p.input_ids, p.positions, p.own_pixels, p.shared, len(p.input_ids)), len(p.input_ids))
                                       for p in prompts], cache)
        rows = [row for p in prompts for row in p.rows]
        for row in rows:
            row.position = len(row.request.input_ids)
        sequences = torch.tensor([sequence for sequence, p in enumerate(prompts) for _ in p.rows], device=self.device)
        draws, masks = _draws(rows), self._masks(rows)
        return self._head(hidden[sequences], logprobs, None if draws is None else draws.to(self.device), None if masks is None else masks.to(self.device))

    def _prefixed_prompt(self, rows: list[_Row]) -> _PrefixedPrompt:
        """A prompt of _prefill_prefixed, its rows given their rotary delta: its images split at its shared part's
        end, and the key of that part."""
        request = rows[0].request
        input_ids, shared = request.input_ids, request.prefix
        pixels = request.pixels.result()
        positions, delta = self.backbone.positions(input_ids, None if pixels is None else pixels.grids)
        for row in rows:
            row.delta = delta
        images = input_ids == self.backbone.image_token_id
        shared_pixels, own_pixels = (None, None) if pixels is None else pixels.split(int(images[:shared].sum()))
        if shared_pixels is not None and pixels.shared_digest is None:  # a key without the pixels would answer another image's question
            raise RuntimeError(f"request {request.index}: its shared part's images were loaded without their digest (infer/engine.py's _load_pixels)")
        key = prefix_key(input_ids[:shared], None if shared_pixels is None else pixels.shared_digest, frequencies_of(self.lm.rotary_emb, len(input_ids)))
        return _PrefixedPrompt(rows, input_ids, shared, positions, shared_pixels, own_pixels, key)

    def _piece(self, input_ids: torch.Tensor, positions: torch.Tensor, pixels: Pixels | None, start: int, end: int) -> _ChunkedPrompt:
        """A prompt as _prefill_chunk reads it for its tokens from `start` to `end`: those tokens embedded, the
        images among them (`pixels`) through the vision tower, their DeepStack features where they stand among
        the prompt's images (what lies outside the piece is never read)."""
        input_ids = input_ids.to(self.device)
        images = input_ids == self.backbone.image_token_id
        embeds, deepstack = self.lm.embed_tokens(input_ids[None]), None
        if pixels is not None:
            features, deepstack = self.backbone.features(self.vlm, pixels.to(self.device, self.dtype))
            within = images.clone()
            within[:start], within[end:] = False, False
            embeds = embeds.masked_scatter(within[None, :, None], features.to(embeds.dtype))
            if deepstack is not None:
                before = int(images[:start].sum())
                deepstack = [torch.cat([layer.new_zeros(before, layer.shape[-1]), layer]) for layer in deepstack]
        return _ChunkedPrompt(embeds, positions.to(self.device), deepstack, images)

    def _prefill_chunk(self, rows: list[_Row], cache: SlotCache, prompt: _ChunkedPrompt, end: int) -> torch.Tensor:
        """The next chunk of one prompt (_prefill_chunks): the hidden state of its last position."""
        return self._prefill_chunks([(rows, prompt, end)], cache)[0]

    @torch.no_grad()
    def _prefill_chunks(self, chunks: list[tuple[list[_Row], _ChunkedPrompt, int]], cache: SlotCache) -> torch.Tensor:
        """The next chunk of each of some prompts in one right-padded pass, each given as (its rows, the prompt, the
        chunk's end): a chunk runs from its rows' position to its end, its keys and values go to every row's slot
        after the chunks before it, which it attends to through its first row's slot (a mask keeps each chunk to its
        own slot, causal, and a pad after it). The hidden state of each chunk's last position, (chunks, hidden)."""
        starts = [rows[0].position for rows, _, _ in chunks]
        lengths = [end - start for (_, _, end), start in zip(chunks, starts)]
        width, reach_end = max(lengths), max(end for _, _, end in chunks)
        # pads repeat the chunk's last place and rotary position (its embeddings are zeros, its outputs never read)
        places = torch.stack([torch.arange(start, start + width, device=self.device).clamp(max=start + length - 1)
                              for start, length in zip(starts, lengths)])
        rotary = torch.stack([prompt.positions[:, places[k]] for k, (_, prompt, _) in enumerate(chunks)], dim=1)  # (axes, chunks, width)
        reach = torch.stack([prompt.positions[:, -1:] for _, prompt, _ in chunks], dim=1)
        if not self.backbone.mrope:
            rotary, reach = rotary[0], reach[0]
        embeds = torch.zeros(len(chunks), width, chunks[0][1].embeds.shape[-1], dtype=self.dtype, device=self.device)
        images = torch.zeros(len(chunks), width, dtype=torch.bool, device=self.device)
        layers = next((len(prompt.deepstack) for _, prompt, _ in chunks if prompt.deepstack is not None), None)
        deepstack = None if layers is None else [[] for _ in range(layers)]
        for k, ((_, prompt, end), start, length) in enumerate(zip(chunks, starts, lengths)):
            embeds[k, :length] = prompt.embeds[0, start:end]
            images[k, :length] = prompt.images[start:end]
            if prompt.deepstack is not None:  # the features of the chunk's image tokens: those after the chunks before it
                before, count = int(prompt.images[:start].sum()), int(prompt.images[start:end].sum())
                for layer, features in zip(deepstack, prompt.deepstack):
                    layer.append(features[before:before + count])
        deepstack = None if deepstack is None else [torch.cat(layer) for layer in deepstack]
        tokens = torch.arange(width, device=self.device)[None, :, None]
        visible = torch.arange(reach_end, device=self.device) <= torch.tensor(starts, device=self.device)[:, None, None] + tokens
        mask = visible[:, None]  # (chunks, 1, width, end): each chunk causal over its own slot
        cache.prefill = [(k, row.slot, start, length) for k, ((rows, _, _), start, length) in enumerate(zip(chunks, starts, lengths)) for row in rows]
        cache.chunk = ([rows[0].slot for rows, _, _ in chunks], reach_end)
        try:
            hidden = self._layers(embeds, places, rotary, mask, cache, deepstack, images, reach=reach)
        finally:
            cache.prefill, cache.chunk = None, None
        self.prefills += 1
        self.prefill_tokens += sum(lengths)
        return hidden[torch.arange(len(chunks), device=self.device), torch.tensor(lengths, device=self.device) - 1]

    @torch.no_grad()
    def _step(self, cache: SlotCache, tokens: torch.Tensor, draws: Draws | None, masks: torch.Tensor | None, penalties: torch.Tensor | None,
              logprobs: int) -> Step:
        """One decoding step of every slot: tokens (slots,) at cache.positions."""
        places = cache.positions[:, None]
        rotary = places + cache.deltas[:, None]
        rotary = rotary.expand(3, -1, -1) if self.backbone.mrope else rotary
        embeds = self.lm.embed_tokens(tokens[:, None])
        with batch_invariant(self.batch_invariant):
            if self.split_kv:
                with _attention_implementation(self.config, ATTENTION):
                    hidden = self._layers(embeds, places, rotary, None, cache, slot_lengths=cache.positions + 1)
            else:
                mask = (torch.arange(cache.width, device=self.device) <= places)[:, None, None, :]
                hidden = self._layers(embeds, places, rotary, mask, cache)
            return self._head(hidden[:, -1], logprobs, draws, masks, penalties)

    def _masks(self, rows: list[_Row | None]) -> torch.Tensor | None:
        """The rows' token masks (infer/grammar.py), or None where no row has a grammar. A row fed follow-up
        tokens writes nothing of its own: it has none."""
        return token_masks([row.matcher if row is not None and not row.following else None for row in rows], self.vocab_size)

    # -- logits mode ------------------------------------------------------------------------------------

    def logits(self, requests: list[Request], load: Loader) -> Iterator[list[tuple[int, torch.Tensor]]]:
        """The recorded columns at each prompt's last position, group by group (no cache, no decoding); a
        request cancelled before its group runs has none."""
        waiting = _Lookahead(requests, 64, load)
        while waiting:
            group = [(r, choices) for r, choices in self._group(waiting, len(waiting.buffer)) if not _cancelled(r)]
            if not group:  # every client of the group has gone: nothing is computed for them
                continue
            recorded = self._prefill_splitting([[_Row(r, len(r.input_ids))] for r, _ in group], None, 0).recorded
            yield [(r.index, recorded[row].cpu()) for row, (r, _) in enumerate(group)]

    def _group(self, waiting: _Lookahead, slots: int, tokens: int | None = None) -> list[tuple[Request, range]]:
        """The next requests that fit in one prefill group of at most `tokens` (padding included; the first is
        taken whatever its length), each with the choices it starts, in at most `slots` slots: longest first,
        so the first sets the width. A deterministic decoder's groups hold one request; prompts with a shared part
        (_prefill_prefixed) are grouped with each other only, prefilled in their two pieces."""
        budget = min(PREFILL_TOKENS, self.token_budget or PREFILL_TOKENS, tokens or PREFILL_TOKENS)
        group = [waiting.take(slots)]
        width = len(group[0][0].input_ids)
        slots -= len(group[0][1])
        prefixed = self._prefixed(group[0][0])
        while not self.deterministic and waiting and slots and self._prefixed(waiting.peek()) == prefixed \
                and (len(group) + 1) * max(width, len(waiting.peek().input_ids)) <= budget:
            group.append(waiting.take(slots))
            slots -= len(group[-1][1])
        return group

    def _prefill_splitting(self, group: list[list[_Row]], cache: SlotCache | None, logprobs: int) -> Step:
        """_prefill, split in halves when the device runs out of memory; OutOfMemory for a lone prompt."""
        try:
            return self._prefill(group, cache, logprobs)
        except torch.OutOfMemoryError:
            if len(group) == 1:
                raise OutOfMemory(group[0][0].request) from None
        _empty_cache(self.device)
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
            return len(request.input_ids) + self._limit(request, max_new_tokens) + follow_up_tokens + 1

        segments = deque(_segments(requests, need))
        lanes: list[_Lane] = []
        while segments or lanes:
            # a segment's lane opens once the lanes before it are done, or (a server's) at once where the budget has room
            while segments and (not lanes or (joining is not None and self._room(lanes) >= max(map(need, segments[0])))):
                segment = segments.popleft()
                lanes.append(self._lane(segment, max(map(need, segment)), sum(r.n for r in segment), load, lanes, need))
            finished = [c for lane in lanes for c in self._cancel(lane)]  # first, so that their slots take waiting requests at once
            if joining is not None:
                joining(lambda request: self._take(request, lanes, need, load, self._limit(request, max_new_tokens)))
            # the step's prompt tokens: new prompts first, whole (a short prompt never waits behind a long one's chunks),
            # but leaving a quarter to the prompts being prefilled in chunks, which take the rest
            ongoing, used = [lane for lane in lanes if lane.chunking()], 0
            admitted = self.prefill_budget if self.prefill_budget is None or not ongoing else self.prefill_budget - self.prefill_budget // 4
            for lane in lanes:
                done, tokens = self._admit(lane, None if admitted is None else admitted - used, max_new_tokens, follow_up, top_logprobs)
                finished, used = finished + done, used + tokens
            for lane in sorted(ongoing, key=lambda lane: lane.chunking()[0].prefill_left):  # the nearest to done first
                row = lane.chunking()[0]
                if (tokens := self._chunk_tokens(row.prefill_left, self.prefill_budget - used, row.position)) is None:
                    continue
                finished += self._chunk(lane, tokens, follow_up, top_logprobs)
                used += tokens
            for lane in lanes:
                finished += self._decode(lane, follow_up, top_logprobs)
            lanes = [lane for lane in lanes if lane.active()]
            if finished:
                yield finished

    def _limit(self, request: Request, max_new_tokens: int) -> int:
        """A request's new tokens at most: its own limit or generate's, within the context after its prompt
        (one, to read the prompt's answer at all, where the prompt fills the context)."""
        return max(1, min(request.max_new_tokens or max_new_tokens, self.context - len(request.input_ids)))

    def _lane(self, requests: list[Request], capacity: int, slots: int, load: Loader, lanes: list[_Lane], need) -> _Lane:
        """A lane for `requests` with up to `slots` slots of `capacity` tokens, as the budget left beside
        `lanes` allows (one at least, where it is the only lane)."""
        try:
            cache = self._allocate(capacity, slots, self._room(lanes) if lanes else None)
        except torch.OutOfMemoryError:  # not even one slot: a long prompt, or a long answer asked for
            raise OutOfMemory(max(requests, key=need)) from None
        slots = cache.rows.numel()
        return _Lane(cache, capacity, _Lookahead(requests, 2 * slots, load), [None] * slots, [self.pad_id] * slots)

    def _take(self, request: Request, lanes: list[_Lane], need, load: Loader, limit: int) -> bool:
        """Place a request that arrived: in a lane that fits it where slots for it are free, or free up within
        its own answer's length (`limit` steps: waiting longer would more than double its time), the fullest
        (its steps shared with the most rows); or else in a lane of its own, where the token budget has room:
        JOIN_SLOTS slots (for those that come after it) of a size class, WIDTH_STEP tokens times a power of
        two (so that requests of similar lengths share it)."""
        fitting = [lane for lane in lanes if lane.capacity >= need(request) and lane.freed_within(limit) >= lane.waiting.choices + request.n]
        if fitting:
            max(fitting, key=lambda lane: (len(lane.slots) - lane.slots.count(None) + lane.waiting.choices, -lane.capacity)).waiting.extend([request])
            return True
        size_class = WIDTH_STEP * 2 ** math.ceil(math.log2(-(-need(request) // WIDTH_STEP)))
        capacity = min(size_class, self.context + need(request) - len(request.input_ids))
        if lanes and self._room(lanes) < capacity:
            return False
        lanes.append(self._lane([request], capacity, max(JOIN_SLOTS, request.n), load, lanes, need))
        return True

    def _admit(self, lane: _Lane, tokens: int | None, max_new_tokens, follow_up, logprobs) -> tuple[list[Completion], int]:
        """Prefill waiting requests into the lane's free slots, a slot per choice, in groups of whole prompts
        within `tokens` (None: no limit); a prompt longer than the prefill budget starts its chunks with what
        is left. Returns the choices of requests cancelled before their turn and rows that finished at their
        first token, and the prompt tokens prefilled."""
        finished, used = [], 0
        while lane.waiting and (free := [s for s, row in enumerate(lane.slots) if row is None]):
            left = None if tokens is None else tokens - used
            head = len(lane.waiting.peek().input_ids)
            if left is not None and head > left:
                if head > self.prefill_budget and not lane.chunking() and (first := self._chunk_tokens(head, left, 0)):
                    done, started = self._start_chunks(lane, free, first, max_new_tokens, follow_up, logprobs)
                    finished, used = finished + done, used + started
                break
            group = []
            for request, choices in self._group(lane.waiting, len(free), left):
                if _cancelled(request):
                    finished += _cancelled_choices(request, choices, len(self.columns))
                    continue
                group.append(self._rows(request, choices, free, len(request.input_ids), max_new_tokens))
            if not group:
                continue
            rows = [row for choices in group for row in choices]
            for row in rows:
                row.draw()
            used += len(group) * max(len(rows[0].request.input_ids) for rows in group)
            outputs = self._prefill_splitting(group, lane.cache, logprobs).cpu().rows()
            for row, output in zip(rows, outputs):
                if self._accept(row, output, lane.tokens, follow_up):
                    finished.append(_completion(row))
                else:
                    lane.slots[row.slot] = row
        return finished, used

    def _chunk_tokens(self, prompt_left: int, room: int, start: int) -> int | None:
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

    def _rows(self, request: Request, choices: range, free: list[int], position: int, max_new_tokens: int) -> list[_Row]:
        """A row per choice of the request, each in a slot taken from `free`, its next input at `position`."""
        request.sampling = seeded(request.sampling)  # once: its choices may start in several admissions
        limit = self._limit(request, max_new_tokens)
        return [_Row(request, position, c, free.pop(0), limit, _generator(request.sampling, c),
                     request.grammar.matcher() if request.grammar is not None else None) for c in choices]

    def _start_chunks(self, lane: _Lane, free: list[int], tokens: int, max_new_tokens, follow_up, logprobs) -> tuple[list[Completion], int]:
        """The lane's next request into free slots, its prompt embedded once, and its first chunk of `tokens`."""
        request, choices = lane.waiting.take(len(free))
        if _cancelled(request):
            return _cancelled_choices(request, choices, len(self.columns)), 0
        for row in self._rows(request, choices, free, 0, max_new_tokens):
            lane.slots[row.slot] = row
        pixels = request.pixels.result()
        positions, delta = self.backbone.positions(request.input_ids, None if pixels is None else pixels.grids)
        for row in lane.chunking():
            row.delta = delta
        input_ids = request.input_ids[None].to(self.device)
        with torch.no_grad():
            embeds, deepstack = self._embed(input_ids, None if pixels is None else pixels.to(self.device, self.dtype))
        lane.prompt = _ChunkedPrompt(embeds, positions.to(self.device), deepstack, input_ids[0] == self.backbone.image_token_id)
        return self._chunk(lane, tokens, follow_up, logprobs), tokens

    def _chunk(self, lane: _Lane, tokens: int, follow_up, logprobs) -> list[Completion]:
        """The next chunk, of up to `tokens`, of the prompt the lane prefills in chunks; after the last, each of
        its rows takes its first token (returned where that ends it)."""
        rows = lane.chunking()
        prompt = len(rows[0].request.input_ids)
        end = min(prompt, rows[0].position + max(1, tokens))
        hidden = self._prefill_chunk(rows, lane.cache, lane.prompt, end)
        for row in rows:
            row.position = end
        if end < prompt:
            return []
        lane.prompt = None
        for row in rows:
            row.draw()
        draws, masks = _draws(rows), self._masks(rows)
        outputs = self._head(hidden.expand(len(rows), -1), logprobs, None if draws is None else draws.to(self.device),
                             None if masks is None else masks.to(self.device)).cpu().rows()
        finished = []
        for row, output in zip(rows, outputs):
            if self._accept(row, output, lane.tokens, follow_up):
                finished.append(_completion(row))
                lane.slots[row.slot] = None
        return finished

    def _decode(self, lane: _Lane, follow_up, logprobs) -> list[Completion]:
        """One decoding step of the lane's rows that have their prompt in full; the rows it finishes."""
        rows = [row if row is not None and not row.prefilling else None for row in lane.slots]
        if not any(rows):
            return []
        # split-KV attention reads each row's own length whatever the width: the whole slot, one graph per lane
        width = lane.capacity if self.split_kv else min(lane.capacity, -(-max(row.position + 1 for row in rows if row) // WIDTH_STEP) * WIDTH_STEP)
        # a slot being prefilled in chunks is written at the position where its next chunk starts, which that chunk overwrites
        lane.cache.positions.copy_(torch.tensor([row.position if row else 0 for row in lane.slots]))
        lane.cache.deltas.copy_(torch.tensor([row.delta if row else 0 for row in lane.slots]))
        outputs = self._run_step(lane.cache, torch.tensor(lane.tokens), _draws(rows), self._masks(rows), _penalties(rows, self.vocab_size), width, lane.graphs,
                                 logprobs).rows()
        finished = []
        for slot, row in enumerate(rows):
            if row is None:
                continue
            row.position += 1
            if self._accept(row, outputs[slot], lane.tokens, follow_up):
                finished.append(_completion(row))
                lane.slots[slot] = None
        return finished

    def _cancel(self, lane: _Lane) -> list[Completion]:
        """The rows of cancelled requests, out of their slots before the next step (a prompt being prefilled
        in chunks included: no further chunk is run)."""
        slots = lane.slots
        cancelled = {id(row.request) for row in slots if row and _cancelled(row.request)}
        finished = []
        for slot, row in enumerate(slots):
            if row and id(row.request) in cancelled:
                row.finish_reason = "cancelled"
                # a row still being prefilled in chunks has written nothing
                finished += [_completion(row)] if row.tokens else _cancelled_choices(row.request, range(row.choice, row.choice + 1), len(self.columns))
                slots[slot] = None
        if not lane.chunking():
            lane.prompt = None
        return finished

    def _accept(self, row: _Row, step: RowStep, tokens: list[int], follow_up) -> bool:
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

    def _run_step(self, cache: SlotCache, tokens: torch.Tensor, draws: Draws | None, masks: torch.Tensor | None,
                  penalties: torch.Tensor | None, width: int, graphs: _StepGraphs, logprobs: int) -> Step:
        cache.width = width
        self.steps += 1
        inputs = _step_inputs(tokens, draws, masks, penalties)
        if not self.cuda_graphs:
            return self._step(cache, *_step_arguments(tuple(t.to(self.device) for t in inputs), draws is not None, masks is not None,
                                                       penalties is not None), logprobs).cpu()
        # Steps where no row samples keep the greedy graph, which computes no draw; steps where no row has a
        # grammar, the graph that applies no mask; steps where no row has a penalty, the graph that takes none off.
        key = (width, draws is not None, masks is not None, penalties is not None)
        if key not in graphs.by_key:
            graphs.by_key[key] = self._capture(cache, inputs, key, graphs, logprobs)
        graph, static_inputs, outputs = graphs.by_key[key]
        for static, value in zip(static_inputs, inputs):
            static.copy_(value, non_blocking=True)
        graph.replay()
        return outputs.cpu()

    def _capture(self, cache: SlotCache, inputs: tuple[torch.Tensor, ...], key: tuple[int, bool, bool, bool], graphs: _StepGraphs,
                 logprobs: int) -> tuple:
        """A CUDA graph of one step at the cache's current width, and its input tensors (_step_inputs, those
        `key` says the step has). Warming up writes keys and values at the slots' current positions, which the
        real step then overwrites before anything reads them."""
        inputs = tuple(t.to(self.device) for t in inputs)
        arguments = _step_arguments(inputs, *key[1:])
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._step(cache, *arguments, logprobs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if graphs.pool is None:
            graphs.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=graphs.pool):
            outputs = self._step(cache, *arguments, logprobs)
        return graph, inputs, outputs

    def _room(self, lanes: list[_Lane]) -> int:
        """KV-cache tokens a new lane may take beside `lanes`: the token budget (on a CPU without one, 65536)
        less what they hold; a lane whose one slot is larger than the whole budget (a prompt too long for it
        gets that slot all the same) is not counted, so that it does not keep every other request out. On a
        GPU without a budget, what free memory holds, beside room for prefill."""
        if self.token_budget is None and (free := _memory_budget(self.device, kv_bytes_per_token(self.config, self.dtype))) is not None:
            return max(0, free - (self.prefix_cache.limit - self.prefix_cache.tokens if self.prefix_cache else 0))  # room for it to fill
        budget = self.token_budget or 65536
        return budget - sum(lane.capacity * len(lane.slots) for lane in lanes if lane.capacity <= budget)

    def _allocate(self, capacity: int, requests: int, room: int | None = None) -> SlotCache:
        """A cache of as many slots of `capacity` tokens as `room` (by default the whole budget: _room) allows,
        one at least, and no more than there are requests."""
        slots = max(1, min(requests, (self._room([]) if room is None else room) // capacity))
        while True:
            try:
                return self._slots(capacity, slots)
            except torch.OutOfMemoryError:
                if slots == 1:
                    raise
                slots //= 2
                _empty_cache(self.device)

    def _slots(self, capacity: int, slots: int, zeroed: bool = True) -> SlotCache:
        config = self.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return SlotCache(config.num_hidden_layers, slots, config.num_key_value_heads, capacity, head_dim, self.dtype, self.device, zeroed)


@dataclass
class _StepGraphs:
    """A cache's decoding-step graphs, one per width, greedy or sampling step, with or without token
    masks, and with or without penalties, sharing one memory pool.
    They live and die with their cache: a pool whose graphs are gone cannot take another capture."""

    by_key: dict[tuple[int, bool, bool, bool], tuple] = field(default_factory=dict)
    pool: tuple | None = None


@dataclass(eq=False)
class _PrefixedPrompt:
    """A prompt of a prefill group with a shared part (_prefill_prefixed): its rows, the shared part's length, its
    rotary positions, its images on either side of the cut, and the shared part's key in the prefix cache."""

    rows: list[_Row]
    input_ids: torch.Tensor
    shared: int
    positions: torch.Tensor
    shared_pixels: Pixels | None
    own_pixels: Pixels | None
    key: bytes


@dataclass
class _ChunkedPrompt:
    """A prompt prefilled in chunks, as its chunks take it: embedded once, with its rotary positions (axes,
    prompt), its DeepStack features (if its backbone has them) and where its image tokens are."""

    embeds: torch.Tensor  # (1, prompt, hidden)
    positions: torch.Tensor
    deepstack: list[torch.Tensor] | None
    images: torch.Tensor  # (prompt,) bool


@dataclass
class _Lane:
    """A cache of slots of `capacity` tokens, the rows in them, and the requests waiting for them (its
    segment's, and a server's that arrived since and fit)."""

    cache: SlotCache
    capacity: int
    waiting: _Lookahead
    slots: list[_Row | None]
    tokens: list[int]  # each slot's next input token (a tensor is made of it once a step: an element written per row cost more)
    graphs: _StepGraphs = field(default_factory=_StepGraphs)
    prompt: _ChunkedPrompt | None = None  # the prompt being prefilled in chunks

    def active(self) -> bool:
        return bool(self.waiting) or any(self.slots)

    def freed_within(self, steps: int) -> int:
        """Slots free now or within `steps` engine steps at the latest (a row's prompt still to prefill counted
        a step a token: at most)."""
        return sum(row is None or row.prefill_left + row.limit - len(row.tokens) <= steps for row in self.slots)

    def chunking(self) -> list[_Row]:
        """The rows of the request whose prompt is being prefilled in chunks (one at a time), if any."""
        return [row for row in self.slots if row is not None and row.prefilling]


def attention_weight(config) -> float:
    """What attending to one more key costs a token, in units of what the token's linear layers cost (per
    layer, multiply-adds): QK^T and AV over every head, against the q, k, v and o projections and the gated
    MLP's three matrices."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    linear = config.hidden_size * head_dim * (2 * heads + 2 * kv_heads) + 3 * config.hidden_size * config.intermediate_size
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


def _cancelled_choices(request: Request, choices: range, columns: int) -> list[Completion]:
    return [Completion(request.index, [], torch.empty(0, columns), choice=c, finish_reason="cancelled") for c in choices]


def _step_inputs(tokens: torch.Tensor, draws: Draws | None, masks: torch.Tensor | None, penalties: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """A step's inputs in the order its graph holds them: tokens, the draws' four if any, the masks if any,
    the penalties if any."""
    return (tokens, *(draws or ()), *(() if masks is None else (masks,)), *(() if penalties is None else (penalties,)))


def _step_arguments(inputs: tuple[torch.Tensor, ...], draws: bool, masks: bool, penalties: bool) -> tuple:
    """_step_inputs read back as _step's arguments (tokens, draws, masks, penalties; None for those the step
    has not), given which it has."""
    rest = list(inputs[1:])
    step_draws = Draws(*(rest.pop(0) for _ in Draws._fields)) if draws else None
    step_masks = rest.pop(0) if masks else None
    step_penalties = rest.pop(0) if penalties else None
    return inputs[0], step_draws, step_masks, step_penalties


def _penalties(rows: list[_Row | None], size: int) -> torch.Tensor | None:
    """Each row's penalty on each of `size` tokens, OpenAI's presence * (count > 0) + frequency * count over
    the tokens it has written (a row fed follow-up tokens writes nothing of its own: none); None where no row
    has one."""
    def penalized(row: _Row | None) -> bool:
        return row is not None and not row.following and bool(row.tokens) and bool(row.request.sampling.presence_penalty
                                                                                    or row.request.sampling.frequency_penalty)

    if not any(map(penalized, rows)):
        return None
    penalties = torch.zeros(len(rows), size)
    for k, row in enumerate(rows):
        if penalized(row):
            counts = torch.bincount(torch.tensor(row.tokens), minlength=size).float()
            penalties[k] = row.request.sampling.presence_penalty * (counts > 0) + row.request.sampling.frequency_penalty * counts
    return penalties


def _segments(requests: list[Request], need: Callable[[Request], int]) -> Iterator[list[Request]]:
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


def seeded(sampling: Sampling) -> Sampling:
    """The sampling settings with a seed: a fresh random one where none is given (and greedy needs none)."""
    if sampling.temperature > 0 and sampling.seed is None:
        return replace(sampling, seed=random.getrandbits(63))
    return sampling


def _generator(sampling: Sampling, choice: int) -> torch.Generator | None:
    """A sampling choice's own generator, seeded from its request's seed and its index; None for greedy."""
    if sampling.temperature <= 0:
        return None
    digest = hashlib.sha256(f"{sampling.seed} {choice}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _draws(rows: list[_Row | None]) -> Draws | None:
    """The rows' draws (empty slots and greedy rows at temperature 0), or None where no row samples."""
    if not any(row is not None and row.generator is not None for row in rows):
        return None
    settings = [row.request.sampling if row is not None else Sampling() for row in rows]
    return Draws(torch.tensor([s.temperature for s in settings], dtype=torch.float32), torch.tensor([s.top_p for s in settings], dtype=torch.float32),
                 torch.tensor([s.top_k for s in settings], dtype=torch.long), torch.tensor([row.uniform if row else 0.0 for row in rows], dtype=torch.float32))


def _sample(logits: torch.Tensor, draws: Draws) -> torch.Tensor:
    """Each row's token where its uniform number falls in the cumulative distribution of its temperature-
    scaled probabilities, cut to its top-k and top-p: the likeliest first, ties in token order (a stable
    sort), so the token depends on the row's logits and number alone. Tokens of probability 0 (suppressed)
    are never drawn."""
    temperature = torch.where(draws.temperature > 0, draws.temperature, 1.0)[:, None]
    probs, ids = (logits / temperature).softmax(-1).sort(dim=-1, descending=True, stable=True)
    cumulative = probs.cumsum(-1)
    rank = torch.arange(probs.shape[1], device=probs.device)
    # the likeliest token always stays; another while the tokens before it hold less than top_p
    keep = (probs > 0) & ((rank == 0) | (cumulative - probs < draws.top_p[:, None]) | (draws.top_p[:, None] >= 1))
    keep &= (draws.top_k[:, None] == 0) | (rank < draws.top_k[:, None])
    cumulative = (probs * keep).cumsum(-1)
    below = (cumulative <= draws.uniform[:, None] * cumulative[:, -1:]).sum(-1, keepdim=True)
    return ids.gather(1, torch.minimum(below, keep.sum(-1, keepdim=True) - 1))[:, 0]


def _cancelled(request: Request) -> bool:
    return request.cancelled is not None and request.cancelled()


def _completion(row: _Row) -> Completion:
    top_logprobs = torch.tensor([logprobs for logprobs, _ in row.top], dtype=torch.float32) if row.top else None
    top_ids = torch.tensor([ids for _, ids in row.top], dtype=torch.long) if row.top else None
    follow_up_logits = None if row.follow_up_logits is None else torch.tensor(row.follow_up_logits, dtype=torch.float32)
    return Completion(row.request.index, row.tokens, torch.tensor(row.logits, dtype=torch.float32), follow_up_logits, top_logprobs, top_ids,
                      row.choice, row.finish_reason, row.matcher.error() if row.finish_reason == "grammar" else "")


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """The keys and values one token keeps in the cache, over every layer of a language model of this config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype.itemsize


def prefix_cache_room(config, dtype: torch.dtype, device: torch.device, memory: int) -> int:
    """Tokens of keys and values a prefix cache may hold for a language model of this config: on a GPU half of what
    its free memory holds beside the weights and a prefill group (the other half is decoding's slots'), elsewhere
    `memory` bytes' worth."""
    per_token = kv_bytes_per_token(config, dtype)
    free = _memory_budget(device, per_token)
    return memory // per_token if free is None else free // 2


def _memory_budget(device: torch.device, bytes_per_token: int) -> int | None:
    """KV-cache tokens that fit in free GPU memory, keeping room for a prefill group's activations."""
    if device.type != "cuda":
        return None
    # memory this process's allocator holds but no tensor uses (an earlier segment's cache) is free too
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    reserve = 6 * 2**30 + PREFILL_TOKENS * bytes_per_token  # the group's activations and its keys and values in flight
    return max(0, free - reserve) // bytes_per_token


def _cache_argument(layer: torch.nn.Module) -> str:
    """The keyword a decoder layer takes its key/value cache by: `past_key_values` up to transformers 5.23,
    `cache` from 5.24 (where the old name warns, until 5.40 removes it). A name the layer does not declare
    would fall into its **kwargs unread, and decoding would run with no cache at all: refused instead."""
    parameters = inspect.signature(layer.forward).parameters
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    raise TypeError(f"{type(layer).__name__}.forward takes its cache by neither `cache` nor `past_key_values`: "
                    "a transformers release this decoder does not know (pyproject.toml lists those tested)")


@contextmanager
def _attention_implementation(config, name: str) -> Iterator[None]:
    """The language model's attention function, by its AttentionInterface name, while the block runs."""
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _Lookahead:
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
