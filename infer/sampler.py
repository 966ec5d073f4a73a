"""The sampler: what a forward pass's last-position logits give each row (the decoder's fourth part,
infer/decoding.py): its written token, its recorded columns and, asked for, its likeliest tokens'
log-probabilities; and the per-row inputs that decide the token (draws, penalties, grammar masks), built on
the host in fixed shapes so that a decoding step with them is one CUDA graph.

Sampling (a request with a temperature above 0) keeps every row its own: each answer ("choice") draws one
uniform number per token on the host from its own generator, seeded from the request's seed and the choice's
index, and the token is read off the inverse CDF of the row's filtered distribution. So a seeded answer is
the same whatever is batched beside it, and a step's shapes stay fixed for its CUDA graph.

Penalties (OpenAI's presence_penalty and frequency_penalty, greedy or sampled) are taken off a row's logits
before its token is chosen: presence * (count > 0) + frequency * count, counted over the tokens the row has
written. Each step builds them on the host, a (rows, vocabulary) input of fixed shape like the draws, so a
step with penalized rows is a CUDA graph too; log-probabilities stay the model's own.

A request may carry a grammar (structured outputs, infer/grammar.py): each of its rows has its own matcher,
which masks the tokens the grammar does not allow before the row's token is chosen or drawn, in the same
batched step as every other row (a row without a grammar allows every token). The mask is one more input
of fixed shape, so a step with constrained rows is a CUDA graph too; log-probabilities stay the model's
own, before the mask (vLLM's default, `raw_logprobs`).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

import torch

from mmjudge.infer.grammar import Matcher, allowed_tokens, token_masks


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


def seeded(sampling: Sampling) -> Sampling:
    """The sampling settings with a seed: a fresh random one where none is given (and greedy needs none)."""
    if sampling.temperature > 0 and sampling.seed is None:
        return replace(sampling, seed=random.getrandbits(63))
    return sampling


def generator(sampling: Sampling, choice: int) -> torch.Generator | None:
    """A sampling choice's own generator, seeded from its request's seed and its index; None for greedy."""
    if sampling.temperature <= 0:
        return None
    digest = hashlib.sha256(f"{sampling.seed} {choice}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


class Sampled(Protocol):
    """What the sampler reads of a row (infer/scheduler.py's Row): its request's settings, its own generator and next
    uniform number, its grammar's matcher, and what it has written."""

    request: Any  # its .sampling: Sampling
    generator: torch.Generator | None
    uniform: float
    matcher: Matcher | None
    following: bool  # fed follow-up tokens: it writes nothing of its own
    tokens: list[int]


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


def draws_of(rows: list[Sampled | None]) -> Draws | None:
    """The rows' draws (empty slots and greedy rows at temperature 0), or None where no row samples."""
    if not any(row is not None and row.generator is not None for row in rows):
        return None
    settings = [row.request.sampling if row is not None else Sampling() for row in rows]
    return Draws(torch.tensor([s.temperature for s in settings], dtype=torch.float32), torch.tensor([s.top_p for s in settings], dtype=torch.float32),
                 torch.tensor([s.top_k for s in settings], dtype=torch.long), torch.tensor([row.uniform if row else 0.0 for row in rows], dtype=torch.float32))


def penalties_of(rows: list[Sampled | None], size: int) -> torch.Tensor | None:
    """Each row's penalty on each of `size` tokens, OpenAI's presence * (count > 0) + frequency * count over
    the tokens it has written (a row fed follow-up tokens writes nothing of its own: none); None where no row
    has one."""
    def penalized(row: Sampled | None) -> bool:
        return row is not None and not row.following and bool(row.tokens) and bool(row.request.sampling.presence_penalty
                                                                                    or row.request.sampling.frequency_penalty)

    if not any(map(penalized, rows)):
        return None
    table = torch.zeros(len(rows), size)
    for k, row in enumerate(rows):
        if penalized(row):
            counts = torch.bincount(torch.tensor(row.tokens), minlength=size).float()
            table[k] = row.request.sampling.presence_penalty * (counts > 0) + row.request.sampling.frequency_penalty * counts
    return table


def masks_of(rows: list[Sampled | None], size: int) -> torch.Tensor | None:
    """The rows' token masks over `size` tokens (infer/grammar.py), or None where no row has a grammar. A row fed
    follow-up tokens writes nothing of its own: it has none."""
    return token_masks([row.matcher if row is not None and not row.following else None for row in rows], size)


def sample(logits: torch.Tensor, draws: Draws) -> torch.Tensor:
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


class Sampler:
    """A forward pass's outputs from its rows' logits. `columns` are the vocabulary entries whose logits are
    recorded at every written token (a judge's score tokens); `suppress` are never written."""

    def __init__(self, columns: torch.Tensor, suppress: torch.Tensor):
        self.columns, self.suppress = columns, suppress

    def __call__(self, logits: torch.Tensor, logprobs: int, draws: Draws | None, masks: torch.Tensor | None,
                 penalties: torch.Tensor | None = None) -> Step:
        """The outputs of float logits (rows, vocabulary); each of fixed shape, so that a CUDA graph can return them.
        Without draws (no row samples) every row takes the argmax; without masks (no row has a grammar) every token
        may be written; `penalties` (rows, vocabulary) are taken off the logits the token is chosen from (none: no row
        has a penalty)."""
        recorded = logits[:, self.columns]
        if len(self.suppress):
            logits.index_fill_(1, self.suppress, float("-inf"))
        writable = logits if penalties is None else logits - penalties
        writable = writable if masks is None else writable.masked_fill(~allowed_tokens(masks, logits.shape[1]), float("-inf"))
        chosen = writable.argmax(-1)
        if draws is not None:
            chosen = torch.where(draws.temperature > 0, sample(writable, draws), chosen)
        if not logprobs:
            return Step(chosen, recorded, logits[:, :0], chosen[:, None][:, :0])
        # The model's own log-probabilities, whatever the temperature and penalties (as OpenAI reports them).
        log_softmax = logits.log_softmax(-1)
        # The written token first even where a tie lets topk put another first (bf16 logits tie often), or a draw
        # wrote a less likely one.
        top_logprobs, top_ids = log_softmax.scatter(1, chosen[:, None], float("inf")).topk(logprobs, dim=-1)
        top_logprobs = torch.cat([log_softmax.gather(1, chosen[:, None]), top_logprobs[:, 1:]], dim=1)
        return Step(chosen, recorded, top_logprobs, top_ids)
