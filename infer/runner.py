"""The runner: the model, driven by hand (the decoder's third part, infer/decoding.py). Its passes are a
prefill group, the chunks of prompts, and a decoding step of every slot of a cache; each ends in the sampler
(infer/sampler.py). The model is driven through its own modules (embeddings, decoder layers, norm, output layer),
so PEFT adapters and DeepSpeed's hooks apply as in its own forward; the cache is infer/cache.py's.

Prefill: a group of prompts of similar length runs as one right-padded batch. Right padding puts every
pad after its row's last token, so causal attention alone keeps the pads out of every real token's view:
no padding mask is needed, and attention runs its causal flash kernel. Each row's rotary positions are its
own, by its backbone's rule (judge/backbones/: 1-D places for InternVL, 3-D M-RoPE for Qwen-VL; pads repeat
the row's last position), so each row gets its own long-rope regime (judge/rope.py) and its own image grid.
The group's keys and values go straight into the rows' slots.

Chunks: a chunk of a prompt attends to the chunks before it through its slot, and its rotary positions take the
regime of the whole prompt (its last position rides along with the chunk's), so a chunked prompt is encoded as
its unchunked prefill encodes it, on either side of a long-rope switch.

Decoding: one token per busy slot and step, each row at its own place in its slot (and at its own rotary
position: the place plus the row's M-RoPE delta), attending to its own slot up to that place. On a GPU each
step is a CUDA graph, so a step costs the kernels' time rather than Python's, and its attention is
split-KV attention (infer/split_kv.py), which reads each row's keys and values up to its own place only:
one graph per cache. Elsewhere attention is SDPA through a mask over the slots' first `width` positions
(the longest row's place rounded up to WIDTH_STEP).

Deterministic (`judge-score --deterministic`): each row's tokens and logits are the same bits in a batch of
any size as alone. The scheduler gives each prompt's prefill the same shapes whatever runs beside it
(infer/scheduler.py); on a GPU the steps' linear layers run batch-invariant matrix products
(infer/batch_invariant.py) beside split-KV attention, which already is; both are Triton kernels.

Prefix cache (infer/prefix_cache.py): a request may name the tokens its prompt shares with others (`prefix`: a
judge prompt's rubric, question and images, before its first answer). Such a prompt is prefilled in two pieces
cut there, each as a chunk into its slots: the shared part, whose keys and values are copied from the cache where
it holds them and kept there where not, then the rest attending to it. The pieces are the same whether the shared
part is cached or not, so a cached part gives the same bits as a fresh one; only the rest's images go through the
vision tower where the part is cached. Such prompts are grouped with each other (a deterministic decoder's
alone): one right-padded pass prefills the shared parts the cache lacks, each distinct one once, and one more
every prompt's rest, each row attending to its own slot, so that many one-sample requests cost two passes, not
one or two each.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from mmjudge.infer.batch_invariant import batch_invariant, deterministic_on, triton_runs_on, use_batch_invariant_linears
from mmjudge.infer.cache import SlotCache, StepGraphs, attending, cache_kind, prefix_cache_refusal, slot_cache, state_tokens
from mmjudge.infer.prefix_cache import Entry, PrefixCache, prefix_key
from mmjudge.infer.sampler import Draws, Sampler, Step, draws_of, masks_of
from mmjudge.infer.scheduler import ChunkedPrompt, Request, Row
from mmjudge.infer.split_kv import ATTENTION
from mmjudge.judge.backbones import backbone_of
from mmjudge.judge.data import UsageError
from mmjudge.judge.rope import frequencies_of
from mmjudge.judge.vision import Pixels


class Runner:
    """The forward passes of one model (module docstring); `sampler` makes each pass's outputs. `cuda_graphs`: a
    decoding step is a CUDA graph where the device allows; `deterministic` (None: wherever its kernels run): each row
    the same bits in any batch; `prefix_cache`: tokens of shared parts kept (0: none)."""

    def __init__(self, model: torch.nn.Module, *, device, pad_id: int, sampler: Sampler, cuda_graphs: bool = True,
                 deterministic: bool | None = False, prefix_cache: int = 0):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.vlm, self.lm_head = base.model, base.lm_head
        self.lm = self.vlm.language_model
        self.config = self.lm.config
        self.backbone = backbone_of(base.config)
        self.device = torch.device(device)
        self.dtype = self.lm.embed_tokens.weight.dtype
        self.pad_id = pad_id
        self.sampler = sampler
        self.vocab_size = self.config.vocab_size  # the output layer's rows (its weight may be partitioned, under ZeRO-3)
        self.cache_argument = cache_argument(self.lm.layers[0])
        self.attending = attending(self.config)  # the layers that attend, through the mask; a hybrid's others keep a state
        self.ragged = cache_kind(self.config).ragged  # whether a prefill group into its cache may mix prompt lengths
        self.state_tokens = state_tokens(self.config, self.dtype)  # what a slot's fixed state weighs beside its tokens
        # Graphs need every weight in place: not under ZeRO-3, whose hooks gather weights as each layer runs.
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda" and not any(hasattr(p, "ds_id") for p in model.parameters())
        # Decoding steps' attention: split-KV on a GPU (Triton comes with PyTorch's CUDA builds), SDPA elsewhere.
        self.split_kv = triton_runs_on(self.device)
        self.deterministic = deterministic_on(self.device, deterministic)
        self.batch_invariant = self.deterministic and self.split_kv
        if self.deterministic:
            use_batch_invariant_linears(self.lm)
            use_batch_invariant_linears(self.lm_head)
        # The shared parts of prompts, at most `prefix_cache` tokens of them (infer/prefix_cache.py); None: off.
        if prefix_cache and (reason := prefix_cache_refusal(self.config)):
            raise UsageError(f"--prefix_cache {prefix_cache}: no prefix cache for {self.backbone.name}: {reason}; leave it off (0)")
        self.prefix_cache = PrefixCache(prefix_cache) if prefix_cache else None
        # The shared parts the last prefill group made and the cache refused (prefill_prefixed): a server's round sorts
        # a GRPO group's answers among others of like length, so its part may be asked again by the next prefill group.
        self.refused: dict[bytes, Entry] = {}
        # Forward passes run, for a server's metrics: prefill groups (or chunks) and decoding steps (one for all
        # busy slots); and the prompt tokens prefilled.
        self.prefills = self.steps = self.prefill_tokens = 0

    def new_cache(self, capacity: int, slots: int, zeroed: bool = True) -> SlotCache:
        return slot_cache(self.config, slots, capacity, self.dtype, self.device, zeroed)

    def embed(self, input_ids: torch.Tensor, pixels: Pixels | None) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The prompts' input embeddings, the image tokens' replaced by the vision tower's features, and the
        backbone's DeepStack features for the image tokens, if it has them."""
        embeds = self.lm.embed_tokens(input_ids)
        if pixels is None:
            return embeds, None
        features, deepstack = self.backbone.features(self.vlm, pixels)
        placeholders = (input_ids == self.backbone.image_token_id).unsqueeze(-1)
        return embeds.masked_scatter(placeholders, features.to(embeds.dtype)), deepstack

    def layers(self, hidden: torch.Tensor, places: torch.Tensor, rotary: torch.Tensor, mask: torch.Tensor | None,
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
            hidden = layer(hidden, attention_mask=mask if self.attending[index] else None, position_ids=places, position_embeddings=position_embeddings,
                           **{self.cache_argument: cache}, **attention)
            if deepstack is not None and index < len(deepstack):
                hidden = hidden.clone()
                hidden[images] = hidden[images] + deepstack[index].to(hidden.dtype)
        return self.lm.norm(hidden)

    def head(self, hidden: torch.Tensor, logprobs: int, draws: Draws | None, masks: torch.Tensor | None,
             penalties: torch.Tensor | None = None) -> Step:
        """A step's outputs from last-position hidden states (rows, hidden): the output layer's logits, through the
        sampler (infer/sampler.py)."""
        return self.sampler(self.lm_head(hidden).float(), logprobs, draws, masks, penalties)

    @torch.no_grad()
    def prefill(self, group: list[list[Row]], cache: SlotCache | None, logprobs: int) -> Step:
        """One right-padded forward over the group's prompts (module docstring), each given as the rows of its
        choices: its keys and values go to each row's slot, and each row gets its own output. A prompt with a
        shared part (`prefixed`) is a group of its own, prefilled in two pieces (prefill_prefixed)."""
        if self.prefixed(group[0][0].request):
            return self.prefill_prefixed(group, cache, logprobs)
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
            embeds, deepstack = self.embed(input_ids, pixels)
            hidden = self.layers(embeds, places, rotary, None, cache, deepstack, input_ids == self.backbone.image_token_id)
        finally:
            if cache is not None:
                cache.prefill = None
        self.prefills += 1
        self.prefill_tokens += int(lengths.sum())
        sequences = torch.tensor([sequence for sequence, rows in enumerate(group) for _ in rows])
        rows = [row for rows in group for row in rows]
        draws, masks = draws_of(rows), masks_of(rows, self.vocab_size)
        return self.head(hidden[sequences.to(self.device), (lengths[sequences] - 1).to(self.device)], logprobs,
                          None if draws is None else draws.to(self.device), None if masks is None else masks.to(self.device))

    def prefixed(self, request: Request) -> bool:
        """Whether the request's prompt is prefilled in two pieces, its shared part from the prefix cache or kept there."""
        if self.prefix_cache is None or not 0 < request.prefix < len(request.input_ids):
            return False
        # never a cut within an image's tokens (ints: asked of every request a prefill group might take)
        return not int(request.input_ids[request.prefix - 1]) == int(request.input_ids[request.prefix]) == self.backbone.image_token_id

    @torch.no_grad()
    def prefill_prefixed(self, group: list[list[Row]], cache: SlotCache | None, logprobs: int) -> Step:
        """Prompts prefilled in two pieces each, their shared parts and then the rest, as chunks (prefill_chunks)
        into their rows' slots: one pass for the shared parts the prefix cache lacks (each distinct part once, kept
        there after), their keys and values copied into the slots of the prompts that share them or that the cache
        holds, then one pass for every prompt's rest. The same two pieces either way, so that a cached shared part
        gives the same bits as a fresh one (infer/prefix_cache.py); those the cache refused are kept for the next group
        alone (`refused`: at most a prefill group's). Logits mode (no cache) prefills into slots of
        its own, one per prompt, of which only what the shared parts do not fill is zeroed (the rest is written)."""
        own_slots = cache is None
        if own_slots:
            cache = self.new_cache(max(len(rows[0].request.input_ids) for rows in group), len(group), zeroed=False)
            for slot, rows in enumerate(group):
                for row in rows:
                    row.slot = slot
        prompts = [self.prefixed_prompt(rows) for rows in group]
        if own_slots:
            for prompt in prompts:
                cache.keys[:, prompt.rows[0].slot, :, prompt.shared:] = 0
                cache.values[:, prompt.rows[0].slot, :, prompt.shared:] = 0
        parts: dict[bytes, Entry] = {}  # each shared part of the group by its key, from the cache or prefilled now
        fresh: dict[bytes, PrefixedPrompt] = {}  # the first prompt of each shared part the cache lacks, by its key
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
            self.prefill_chunks([(p.rows, self.piece(p.input_ids, p.positions, p.shared_pixels, 0, p.shared), p.shared) for p in fresh.values()], cache)
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
        hidden = self.prefill_chunks([(p.rows, self.piece(p.input_ids, p.positions, p.own_pixels, p.shared, len(p.input_ids)), len(p.input_ids))
                                       for p in prompts], cache)
        rows = [row for p in prompts for row in p.rows]
        for row in rows:
            row.position = len(row.request.input_ids)
        sequences = torch.tensor([sequence for sequence, p in enumerate(prompts) for _ in p.rows], device=self.device)
        draws, masks = draws_of(rows), masks_of(rows, self.vocab_size)
        return self.head(hidden[sequences], logprobs, None if draws is None else draws.to(self.device), None if masks is None else masks.to(self.device))

    def prefixed_prompt(self, rows: list[Row]) -> PrefixedPrompt:
        """A prompt of prefill_prefixed, its rows given their rotary delta: its images split at its shared part's
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
        return PrefixedPrompt(rows, input_ids, shared, positions, shared_pixels, own_pixels, key)

    def piece(self, input_ids: torch.Tensor, positions: torch.Tensor, pixels: Pixels | None, start: int, end: int) -> ChunkedPrompt:
        """A prompt as prefill_chunk reads it for its tokens from `start` to `end`: those tokens embedded, the
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
        return ChunkedPrompt(embeds, positions.to(self.device), deepstack, images)

    def chunked_prompt(self, rows: list[Row]) -> ChunkedPrompt:
        """The prompt of `rows` (one request's choices) as its chunks take it, embedded once; the rows given their rotary
        delta."""
        request = rows[0].request
        pixels = request.pixels.result()
        positions, delta = self.backbone.positions(request.input_ids, None if pixels is None else pixels.grids)
        for row in rows:
            row.delta = delta
        input_ids = request.input_ids[None].to(self.device)
        with torch.no_grad():
            embeds, deepstack = self.embed(input_ids, None if pixels is None else pixels.to(self.device, self.dtype))
        return ChunkedPrompt(embeds, positions.to(self.device), deepstack, input_ids[0] == self.backbone.image_token_id)

    def prefill_chunk(self, rows: list[Row], cache: SlotCache, prompt: ChunkedPrompt, end: int) -> torch.Tensor:
        """The next chunk of one prompt (prefill_chunks): the hidden state of its last position."""
        return self.prefill_chunks([(rows, prompt, end)], cache)[0]

    @torch.no_grad()
    def prefill_chunks(self, chunks: list[tuple[list[Row], ChunkedPrompt, int]], cache: SlotCache) -> torch.Tensor:
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
            hidden = self.layers(embeds, places, rotary, mask, cache, deepstack, images, reach=reach)
        finally:
            cache.prefill, cache.chunk = None, None
        self.prefills += 1
        self.prefill_tokens += sum(lengths)
        return hidden[torch.arange(len(chunks), device=self.device), torch.tensor(lengths, device=self.device) - 1]

    @torch.no_grad()
    def step(self, cache: SlotCache, tokens: torch.Tensor, draws: Draws | None, masks: torch.Tensor | None, penalties: torch.Tensor | None,
             logprobs: int) -> Step:
        """One decoding step of every slot: tokens (slots,) at cache.positions."""
        places = cache.positions[:, None]
        rotary = places + cache.deltas[:, None]
        rotary = rotary.expand(3, -1, -1) if self.backbone.mrope else rotary
        embeds = self.lm.embed_tokens(tokens[:, None])
        with batch_invariant(self.batch_invariant):
            if self.split_kv:
                with attention_implementation(self.config, ATTENTION):
                    hidden = self.layers(embeds, places, rotary, None, cache, slot_lengths=cache.positions + 1)
            else:
                mask = (torch.arange(cache.width, device=self.device) <= places)[:, None, None, :]
                hidden = self.layers(embeds, places, rotary, mask, cache)
            return self.head(hidden[:, -1], logprobs, draws, masks, penalties)

    def run_step(self, cache: SlotCache, tokens: torch.Tensor, draws: Draws | None, masks: torch.Tensor | None,
                 penalties: torch.Tensor | None, width: int, graphs: StepGraphs, logprobs: int) -> Step:
        cache.width = width
        self.steps += 1
        inputs = step_inputs(tokens, draws, masks, penalties)
        if not self.cuda_graphs:
            return self.step(cache, *step_arguments(tuple(t.to(self.device) for t in inputs), draws is not None, masks is not None,
                                                      penalties is not None), logprobs).cpu()
        # Steps where no row samples keep the greedy graph, which computes no draw; steps where no row has a
        # grammar, the graph that applies no mask; steps where no row has a penalty, the graph that takes none off.
        key = (width, draws is not None, masks is not None, penalties is not None)
        if key not in graphs.by_key:
            graphs.by_key[key] = self.capture(cache, inputs, key, graphs, logprobs)
        graph, static_inputs, outputs = graphs.by_key[key]
        for static, value in zip(static_inputs, inputs):
            static.copy_(value, non_blocking=True)
        graph.replay()
        return outputs.cpu()

    def capture(self, cache: SlotCache, inputs: tuple[torch.Tensor, ...], key: tuple[int, bool, bool, bool], graphs: StepGraphs,
                logprobs: int) -> tuple:
        """A CUDA graph of one step at the cache's current width, and its input tensors (step_inputs, those
        `key` says the step has). Warming up writes keys and values at the slots' current positions, which the
        real step then overwrites before anything reads them."""
        inputs = tuple(t.to(self.device) for t in inputs)
        arguments = step_arguments(inputs, *key[1:])
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.step(cache, *arguments, logprobs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if graphs.pool is None:
            graphs.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=graphs.pool):
            outputs = self.step(cache, *arguments, logprobs)
        return graph, inputs, outputs


@dataclass(eq=False)
class PrefixedPrompt:
    """A prompt of a prefill group with a shared part (Runner.prefill_prefixed): its rows, the shared part's length, its
    rotary positions, its images on either side of the cut, and the shared part's key in the prefix cache."""

    rows: list[Row]
    input_ids: torch.Tensor
    shared: int
    positions: torch.Tensor
    shared_pixels: Pixels | None
    own_pixels: Pixels | None
    key: bytes


def step_inputs(tokens: torch.Tensor, draws: Draws | None, masks: torch.Tensor | None, penalties: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """A step's inputs in the order its graph holds them: tokens, the draws' four if any, the masks if any,
    the penalties if any."""
    return (tokens, *(draws or ()), *(() if masks is None else (masks,)), *(() if penalties is None else (penalties,)))


def step_arguments(inputs: tuple[torch.Tensor, ...], draws: bool, masks: bool, penalties: bool) -> tuple:
    """step_inputs read back as the runner's step's arguments (tokens, draws, masks, penalties; None for those the step
    has not), given which it has."""
    rest = list(inputs[1:])
    step_draws = Draws(*(rest.pop(0) for _ in Draws._fields)) if draws else None
    step_masks = rest.pop(0) if masks else None
    step_penalties = rest.pop(0) if penalties else None
    return inputs[0], step_draws, step_masks, step_penalties


def cache_argument(layer: torch.nn.Module) -> str:
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
def attention_implementation(config, name: str) -> Iterator[None]:
    """The language model's attention function, by its AttentionInterface name, while the block runs."""
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before
