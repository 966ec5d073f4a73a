"""Loading a judge: a checkpoint of any supported backbone becomes transformers' native model of its family.

Three kinds of directory are accepted, told apart by their files:

    original  config.json with "architectures": ["InternVLChatModel"]  (InternVL2, 2.5, 3 as released; MMIE-Eval)
    native    config.json whose model_type is a native family's:      internvl (-hf, or written here),
                                                                        qwen2_5_vl, qwen3_vl, qwen3_5, qwen3_5_moe
                                                                        (as released)
    adapter   adapter_config.json (PEFT) over either of the above        (written by judge-train)

A Judge's `source_format` is one of these, or "training" for the model judge-train is training, which its
evaluation scores without a directory (train/recipe.py).

Each is named by its local directory or by a Hugging Face Hub id, fetched into huggingface_hub's cache
(judge/hub.py) with only the files listed in CHECKPOINT_FILES.

What differs between families lives in their adapters (judge/backbones/): the original format's conversion and
its export back (judge/backbones/internvl.py), each family's images, template and positions. This module is
what every family shares: finding and checking the files, the tokenizer, the native loader, adapters, and the
judge's settings (judge_config.json). Nothing from a checkpoint is ever executed: configs are read as data,
weights only from safetensors.

An adapter is merged into its base as it loads, each weight it changes rounded to the dtype the base stores
that weight in: the judge is the one `judge-train merge` writes (either format), and the adapter and its
export score alike, bit for bit on one device. Scored unmerged, the adapter's weights kept precision the
export rounds away (a bfloat16 base's merged weights, by a part in 256 or so), enough to change the argmax
of a near tie: on a 3-step adapter, 22 of 24 texts equal to the reference's on the export, where the
export gives 24 (docs/exactness.md).
"""

from __future__ import annotations

import dataclasses
import functools
import reprlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, Literal
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from safetensors import safe_open
from transformers import CONFIG_MAPPING, PretrainedConfig, PreTrainedTokenizerBase

from mmjudge.judge.backbones import Backbone, backbone_of, internvl, qwen_vl
from mmjudge.judge.checkpoint import (INDEX_FILE, MOE_TEXT_SIZES, QWEN_VISION_SIZES, SAFETENSORS_DTYPES, TEXT_SIZES, TOKENIZER_FILES, VISION_SIZES, CheckpointError,
                                      JudgeSettings, SettingsFile, built, check_counts, check_image_token, check_rope, check_size, load_tokenizer,
                                      native_class, one_line, read_json_object, readable_safetensors, require, safetensors_files, save_tokenizer)
from mmjudge.judge.data import InputError, UsageError, validation_problems, write_json_atomically, write_text_atomically
from mmjudge.judge.detokenize import chat_answer, reference_lead, text_decoder, without_hash_merges
from mmjudge.judge.hub import Checkpoint, resolve
from mmjudge.judge.kernels import use_fused_kernels
from mmjudge.judge.rope import context_length, use_rowwise_rope

SETTINGS_FILE = "judge_config.json"
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")  # a native checkpoint's Jinja, beside its tokenizer's own
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# A native checkpoint's image processor's settings (Qwen-VL's least and most pixels, a -hf InternVL's tiles).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")
# Every file load_judge reads, as huggingface_hub allow patterns: a checkpoint named by its Hub id is fetched
# with these only, so its own code (modeling_*.py; conversation.py is read as data) and pickled .bin weights
# never reach the disk.
CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors", INDEX_FILE, "model-*.safetensors",
                    "adapter_config.json", ADAPTER_WEIGHTS, SETTINGS_FILE, "conversation.py", *TOKENIZER_FILES, *PROCESSOR_FILES)
# An original checkpoint's own code, which trust_remote_code loads: fetched only for save_original to copy, never run.
REMOTE_CODE = ("*.py",)











@dataclass
class Judge:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    settings: JudgeSettings
    source_format: str  # "original", "native", "adapter", or "training" for a model judge-train is training

    @functools.cached_property
    def backbone(self) -> Backbone:
        return backbone_of(_inner(self.model).config)

    @property
    def image_token_id(self) -> int:
        return self.backbone.image_token_id

    @functools.cached_property
    def decode(self) -> Callable[[list[int]], str]:
        """Token ids to text, as the backbone's reference decodes the judge's output (judge/detokenize.py)."""
        return text_decoder(self.tokenizer)

    @property
    def pad_id(self) -> int:
        """The token a batch's rows are padded with (never attended to): the tokenizer's pad, or else its end."""
        tokenizer = self.tokenizer
        return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    @property
    def stop_text(self) -> str:
        return self.settings.template.stop_token

    @functools.cached_property
    def stop_ids(self) -> tuple[int, ...]:
        """The tokens the judge's answer ends at: its template's separator, and for a family whose reference is
        transformers' `generate` (Qwen-VL), also the end tokens of its generation config. A model that cannot
        generate (a reward model: transformers gives it no generation config) writes no answer, and its
        template's separator stands for its end wherever one is asked (the server's structured-output vocabulary)."""
        stops = [self.tokenizer.convert_tokens_to_ids(self.stop_text)]
        if self.backbone.generation_stops and _inner(self.model).can_generate():
            eos = _inner(self.model).generation_config.eos_token_id
            stops += [eos] if isinstance(eos, int) else list(eos or [])
        return tuple(dict.fromkeys(stops))

    def answer(self, tokens: list[int]) -> str:
        """The judge's text from its tokens, finished as its backbone's reference finishes it: InternVL's `chat()`
        cuts at a spelled separator and strips; Qwen-VL's processor decodes and leaves the text as it is."""
        text = self.decode([t for t in tokens if t not in self.stop_ids])
        return chat_answer(text, self.stop_text) if self.backbone.strips_answer else text


def _inner(model: torch.nn.Module) -> torch.nn.Module:
    """The native model under a PEFT wrapper."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bf16 on an accelerator (the checkpoints' own dtype), fp32 on CPU where bf16 matmuls are slow."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def checkpoint_format(path: Path) -> str:
    if (path / "adapter_config.json").is_file():
        return "adapter"
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(
            f"{path}: no config.json or adapter_config.json; expected a judge checkpoint directory "
            "(original InternVLChatModel format, a native transformers InternVL, Qwen2.5-VL, Qwen3-VL or Qwen3.5, or a PEFT adapter)"
        )
    config = read_json_object(config_file)
    if "InternVLChatModel" in (config.get("architectures") or []) or config.get("model_type") == "internvl_chat":
        return "original"
    if config.get("model_type") in NATIVE_MODEL_TYPES:
        return "native"
    raise CheckpointError(
        f"{config_file}: unsupported architecture {config.get('architectures')} (model_type "
        f"{config.get('model_type')!r}); expected InternVLChatModel, or transformers' {', '.join(NATIVE_MODEL_TYPES.values())}"
    )


def find_checkpoint(name: str | Path, revision: str | None = None, extra_files: tuple[str, ...] = ()) -> Checkpoint:
    """A checkpoint named by its local directory or its Hub id (judge/hub.py), with every file load_judge
    reads and the `extra_files` patterns."""
    return resolve(name, revision, CHECKPOINT_FILES + extra_files)


def load_judge(name: str | Path, device: str = "cpu", dtype: torch.dtype | None = None, revision: str | None = None) -> Judge:
    """Load any supported judge checkpoint (see module docstring), by its directory or its Hub id, ready for inference."""
    path = find_checkpoint(name, revision).path
    dtype = dtype or default_dtype(device)
    kind = checkpoint_format(path)
    if kind == "adapter":
        return _load_adapter(path, device, dtype)
    if "reward_head" in read_json_object(path / "config.json"):  # judge-train --objective bradley_terry's reward model (judge/reward_model.py)
        return _load_reward_judge(path, device, dtype)
    tokenizer = judge_tokenizer(path)
    settings, config = unloaded_settings(path, tokenizer)
    if kind == "original":
        model = internvl.build_from_original(path, config, device, dtype)
    else:
        model = load_native(path, dtype).to(device)
    _check_tying(model)
    check_finite(path, model.named_parameters())
    use_rowwise_rope(model.model.language_model)
    use_fused_kernels(model, device)
    model.eval()
    return Judge(model, tokenizer, settings, kind)


def _load_reward_judge(path: Path, device: str, dtype: torch.dtype) -> Judge:
    """A reward checkpoint with its tokenizer and judge settings, as a generative judge loads: its prompts are
    built the same way."""
    # Imported here: the module registers a classifier class per family with transformers, which imports their
    # modeling code; a generative judge needs none of it.
    from mmjudge.judge.reward_model import load_reward_model

    model = load_reward_model(path, dtype)
    check_finite(path, model.named_parameters())
    tokenizer = judge_tokenizer(path)
    settings = read_settings(path, _family(path, "native").native_settings(path, model.config, tokenizer))
    return Judge(model.to(device).eval(), tokenizer, settings, "native")


def unloaded_settings(path: Path, tokenizer: PreTrainedTokenizerBase) -> tuple[JudgeSettings, PretrainedConfig]:
    """The settings of the judge at `path` and its model's config (an adapter's: its base's), as load_judge
    gives them, read and checked without the weights: what a run's prompts can be counted with before the
    model loads."""
    kind = checkpoint_format(path)
    if kind == "adapter":
        base_settings, config = unloaded_settings(checked_adapter(path), tokenizer)
        settings = read_settings(path, base_settings)
    elif kind == "original":
        raw = read_json_object(path / "config.json")
        config = internvl.original_native_config(path, raw, tokenizer)
        settings = internvl.settings_from_original(path, raw, config)
    else:
        family = _family(path, kind)
        check_image_token(path, read_json_object(path / "config.json"), tokenizer, family.IMAGE_TOKENS[1])
        config = native_config(path)
        settings = read_settings(path, family.native_settings(path, config, tokenizer))
    check_image_tokens(path, settings, config)
    return settings, config


def check_image_tokens(path: Path, settings: JudgeSettings, config) -> None:
    """An image at the most its processing allows fits the judge's context (`config` the model's): a
    preprocessor's min_pixels of 1e9 made every image 3.8M tokens (9.1 GB and growing), and a
    max_dynamic_patch of 1e9 hung choosing a grid among a billion tiles."""
    most, context = settings.images.most_tokens(), context_length(config.get_text_config())
    if most > context:
        limit, value = settings.images.limit()
        raise CheckpointError(f"{path}: an image at its {value:,} {limit} takes {most:,} image tokens, more than the judge's context of {context:,} "
                              "tokens; lower the limit in its processor config or judge_config.json")


def _family(path: Path, kind: str):
    """The backbone module of a checkpoint that is no adapter: InternVL's (original or native) or Qwen-VL's."""
    return internvl if kind == "original" or read_json_object(path / "config.json").get("model_type") == "internvl" else qwen_vl


def judge_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer the judge at `path` reads and writes with, as load_judge gives it, read without the
    weights: what a run's settings can be checked against before the model loads."""
    kind = checkpoint_format(path)
    if kind == "adapter":
        base_path = checked_adapter(path)
        return adapter_tokenizer(path, judge_tokenizer(base_path), _family(base_path, checkpoint_format(base_path)).IMAGE_TOKENS)
    tokenizer = load_tokenizer(path, _family(path, kind).IMAGE_TOKENS)
    # as InternVL's pinned transformers 4.37 reads Qwen2's merges
    return without_hash_merges(tokenizer, path) if kind == "original" else tokenizer




def _load_adapter(path: Path, device: str, dtype: torch.dtype) -> Judge:
    from peft import PeftModel

    base_path = checked_adapter(path)
    base = load_judge(base_path, device, dtype)
    # PEFT warns of what check_adapter_weights refuses (missing keys: four lines of a library's words before
    # the refusal); its warnings are shown once the adapter is taken, never above a refusal.
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")
        try:
            model = PeftModel.from_pretrained(base.model, path).eval()
        except ValueError as err:  # PEFT's own words: e.g. target_modules that name no layer of the base
            raise CheckpointError(f"{path}/adapter_config.json: does not fit the base {base_path}: {one_line(err)}") from None
        except KeyError as err:  # a weight the config makes (modules_to_save) but the file lacks
            raise CheckpointError(f"{path}/{ADAPTER_WEIGHTS}: lacks {err.args[0]}, which its config makes over the base {base_path}") from None
        except RuntimeError as err:  # a weight of another shape than the base's layer
            raise CheckpointError(f"{path}/{ADAPTER_WEIGHTS}: does not fit the base {base_path}: {one_line(err)}") from None
        check_adapter_weights(path, model)
    for warning in said:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    tokenizer = adapter_tokenizer(path, base.tokenizer, base.settings.images.image_tokens)
    settings = read_settings(path, base.settings)
    check_image_tokens(path, settings, base.model.config)
    return Judge(merge_adapter(model, base_path), tokenizer, settings, "adapter")


def merge_adapter(model, base: Path) -> torch.nn.Module:
    """The PEFT `model` folded into its base, each weight the adapter changes (its LoRA layers' and the layers it
    trains whole) rounded to the dtype `base` stores it in: the base's precision, in which the export writes it."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import ModulesToSaveWrapper

    changed = [name for name, module in model.base_model.model.named_modules() if isinstance(module, (BaseTunerLayer, ModulesToSaveWrapper))]
    merged = model.merge_and_unload()
    weights = {name: weight for module in changed for name, weight in merged.get_submodule(module).named_parameters(prefix=module)}
    stored = stored_dtypes(base, list(dict(merged.named_parameters())))
    with torch.no_grad():
        for name, weight in weights.items():
            if (dtype := stored.get(name)) is not None and dtype != weight.dtype:
                weight.copy_(weight.to(dtype))
    return merged.eval()


def stored_dtypes(path: Path, names: list[str]) -> dict[str, torch.dtype]:
    """The dtype the checkpoint at `path` stores each weight of its model (`names`, native) in, read from the
    safetensors headers. An original checkpoint's keys map through its KeyMap (judge/backbones/internvl.py); transformers' `save_pretrained`
    writes a native one's weights in one dtype, under names of its own: where they hold several, none is given."""
    headers = {}
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as stored:
            headers |= {key: (SAFETENSORS_DTYPES.get(stored.get_slice(key).get_dtype()), stored.get_slice(key).get_shape()) for key in stored.keys()}
    if checkpoint_format(path) == "original":
        keys = internvl.KeyMap.of(read_json_object(path / "config.json")["llm_config"])
        return {name: dtype for key, (dtype, shape) in headers.items() if dtype is not None
                for name, _ in keys.native_tensors(key, torch.empty(shape, device="meta"))}
    dtypes = {dtype for dtype, _ in headers.values()}
    return dict.fromkeys(names, dtypes.pop()) if len(dtypes) == 1 and None not in dtypes else {}


def adapter_tokenizer(path: Path, base: PreTrainedTokenizerBase, image_tokens: tuple[str, ...]) -> PreTrainedTokenizerBase:
    """The base's tokenizer, unless the adapter's own files give tokens the base lacks. An adapter of the same
    tokens is read and written by its base's rules: one written by judge-train before save_tokenizer holds
    transformers' rewrite of the base's files, which encodes every prompt without its word-start token."""
    if not (path / "tokenizer_config.json").is_file():
        return base
    own = load_tokenizer(path, image_tokens)
    return base if own.get_vocab() == base.get_vocab() else own


def checked_adapter(path: Path) -> Path:
    """The base of the adapter at `path`, once the adapter's files are checked and the base is no adapter."""
    check_adapter_files(path)
    base_path = adapter_base(path).path
    if checkpoint_format(base_path) == "adapter":  # an adapter naming itself as its base recursed until Python gave up
        raise CheckpointError(f"{path}/adapter_config.json: base_model_name_or_path {str(base_path)!r} is an adapter itself; "
                              "give the checkpoint it was trained on, or merge that adapter first (judge-train merge)")
    return base_path


def weight_files(path: Path) -> list[Path]:
    """The safetensors files whose weights make the judge at `path` (an adapter's, then its base's), checked
    whole as load_judge checks them, before it loads them."""
    if checkpoint_format(path) == "adapter":
        base = checked_adapter(path)
        return [path / ADAPTER_WEIGHTS, *safetensors_files(base)]
    return safetensors_files(path)


# What an adapter_config.json may hold, checked before PEFT reads it: PEFT matches every entry of target_modules
# (rank_pattern, modules_to_save, ...) against every layer of the base, so that 30,000 entries took 79 s on the
# tiny test judge, before any word (300,000: silent past 90 s); 1,000 take 0.2-0.4 s there. A real adapter lists a
# few layer kinds, or each layer of a large model's projections (hundreds); judge-train writes one pattern of
# about 60 characters.
MAX_ADAPTER_ENTRIES = 1_000
MAX_ADAPTER_CHARS = 10_000


Pattern = str | list[str] | None


class LoraFields(BaseModel):
    """The fields of a PEFT LoRA config that a judge's adapter may set, in the types PEFT handles. PEFT takes
    the file's values as they are: a null where it expects a mapping (alpha_pattern) failed deep inside it,
    "internal failure: AttributeError". The other fields of PEFT's LoraConfig, its LoRA variants' (DoRA's
    offloading, LoftQ, EVA, CorDA, Megatron, ...), must stay at PEFT's defaults (_check_lora_fields)."""

    model_config = ConfigDict(strict=True)
    base_model_name_or_path: str | None = None
    revision: str | None = None
    peft_version: str | None = None
    auto_mapping: dict | None = None
    task_type: Literal["CAUSAL_LM"] | None = None  # PEFT wraps a model of another task in that task's head
    inference_mode: bool = True
    r: int
    lora_alpha: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    lora_dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    rank_pattern: dict[str, int] = {}
    alpha_pattern: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = {}
    target_modules: Pattern = None
    exclude_modules: Pattern = None
    layers_to_transform: int | list[int] | None = None
    layers_pattern: Pattern = None
    modules_to_save: list[str] | None = None
    bias: Literal["none", "all", "lora_only"] = "none"
    fan_in_fan_out: bool = False
    use_rslora: bool = False
    use_dora: bool = False
    lora_bias: bool = False
    init_lora_weights: bool | Literal["gaussian"] = True  # overwritten by the saved weights: only the cheap ones


def _check_lora_fields(config: dict, where: Path) -> None:
    from peft import LoraConfig

    try:
        LoraFields.model_validate({k: v for k, v in config.items() if k in LoraFields.model_fields and k != "peft_type"})
    except ValidationError as err:
        raise CheckpointError(str(validation_problems(str(where), None, None, err)[0])) from None
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(LoraConfig) if f.name not in LoraFields.model_fields and f.name != "peft_type"}
    for key, value in config.items():
        if key in defaults and value != defaults[key]:
            raise CheckpointError(f"{where}: {key} {reprlib.repr(value)}; a judge's LoRA adapter leaves it at PEFT's default "
                                  f"({reprlib.repr(defaults[key])})")


def check_adapter_files(path: Path) -> None:
    """What a LoRA adapter must be, read from its config and its weights' headers before any model loads: PEFT
    fails on the others half-way through with its internals' errors, and a rank of 1e9 is allocated first."""
    where = path / "adapter_config.json"
    weights = path / ADAPTER_WEIGHTS
    if not weights.is_file():
        pickled = " (only adapter_model.bin, pickled weights, which are never unpickled here: save the adapter as safetensors)"
        raise CheckpointError(f"{path}: no {ADAPTER_WEIGHTS}{pickled if (path / 'adapter_model.bin').is_file() else ''}")
    readable_safetensors([weights])
    config = read_json_object(where)
    if config.get("peft_type") != "LORA":
        raise CheckpointError(f"{where}: peft_type {config.get('peft_type')!r}; a judge's adapter is a LoRA adapter (\"LORA\")")
    for key, value in config.items():  # PEFT matches each name or pattern against every layer of the base
        if isinstance(value, (list, dict)) and len(value) > MAX_ADAPTER_ENTRIES:
            raise CheckpointError(f"{where}: {key} holds {len(value):,} entries; an adapter names its layers' kinds or patterns, "
                                  f"at most {MAX_ADAPTER_ENTRIES:,} here")
        if isinstance(value, str) and len(value) > MAX_ADAPTER_CHARS:
            raise CheckpointError(f"{where}: {key} is {len(value):,} characters long; at most {MAX_ADAPTER_CHARS:,} here")
    pattern = config.get("rank_pattern")
    ranks = [config.get("r"), *(pattern.values() if isinstance(pattern, dict) else [])]  # not a mapping: _check_lora_fields says so
    if bad := [r for r in ranks if type(r) is not int or r < 1]:
        raise CheckpointError(f"{where}: r {bad[0]!r}; a LoRA rank is a whole number of at least 1")
    _check_lora_fields(config, where)
    with safe_open(weights, framework="pt") as f:
        saved = sorted({f.get_slice(key).get_shape()[0] for key in f.keys() if ".lora_A." in key})
    if not saved:
        raise CheckpointError(f"{weights}: holds no LoRA weights (lora_A, lora_B); is it a whole model's weights? "
                              "A judge with its weights in full is a checkpoint directory without adapter_config.json")
    if unknown := [r for r in saved if r not in ranks]:
        raise CheckpointError(f"{weights}: holds LoRA rank {unknown[0]}, which {where.name} does not give (r {config.get('r')})")




def check_adapter_weights(path: Path, model) -> None:
    """The adapter's saved weights are exactly those its config makes: PEFT leaves a missing one at its
    initialisation (LoRA's B at zero: no adapter at all) with a warning, and ignores an unexpected one."""
    from peft import get_peft_model_state_dict
    from peft.utils import load_peft_weights

    saved = load_peft_weights(str(path), device="cpu")
    expected = set(get_peft_model_state_dict(model))
    _refuse_mismatch(path, sorted(expected - set(saved)), sorted(set(saved) - expected))
    check_finite(path, saved.items())


def _refuse_mismatch(path: Path, missing: list[str], unexpected: list[str]) -> None:
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not match the config: missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
                              f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")


def check_finite(path: Path, tensors) -> None:
    """Every weight a number: a NaN weight made every score of the judge NaN, silently."""
    if bad := [name for name, tensor in tensors if tensor.is_floating_point() and not torch.isfinite(tensor).all()]:
        raise CheckpointError(f"{path}: weights hold NaN or Infinity: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}")


def load_native(path: Path, dtype: torch.dtype):
    """A native checkpoint, refused where its config is incomplete (transformers would fill the gaps with the
    defaults of a model of billions of weights and try to allocate it) or its weights do not fill the model
    exactly (a missing weight would be left at a random initialisation)."""
    config = native_config(path)
    check_size(path, config)
    model, info = native_class(config.model_type).from_pretrained(path, config=config, dtype=dtype, output_loading_info=True)
    mismatched = [f"{key} (shape)" for key, *_ in info.get("mismatched_keys", [])]
    missing = [key for key in info["missing_keys"] if not (config.tie_word_embeddings and key == "lm_head.weight")]
    _refuse_mismatch(path, sorted(missing) + mismatched, sorted(info["unexpected_keys"]))
    return model


def native_config(path: Path) -> PretrainedConfig:
    """A native checkpoint's config, built once its config.json is complete and its counts are checked."""
    where = f"{path}/config.json"
    raw = read_json_object(path / "config.json")
    kind = f"a native {NATIVE_MODEL_TYPES[raw['model_type']]} config"
    # InternVL nests its language model's config; Qwen2.5-VL's released config keeps it flat at the top.
    nested = raw["model_type"] == "internvl" or "text_config" in raw
    require(raw, ("text_config",) * nested + ("vision_config",), where, kind)
    text, text_where = (raw["text_config"], f"{where} text_config") if nested else (raw, where)
    require(text, ("model_type",) * (raw["model_type"] == "internvl") + (MOE_TEXT_SIZES if raw["model_type"] == "qwen3_5_moe" else TEXT_SIZES),
            text_where, kind)
    require(raw["vision_config"], NATIVE_VISION_SIZES[raw["model_type"]], f"{where} vision_config", kind)
    check_counts(path, raw)
    config = built(path, lambda: CONFIG_MAPPING[raw["model_type"]].from_pretrained(path))
    check_rope(path, config)
    return config






def adapter_base(path: Path, extra_files: tuple[str, ...] = ()) -> Checkpoint:
    """The base an adapter applies to: its adapter_config.json's base_model_name_or_path, a directory or a
    Hub id at the config's `revision` (judge-train pins the commit it trained over)."""
    config = read_json_object(path / "adapter_config.json")
    try:
        return find_checkpoint(config.get("base_model_name_or_path") or "", config.get("revision"), extra_files)
    except UsageError as err:
        raise CheckpointError(f"{path}/adapter_config.json: base_model_name_or_path: {err} "
                              "(it names the base checkpoint the adapter was trained on)") from None












def _check_tying(model: torch.nn.Module) -> None:
    """The output layer is the input embeddings exactly where the config ties them (transformers' InternVLConfig
    defaults to tied embeddings; InternVL2-4B has its own output layer, InternVL3-1B's Qwen2.5 ties them)."""
    inner = _inner(model)
    shared = inner.lm_head.weight.data_ptr() == inner.get_input_embeddings().weight.data_ptr()
    if shared != bool(inner.config.tie_word_embeddings):
        raise CheckpointError(f"the output layer {'shares' if shared else 'does not share'} storage with the input embeddings "
                              f"although the config says {'un' if shared else ''}tied")


def read_settings(path: Path, base: JudgeSettings) -> JudgeSettings:
    """judge_config.json's settings over `base`, where the file exists (SettingsFile)."""
    file = path / SETTINGS_FILE
    if not file.is_file():
        return base
    try:
        return SettingsFile.model_validate(read_json_object(file)).judge_settings(base)
    except ValidationError as err:
        raise InputError(validation_problems(file, None, None, err)) from None
    except ValueError as err:
        raise CheckpointError(f"{file}: {err}") from None




def original_base(adapter: Path) -> Path:
    """The original checkpoint an adapter was trained over, with its own Python files (fetched as data where
    it is a Hub id): what the original-format export takes the config, code and layout from. Refused before any
    weights load where the base is in another format."""
    base = adapter_base(adapter, REMOTE_CODE).path
    if (kind := checkpoint_format(base)) != "original":
        raise CheckpointError(f"{base}: the adapter's base is a {kind} checkpoint; the original format takes its config.json, code and "
                              "weight layout from an original (InternVLChatModel) base: train over the original checkpoint "
                              "(e.g. OpenGVLab/InternVL2-4B) to export in that format; a native base's own layout is what "
                              "--format native writes")
    return base


def save_native(judge: Judge, out_dir: str | Path) -> Path:
    """Write a standalone native checkpoint (weights, tokenizer, judge settings) that `load_judge` reads."""
    out_dir = Path(out_dir)
    model = judge.model.merge_and_unload() if hasattr(judge.model, "merge_and_unload") else judge.model
    model.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(judge.tokenizer, out_dir)
    if (processor := judge.settings.images.processor_config()) is not None:  # what transformers' processor reads
        write_json_atomically(out_dir / "preprocessor_config.json", processor)
    if not any((out_dir / name).is_file() for name in CHAT_TEMPLATE_FILES):  # InternVL's original layout: its template is Python
        write_text_atomically(out_dir / "chat_template.jinja", exported_chat_template(judge))
    write_settings(judge.settings, out_dir)
    return out_dir




def exported_chat_template(judge: Judge) -> str:
    """The judge's chat template as Jinja, for a checkpoint in transformers' layout whose base had none (InternVL's
    original layout), so that transformers' apply_chat_template gives the prompt ids this toolkit gives: an image
    part as the processor's image token, and after BOS what the reference's tokenizer reads there and transformers
    5's does not (InternVL2-4B's lone word-start marker: judge/detokenize.py)."""
    template, system = judge.settings.template, judge.settings.system_message
    return template.jinja(system, lead=reference_lead(judge.tokenizer, template.render("", system)),
                          image=judge.settings.images.image_tokens[1])


def write_settings(settings: JudgeSettings, out_dir: str | Path) -> None:
    write_text_atomically(Path(out_dir) / SETTINGS_FILE, SettingsFile.of(settings).model_dump_json(indent=2, exclude_none=True) + "\n")




def with_max_tiles(settings: JudgeSettings, max_tiles: int | None) -> JudgeSettings:
    """The same settings with a user's --max_tiles, if given (a UsageError for a backbone without tiles)."""
    if max_tiles is None:
        return settings
    return replace(settings, images=settings.images.with_max_tiles(max_tiles))


# The sizes a native config's vision part must give, by family.
NATIVE_VISION_SIZES = {
    "internvl": VISION_SIZES,
    "qwen2_5_vl": QWEN_VISION_SIZES,
    "qwen3_vl": QWEN_VISION_SIZES,
    "qwen3_5": QWEN_VISION_SIZES,
    "qwen3_5_moe": QWEN_VISION_SIZES,
}
NATIVE_MODEL_TYPES = {"internvl": "InternVL", "qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL", "qwen3_5": "Qwen3.5", "qwen3_5_moe": "Qwen3.5 MoE"}
