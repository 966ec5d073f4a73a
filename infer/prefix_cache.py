"""A prefix cache: the keys and values of prompts' shared parts, so that the prompts of a GRPO group (one
question, its images and the rubric, then eight answers), or a pair's two orders, prefill that part once.

A judge prompt's shared part (`Request.prefix`) is what comes before its first answer: where it ends is a
property of the prompt alone (infer/engine.py's prepare finds it), never of what the cache holds. A prompt
with a shared part is always prefilled in two pieces cut there, the shared part and then the rest attending
to it through its slot (infer/decoding.py), whether the shared part's keys and values are computed or copied
from here: a prompt whose shared part came from the cache is therefore the same bits as the same prompt
prefilled fresh, by construction, alone and in any batch.

An entry is found by its exact token ids, a digest of the pixels of the images among them, and what else
decides their rotary embedding (judge/rope.py's frequencies_of: a long-rope prompt past 4,096 tokens is
encoded with other frequencies from its first token on), so the same text beside another image is a miss.
The cache holds at most `limit` tokens, the least recently used entry leaving first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import torch

from mmjudge.judge.vision import Pixels


@dataclass
class Entry:
    input_ids: torch.Tensor  # (tokens,) the shared part's token ids, compared whole on every hit
    keys: torch.Tensor  # (layers, heads, tokens, head_dim)
    values: torch.Tensor


def pixel_digest(pixels: Pixels) -> bytes:
    """A digest of some images' pixels (and Qwen-VL's grids): SHA-256 over megabytes of tiles, 5 ms of CPU per 7
    InternVL tiles in bf16 (11 in fp32), so made where the images are loaded (infer/engine.py), never on the model thread."""
    digest = hashlib.sha256(pixels.values.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    if pixels.grids is not None:
        digest.update(pixels.grids.to(torch.int64).cpu().numpy().tobytes())
    return digest.digest()


def prefix_key(input_ids: torch.Tensor, shared_digest: bytes | None, frequencies: int) -> bytes:
    """A digest of a shared part's token ids, its images' pixel_digest (None: it has no image), and its rotary
    frequencies' setting."""
    digest = hashlib.sha256(input_ids.to(torch.int64).numpy().tobytes())
    digest.update(str(frequencies).encode())
    if shared_digest is not None:
        digest.update(shared_digest)
    return digest.digest()


class PrefixCache:
    """Entries by prefix_key, least recently used first, holding at most `limit` tokens."""

    def __init__(self, limit: int):
        self.limit = limit
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()
        self.tokens = 0  # held now
        self.hits = self.misses = self.evictions = 0

    def get(self, key: bytes, input_ids: torch.Tensor) -> Entry | None:
        entry = self.entries.get(key)
        if entry is None or not torch.equal(entry.input_ids, input_ids):
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: bytes, entry: Entry) -> None:
        """Keep the entry, the least recently used leaving until it fits; one larger than the whole limit is not kept."""
        size = len(entry.input_ids)
        if size > self.limit or key in self.entries:
            return
        while self.tokens + size > self.limit:
            _, evicted = self.entries.popitem(last=False)
            self.tokens -= len(evicted.input_ids)
            self.evictions += 1
        self.entries[key] = entry
        self.tokens += size
