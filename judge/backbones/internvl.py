"""The InternVL family (InternVL2 1B-8B, InternVL2.5, InternVL3) on transformers' `InternVLForConditionalGeneration`.

Two layouts, told apart by config.json (judge/model.py, `checkpoint_format`):

    original  "architectures": ["InternVLChatModel"], InternVL's remote-code format, as every InternVL2, 2.5 and 3
              checkpoint ships: converted here, on the fly, field by field and tensor by tensor; nothing of the
              checkpoint is executed
    native    "model_type": "internvl": transformers' own, as the official -hf checkpoints (InternVL3-*-hf) ship
              and as this toolkit writes merged judges; loaded by transformers

The language model of an original checkpoint becomes transformers' native class of the same architecture: Phi-3
(InternVL2-4B), Qwen2 and Qwen2.5 (InternVL2-1B, InternVL2.5-1B/4B, InternVL3), Llama; and InternLM2/2.5
(InternVL2-2B/8B, InternVL2.5-2B/8B), which transformers does not implement, becomes a Llama: the same
computation under other names, its attention's fused `wqkv` split into q, k and v. InternLM2 lays `wqkv`'s rows
out by key-value head: for each of the K key-value heads, its G = heads / K query heads, then its key, then its
value, each `head_dim` rows; q, k and v are those rows regrouped, and `fused` lays them back. Its dynamic NTK
rope becomes Llama's "dynamic" rope, applied per row (judge/rope.py).

One key table per language model, read in both directions: `save_original` writes a trained judge back in the
original layout of its base (its config, code, shards and dtypes), which InternVL's code, MMIE's main.py, vLLM
and LMDeploy read. A checkpoint with tied embeddings (the language model's `tie_word_embeddings`, e.g. Qwen2.5
0.5B's) stores no output layer; the model ties it to the input embeddings, and the export leaves it out again.

Images: InternVL's dynamic tiling and thumbnail (judge/tiling.py), the same in every generation; an original
checkpoint gives its tile range in config.json, a -hf one in its processor config. Template: the original's
config.json names it, its conversation.py defines it (judge/templates.py); a -hf checkpoint's is its Jinja chat
template. Answers are finished as InternVL's `chat()` finishes them: cut at the separator it spells, stripped.
"""

from __future__ import annotations

import functools
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from pydantic import ValidationError
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoConfig, InternVLConfig, InternVLForConditionalGeneration, InternVLVisionConfig, LlamaConfig
from transformers.initialization import no_init_weights

from mmjudge.judge.data import InputError, validation_problems, write_json_atomically
from mmjudge.judge.checkpoint import (INDEX_FILE, SAFETENSORS_DTYPES, TEXT_SIZES, VISION_SIZES, CheckpointError, JudgeSettings, SettingsFile, built,
                                      chat_template_of, check_counts, check_downsample_ratio, check_size, load_tokenizer, read_json_object, require,
                                      safetensors_files, save_tokenizer)
from mmjudge.judge.templates import TEMPLATES, ChatTemplate, template_from_conversation_py
from mmjudge.judge.tiling import IMAGE_TOKENS, IMG_CONTEXT, TilingConfig

# Language models transformers implements natively, and InternLM2, which it does not (mapped onto Llama).
SUPPORTED_LLMS = ("phi3", "qwen2", "llama", "internlm2")
# Which conversation template a native checkpoint without a chat template or judge_config.json most likely uses.
TEMPLATE_BY_LLM = {"phi3": "phi3-chat", "qwen2": "Hermes-2", "llama": "Hermes-2"}
# The config.json keys an original checkpoint's settings come from, by the settings' own names.
SETTING_KEYS = {"image_size": "force_image_size", "min_tiles": "min_dynamic_patch", "max_tiles": "max_dynamic_patch",
                "use_thumbnail": "use_thumbnail", "system_message": "system_message"}


# -- the config --------------------------------------------------------------------------------------------------

def native_config_from_original(config: dict, tokenizer, where: str = "config.json") -> InternVLConfig:
    """Map an InternVLChatModel config onto transformers' InternVLConfig, refusing what it cannot represent;
    `where` names the file in messages."""

    require(config, ("llm_config", "vision_config", "downsample_ratio"), where)
    require(config["llm_config"], TEXT_SIZES, f"{where} llm_config")
    require(config["vision_config"], VISION_SIZES, f"{where} vision_config")
    llm, vision, ratio = dict(config["llm_config"]), config["vision_config"], config["downsample_ratio"]
    check_downsample_ratio(ratio, where)
    if llm.get("model_type") not in SUPPORTED_LLMS:
        raise CheckpointError(f"unsupported language model {llm.get('model_type')!r} (architectures {llm.get('architectures')}); "
                              f"this toolkit maps {', '.join(SUPPORTED_LLMS)} onto transformers' native classes")
    if config.get("ps_version", "v1") != "v2":
        raise CheckpointError(f"unsupported ps_version {config.get('ps_version')!r}; only 'v2' pixel shuffle is supported")
    if vision.get("qk_normalization") or vision.get("norm_type", "layer_norm") != "layer_norm":
        raise CheckpointError("unsupported vision tower: only InternViT-300M (no qk normalization, LayerNorm) is supported")
    tied = bool(llm.get("tie_word_embeddings", False))
    text_config = _text_config(llm)
    vision_config = InternVLVisionConfig(
        hidden_size=vision["hidden_size"],
        num_hidden_layers=vision["num_hidden_layers"],
        num_attention_heads=vision["num_attention_heads"],
        intermediate_size=vision["intermediate_size"],
        image_size=vision["image_size"],
        patch_size=vision["patch_size"],
        num_channels=vision.get("num_channels", 3),
        attention_bias=vision.get("qkv_bias", True),
        use_qk_norm=False,
        hidden_act=vision.get("hidden_act", "gelu"),
        layer_norm_eps=vision.get("layer_norm_eps", 1e-6),
        layer_scale_init_value=vision.get("initializer_factor", 1.0),
        use_mean_pooling=True,  # False would add a final LayerNorm that InternViT does not have
    )
    patches = vision["image_size"] // vision["patch_size"]
    return InternVLConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_id=tokenizer.convert_tokens_to_ids(IMG_CONTEXT),
        image_seq_length=int(patches * patches * config["downsample_ratio"] ** 2),
        downsample_ratio=config["downsample_ratio"],
        projector_hidden_act="gelu",
        vision_feature_layer=config.get("select_layer", -1),
        vision_feature_select_strategy="default",
        tie_word_embeddings=tied,
    )


def _text_config(llm: dict):
    """transformers' config of the language model: its own class, InternLM2's mapped onto Llama."""
    # The loader, not the checkpoint, decides the dtype; the rest are bookkeeping of the original code.
    for key in ("architectures", "auto_map", "_name_or_path", "transformers_version", "attn_implementation", "torch_dtype", "dtype"):
        llm.pop(key, None)
    if (rope := llm.pop("rope_scaling", None)) is not None:
        llm["rope_parameters"] = _rope_parameters(rope, llm)
    llm["tie_word_embeddings"] = bool(llm.get("tie_word_embeddings", False))
    if llm["model_type"] != "internlm2":
        return AutoConfig.for_model(**llm)
    rope = llm.get("rope_parameters") or {"rope_type": "default", "rope_theta": llm.get("rope_theta", 10000.0)}
    return LlamaConfig(
        vocab_size=llm["vocab_size"], hidden_size=llm["hidden_size"], intermediate_size=llm["intermediate_size"],
        num_hidden_layers=llm["num_hidden_layers"], num_attention_heads=llm["num_attention_heads"],
        num_key_value_heads=llm.get("num_key_value_heads", llm["num_attention_heads"]), hidden_act=llm.get("hidden_act", "silu"),
        max_position_embeddings=llm.get("max_position_embeddings", 2048), rms_norm_eps=llm.get("rms_norm_eps", 1e-6),
        attention_bias=bool(llm.get("bias", True)), mlp_bias=False, rope_parameters=rope,
        bos_token_id=llm.get("bos_token_id", 1), eos_token_id=llm.get("eos_token_id", 2), pad_token_id=llm.get("pad_token_id", 0),
        tie_word_embeddings=llm["tie_word_embeddings"],
    )


def _rope_parameters(rope: dict, llm: dict) -> dict:
    """transformers' rope_parameters from an original rope_scaling: Phi-3's "su" is "longrope", and the
    pre-training context length moves inside."""
    params = {k: v for k, v in rope.items() if k != "type"}
    rope_type = rope.get("rope_type", rope.get("type"))
    params["rope_type"] = "longrope" if rope_type == "su" else rope_type
    params["rope_theta"] = llm.pop("rope_theta", 10000.0)
    if "original_max_position_embeddings" in llm:
        params.setdefault("original_max_position_embeddings", llm["original_max_position_embeddings"])
        # Phi-3's scaling factor is the context extension, which the original code derives the same way.
        params.setdefault("factor", llm["max_position_embeddings"] / llm["original_max_position_embeddings"])
    return params


# -- the weights ---------------------------------------------------------------------------------------------------

# Original key <-> native key, read in both directions (loading, and save_original). "{n}" is a layer number; a
# key ending in "." is a prefix whose rest (weight, bias) is kept as it is.
VISION_KEYS = (
    ("vision_model.embeddings.class_embedding", "model.vision_tower.embeddings.cls_token"),
    ("vision_model.embeddings.position_embedding", "model.vision_tower.embeddings.position_embeddings"),
    ("vision_model.embeddings.patch_embedding.", "model.vision_tower.embeddings.patch_embeddings.projection."),
    ("vision_model.encoder.layers.{n}.attn.proj.", "model.vision_tower.encoder.layer.{n}.attention.projection_layer."),
    ("vision_model.encoder.layers.{n}.norm1.", "model.vision_tower.encoder.layer.{n}.layernorm_before."),
    ("vision_model.encoder.layers.{n}.norm2.", "model.vision_tower.encoder.layer.{n}.layernorm_after."),
    ("vision_model.encoder.layers.{n}.ls1", "model.vision_tower.encoder.layer.{n}.lambda_1"),
    ("vision_model.encoder.layers.{n}.ls2", "model.vision_tower.encoder.layer.{n}.lambda_2"),
    ("vision_model.encoder.layers.{n}.mlp.", "model.vision_tower.encoder.layer.{n}.mlp."),
    ("mlp1.0.", "model.multi_modal_projector.layer_norm."),
    ("mlp1.1.", "model.multi_modal_projector.linear_1."),
    ("mlp1.3.", "model.multi_modal_projector.linear_2."),
)
# Phi-3, Qwen2 and Llama keep transformers' own names under the original prefix.
NATIVE_LLM_KEYS = (
    ("language_model.model.", "model.language_model."),
    ("language_model.lm_head.", "lm_head."),
)
INTERNLM2_KEYS = (
    ("language_model.model.tok_embeddings.", "model.language_model.embed_tokens."),
    ("language_model.model.layers.{n}.attention.wo.", "model.language_model.layers.{n}.self_attn.o_proj."),
    ("language_model.model.layers.{n}.feed_forward.w1.", "model.language_model.layers.{n}.mlp.gate_proj."),
    ("language_model.model.layers.{n}.feed_forward.w3.", "model.language_model.layers.{n}.mlp.up_proj."),
    ("language_model.model.layers.{n}.feed_forward.w2.", "model.language_model.layers.{n}.mlp.down_proj."),
    ("language_model.model.layers.{n}.attention_norm.", "model.language_model.layers.{n}.input_layernorm."),
    ("language_model.model.layers.{n}.ffn_norm.", "model.language_model.layers.{n}.post_attention_layernorm."),
    ("language_model.model.norm.", "model.language_model.norm."),
    ("language_model.output.", "lm_head."),
)
QKV_PARTS = ("q", "k", "v")
ORIGINAL, NATIVE = 0, 1  # the sides of a key pair


@dataclass(frozen=True)
class Fused:
    """An original tensor that is several native ones: InternViT's qkv (rows [q; k; v]) and InternLM2's wqkv
    (rows grouped by key-value head, module docstring)."""

    keys: tuple[str, str]  # original, native; the native side holds {part}
    split: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
    fuse: Callable[[list[torch.Tensor]], torch.Tensor]


def _grouped_split(tensor: torch.Tensor, heads: int, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    group = heads // kv_heads
    grouped = tensor.reshape(kv_heads, group + 2, -1, *tensor.shape[1:])
    rest = tensor.shape[1:]
    return grouped[:, :group].reshape(-1, *rest), grouped[:, group].reshape(-1, *rest), grouped[:, group + 1].reshape(-1, *rest)


def _grouped_fuse(parts: list[torch.Tensor], heads: int, kv_heads: int) -> torch.Tensor:
    q, k, v = parts
    rest = q.shape[1:]
    return torch.cat([q.reshape(kv_heads, heads // kv_heads, -1, *rest), k.reshape(kv_heads, 1, -1, *rest),
                      v.reshape(kv_heads, 1, -1, *rest)], dim=1).reshape(-1, *rest)


@dataclass(frozen=True)
class KeyMap:
    """The key table of one checkpoint's language model, read in both directions (module docstring)."""

    pairs: tuple[tuple[str, str], ...]
    fused: tuple[Fused, ...]

    @classmethod
    def of(cls, llm: dict) -> KeyMap:
        vit_qkv = Fused(("vision_model.encoder.layers.{n}.attn.qkv.", "model.vision_tower.encoder.layer.{n}.attention.{part}_proj."),
                        lambda t: t.chunk(3, dim=0), torch.cat)
        if llm.get("model_type") != "internlm2":
            return cls(VISION_KEYS + NATIVE_LLM_KEYS, (vit_qkv,))
        heads = llm["num_attention_heads"]
        kv_heads = llm.get("num_key_value_heads", heads)
        wqkv = Fused(("language_model.model.layers.{n}.attention.wqkv.", "model.language_model.layers.{n}.self_attn.{part}_proj."),
                     functools.partial(_grouped_split, heads=heads, kv_heads=kv_heads),
                     functools.partial(_grouped_fuse, heads=heads, kv_heads=kv_heads))
        return cls(VISION_KEYS + INTERNLM2_KEYS, (vit_qkv, wqkv))

    def native_tensors(self, key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """The native (name, tensor) pairs for one original tensor: a rename, or a fused tensor's parts."""
        for fused in self.fused:
            if _key_pattern(fused.keys[ORIGINAL]).match(key):
                return [(_translate(key, fused.keys, ORIGINAL, part=part), t) for part, t in zip(QKV_PARTS, fused.split(tensor))]
        return [(self._renamed(key, ORIGINAL), tensor)]

    def original_tensors(self, native: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The original state dict of a native one: `native_tensors` undone, each fused tensor fused again."""
        original, parts = {}, {}
        for key, tensor in native.items():
            fused = next((f for f in self.fused if _key_pattern(f.keys[NATIVE]).match(key)), None)
            if fused is None:
                original[self._renamed(key, NATIVE)] = tensor
            else:
                part = _key_pattern(fused.keys[NATIVE]).match(key)["part"]
                parts.setdefault((_translate(key, fused.keys, NATIVE), fused), {})[part] = tensor
        for (key, fused), found in parts.items():
            if missing := [p for p in QKV_PARTS if p not in found]:
                raise CheckpointError(f"{key}: the model has no {'/'.join(missing)} projection to fuse with {'/'.join(found)}")
            original[key] = fused.fuse([found[p] for p in QKV_PARTS])
        return original

    def _renamed(self, key: str, side: int) -> str:
        """The key on the other side of the table; a key it does not name stays as it is (and is then refused
        as unexpected by whoever compares it with a model)."""
        return next((new for pair in self.pairs if (new := _translate(key, pair, side)) is not None), key)


@functools.cache
def _key_pattern(template: str) -> re.Pattern:
    """A key template as a regex: {n} and {part} captured, a prefix's rest too."""
    body = "".join(
        {"{n}": r"(?P<n>\d+)", "{part}": f"(?P<part>{'|'.join(QKV_PARTS)})"}.get(piece, re.escape(piece))
        for piece in re.split(r"(\{n\}|\{part\})", template)
    )
    return re.compile(body + ("(?P<rest>.+)" if template.endswith(".") else "") + "$")


def _translate(key: str, pair: tuple[str, str], side: int, **fill: str) -> str | None:
    """`key`, written on `side` of `pair`, as the other side writes it; None if the pair does not name it."""
    if not (match := _key_pattern(pair[side]).match(key)):
        return None
    groups = match.groupdict() | fill
    return pair[1 - side].format(**groups) + (groups.get("rest") or "")


def original_native_config(path: Path, config: dict, tokenizer) -> InternVLConfig:
    """The native config of an original checkpoint's config.json, built once its counts are checked."""
    check_counts(path, config)
    return built(path, lambda: native_config_from_original(config, tokenizer, f"{path}/config.json"))


def build_from_original(path: Path, native_config: InternVLConfig, device: str, dtype: torch.dtype) -> InternVLForConditionalGeneration:
    """The native model of an original checkpoint (its config: `original_native_config`), allocated once in the
    target dtype and filled tensor by tensor from its safetensors files (host memory peaks near one copy of the
    weights)."""

    config = read_json_object(path / "config.json")
    check_size(path, native_config)
    keys = KeyMap.of(config["llm_config"])
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights(), torch.device(device):
            model = InternVLForConditionalGeneration(native_config)
    finally:
        torch.set_default_dtype(previous)
    params = dict(model.named_parameters())  # a tied output layer is the embeddings' parameter, listed once
    unfilled, unexpected = set(params), []
    with torch.no_grad():
        for file in safetensors_files(path):
            with safe_open(file, framework="pt") as weights:
                for key in weights.keys():
                    for name, tensor in keys.native_tensors(key, weights.get_tensor(key)):
                        if name not in params:
                            unexpected.append(key)
                            continue
                        if params[name].shape != tensor.shape:
                            raise CheckpointError(
                                f"{file}: {key} has shape {tuple(tensor.shape)}, the config implies {tuple(params[name].shape)}")
                        params[name].copy_(tensor)
                        unfilled.discard(name)
    if unfilled or unexpected:
        raise CheckpointError(f"{path}: weights do not match the config: missing {sorted(unfilled)[:5]}"
                              f"{' ...' if len(unfilled) > 5 else ''}, unexpected {sorted(set(unexpected))[:5]}")
    return model


# -- the settings ----------------------------------------------------------------------------------------------

def tokens_per_tile(config: InternVLConfig) -> int:
    image_size = config.vision_config.image_size[0]
    patch_size = config.vision_config.patch_size[0]
    return int((image_size // patch_size) ** 2 * config.downsample_ratio**2)


def original_template(path: Path, name: object) -> ChatTemplate:
    """The template an original config names, as its conversation.py defines it (its default system message
    included), or else as InternVL publishes it."""
    template = None
    if isinstance(name, str) and (path / "conversation.py").is_file():
        try:
            template = template_from_conversation_py(path / "conversation.py", name)
        except InputError as err:
            raise CheckpointError("; ".join(map(str, err.problems))) from None
    if template is not None:
        return template
    if name not in TEMPLATES:
        raise CheckpointError(f"{path}/config.json: template {name!r} is not one of {', '.join(TEMPLATES)}"
                              f"{'' if (path / 'conversation.py').is_file() else ', and the checkpoint has no conversation.py defining it'}")
    return TEMPLATES[name]


def settings_from_original(path: Path, config: dict, native: InternVLConfig):
    """The template and tiling an original config asks for; `path` is its directory (conversation.py)."""

    template = original_template(path, config.get("template"))
    # The stored settings' own checks (positive whole numbers, true or false), in config.json's names: a
    # "six" here was found only when the first image was tiled, after the model had loaded.
    try:
        stored = SettingsFile(
            system_message=config.get("system_message"),
            image_size=config.get("force_image_size") or config["vision_config"]["image_size"],
            min_tiles=config.get("min_dynamic_patch", 1),
            max_tiles=config.get("max_dynamic_patch", 12) if config.get("dynamic_image_size", True) else 1,
            use_thumbnail=config.get("use_thumbnail", True),
        )
    except ValidationError as err:
        problems = validation_problems(path / "config.json", None, None, err)
        raise CheckpointError("; ".join(str(replace(p, field=SETTING_KEYS.get(p.field, p.field))) for p in problems)) from None
    return stored.judge_settings(JudgeSettings(template, None, TilingConfig(tokens_per_tile=tokens_per_tile(native))))


def native_settings(path: Path, config: InternVLConfig, tokenizer):
    """A native checkpoint's settings before judge_config.json: its Jinja chat template (a -hf checkpoint's) or
    else the usual template of its language model, and its processor config's tiles (a -hf checkpoint's
    preprocessor_config.json: GotOcr2's min_patches, max_patches, size; InternVLProcessor crops to patches
    whatever the image processor's own crop_to_patches says; transparency composited onto white, as that processor
    converts to RGB) or else InternVL's default tiling (1-12 tiles and a thumbnail)."""

    template = chat_template_of(path, tokenizer)
    if template is None:
        llm_type = config.text_config.model_type
        if llm_type not in TEMPLATE_BY_LLM:
            raise CheckpointError(f"{path}: no chat template, no judge_config.json, and no usual template for language model {llm_type!r}")
        template = TEMPLATES[TEMPLATE_BY_LLM[llm_type]]
    tiling = TilingConfig(image_size=config.vision_config.image_size[0], tokens_per_tile=tokens_per_tile(config))
    if (processor := path / "preprocessor_config.json").is_file():
        found = read_json_object(processor)
        for key, value in (("min_patches", found.get("min_patches", 1)), ("max_patches", found.get("max_patches", 12)),
                           ("size height", (found.get("size") or {}).get("height", tiling.image_size))):
            if type(value) is not int or value < 1:
                raise CheckpointError(f"{processor}: {key} {value!r}: a positive whole number")
        size = (found.get("size") or {}).get("height", tiling.image_size)
        max_tiles = found.get("max_patches", 12)
        tiling = replace(tiling, image_size=size, min_tiles=min(found.get("min_patches", 1), max_tiles), max_tiles=max_tiles, on_white=True)
    return JudgeSettings(template, None, tiling)


# -- the export back to the original layout ------------------------------------------------------------------

def save_original(judge, base: Path, out_dir: str | Path) -> Path:
    """Write a judge (an adapter is merged first) as an original InternVL2 checkpoint, laid out like `base`,
    the original checkpoint it was trained over (`original_base`): the base's config.json with the judge's
    settings, the weights under the original key names in the base's dtypes and shards, and the base's
    tokenizer files, generation_config.json and Python files (the remote code `trust_remote_code` loads,
    and conversation.py), copied as files and never run. Refuses weights or a tokenizer that the base's
    config cannot describe. config.json is written last: an export cut short cannot be loaded."""

    out_dir = Path(out_dir)
    model = judge.model.merge_and_unload() if hasattr(judge.model, "merge_and_unload") else judge.model
    config = read_json_object(base / "config.json")
    native = {k: t.detach() for k, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        native.pop("lm_head.weight", None)  # the input embeddings, which the base stores once
    tensors = KeyMap.of(config["llm_config"]).original_tensors(native)
    layout = _weight_layout(base)
    _check_expressible(tensors, layout, judge.tokenizer, base)
    out_dir.mkdir(parents=True, exist_ok=True)
    for shard in sorted({entry.shard for entry in layout.values()}):
        save_file({k: tensors[k].to(e.dtype).contiguous() for k, e in layout.items() if e.shard == shard}, out_dir / shard, metadata={"format": "pt"})
    if (base / INDEX_FILE).is_file():
        total = sum(tensors[k].numel() * e.dtype.itemsize for k, e in layout.items())
        write_json_atomically(out_dir / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": {k: e.shard for k, e in sorted(layout.items())}})
    save_tokenizer(judge.tokenizer, out_dir)
    for file in base.iterdir():
        if file.is_file() and (file.suffix == ".py" or file.name == "generation_config.json"):
            shutil.copyfile(file, out_dir / file.name)
    _note_missing_remote_code(config, base)
    write_json_atomically(out_dir / "config.json", original_config(config, judge.settings, settings_from_original(base, config, model.config)))
    return out_dir


@dataclass(frozen=True)
class StoredTensor:
    shard: str  # the safetensors file that holds it
    dtype: torch.dtype
    shape: tuple[int, ...]



def _weight_layout(path: Path) -> dict[str, StoredTensor]:
    """Where and how an original checkpoint stores each tensor, read from the safetensors headers only."""

    layout = {}
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as weights:
            for key in weights.keys():
                stored = weights.get_slice(key)
                if stored.get_dtype() not in SAFETENSORS_DTYPES:
                    raise CheckpointError(f"{file}: {key} is stored as {stored.get_dtype()}; the export writes {', '.join(SAFETENSORS_DTYPES)} only")
                layout[key] = StoredTensor(file.name, SAFETENSORS_DTYPES[stored.get_dtype()], tuple(stored.get_shape()))
    return layout


def _check_expressible(tensors: dict[str, torch.Tensor], layout: dict[str, StoredTensor], tokenizer, base: Path) -> None:
    """What the base's config.json and tokenizer cannot describe, refused in one message."""

    problems = []
    if extra := sorted(set(tensors) - set(layout)):
        problems.append(f"weights the base has no place for: {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    if missing := sorted(set(layout) - set(tensors)):
        problems.append(f"base weights the judge lacks: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if reshaped := [k for k in sorted(set(tensors) & set(layout)) if tuple(tensors[k].shape) != layout[k].shape]:
        k = reshaped[0]
        problems.append(f"{len(reshaped)} weight(s) of another shape than the base's, e.g. {k} {tuple(tensors[k].shape)} (base {layout[k].shape})")
    if tokenizer.get_vocab() != load_tokenizer(base, IMAGE_TOKENS).get_vocab():
        problems.append("the judge's tokenizer has another vocabulary than the base's")
    if problems:
        raise CheckpointError(f"cannot be written in the original format of {base}: " + "; ".join(problems))


def original_config(config: dict, settings, base) -> dict:
    """The base's original config.json carrying the judge's settings (JudgeSettings): `settings_from_original`
    reads them back. The template is named: the base's conversation.py (copied) or InternVL's published
    templates define it; a judge with another template is refused."""
    if settings.template.name != base.template.name and settings.template.name not in TEMPLATES:
        raise CheckpointError(f"the judge's chat template {settings.template.name!r} is neither its base's nor one InternVL publishes: "
                        "the original format names its template, and no conversation.py would define this one")
    tiling = settings.images
    config = {**config, "template": settings.template.name, "force_image_size": tiling.image_size, "min_dynamic_patch": tiling.min_tiles,
              "max_dynamic_patch": tiling.max_tiles, "use_thumbnail": tiling.use_thumbnail,
              "dynamic_image_size": config.get("dynamic_image_size", True) or tiling.max_tiles > 1}
    if settings.system != base.system:
        config["system_message"] = settings.system  # conversation.py stays the base's: the config's own field overrides it
    return config


def _note_missing_remote_code(config: dict, base: Path) -> None:
    """The modules config.json's auto_map names that the base does not have: without them neither the base nor
    the export loads with trust_remote_code (here both load without)."""
    modules = sorted({f"{ref.split('.')[0]}.py" for ref in (config.get("auto_map") or {}).values() if isinstance(ref, str)})
    if missing := [m for m in modules if not (base / m).is_file()]:
        print(f"note: {base} lacks {', '.join(missing)}, which its config.json's auto_map names: the export, like its base, "
              "loads with this toolkit but not with trust_remote_code until they are added", file=sys.stderr)


