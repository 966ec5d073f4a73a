"""Decoding attention that reads each slot's keys and values up to its own length: split-KV attention
("flash-decoding"), as a Triton kernel.

Why: a decoding step with SDPA attends through a mask to every slot's first `width` positions (the
longest row's place rounded up to WIDTH_STEP), so a short row reads the keys and values of the longest,
and an empty slot reads them too. Reading the cache is what a step's time is made of (Phi-3-mini keeps
393 KB a token); on an H100 this attention was 30% of generate mode's GPU time (docs/performance.md).

How (the kernels are in infer/split_kv_kernels.py): each row's positions are cut in spans of SPAN; one
program per (row, key/value head, span) computes that span's softmax numerator and denominator for the
query heads that share the key/value head, and a second program per (row, heads) merges the row's spans
in order. A span past a row's length does nothing.
So a row's output depends on its own query, keys, values and length alone: bit for bit the same whatever is
batched beside it and at any width, which SDPA's masked kernels do not promise.

Used by the decoder's steps (infer/runner.py) on a GPU with Triton (installed with PyTorch's CUDA builds);
the tests run the same kernels on the CPU in Triton's interpreter (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import importlib

import torch
from transformers import AttentionInterface

# Positions per program: enough work per program to hide a load's latency, small enough that one long row
# alone still gives the GPU hundreds of programs (a 14,000-token row: 28 spans per head).
SPAN = 512
BLOCK = 64  # positions per inner step of a program
HEADS = 16  # query heads per program; tl.dot's smallest side
ATTENTION = "mmjudge_split_kv"  # its name among transformers' attention functions


def slot_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, *, slot_lengths: torch.Tensor, scaling: float | None = None,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """A transformers attention function (AttentionInterface) for one decoding step: query (rows, heads, 1,
    head_dim); key and value (rows, kv_heads, width, head_dim) as the slot cache returns them; each row
    attends to its first slot_lengths[row] positions (at least one), the mask ignored. Returns the
    output in transformers' layout, (rows, 1, heads, head_dim)."""
    rows, heads, _, head_dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    group = heads // kv_heads
    spans = -(-width // SPAN)
    padded = max(16, _power_of_2(head_dim))
    query = query if query.stride(-1) == 1 else query.contiguous()
    numerator = torch.empty(rows, heads, spans, padded, dtype=torch.float32, device=query.device)
    maximum = torch.empty(rows, heads, spans, dtype=torch.float32, device=query.device)
    denominator = torch.empty_like(maximum)
    output = torch.empty(rows, 1, heads, head_dim, dtype=query.dtype, device=query.device)
    kernels = importlib.import_module("mmjudge.infer.split_kv_kernels")  # imports Triton: on first use only
    scale = scaling if scaling is not None else head_dim**-0.5
    kernels.partial[(rows, kv_heads, spans)](
        query, key, value, slot_lengths, numerator, maximum, denominator,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), scale, heads, spans,
        GROUP=group, GROUP_PAD=max(HEADS, _power_of_2(group)), HEAD_DIM=head_dim, D_PAD=padded,
        SPAN=SPAN, BLOCK=BLOCK, PRECISION="ieee" if query.dtype == torch.float32 else "tf32")  # fp32 as fp32, not TF32
    kernels.merge[(rows, -(-heads // HEADS))](
        numerator, maximum, denominator, slot_lengths, output, heads, spans,
        HEAD_DIM=head_dim, D_PAD=padded, SPAN=SPAN, HEADS=HEADS)
    return output, None


def _power_of_2(n: int) -> int:
    """The smallest power of 2 at least n: a Triton block's side."""
    return 1 << (n - 1).bit_length()


AttentionInterface.register(ATTENTION, slot_attention)

