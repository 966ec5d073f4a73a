"""The backbone families of the tiny checkpoints (judge/testing/families.py writes them): their names, layouts and
language models, without torch, so that a command that only lists or checks them starts in a fraction of a second."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Family:
    layout: str  # "original" or "native"
    llm: str  # the language model's model_type
    tokenizer: str  # "llama-sp", "internlm2-sp", "qwen2", "qwen2.5", "qwen3", "qwen3.5"
    template: str  # the original config's template name; "" for a native checkpoint's Jinja
    tied: bool = False
    kv_heads: int | None = None  # fewer than the heads: grouped-query attention; None: as many (SIZES.llm_heads)
    extra: dict = field(default_factory=dict)


FAMILIES = {
    "internvl2-4b": Family("original", "phi3", "llama-sp", "phi3-chat"),
    "internvl2-1b": Family("original", "qwen2", "qwen2", "Hermes-2", kv_heads=2),
    "internvl2-8b": Family("original", "internlm2", "internlm2-sp", "internlm2-chat", kv_heads=2),
    "internvl2.5-8b": Family("original", "internlm2", "internlm2-sp", "internvl2_5", kv_heads=2),
    "internvl3-2b": Family("original", "qwen2", "qwen2.5", "internvl2_5", kv_heads=2),
    "internvl3-1b-hf": Family("native", "internvl", "qwen2.5", "", tied=True, kv_heads=2),
    "qwen2.5-vl-3b": Family("native", "qwen2_5_vl", "qwen2.5", "", tied=True, kv_heads=2),
    "qwen2.5-vl-7b": Family("native", "qwen2_5_vl", "qwen2.5", "", kv_heads=2),
    "qwen3-vl-4b": Family("native", "qwen3_vl", "qwen3", "", tied=True, kv_heads=2),
    "qwen3-vl-8b": Family("native", "qwen3_vl", "qwen3", "", kv_heads=2),
    "qwen3.5-4b": Family("native", "qwen3_5", "qwen3.5", "", tied=True, kv_heads=2),
    "qwen3.5-9b": Family("native", "qwen3_5", "qwen3.5", "", kv_heads=2),
    "qwen3.5-35b-a3b": Family("native", "qwen3_5_moe", "qwen3.5", "", kv_heads=2),
}
# Where each LLM's rotary embedding switches regime, by default beyond any test prompt; lowered to put prompts
# on both sides of it (the long rope's original context, InternLM2's dynamic-NTK max_position_embeddings).
DEFAULT_SWITCH = 4096
