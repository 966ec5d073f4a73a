"""The cache: each row's state between forward passes (the decoder's second part, infer/decoding.py), in
`slots` preallocated for a lane's rows, and what it costs in memory.

A cache is what the model's decoder layers are given as their cache (transformers' `Cache` methods, by their
names): SlotCache holds keys and values, which attention layers store and read through `update`. The runner
(infer/runner.py) says what a pass writes where (`prefill`, `chunk`, `positions`), and the cache writes each
row's part into its slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Prefill groups hold at most this many tokens, padding included (infer/scheduler.py): enough rows for the matrix
# units to run at full rate, few enough that the group's activations stay small beside the cache, which keeps room
# for them (memory_budget).
PREFILL_TOKENS = 16384


class SlotCache:
    """Keys and values of `slots` sequences of up to `capacity` tokens, for every layer. Passed to the
    decoder layers as their cache: `update`, with the signature of transformers' public `Cache.update`,
    stores a step's (or a prefill's) keys and values and returns what attention reads."""

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


@dataclass
class StepGraphs:
    """A cache's decoding-step graphs, one per width, greedy or sampling step, with or without token
    masks, and with or without penalties, sharing one memory pool.
    They live and die with their cache: a pool whose graphs are gone cannot take another capture."""

    by_key: dict[tuple[int, bool, bool, bool], tuple] = field(default_factory=dict)
    pool: tuple | None = None


def slot_cache(config, slots: int, capacity: int, dtype, device, zeroed: bool = True) -> SlotCache:
    """A cache of `slots` slots of `capacity` tokens for a language model of this config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return SlotCache(config.num_hidden_layers, slots, config.num_key_value_heads, capacity, head_dim, dtype, device, zeroed)


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """The keys and values one token keeps in the cache, over every layer of a language model of this config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype.itemsize


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
