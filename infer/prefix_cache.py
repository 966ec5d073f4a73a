"""A prefix cache: the keys and values of prompts' shared parts, so that the prompts of a GRPO group (one
question, its images and the rubric, then eight answers), or a pair's two orders, prefill that part once.

A judge prompt's shared part (`Request.prefix`) is what comes before its first answer: where it ends is a
property of the prompt alone (infer/engine.py's prepare finds it), never of what the cache holds. A prompt
with a shared part is always prefilled in two pieces cut there, the shared part and then the rest attending
to it through its slot (infer/runner.py), whether the shared part's keys and values are computed or copied
from here: a prompt whose shared part came from the cache is therefore the same bits as the same prompt
prefilled fresh, by construction, alone and in any batch.

An entry is found by its exact token ids, a digest of the pixels of the images among them, and what else
decides their rotary embedding (judge/rope.py's frequencies_of: a long-rope prompt past 4,096 tokens is
encoded with other frequencies from its first token on), so the same text beside another image is a miss.
The cache holds at most `limit` tokens, the least recently used entry leaving first, but only for a part asked for
more often lately than that entry (each key's asks counted, the counts halved every AGE_ASKS asks: TinyLFU's
admission): questions that come back in a cycle longer than the cache holds (a benchmark's, an epoch's) would
otherwise each evict the next to come back, and every one would miss; so the cache keeps those it holds, and a
GRPO step's new questions, asked for by each of their answers, displace the last step's as their counts age.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from dataclasses import dataclass

import torch

from mmjudge.judge.vision import Pixels

# Asks for shared parts after which every key's count is halved: what was asked for long ago weighs less.
AGE_ASKS = 256


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
    """Entries by prefix_key, least recently used first, holding at most `limit` tokens (module docstring)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.entries: OrderedDict[bytes, Entry] = OrderedDict()
        self.tokens = 0  # held now
        self.asked: Counter[bytes] = Counter()  # each key's asks lately, halved every AGE_ASKS asks
        self.asks = 0  # since the last halving
        self.hits = self.misses = self.evictions = self.refusals = 0

    def get(self, key: bytes, input_ids: torch.Tensor) -> Entry | None:
        self._ask(key)
        entry = self.entries.get(key)
        if entry is None or not torch.equal(entry.input_ids, input_ids):
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return entry

    def shared(self, key: bytes) -> None:
        """A hit on a part another prompt of the same prefill group brings (computed or copied once for both)."""
        self._ask(key)
        self.hits += 1

    def put(self, key: bytes, entry: Entry) -> None:
        """Keep the entry, the least recently used leaving until it fits, if it was asked for more often lately than the
        first to leave (else it is refused); one larger than the whole limit is not kept."""
        size = len(entry.input_ids)
        if size > self.limit or key in self.entries:
            return
        if self.tokens + size > self.limit and self.asked[key] <= self.asked[next(iter(self.entries))]:
            self.refusals += 1
            return
        while self.tokens + size > self.limit:
            _, evicted = self.entries.popitem(last=False)
            self.tokens -= len(evicted.input_ids)
            self.evictions += 1
        self.entries[key] = entry
        self.tokens += size

    def _ask(self, key: bytes) -> None:
        self.asked[key] += 1
        self.asks += 1
        if self.asks == AGE_ASKS:  # the counts held stay bounded: at most AGE_ASKS keys between two halvings
            self.asked = Counter({k: n // 2 for k, n in self.asked.items() if n > 1})
            self.asks = 0
