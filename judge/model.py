"""Loading a judge: any InternVL2 checkpoint becomes transformers' native `InternVLForConditionalGeneration`.

Three kinds of directory are accepted, told apart by their files:

    original  config.json with "architectures": ["InternVLChatModel"]  (InternVL2-4B, MMIE-Eval)
    native    config.json with "model_type": "internvl"                 (written by transformers or by us)
    adapter   adapter_config.json (PEFT) over either of the above        (written by judge-train)

A Judge's `source_format` is one of these, or "training" for the model judge-train is training, which its
evaluation scores without a directory (train/recipe.py).

Each is named by its local directory or by a Hugging Face Hub id, fetched into huggingface_hub's cache
(judge/hub.py) with only the files listed in CHECKPOINT_FILES.

The original format is converted on the fly and nothing from the checkpoint is executed: the config is
mapped field by field, and the weights are streamed one tensor at a time from the safetensors files
into a model allocated once in the target dtype, so host memory peaks near one copy of the weights. The
key names map through one table, KEY_MAP (and FUSED_QKV for InternViT's fused qkv), read in both
directions: `save_original` writes a trained judge back in the original format of its base.

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
import math
import reprlib
import re
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, Literal
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator, model_validator
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import (
    AutoConfig,
    AutoTokenizer,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLVisionConfig,
    PreTrainedTokenizerBase,
)
from transformers.initialization import no_init_weights
from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

from mmjudge.judge.data import MAX_SETTINGS_BYTES, InputError, UsageError, read_json, validation_problems, write_json_atomically, write_text_atomically
from mmjudge.judge.hub import Checkpoint, resolve
from mmjudge.judge.parsing import SCORE_HEADING
from mmjudge.judge.prompts import IMAGE_TOKENS, IMG_CONTEXT
from mmjudge.judge.detokenize import text_decoder
from mmjudge.judge.kernels import use_fused_kernels
from mmjudge.judge.rope import use_rowwise_rope
from mmjudge.judge.templates import TEMPLATES, system_message_from_conversation_py
from mmjudge.judge.tiling import TilingConfig

SETTINGS_FILE = "judge_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt")
# Every file load_judge reads, as huggingface_hub allow patterns: a checkpoint named by its Hub id is fetched
# with these only, so its own code (modeling_*.py; conversation.py is read as data) and pickled .bin weights
# never reach the disk.
CHECKPOINT_FILES = ("config.json", "generation_config.json", "model.safetensors", INDEX_FILE, "model-*.safetensors",
                    "adapter_config.json", ADAPTER_WEIGHTS, SETTINGS_FILE, "conversation.py", *TOKENIZER_FILES)
# An original checkpoint's own code, which trust_remote_code loads: fetched only for save_original to copy, never run.
REMOTE_CODE = ("*.py",)

# LLMs that transformers implements natively; InternLM2 (InternVL2-2B/8B/26B) needs remote code.
SUPPORTED_LLMS = ("phi3", "qwen2", "llama")
# Which conversation template a native checkpoint without judge_config.json most likely uses.
TEMPLATE_BY_LLM = {"phi3": "phi3-chat", "qwen2": "Hermes-2", "llama": "Hermes-2"}


class CheckpointError(UsageError):
    """A checkpoint directory that cannot be loaded; the message says what was expected. The user's to
    fix (a wrong --model_path, a broken or unsupported checkpoint), so commands exit with code 2."""


@dataclass(frozen=True)
class JudgeSettings:
    """How the judge expects its input: chat template, system message and image tiling.

    Read from the original config (`template`, `max_dynamic_patch`, ...) or from `judge_config.json`
    beside a native checkpoint; `system_message=None` means the template's default."""

    template: str
    system_message: str | None
    tiling: TilingConfig
    tokens_per_tile: int

    def to_json(self) -> dict:
        return SettingsFile.of(self).model_dump()


class SettingsFile(BaseModel):
    """judge_config.json, beside a native checkpoint or an adapter: the judge's settings as stored. Its keys
    are named here only; `write_settings` and `read_settings` go through this model."""

    model_config = ConfigDict(extra="forbid")
    template: str
    system_message: str | None = None
    image_size: PositiveInt
    min_tiles: PositiveInt
    max_tiles: PositiveInt
    use_thumbnail: bool

    @field_validator("template")
    @classmethod
    def _known_template(cls, template: str) -> str:
        if template not in TEMPLATES:
            raise ValueError(f"{template!r} is not one of {', '.join(TEMPLATES)}")
        return template

    @model_validator(mode="after")
    def _tile_range(self) -> SettingsFile:
        if self.min_tiles > self.max_tiles:
            raise ValueError(f"min_tiles {self.min_tiles} is above max_tiles {self.max_tiles}")
        return self

    @classmethod
    def of(cls, settings: JudgeSettings) -> SettingsFile:
        tiling = settings.tiling
        return cls(template=settings.template, system_message=settings.system_message, image_size=tiling.image_size,
                   min_tiles=tiling.min_tiles, max_tiles=tiling.max_tiles, use_thumbnail=tiling.use_thumbnail)

    def judge_settings(self, tokens_per_tile: int) -> JudgeSettings:
        tiling = TilingConfig(image_size=self.image_size, min_tiles=self.min_tiles, max_tiles=self.max_tiles, use_thumbnail=self.use_thumbnail)
        return JudgeSettings(self.template, self.system_message, tiling, tokens_per_tile)


@dataclass
class Judge:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    settings: JudgeSettings
    source_format: str  # "original", "native", "adapter", or "training" for a model judge-train is training

    @property
    def image_token_id(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(IMG_CONTEXT)

    @functools.cached_property
    def decode(self) -> Callable[[list[int]], str]:
        """Token ids to text, as MMIE's reference decodes the judge's output (judge/detokenize.py)."""
        return text_decoder(self.tokenizer)


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bf16 on an accelerator (the checkpoints' own dtype), fp32 on CPU where bf16 matmuls are slow."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


def checkpoint_format(path: Path) -> str:
    if (path / "adapter_config.json").is_file():
        return "adapter"
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(
            f"{path}: no config.json or adapter_config.json; expected an InternVL2 checkpoint directory "
            "(original InternVLChatModel format, native transformers InternVL, or a PEFT adapter)"
        )
    config = read_json_object(config_file)
    if "InternVLChatModel" in (config.get("architectures") or []) or config.get("model_type") == "internvl_chat":
        return "original"
    if config.get("model_type") == "internvl":
        return "native"
    raise CheckpointError(
        f"{config_file}: unsupported architecture {config.get('architectures')} (model_type "
        f"{config.get('model_type')!r}); expected InternVLChatModel or transformers' InternVL"
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
    tokenizer = load_tokenizer(path)
    if kind == "original":
        config = read_json_object(path / "config.json")
        model = _build_from_original(path, config, tokenizer, device, dtype)
        settings = settings_from_original(path, config, model.config)
    else:
        model = load_native(path, dtype).to(device)
        settings = _settings_from_native(path, model.config)
    _check_untied(model)
    check_finite(path, model.named_parameters())
    use_rowwise_rope(model.model.language_model)
    use_fused_kernels(model, device)
    model.eval()
    return Judge(model, tokenizer, settings, kind)


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    # Resolve the class named in tokenizer_config.json ourselves: AutoTokenizer would also read the
    # original config.json, whose auto_map names remote code that must never run.
    config_file = path / "tokenizer_config.json"
    name = read_json_object(config_file).get("tokenizer_class") if config_file.is_file() else None
    tokenizer_class = tokenizer_class_from_name(name) if name else None
    try:
        if tokenizer_class is not None:
            tokenizer = tokenizer_class.from_pretrained(path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: cannot load the tokenizer ({err})") from None
    missing = [t for t in IMAGE_TOKENS if t not in tokenizer.get_vocab()]
    if missing:
        raise CheckpointError(f"{path}: the tokenizer lacks InternVL's image tokens {missing}")
    # A tokenizer whose vocabulary file is missing still loads, with its added tokens only, and encodes
    # every word to nothing or <unk>: the judge would then read prompts without text and score garbage.
    probe = tokenizer(f"{SCORE_HEADING}\nImage quality: 4", add_special_tokens=False).input_ids
    if not probe or all(i == tokenizer.unk_token_id for i in probe):
        raise CheckpointError(f"{path}: the tokenizer encodes text to nothing; its vocabulary file "
                              "(tokenizer.model, tokenizer.json or vocab.json) is missing or empty")
    return tokenizer


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
            raise CheckpointError(f"{path}/adapter_config.json: does not fit the base {base_path}: {_one_line(err)}") from None
        except KeyError as err:  # a weight the config makes (modules_to_save) but the file lacks
            raise CheckpointError(f"{path}/{ADAPTER_WEIGHTS}: lacks {err.args[0]}, which its config makes over the base {base_path}") from None
        except RuntimeError as err:  # a weight of another shape than the base's layer
            raise CheckpointError(f"{path}/{ADAPTER_WEIGHTS}: does not fit the base {base_path}: {_one_line(err)}") from None
        check_adapter_weights(path, model)
    for warning in said:
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    settings = read_settings(path, base.settings.tokens_per_tile) or base.settings
    return Judge(merge_adapter(model, base_path), adapter_tokenizer(path, base.tokenizer), settings, "adapter")


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
    safetensors headers. An original checkpoint's keys map through KEY_MAP; transformers' `save_pretrained`
    writes a native one's weights in one dtype, under names of its own: where they hold several, none is given."""
    headers = {}
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as stored:
            headers |= {key: (_DTYPES.get(stored.get_slice(key).get_dtype()), stored.get_slice(key).get_shape()) for key in stored.keys()}
    if checkpoint_format(path) == "original":
        return {name: dtype for key, (dtype, shape) in headers.items() if dtype is not None
                for name, _ in native_tensors(key, torch.empty(shape, device="meta"))}
    dtypes = {dtype for dtype, _ in headers.values()}
    return dict.fromkeys(names, dtypes.pop()) if len(dtypes) == 1 and None not in dtypes else {}


def adapter_tokenizer(path: Path, base: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The base's tokenizer, unless the adapter's own files give tokens the base lacks. An adapter of the same
    tokens is read and written by its base's rules: one written by judge-train before save_tokenizer holds
    transformers' rewrite of the base's files, which encodes every prompt without its word-start token."""
    if not (path / "tokenizer_config.json").is_file():
        return base
    own = load_tokenizer(path)
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
    _readable([weights])
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


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:500]


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


def load_native(path: Path, dtype: torch.dtype) -> InternVLForConditionalGeneration:
    """A native checkpoint, refused where its config is incomplete (transformers would fill the gaps with the
    defaults of a 12-billion-parameter model and try to allocate it) or its weights do not fill the model
    exactly (a missing weight would be left at a random initialisation)."""
    where, kind = f"{path}/config.json", "a native InternVL config"
    raw = read_json_object(path / "config.json")
    _require(raw, ("text_config", "vision_config"), where, kind)
    _require(raw["text_config"], ("model_type", *TEXT_SIZES), f"{where} text_config", kind)
    _require(raw["vision_config"], VISION_SIZES, f"{where} vision_config", kind)
    config = _built(path, lambda: InternVLConfig.from_pretrained(path))
    _check_size(path, config)
    model, info = InternVLForConditionalGeneration.from_pretrained(path, config=config, dtype=dtype, output_loading_info=True)
    mismatched = [f"{key} (shape)" for key, *_ in info.get("mismatched_keys", [])]
    _refuse_mismatch(path, sorted(info["missing_keys"]) + mismatched, sorted(info["unexpected_keys"]))
    return model


def _built(path: Path, build):
    """A config object built from config.json; a value of the wrong type is a CheckpointError naming it."""
    try:
        return build()
    except (StrictDataclassError, TypeError, ValueError) as err:
        raise CheckpointError(f"{path}/config.json: {' '.join(str(err).split())}") from None


def _check_size(path: Path, config: InternVLConfig) -> None:
    """The model the config describes holds as many numbers as the weight files, read from their headers,
    before anything is allocated: a config that describes another model would be allocated first and
    found out after (a 12-billion-parameter one is killed for memory first)."""
    with torch.device("meta"), no_init_weights():
        described = sum(p.numel() for p in InternVLForConditionalGeneration(config).parameters())
    stored = 0
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as weights:
            stored += sum(math.prod(weights.get_slice(key).get_shape()) for key in weights.keys())
    if described != stored:
        raise CheckpointError(f"{path}: config.json describes a model of {described:,} weights, the weight files hold {stored:,}")


def adapter_base(path: Path, extra_files: tuple[str, ...] = ()) -> Checkpoint:
    """The base an adapter applies to: its adapter_config.json's base_model_name_or_path, a directory or a
    Hub id at the config's `revision` (judge-train pins the commit it trained over)."""
    config = read_json_object(path / "adapter_config.json")
    try:
        return find_checkpoint(config.get("base_model_name_or_path") or "", config.get("revision"), extra_files)
    except UsageError as err:
        raise CheckpointError(f"{path}/adapter_config.json: base_model_name_or_path: {err} "
                              "(it names the base checkpoint the adapter was trained on)") from None


def native_config_from_original(config: dict, tokenizer: PreTrainedTokenizerBase, where: str = "config.json") -> InternVLConfig:
    """Map an InternVLChatModel config onto transformers' InternVLConfig, refusing what it cannot represent;
    `where` names the file in messages."""
    _require(config, ("llm_config", "vision_config", "downsample_ratio"), where)
    _require(config["llm_config"], TEXT_SIZES, f"{where} llm_config")
    _require(config["vision_config"], VISION_SIZES, f"{where} vision_config")
    llm, vision, ratio = dict(config["llm_config"]), config["vision_config"], config["downsample_ratio"]
    if type(ratio) not in (int, float) or not 0 < ratio <= 1:
        raise CheckpointError(f"{where}: downsample_ratio must be a number in (0, 1], got {ratio!r}")
    llm_type = llm.get("model_type")
    if llm_type not in SUPPORTED_LLMS:
        raise CheckpointError(
            f"unsupported language model {llm_type!r} (architectures {llm.get('architectures')}); "
            f"transformers implements {', '.join(SUPPORTED_LLMS)} natively"
        )
    if config.get("ps_version", "v1") != "v2":
        raise CheckpointError(f"unsupported ps_version {config.get('ps_version')!r}; only 'v2' pixel shuffle is supported")
    if vision.get("qk_normalization") or vision.get("norm_type", "layer_norm") != "layer_norm":
        raise CheckpointError("unsupported vision tower: only InternViT-300M (no qk normalization, LayerNorm) is supported")
    # The loader, not the checkpoint, decides the dtype; the rest are bookkeeping of the original code.
    for key in ("architectures", "auto_map", "_name_or_path", "transformers_version", "attn_implementation", "torch_dtype", "dtype"):
        llm.pop(key, None)
    if (rope := llm.pop("rope_scaling", None)) is not None:
        llm["rope_parameters"] = _rope_parameters(rope, llm)
    llm["tie_word_embeddings"] = False
    text_config = AutoConfig.for_model(**llm)
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
        tie_word_embeddings=False,
    )


# The sizes a config must give, each a whole number, for the model it describes to be known.
TEXT_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
VISION_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size", "patch_size")


def _require(config: object, keys: tuple[str, ...], where: str, kind: str = "an original InternVL2 config") -> None:
    """`keys` are in `config`, and those that are sizes are positive whole numbers."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{where} must be an object, got {type(config).__name__}: not {kind}")
    if missing := [k for k in keys if k not in config]:
        raise CheckpointError(f"{where} lacks {', '.join(missing)}: not {kind}")
    sizes = set(TEXT_SIZES) | set(VISION_SIZES)
    if wrong := [f"{k} {config[k]!r}" for k in keys if k in sizes and not _size(config[k])]:
        raise CheckpointError(f"{where}: {', '.join(wrong)}: sizes must be positive whole numbers")


def _size(value: object) -> bool:
    """A positive whole number, or (a native config's image and patch sizes) a pair of them."""
    values = value if isinstance(value, list) and value else [value]
    return all(type(v) is int and v >= 1 for v in values)


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


# Original key <-> native key, one table read in both directions (loading, and save_original). "{n}" is a
# layer number; a key ending in "." is a prefix whose rest (weight, bias) is kept as it is.
KEY_MAP = (
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
    ("language_model.model.", "model.language_model."),
    ("language_model.lm_head.", "lm_head."),
)
# InternViT's fused qkv is three native projections: its rows are [q; k; v], as InternViT reshapes its qkv output.
FUSED_QKV = ("vision_model.encoder.layers.{n}.attn.qkv.", "model.vision_tower.encoder.layer.{n}.attention.{part}_proj.")
QKV_PARTS = ("q", "k", "v")
ORIGINAL, NATIVE = 0, 1  # the sides of KEY_MAP and FUSED_QKV


@functools.cache
def _key_pattern(template: str) -> re.Pattern:
    """A key template of KEY_MAP or FUSED_QKV as a regex: {n} and {part} captured, a prefix's rest too."""
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


def _renamed(key: str, side: int) -> str:
    """The key on the other side of KEY_MAP; a key the table does not name stays as it is (and is then refused
    as unexpected by whoever compares it with a model)."""
    return next((new for pair in KEY_MAP if (new := _translate(key, pair, side)) is not None), key)


def native_tensors(key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """The native (name, tensor) pairs for one original tensor: a rename, or the split of a fused qkv."""
    if _key_pattern(FUSED_QKV[ORIGINAL]).match(key):
        return [(_translate(key, FUSED_QKV, ORIGINAL, part=part), t) for part, t in zip(QKV_PARTS, tensor.chunk(3, dim=0))]
    return [(_renamed(key, ORIGINAL), tensor)]


def original_tensors(native: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The original state dict of a native one: `native_tensors` undone, each q, k, v fused again."""
    original, fused = {}, {}
    for key, tensor in native.items():
        if (qkv := _key_pattern(FUSED_QKV[NATIVE]).match(key)) is not None:
            fused.setdefault(_translate(key, FUSED_QKV, NATIVE), {})[qkv["part"]] = tensor
        else:
            original[_renamed(key, NATIVE)] = tensor
    for key, parts in fused.items():
        if missing := [p for p in QKV_PARTS if p not in parts]:
            raise CheckpointError(f"{key}: the vision tower has no {'/'.join(missing)} projection to fuse with {'/'.join(parts)}")
        original[key] = torch.cat([parts[p] for p in QKV_PARTS])
    return original


def safetensors_files(path: Path) -> list[Path]:
    index = path / INDEX_FILE
    if index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no \"weight_map\" object naming each tensor's shard")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise CheckpointError(f"{index}: lists shards that are missing: {', '.join(missing)}")
        return _readable([path / s for s in shards])
    if (path / "model.safetensors").is_file():
        return _readable([path / "model.safetensors"])
    if any(path.glob("*.bin")):
        raise CheckpointError(f"{path}: only .bin weights found; convert them to safetensors first")
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _readable(files: list[Path]) -> list[Path]:
    """The files, each with a whole safetensors header (a truncated or empty one is an interrupted copy)."""
    for file in files:
        try:
            with safe_open(file, framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{file}: not a complete safetensors file ({err}); copy or download it again") from None
    return files


def _build_from_original(
    path: Path, config: dict, tokenizer: PreTrainedTokenizerBase, device: str, dtype: torch.dtype
) -> InternVLForConditionalGeneration:
    native_config = _built(path, lambda: native_config_from_original(config, tokenizer, f"{path}/config.json"))
    _check_size(path, native_config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights(), torch.device(device):
            model = InternVLForConditionalGeneration(native_config)
    finally:
        torch.set_default_dtype(previous)
    params = dict(model.named_parameters())
    unfilled, unexpected = set(params), []
    with torch.no_grad():
        for file in safetensors_files(path):
            with safe_open(file, framework="pt") as weights:
                for key in weights.keys():
                    for name, tensor in native_tensors(key, weights.get_tensor(key)):
                        if name not in params:
                            unexpected.append(key)
                            continue
                        if params[name].shape != tensor.shape:
                            raise CheckpointError(
                                f"{file}: {key} has shape {tuple(tensor.shape)}, the config implies {tuple(params[name].shape)}"
                            )
                        params[name].copy_(tensor)
                        unfilled.discard(name)
    if unfilled or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the config: missing {sorted(unfilled)[:5]}"
            f"{' ...' if len(unfilled) > 5 else ''}, unexpected {sorted(set(unexpected))[:5]}"
        )
    return model


def _check_untied(model: torch.nn.Module) -> None:
    # transformers' InternVLConfig defaults to tied embeddings; InternVL2 checkpoints have their own lm_head.
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if inner.config.tie_word_embeddings:
        return
    if inner.lm_head.weight.data_ptr() == inner.get_input_embeddings().weight.data_ptr():
        raise CheckpointError("lm_head shares storage with the input embeddings although the config says untied")


def _tokens_per_tile(config: InternVLConfig) -> int:
    image_size = config.vision_config.image_size[0]
    patch_size = config.vision_config.patch_size[0]
    return int((image_size // patch_size) ** 2 * config.downsample_ratio**2)


def settings_from_original(path: Path, config: dict, native: InternVLConfig) -> JudgeSettings:
    """The template and tiling an original config asks for; `path` is its directory (conversation.py)."""
    template = config.get("template")
    if template not in TEMPLATES:
        raise CheckpointError(f"{path}/config.json: template {template!r} is not one of {', '.join(TEMPLATES)}")
    system_message = config.get("system_message")
    if system_message is None and (path / "conversation.py").is_file():
        try:
            system_message = system_message_from_conversation_py(path / "conversation.py", template)
        except InputError as err:
            raise CheckpointError("; ".join(map(str, err.problems))) from None
    # The stored settings' own checks (positive whole numbers, true or false), in config.json's names: a
    # "six" here was found only when the first image was tiled, after the model had loaded.
    names = {"image_size": "force_image_size", "min_tiles": "min_dynamic_patch", "max_tiles": "max_dynamic_patch",
             "use_thumbnail": "use_thumbnail", "system_message": "system_message"}
    try:
        stored = SettingsFile(
            template=template, system_message=system_message,
            image_size=config.get("force_image_size") or config["vision_config"]["image_size"],
            min_tiles=config.get("min_dynamic_patch", 1),
            max_tiles=config.get("max_dynamic_patch", 12) if config.get("dynamic_image_size", True) else 1,
            use_thumbnail=config.get("use_thumbnail", True),
        )
    except ValidationError as err:
        problems = validation_problems(path / "config.json", None, None, err)
        raise CheckpointError("; ".join(str(replace(p, field=names.get(p.field, p.field))) for p in problems)) from None
    return stored.judge_settings(_tokens_per_tile(native))


def read_settings(path: Path, tokens_per_tile: int) -> JudgeSettings | None:
    file = path / SETTINGS_FILE
    if not file.is_file():
        return None
    try:
        stored = SettingsFile.model_validate(read_json_object(file))
    except ValidationError as err:
        raise InputError(validation_problems(file, None, None, err)) from None
    return stored.judge_settings(tokens_per_tile)


def _settings_from_native(path: Path, config: InternVLConfig) -> JudgeSettings:
    """judge_config.json when present; otherwise the template of the LLM family and InternVL's default tiling."""
    tokens_per_tile = _tokens_per_tile(config)
    if settings := read_settings(path, tokens_per_tile):
        return settings
    llm_type = config.text_config.model_type
    if llm_type not in TEMPLATE_BY_LLM:
        raise CheckpointError(f"{path}: no {SETTINGS_FILE} and no default template for language model {llm_type!r}")
    return JudgeSettings(
        TEMPLATE_BY_LLM[llm_type], None, TilingConfig(image_size=config.vision_config.image_size[0]), tokens_per_tile
    )


def original_base(adapter: Path) -> Path:
    """The original checkpoint an adapter was trained over, with its own Python files (fetched as data where
    it is a Hub id): what `save_original` takes the config, code and layout from. Refused before any
    weights load where the base is in another format."""
    base = adapter_base(adapter, REMOTE_CODE).path
    if (kind := checkpoint_format(base)) != "original":
        raise CheckpointError(f"{base}: the adapter's base is a {kind} checkpoint; the original format takes its config.json, code and "
                              "weight layout from an original (InternVLChatModel) base: train over the original checkpoint "
                              "(e.g. OpenGVLab/InternVL2-4B) to export in that format")
    return base


def save_original(judge: Judge, base: Path, out_dir: str | Path) -> Path:
    """Write a judge (an adapter is merged first) as an original InternVL2 checkpoint, laid out like `base`,
    the original checkpoint it was trained over (`original_base`): the base's config.json with the judge's
    settings, the weights under the original key names in the base's dtypes and shards, and the base's
    tokenizer files, generation_config.json and Python files (the remote code `trust_remote_code` loads,
    and conversation.py), copied as files and never run. Refuses weights or a tokenizer that the base's
    config cannot describe. config.json is written last: an export cut short cannot be loaded."""
    out_dir = Path(out_dir)
    model = judge.model.merge_and_unload() if hasattr(judge.model, "merge_and_unload") else judge.model
    tensors = original_tensors({k: t.detach() for k, t in model.state_dict().items()})
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
    config = read_json_object(base / "config.json")
    _note_missing_remote_code(config, base)
    write_json_atomically(out_dir / "config.json", original_config(config, judge.settings, settings_from_original(base, config, model.config)))
    return out_dir


@dataclass(frozen=True)
class StoredTensor:
    shard: str  # the safetensors file that holds it
    dtype: torch.dtype
    shape: tuple[int, ...]


_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def _weight_layout(path: Path) -> dict[str, StoredTensor]:
    """Where and how an original checkpoint stores each tensor, read from the safetensors headers only."""
    layout = {}
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as weights:
            for key in weights.keys():
                stored = weights.get_slice(key)
                if stored.get_dtype() not in _DTYPES:
                    raise CheckpointError(f"{file}: {key} is stored as {stored.get_dtype()}; the export writes {', '.join(_DTYPES)} only")
                layout[key] = StoredTensor(file.name, _DTYPES[stored.get_dtype()], tuple(stored.get_shape()))
    return layout


def _check_expressible(tensors: dict[str, torch.Tensor], layout: dict[str, StoredTensor], tokenizer: PreTrainedTokenizerBase, base: Path) -> None:
    """What the base's config.json and tokenizer cannot describe, refused in one message."""
    problems = []
    if extra := sorted(set(tensors) - set(layout)):
        problems.append(f"weights the base has no place for: {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    if missing := sorted(set(layout) - set(tensors)):
        problems.append(f"base weights the judge lacks: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if reshaped := [k for k in sorted(set(tensors) & set(layout)) if tuple(tensors[k].shape) != layout[k].shape]:
        k = reshaped[0]
        problems.append(f"{len(reshaped)} weight(s) of another shape than the base's, e.g. {k} {tuple(tensors[k].shape)} (base {layout[k].shape})")
    if tokenizer.get_vocab() != load_tokenizer(base).get_vocab():
        problems.append("the judge's tokenizer has another vocabulary than the base's")
    if problems:
        raise CheckpointError(f"cannot be written in the original format of {base}: " + "; ".join(problems))


def original_config(config: dict, settings: JudgeSettings, base: JudgeSettings) -> dict:
    """The base's original config.json carrying the judge's settings: `settings_from_original` reads them back."""
    tiling = settings.tiling
    config = {**config, "template": settings.template, "force_image_size": tiling.image_size, "min_dynamic_patch": tiling.min_tiles,
              "max_dynamic_patch": tiling.max_tiles, "use_thumbnail": tiling.use_thumbnail,
              "dynamic_image_size": config.get("dynamic_image_size", True) or tiling.max_tiles > 1}
    system_message = _effective_system_message(settings)
    if system_message != _effective_system_message(base):
        config["system_message"] = system_message  # conversation.py stays the base's: the config's own field overrides it
    return config


def _effective_system_message(settings: JudgeSettings) -> str:
    return TEMPLATES[settings.template].default_system_message if settings.system_message is None else settings.system_message


def _note_missing_remote_code(config: dict, base: Path) -> None:
    """The modules config.json's auto_map names that the base does not have: without them neither the base nor
    the export loads with trust_remote_code (here both load without)."""
    modules = sorted({f"{ref.split('.')[0]}.py" for ref in (config.get("auto_map") or {}).values() if isinstance(ref, str)})
    if missing := [m for m in modules if not (base / m).is_file()]:
        print(f"note: {base} lacks {', '.join(missing)}, which its config.json's auto_map names: the export, like its base, "
              "loads with this toolkit but not with trust_remote_code until they are added", file=sys.stderr)


def save_native(judge: Judge, out_dir: str | Path) -> Path:
    """Write a standalone native checkpoint (weights, tokenizer, judge settings) that `load_judge` reads."""
    out_dir = Path(out_dir)
    model = judge.model.merge_and_unload() if hasattr(judge.model, "merge_and_unload") else judge.model
    model.save_pretrained(out_dir, safe_serialization=True)
    save_tokenizer(judge.tokenizer, out_dir)
    write_settings(judge.settings, out_dir)
    return out_dir


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> None:
    """A judge's tokenizer files, copied from the checkpoint they were read from (`load_tokenizer`), so that a
    trained or merged judge is read and written exactly as its base is. transformers 5's `save_pretrained`
    would write tokenizer.json and a tokenizer_config.json of its own, without tokenizer.model and without
    `"legacy": false`, from which judge/detokenize.py rebuilds the reference's encoding and decoding: every
    prompt would lose its word-start token and the judge's text would be decoded by transformers."""
    source = Path(tokenizer.name_or_path)
    files = [source / name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not files:  # every judge's tokenizer comes from load_tokenizer, which reads a directory of these
        raise CheckpointError(f"{source}: no tokenizer files ({', '.join(TOKENIZER_FILES)}) to copy")
    for file in files:
        shutil.copyfile(file, Path(out_dir) / file.name)


def write_settings(settings: JudgeSettings, out_dir: str | Path) -> None:
    write_text_atomically(Path(out_dir) / SETTINGS_FILE, SettingsFile.of(settings).model_dump_json(indent=2) + "\n")


def read_json_object(file: Path) -> dict:
    """A checkpoint's JSON file, which must hold an object; a broken one is a CheckpointError naming it."""
    try:
        value = read_json(file, MAX_SETTINGS_BYTES)
    except InputError as err:
        raise CheckpointError("; ".join(map(str, err.problems))) from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{file}: expected a JSON object, found a {type(value).__name__}")
    return value


def with_max_tiles(settings: JudgeSettings, max_tiles: int | None) -> JudgeSettings:
    """The same settings with a user's --max_tiles, if given."""
    if max_tiles is None:
        return settings
    return replace(settings, tiling=replace(settings.tiling, max_tiles=max_tiles))
