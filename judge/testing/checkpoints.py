"""Tiny random InternVL2-4B look-alikes, written in the same files and formats as the real checkpoint.

The tokenizer is a small sentencepiece BPE model trained here, offline, on a fixed corpus, then given
InternVL2-4B's special tokens in InternVL2-4B's order, so each sits at the same offset above the base
vocabulary as in the real one (<|endoftext|> +0, <|assistant|> +1, <|system|> +6, <|end|> +7,
<|user|> +10, <img> +11, </img> +12, <IMG_CONTEXT> +13; the real base vocabulary has 32000 pieces).
"""

from __future__ import annotations

import functools
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, InternVLForConditionalGeneration

from judge.model import JudgeSettings, native_config_from_original, write_settings
from judge.tiling import TilingConfig

SPECIAL_TOKENS = (
    "<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>", "<|placeholder4|>",
    "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>",
    "<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>",
)
CORPUS_WORDS = (
    "the a an of to in and is are was were it this that with for on as by be not but what how why which next then "
    "image images answer question score feedback text quality coherence style stylistic consistency overall reference "
    "good poor excellent average story boat harbour step plan reason result figure chart shows looks clear blurry "
    "sharp colour colours red blue green scene judge review critique criterion criteria rubric continue explain"
).split()


@dataclass(frozen=True)
class TinySizes:
    base_vocab: int = 600
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 2
    vision_intermediate: int = 64
    llm_hidden: int = 64
    llm_layers: int = 2
    llm_heads: int = 4
    llm_intermediate: int = 128
    image_size: int = 448
    patch_size: int = 14
    max_tiles: int = 6

    @property
    def vocab_size(self) -> int:
        # Like Phi-3 (32064 for 32020 tokens): the embedding rounded up to a multiple of 64.
        return -(-(self.base_vocab + len(SPECIAL_TOKENS)) // 64) * 64


SIZES = TinySizes()


def _corpus(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(CORPUS_WORDS) for _ in range(rng.randint(3, 15))) for _ in range(3000)]
    lines += ["### Question", "### Answer", "### Feedback", "### Score", "### Reference Answer", "Image-1: <image>"] * 50
    lines += ["Text quality: 4", "Image quality: 3", "Text-image coherence: 5", "Stylistic consistency: 2"] * 50
    return lines + [" ".join(str(rng.randint(0, 9)) for _ in range(8)) for _ in range(200)]


@functools.cache
def _sentencepiece_model() -> bytes:
    # Deterministic (one thread, fixed corpus), so training once per process is enough.
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()), model_writer=model, vocab_size=SIZES.base_vocab, model_type="bpe",
        byte_fallback=True, split_digits=True, character_coverage=1.0, num_threads=1, unk_id=0, bos_id=1, eos_id=2,
        pad_id=-1, add_dummy_prefix=True, remove_extra_whitespaces=False, normalization_rule_name="identity", minloglevel=2,
    )
    return model.getvalue()


def write_tokenizer(out_dir: str | Path):
    """A real sentencepiece tokenizer in InternVL2-4B's file layout; returns it loaded."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.model").write_bytes(_sentencepiece_model())
    ids = {token: SIZES.base_vocab + i for i, token in enumerate(SPECIAL_TOKENS)}
    decoder = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True} for t, i in ids.items()}
    special = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>"}
    config = {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder, **special, "clean_up_tokenization_spaces": False,
              "legacy": False, "model_max_length": 131072, "padding_side": "right", "tokenizer_class": "LlamaTokenizer"}
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "added_tokens.json", ids)
    _write_json(out_dir / "special_tokens_map.json", special)
    return AutoTokenizer.from_pretrained(out_dir)


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _rope_factors(head_dim: int) -> dict:
    # Factors other than 1 so that the longrope path really runs (InternVL2-4B's config carries "su").
    n = head_dim // 2
    return {"type": "su", "short_factor": [1.0 + 0.1 * i / n for i in range(n)], "long_factor": [1.0 + 0.5 * i / n for i in range(n)]}


def _llm_config(tokenizer) -> dict:
    s = SIZES
    return {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": s.llm_hidden, "num_hidden_layers": s.llm_layers,
        "num_attention_heads": s.llm_heads, "num_key_value_heads": s.llm_heads, "intermediate_size": s.llm_intermediate,
        "vocab_size": s.vocab_size, "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0, "rope_scaling": _rope_factors(s.llm_hidden // s.llm_heads), "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": False, "sliding_window": 262144,
        "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "initializer_range": 0.02, "torch_dtype": "bfloat16",
    }


def _original_config(tokenizer) -> dict:
    s = SIZES
    vision = {
        "architectures": ["InternVisionModel"], "model_type": "intern_vit_6b", "hidden_size": s.vision_hidden,
        "num_hidden_layers": s.vision_layers, "num_attention_heads": s.vision_heads, "intermediate_size": s.vision_intermediate,
        "image_size": s.image_size, "patch_size": s.patch_size, "num_channels": 3, "qkv_bias": True, "qk_normalization": False,
        "norm_type": "layer_norm", "layer_norm_eps": 1e-6, "hidden_act": "gelu", "initializer_factor": 1.0,
        "drop_path_rate": 0.0, "use_flash_attn": False,
    }
    return {
        "architectures": ["InternVLChatModel"], "model_type": "internvl_chat",
        "auto_map": {"AutoConfig": "configuration_internvl_chat.InternVLChatConfig", "AutoModel": "modeling_internvl_chat.InternVLChatModel",
                     "AutoModelForCausalLM": "modeling_internvl_chat.InternVLChatModel"},
        "llm_config": _llm_config(tokenizer), "vision_config": vision, "force_image_size": s.image_size, "downsample_ratio": 0.5,
        "ps_version": "v2", "select_layer": -1, "template": "phi3-chat", "dynamic_image_size": True, "use_thumbnail": True,
        "min_dynamic_patch": 1, "max_dynamic_patch": s.max_tiles, "use_backbone_lora": 0, "use_llm_lora": 0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


def _original_weights(seed: int) -> dict[str, torch.Tensor]:
    """Random tensors under InternVL2's original key names and shapes."""
    s = SIZES
    g = torch.Generator().manual_seed(seed)
    normal = lambda *shape, std=0.02: torch.randn(*shape, generator=g) * std  # noqa: E731
    near_one = lambda n: 1 + normal(n, std=0.1)  # noqa: E731
    v, h, p = s.vision_hidden, s.llm_hidden, (s.image_size // s.patch_size) ** 2
    w = {
        "vision_model.embeddings.class_embedding": normal(1, 1, v),
        "vision_model.embeddings.position_embedding": normal(1, p + 1, v),
        "vision_model.embeddings.patch_embedding.weight": normal(v, 3, s.patch_size, s.patch_size),
        "vision_model.embeddings.patch_embedding.bias": normal(v),
    }
    for i in range(s.vision_layers):
        pre = f"vision_model.encoder.layers.{i}."
        w |= {
            pre + "attn.qkv.weight": normal(3 * v, v), pre + "attn.qkv.bias": normal(3 * v),
            pre + "attn.proj.weight": normal(v, v), pre + "attn.proj.bias": normal(v),
            pre + "mlp.fc1.weight": normal(s.vision_intermediate, v), pre + "mlp.fc1.bias": normal(s.vision_intermediate),
            pre + "mlp.fc2.weight": normal(v, s.vision_intermediate), pre + "mlp.fc2.bias": normal(v),
            pre + "norm1.weight": near_one(v), pre + "norm1.bias": normal(v), pre + "norm2.weight": near_one(v), pre + "norm2.bias": normal(v),
            pre + "ls1": near_one(v), pre + "ls2": near_one(v),
        }
    w |= {
        "mlp1.0.weight": near_one(4 * v), "mlp1.0.bias": normal(4 * v),
        "mlp1.1.weight": normal(h, 4 * v), "mlp1.1.bias": normal(h), "mlp1.3.weight": normal(h, h), "mlp1.3.bias": normal(h),
        "language_model.model.embed_tokens.weight": normal(s.vocab_size, h),
        "language_model.model.norm.weight": near_one(h),
        "language_model.lm_head.weight": normal(s.vocab_size, h),
    }
    for i in range(s.llm_layers):
        pre = f"language_model.model.layers.{i}."
        w |= {
            pre + "self_attn.qkv_proj.weight": normal(3 * h, h), pre + "self_attn.o_proj.weight": normal(h, h),
            pre + "mlp.gate_up_proj.weight": normal(2 * s.llm_intermediate, h), pre + "mlp.down_proj.weight": normal(h, s.llm_intermediate),
            pre + "input_layernorm.weight": near_one(h), pre + "post_attention_layernorm.weight": near_one(h),
        }
    return w


def write_original_checkpoint(out_dir: str | Path, *, seed: int = 0, shards: int = 1, dtype: str = "float32") -> Path:
    """A tiny checkpoint in InternVL2-4B's original (InternVLChatModel) format."""
    out_dir = Path(out_dir)
    tokenizer = write_tokenizer(out_dir)
    _write_json(out_dir / "config.json", _original_config(tokenizer))
    _write_json(out_dir / "generation_config.json", {"eos_token_id": [2, tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|end|>")]})
    weights = {k: t.to(getattr(torch, dtype)).contiguous() for k, t in _original_weights(seed).items()}
    _save_shards(out_dir, weights, shards)
    return out_dir


def _save_shards(out_dir: Path, weights: dict[str, torch.Tensor], shards: int) -> None:
    if shards == 1:
        save_file(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
        return
    keys = list(weights)
    weight_map = {}
    for n in range(shards):
        name = f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[n::shards]
        save_file({k: weights[k] for k in part}, out_dir / name, metadata={"format": "pt"})
        weight_map |= {k: name for k in part}
    total = sum(t.numel() * t.element_size() for t in weights.values())
    _write_json(out_dir / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


def write_native_checkpoint(out_dir: str | Path, *, seed: int = 0) -> Path:
    """The same tiny architecture saved by transformers' own InternVLForConditionalGeneration (random
    init), plus the judge_config.json sidecar that carries what the native config has no field for."""
    out_dir = Path(out_dir)
    tokenizer = write_tokenizer(out_dir)
    config = native_config_from_original(_original_config(tokenizer), tokenizer)
    torch.manual_seed(seed)
    InternVLForConditionalGeneration(config).save_pretrained(out_dir)
    tiling = TilingConfig(image_size=SIZES.image_size, max_tiles=SIZES.max_tiles)
    write_settings(JudgeSettings("phi3-chat", None, tiling, config.image_seq_length), out_dir)
    return out_dir
