"""Tiny random InternVL2-4B look-alikes, written in the same files and formats as the real checkpoint.

The tokenizer is a small sentencepiece BPE model trained here, offline, on a fixed corpus, then given
InternVL2-4B's special tokens in InternVL2-4B's order, so each sits at the same offset above the base
vocabulary as in the real one (base 32000 there, `TinySizes.base_vocab` here):

    <|endoftext|> +0 (eos, pad)   <|assistant|> +1   <|system|> +6   <|end|> +7   <|user|> +10
    <img> +11   </img> +12   <IMG_CONTEXT> +13   (<s> 1 is bos, </s> 2, <unk> 0, as in Llama's model)

Two checkpoint formats share one tiny architecture (`SIZES`):

    original  config.json "InternVLChatModel" + InternVL's own key names (fused ViT qkv, mlp1.*),
              as InternVL2-4B and MMIE-Eval ship; the loader converts it on the fly
    native    transformers' InternVLForConditionalGeneration.save_pretrained + judge_config.json
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
from transformers import AutoTokenizer, InternVLForConditionalGeneration, PreTrainedTokenizerBase

from mmjudge.judge.backbones.internvl import native_config_from_original
from mmjudge.judge.checkpoint import JudgeSettings
from mmjudge.judge.model import write_settings
from mmjudge.judge.templates import TEMPLATES
from mmjudge.judge.tiling import TilingConfig

# Phi-3's added tokens, then InternVL's, in the order of InternVL2-4B's tokenizer (ids 32000..32019 there).
SPECIAL_TOKENS = (
    "<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>", "<|placeholder4|>",
    "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>",
    "<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>", "<box>", "</box>",
)
# Words of the rubrics, prompts and synthetic datasets, so that they tokenize to few pieces as real text
# does with a real tokenizer; anything else still tokenizes, through byte fallback.
CORPUS_WORDS = """
the a an of to in and is are was were it its this that these those with for on at as by be been not but or if so
what how why which who when where next then than there here each every some any all more most less few many much very
one two three four five six first second last new old same other own only just also still again after before while
image images picture photo figure chart diagram panel answer answers question questions score scores feedback review
reviewer text texts quality coherence coherent style stylistic consistency consistent overall reference rubric criterion
criteria critique rate rated rating judge judges scale whole number numbers line lines layout order listed exact short
good poor excellent average outstanding strong weak adequate usable broken empty missing flaw flaws small clear clearly
blurry sharp artefact artefacts distortion distortions careful correct fluent informative free repetition contradiction
story stories scene scenes situation situational analysis project projects based learning multi step steps reasoning
plan plans result results reason reasons explain explains explanation continue continues carry forward follows follow
boat harbour sea ship river bridge city street house garden tree trees forest mountain sky cloud sun moon night morning
red blue green yellow orange purple black white grey brown colour colours circle square triangle shape shapes
character characters setting mood event events depict depicts narrate narrates place right wrong make makes made
serve serves purpose part parts major errors error related topic off cite cites label labels visual share shares
student teacher task tasks build builds material materials measure cut glue paint draw drawn drawing model models
problem problems solve solution solutions compute total sum add subtract multiply divide equal equals value values
look looks shows show shown see seen tell told write written writing read reading give given gives take taken
user assistant system helpful harmless please describe describes description provide provides happens leaves goes
""".split()
PROMPT_LINES = (
    "### Question", "### Answer", "### Feedback", "### Score", "### Reference Answer", "Image-1: <image>",
    "Question", "Answer", "Feedback", "Score", "Image", "Text quality: 4", "Image quality: 3",
    "Text-image coherence: 5", "Stylistic consistency: 2", "Rate the answer from 0 to 6.",
)


@dataclass(frozen=True)
class TinySizes:
    """The tiny architecture: InternVL2-4B's shapes with every width and depth shrunk."""

    base_vocab: int = 1200  # sentencepiece pieces; InternVL2-4B has 32000
    vision_hidden: int = 32
    vision_layers: int = 2
    vision_heads: int = 2
    vision_intermediate: int = 64
    # Width 128: at 64 the judge learned the synthetic rule on some seeds and stalled on one marker word on
    # others (demo test Pearson 0.28-0.99 over seeds 0-2); at 128 all three reach 0.985 or more.
    llm_hidden: int = 128
    llm_layers: int = 2
    llm_heads: int = 4
    llm_intermediate: int = 256
    # 56 px tiles give 4 image tokens each (InternVL2-4B: 448 px, 256). With 448, a sample's images made a
    # thousand positions around a few dozen words, and a 2-layer judge could not learn to find the words
    # that decide the score in a CPU-sized run; at 56 it learns the synthetic rule in a few hundred steps.
    image_size: int = 56
    patch_size: int = 14
    max_tiles: int = 6

    @property
    def vocab_size(self) -> int:
        # Like Phi-3 (32064 rows for 32020 tokens): the embedding rounded up to a multiple of 64.
        return -(-(self.base_vocab + len(SPECIAL_TOKENS)) // 64) * 64

    @property
    def patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_tile(self) -> int:
        return self.patches // 4  # the pixel shuffle halves each side


SIZES = TinySizes()


def _corpus(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    sentences = [
        " ".join(rng.choice(CORPUS_WORDS) for _ in range(rng.randint(3, 15))).capitalize() + rng.choice(".?,.")
        for _ in range(4000)
    ]
    # Digits are split one per piece (split_digits), as in Llama's model, so every score is one token.
    digits = [" ".join(str(rng.randint(0, 9)) for _ in range(8)) for _ in range(200)]
    return sentences + list(PROMPT_LINES) * 200 + digits


@functools.cache
def _sentencepiece_model() -> bytes:
    # Deterministic (BPE on a fixed corpus, one thread, no sentence sampling), so once per process is enough.
    # The options are those of Llama's tokenizer.model, which Phi-3 and InternVL2-4B reuse: byte fallback
    # (no text is unknown; a newline becomes <0x0A>), a dummy "▁" prefix, whitespace kept as written.
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus()), model_writer=model, vocab_size=SIZES.base_vocab, model_type="bpe",
        byte_fallback=True, split_digits=True, character_coverage=1.0, num_threads=1,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True, remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, normalization_rule_name="identity", minloglevel=2,
    )
    return model.getvalue()


def write_tokenizer(out_dir: str | Path) -> PreTrainedTokenizerBase:
    """A real sentencepiece tokenizer in InternVL2-4B's file layout; returns it loaded by AutoTokenizer."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tokenizer.model").write_bytes(_sentencepiece_model())
    ids = {token: SIZES.base_vocab + i for i, token in enumerate(SPECIAL_TOKENS)}
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    decoder = {str(i): {"content": t, **flags} for t, i in ids.items()}
    special = {"bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "unk_token": "<unk>"}
    config = {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": decoder, **special,
        "clean_up_tokenization_spaces": False, "legacy": False, "model_max_length": 131072, "padding_side": "right",
        "tokenizer_class": "LlamaTokenizer",
    }
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "added_tokens.json", ids)
    _write_json(out_dir / "special_tokens_map.json", special)
    return AutoTokenizer.from_pretrained(out_dir)


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _rope_scaling(head_dim: int) -> dict:
    # Factors other than 1 so that the longrope path really runs (InternVL2-4B's config says "su").
    n = head_dim // 2
    return {"type": "su", "short_factor": [1.0 + 0.1 * i / n for i in range(n)], "long_factor": [1.0 + 0.5 * i / n for i in range(n)]}


def _llm_config(tokenizer: PreTrainedTokenizerBase, original_max_position_embeddings: int) -> dict:
    s = SIZES
    return {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": s.llm_hidden, "num_hidden_layers": s.llm_layers,
        "num_attention_heads": s.llm_heads, "num_key_value_heads": s.llm_heads, "intermediate_size": s.llm_intermediate,
        "vocab_size": s.vocab_size, "max_position_embeddings": 131072, "original_max_position_embeddings": original_max_position_embeddings,
        "rope_theta": 10000.0, "rope_scaling": _rope_scaling(s.llm_hidden // s.llm_heads), "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": False, "sliding_window": 262144,
        "attention_dropout": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "initializer_range": 0.02, "torch_dtype": "bfloat16",
    }


def _original_config(tokenizer: PreTrainedTokenizerBase, original_max_position_embeddings: int = 4096) -> dict:
    return internvl_chat_config(_llm_config(tokenizer, original_max_position_embeddings))


def internvl_chat_config(llm_config: dict, template: str = "phi3-chat") -> dict:
    """An original (InternVLChatModel) config.json around a language model's config, with the tiny vision tower."""
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
        # Names of the remote code a real checkpoint ships; no code is written, and the loader never runs any.
        "auto_map": {"AutoConfig": "configuration_internvl_chat.InternVLChatConfig", "AutoModel": "modeling_internvl_chat.InternVLChatModel",
                     "AutoModelForCausalLM": "modeling_internvl_chat.InternVLChatModel"},
        "llm_config": llm_config, "vision_config": vision, "force_image_size": s.image_size, "downsample_ratio": 0.5,
        "ps_version": "v2", "select_layer": -1, "template": template, "dynamic_image_size": True, "use_thumbnail": True,
        "min_dynamic_patch": 1, "max_dynamic_patch": s.max_tiles, "use_backbone_lora": 0, "use_llm_lora": 0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


def _stop_tokens(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    # InternVL2-4B's generation_config: [2, 32000, 32007], i.e. </s>, <|endoftext|>, <|end|>.
    return tokenizer.convert_tokens_to_ids(["</s>", "<|endoftext|>", "<|end|>"])


def _original_weights(seed: int) -> dict[str, torch.Tensor]:
    """Random tensors under InternVL2's original key names and shapes. Biases and norms are random too,
    so a converter that drops or swaps one changes the output."""
    s = SIZES
    g = torch.Generator().manual_seed(seed)
    normal = lambda *shape, std=0.02: torch.randn(*shape, generator=g) * std  # noqa: E731
    near_one = lambda n: 1 + normal(n, std=0.1)  # noqa: E731
    v, h = s.vision_hidden, s.llm_hidden
    w = {
        "vision_model.embeddings.class_embedding": normal(1, 1, v),
        "vision_model.embeddings.position_embedding": normal(1, s.patches + 1, v),
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
            pre + "ls1": near_one(v), pre + "ls2": near_one(v),  # positive, as layer scales are
        }
    w |= {
        # mlp1: LayerNorm(4v) -> Linear(4v, h) -> GELU (mlp1.2, no weights) -> Linear(h, h)
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


def write_original_checkpoint(out_dir: str | Path, *, seed: int = 0, shards: int = 1, dtype: str = "float32",
                              original_max_position_embeddings: int = 4096, system_message: str | None = None) -> Path:
    """A tiny checkpoint in InternVL2-4B's original (InternVLChatModel) format. The real one is stored in
    bfloat16; float32 is the default here so that parity checks against it can be exact.
    `original_max_position_embeddings` is where Phi-3's long-rope switches to its long factors (4096 in
    InternVL2-4B); a small one puts a test's short prompts on both sides of it. `system_message` goes to
    config.json, where a checkpoint's own replaces InternVL's default (None: the default, as InternVL2-4B's)."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, got {shards}")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
    out_dir = Path(out_dir)
    tokenizer = write_tokenizer(out_dir)
    config = _original_config(tokenizer, original_max_position_embeddings)
    _write_json(out_dir / "config.json", config if system_message is None else {**config, "system_message": system_message})
    _write_json(out_dir / "generation_config.json", {"eos_token_id": _stop_tokens(tokenizer)})
    weights = {k: t.to(getattr(torch, dtype)).contiguous() for k, t in _original_weights(seed).items()}
    _save_shards(out_dir, weights, shards)
    return out_dir


def _save_shards(out_dir: Path, weights: dict[str, torch.Tensor], shards: int) -> None:
    """One model.safetensors, or HF's sharded layout: model-0000k-of-0000n.safetensors and an index."""
    if shards == 1:
        save_file(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
        return
    keys = list(weights)
    weight_map = {}
    for n in range(shards):
        name = f"model-{n + 1:05d}-of-{shards:05d}.safetensors"
        part = keys[n::shards]  # interleaved, so that every shard holds vision and language tensors
        save_file({k: weights[k] for k in part}, out_dir / name, metadata={"format": "pt"})
        weight_map |= {k: name for k in part}
    total = sum(t.numel() * t.element_size() for t in weights.values())
    _write_json(out_dir / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


def write_native_checkpoint(out_dir: str | Path, *, seed: int = 0) -> Path:
    """The same tiny architecture saved by transformers' own InternVLForConditionalGeneration (its own
    random init, seeded), plus judge_config.json for what the native config has no field for."""
    out_dir = Path(out_dir)
    tokenizer = write_tokenizer(out_dir)
    # The loader's own mapping, so that the native config is exactly what an original one converts to
    # (Phi-3 text config with longrope rope_parameters, untied embeddings at every level).
    config = native_config_from_original(_original_config(tokenizer), tokenizer)
    with torch.random.fork_rng(devices=[]):  # seed the init without disturbing the caller's random state
        torch.manual_seed(seed)
        model = InternVLForConditionalGeneration(config)
    model.generation_config.eos_token_id = _stop_tokens(tokenizer)
    model.save_pretrained(out_dir, safe_serialization=True)
    tiling = TilingConfig(image_size=SIZES.image_size, min_tiles=1, max_tiles=SIZES.max_tiles, use_thumbnail=True, tokens_per_tile=config.image_seq_length)
    write_settings(JudgeSettings(TEMPLATES["phi3-chat"], None, tiling), out_dir)
    return out_dir


class Planted:
    """An object that, unpickled, creates the file `marker`, where a planted one could run any code: for
    the tests that no command of the toolkit unpickles it (mmjudge.judge.cli.forbid_pickled_code)."""

    def __init__(self, marker: str | Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")
