"""Rotary position embeddings seen per row, so that a sequence is encoded the same in any batch.

Phi-3's long-rope scaling (InternVL2-4B, MMIE-Eval) has two sets of frequencies: the short factors while a
sequence is within the pre-training context (`original_max_position_embeddings`, 4096 for Phi-3-mini-128k)
and the long factors beyond it. Both transformers' `longrope` update and InternVL's reference
`modeling_phi3.py` pick the set once per forward call, from the largest position in the whole call:

    long = max(position_ids) + 1 > original_max_position_embeddings

Alone, a sequence's largest position is its own length, so a 3,000-token prompt is encoded with the short
factors. In a batch it is the longest row's, so the same prompt beside an 8,000-token one was encoded with
the long factors and scored differently. `RowwiseLongRope` applies the same rule to each row on its own:
each row's set comes from its own largest position. For a batch of one it is exactly the original rule,
and so is every row of a batch whose position ids are the row's own (padding given a position that is not
beyond the row's last token): right-padded prefill, one token per row in decoding, and training batches.

InternLM2's dynamic NTK rope (InternVL2-2B/8B, InternVL2.5-2B/8B, mapped onto Llama's "dynamic" rope) has the
same defect in transformers: the base grows with the whole call's largest position. Its reference
(`modeling_internlm2.py`) computes, for a sequence of L tokens so far, the base

    base * (factor * L / max_position_embeddings - (factor - 1)) ** (dim / (dim - 2))    when L > max_position_embeddings

and the configured base otherwise. `RowwiseDynamicRope` computes it per row from the row's own largest
position, with the reference's arithmetic (the base in double, the frequencies in float32), in tensor
operations only, so that a CUDA graph can replay it. (The reference also keeps a grown base for every later,
shorter sequence until the model is reloaded: an order dependence of its own, not reproduced here.)
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


class RowwiseLongRope(nn.Module):
    """Drop-in for a model's long-rope rotary embedding: forward(x, position_ids) -> (cos, sin), each
    (batch, seq, head_dim), with each row's frequencies chosen by that row's largest position."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        config = rotary.config
        self.original_max = config.rope_parameters["original_max_position_embeddings"]
        # The same tensors transformers computes: its buffers for the short set, its init for the long one.
        long_inv_freq, _ = ROPE_INIT_FUNCTIONS["longrope"](config, rotary.original_inv_freq.device, seq_len=self.original_max + 1)
        self.short_inv_freq = nn.Buffer(rotary.original_inv_freq.clone(), persistent=False)
        self.long_inv_freq = nn.Buffer(long_inv_freq.to(rotary.original_inv_freq.device), persistent=False)
        self.attention_scaling = rotary.attention_scaling

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        long = (position_ids.amax(dim=-1, keepdim=True) + 1 > self.original_max)[..., None]  # (batch, 1, 1)
        inv_freq = torch.where(long, self.long_inv_freq.float(), self.short_inv_freq.float())  # (batch, 1, dim / 2)
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class RowwiseDynamicRope(nn.Module):
    """Drop-in for a model's dynamic-NTK rotary embedding: forward(x, position_ids) -> (cos, sin), each row's
    base from that row's largest position (module docstring)."""

    def __init__(self, rotary: nn.Module):
        super().__init__()
        config = rotary.config
        params = config.rope_parameters
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        self.base, self.factor, self.longest = float(params["rope_theta"]), float(params["factor"]), config.max_position_embeddings
        self.exponents = nn.Buffer(torch.arange(0, self.dim, 2).float().to(rotary.original_inv_freq.device) / self.dim, persistent=False)
        self.inv_freq = nn.Buffer(rotary.original_inv_freq.clone(), persistent=False)

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        length = position_ids.amax(dim=-1, keepdim=True).double() + 1  # (batch, 1)
        grown = self.base * (self.factor * length / self.longest - (self.factor - 1)) ** (self.dim / (self.dim - 2))
        dynamic = 1.0 / (grown.float() ** self.exponents)  # (batch, dim / 2)
        inv_freq = torch.where(length > self.longest, dynamic, self.inv_freq.float())[:, None]  # (batch, 1, dim / 2)
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)


def use_rowwise_rope(language_model: nn.Module) -> None:
    """Give a language model per-row long-rope or dynamic-NTK frequencies (module docstring); other rope types
    depend on positions alone, and are left as they are."""
    rotary = language_model.rotary_emb
    if isinstance(rotary, (RowwiseLongRope, RowwiseDynamicRope)):
        return
    rope_type = getattr(rotary, "rope_type", None)
    if rope_type == "longrope":
        language_model.rotary_emb = RowwiseLongRope(rotary)
    elif rope_type == "dynamic":
        language_model.rotary_emb = RowwiseDynamicRope(rotary)


def frequencies_of(rotary: nn.Module, length: int) -> int:
    """What, beside positions, decides the rotary embedding of a sequence of `length` tokens: long-rope's set
    (1: the long factors), dynamic NTK's grown length (0: the configured base), 0 for a rope of positions alone.
    Keys computed for a prompt's first tokens may serve another prompt only where it is the same (a prefix
    cache's key, infer/prefix_cache.py)."""
    if isinstance(rotary, RowwiseLongRope):
        return int(length > rotary.original_max)
    if isinstance(rotary, RowwiseDynamicRope):
        return length if length > rotary.longest else 0
    return 0


def context_length(config) -> int:
    """The tokens a language model reads and writes together at most: its max_position_embeddings, which dynamic
    NTK scaling extends by its factor (InternLM2's 32,768 positions reach 65,536 at factor 2)."""
    params = getattr(config, "rope_parameters", None) or {}
    factor = params.get("factor", 1.0) if params.get("rope_type") == "dynamic" else 1.0
    return int(config.max_position_embeddings * factor)
