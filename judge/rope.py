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


def use_rowwise_rope(language_model: nn.Module) -> None:
    """Give a language model per-row long-rope frequencies (module docstring); other rope types depend on
    positions alone, and are left as they are."""
    rotary = language_model.rotary_emb
    if isinstance(rotary, RowwiseLongRope):
        return
    if getattr(rotary, "rope_type", None) == "longrope":
        language_model.rotary_emb = RowwiseLongRope(rotary)
