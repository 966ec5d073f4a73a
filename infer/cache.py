"""The cache: each row's state between forward passes (the decoder's second part, infer/decoding.py), in
`slots` preallocated for a lane's rows, and what it costs in memory.

A cache is what the model's decoder layers are given as their cache (transformers' `Cache` methods, by their
names), one kind per kind of layer a model has (`slot_cache` picks it from the config):
- SlotCache: keys and values, which attention layers store and read through `update`;
- LinearAttentionCache: those of a hybrid's attention layers, and each linear-attention layer's state (Qwen3.5's
  Gated DeltaNet: a convolution's last inputs and a recurrent state per sequence), which its layers read and write
  through `get_conv_state`, `update_conv_state`, `get_recurrent_state` and `update_recurrent_state`.
The runner (infer/runner.py) says what a pass writes where (`prefill`, `chunk`, `plan_step`), and the cache writes
each row's part into its slot. What the scheduler must know of a kind is `ragged`: whether a prefill group may hold
prompts of different lengths, right-padded.

A recurrent state is a sequence's whole past in a fixed size, so it differs from keys and values in three ways:
- it is the state after the pass's last input, pads included: a right-padded row would carry its pads' updates, so
  the prompts of a prefill group for such a model have one length (a row's convolution inputs are taken at its own
  end either way);
- a decoding step updates every slot's state in place, so a slot that is not decoding (a prompt between its
  chunks) keeps its state through `plan_step`'s `advancing`, where keys and values written at its next place are
  simply overwritten by its next chunk;
- it cannot be cut at a shared prefix's end after the fact, and a prefill pass gives it at the pass's end only:
  the prefix cache, which stores and copies keys and values, is refused for such a model (`prefix_cache_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Prefill groups hold at most this many tokens, padding included (infer/scheduler.py): enough rows for the matrix
# units to run at full rate, few enough that the group's activations stay small beside the cache, which keeps room
# for them (memory_budget).
PREFILL_TOKENS = 16384
LINEAR = "linear_attention"  # a hybrid's layer kind that keeps a state, not keys and values (transformers' layer_types)


class SlotCache:
    """Keys and values of `slots` sequences of up to `capacity` tokens, for every layer. Passed to the
    decoder layers as their cache: `update`, with the signature of transformers' public `Cache.update`,
    stores a step's (or a prefill's) keys and values and returns what attention reads."""

    # Right padding puts every pad after its row's last token, out of every real token's causal view: a prefill group
    # may hold prompts of different lengths.
    ragged = True

    def __init__(self, layers: int, slots: int, heads: int, capacity: int, head_dim: int, dtype, device, zeroed: bool = True):
        # zeroed: attention reads a slot past its row's tokens (masked, but a NaN there would still spread);
        # not zeroed: its user writes every place attention reads (the runner's prefill_prefixed)
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

    def plan_step(self, positions: list[int], deltas: list[int], advancing: list[bool]) -> None:
        """A decoding step's places and rotary deltas, a slot each. A slot not `advancing` (empty, or its prompt being
        prefilled in chunks) is written at its position, where its next chunk starts and overwrites it."""
        self.positions.copy_(torch.tensor(positions))
        self.deltas.copy_(torch.tensor(deltas))


class LinearAttentionCache(SlotCache):
    """A hybrid's cache (Qwen3.5: Gated DeltaNet layers among attention layers; module docstring): keys and values of
    its attention layers (`attention`: the model's layer index -> the cache's), and of each linear-attention layer
    (`linear`) every slot's convolution state (its last `kernel` inputs) and recurrent state (float32, as transformers
    keeps it). A layer reads a pass's rows' states (a copy: it may update them in place) and gives their new ones; the
    last it gives, the recurrent state, commits both to the rows' slots."""

    ragged = False  # the state after a right-padded row's pads is not its own (module docstring)

    def __init__(self, config, slots: int, capacity: int, dtype, device, zeroed: bool = True):
        types = config.layer_types[: config.num_hidden_layers]
        self.attention = {layer: k for k, layer in enumerate(i for i, kind in enumerate(types) if kind != LINEAR)}
        self.linear = {layer: k for k, layer in enumerate(i for i, kind in enumerate(types) if kind == LINEAR)}
        super().__init__(len(self.attention), slots, config.num_key_value_heads, capacity, head_dim_of(config), dtype, device, zeroed)
        self.kernel = config.linear_conv_kernel_dim
        self.conv = torch.zeros(len(self.linear), slots, conv_channels(config), self.kernel, dtype=dtype, device=device)
        self.recurrent = torch.zeros(len(self.linear), slots, config.linear_num_value_heads, config.linear_key_head_dim,
                                     config.linear_value_head_dim, dtype=torch.float32, device=device)
        self.advancing = torch.zeros(slots, dtype=torch.bool, device=device)  # decoding: the slots whose state a step moves on
        self.stepped: torch.Tensor | None = None  # the pass's rows' new convolution states, until the recurrent state commits them

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return super().update(key_states, value_states, self.attention[layer_idx])

    def plan_step(self, positions: list[int], deltas: list[int], advancing: list[bool]) -> None:
        super().plan_step(positions, deltas, advancing)
        self.advancing.copy_(torch.tensor(advancing))

    def is_recording_past(self, layer_idx: int) -> bool:
        return False  # transformers' speculative decoding keeps past states to roll back; nothing here does

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        self.stepped = self._read(self.conv, layer_idx)  # a single token's step updates it in place
        return self.stepped

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self._read(self.recurrent, layer_idx)

    def _read(self, states: torch.Tensor, layer_idx: int) -> torch.Tensor | None:
        """The pass's rows' states: None for a prefill from the prompts' start (the layer starts from zeros, as in
        transformers' own prefill); a chunk's, its first slot's (a pass continues one prompt: the scheduler never
        groups a chunk with others); a decoding step's, every slot's."""
        if self.prefill is None:
            return states[self.linear[layer_idx]].clone()
        if self.prefill[0][2] == 0:
            return None
        return states[self.linear[layer_idx], self.chunk[0]]

    def update_conv_state(self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs) -> torch.Tensor:
        """The convolution's inputs, the rows' states before this pass's (rows, channels, tokens), as transformers'
        `update_conv_state` returns them; each row's new state is the last `kernel` inputs up to its own last token."""
        before = self._read(self.conv, layer_idx)
        inputs = conv_states if before is None else torch.cat([before, conv_states], dim=-1)
        if inputs.shape[-1] < self.kernel:  # a prompt shorter than the kernel, as transformers pads it
            inputs = torch.nn.functional.pad(inputs, (self.kernel - inputs.shape[-1], 0))
        padded = torch.nn.functional.pad(inputs, (self.kernel, 0))  # zeros before a row shorter than the kernel
        offset = inputs.shape[-1] - conv_states.shape[-1]  # where the pass's first token stands in `inputs`
        lengths = {row: length for row, _, _, length in self.prefill}
        self.stepped = torch.stack([padded[row, :, offset + lengths[row]:offset + lengths[row] + self.kernel] for row in range(len(inputs))])
        return inputs

    def update_recurrent_state(self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs) -> torch.Tensor:
        """Commit the layer's new states: a prefill's into each row's slots, a decoding step's into the slots it
        advances (the others keep theirs)."""
        layer = self.linear[layer_idx]
        if self.prefill is not None:
            for row, slot, _, _ in self.prefill:
                self.conv[layer, slot] = self.stepped[row]
                self.recurrent[layer, slot] = recurrent_states[row]
        else:
            self.conv[layer].copy_(torch.where(self.advancing[:, None, None], self.stepped, self.conv[layer]))
            self.recurrent[layer].copy_(torch.where(self.advancing[:, None, None, None], recurrent_states, self.recurrent[layer]))
        self.stepped = None
        return recurrent_states


@dataclass
class StepGraphs:
    """A cache's decoding-step graphs, one per width, greedy or sampling step, with or without token
    masks, and with or without penalties, sharing one memory pool.
    They live and die with their cache: a pool whose graphs are gone cannot take another capture."""

    by_key: dict[tuple[int, bool, bool, bool], tuple] = field(default_factory=dict)
    pool: tuple | None = None


def conv_channels(config) -> int:
    """A linear-attention layer's convolution channels: its queries', keys' and values' (Qwen3.5's in_proj_qkv)."""
    return 2 * config.linear_num_key_heads * config.linear_key_head_dim + config.linear_num_value_heads * config.linear_value_head_dim


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def attending(config) -> list[bool]:
    """Whether each layer of a language model of this config attends (keeps keys and values); a hybrid's linear-attention
    layers keep a state instead."""
    types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    return [kind != LINEAR for kind in types[: config.num_hidden_layers]]


def cache_kind(config) -> type[SlotCache]:
    """The kind of cache a language model of this config keeps (module docstring)."""
    return SlotCache if all(attending(config)) else LinearAttentionCache


def slot_cache(config, slots: int, capacity: int, dtype, device, zeroed: bool = True) -> SlotCache:
    """A cache of `slots` slots of `capacity` tokens for a language model of this config."""
    if cache_kind(config) is LinearAttentionCache:
        return LinearAttentionCache(config, slots, capacity, dtype, device, zeroed)
    return SlotCache(config.num_hidden_layers, slots, config.num_key_value_heads, capacity, head_dim_of(config), dtype, device, zeroed)


def state_tokens(config, dtype: torch.dtype) -> int:
    """What a slot's fixed state weighs, in tokens of keys and values: a hybrid's linear-attention state (a float32
    recurrent state of value heads x key width x value width per layer, whatever the sequence's length); 0 for a cache of
    keys and values alone."""
    if cache_kind(config) is SlotCache:
        return 0
    layers = len(attending(config)) - sum(attending(config))
    conv = conv_channels(config) * config.linear_conv_kernel_dim * dtype.itemsize
    recurrent = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * torch.float32.itemsize
    return -(-layers * (conv + recurrent) // kv_bytes_per_token(config, dtype))


def prefix_cache_refusal(config) -> str | None:
    """Why the prefix cache cannot keep the shared parts of a language model of this config's prompts, or None."""
    if cache_kind(config) is SlotCache:
        return None
    return ("its linear-attention layers keep a recurrent state per sequence, which a prefill gives at the pass's end only and "
            "which cannot be cut at a shared part's end as keys and values are; the prefix cache keeps keys and values")


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """The keys and values one token keeps in the cache, over every attending layer of a language model of this config."""
    return 2 * sum(attending(config)) * config.num_key_value_heads * head_dim_of(config) * dtype.itemsize


def prefix_cache_room(config, dtype: torch.dtype, device: torch.device, memory: int) -> int:
    """Tokens of keys and values a prefix cache may hold for a language model of this config: on a GPU half of what
    its free memory holds beside the weights and a prefill group (the other half is decoding's slots'), elsewhere
    `memory` bytes' worth."""
    per_token = kv_bytes_per_token(config, dtype)
    free = memory_budget(device, per_token)
    return memory // per_token if free is None else free // 2


def memory_budget(device: torch.device, bytes_per_token: int) -> int | None:
    """KV-cache tokens that fit in free GPU memory, keeping room for a prefill group's activations."""
    if device.type != "cuda":
        return None
    # memory this process's allocator holds but no tensor uses (an earlier segment's cache) is free too
    free = torch.cuda.mem_get_info(device)[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    reserve = 6 * 2**30 + PREFILL_TOKENS * bytes_per_token  # the group's activations and its keys and values in flight
    return max(0, free - reserve) // bytes_per_token


def empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
