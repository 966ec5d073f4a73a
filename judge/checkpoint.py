"""What a checkpoint is made of, shared by the generic loader (judge/model.py) and every family's adapter
(judge/backbones/): its JSON files read as data, its weight files found and checked, its sizes checked by
arithmetic before anything is built, its tokenizer, its chat template, and the judge's settings
(JudgeSettings, judge_config.json's fields). Nothing here knows a family's rules: the backbones build on this
module, and judge/model.py on both."""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from pydantic import BaseModel, ConfigDict, PositiveInt, field_validator, model_validator
from safetensors import SafetensorError, safe_open
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from transformers.initialization import no_init_weights
from transformers.models.auto.tokenization_auto import MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS, TOKENIZER_MAPPING_NAMES, tokenizer_class_from_name

from mmjudge.judge.data import MAX_SETTINGS_BYTES, InputError, UsageError, read_json
from mmjudge.judge.detokenize import write_merges_as_read
from mmjudge.judge.parsing import SCORE_HEADING
from mmjudge.judge.templates import TEMPLATES, ChatTemplate, bounded_sandbox, template_from_jinja
from mmjudge.judge.vision import ImageProcessing

INDEX_FILE = "model.safetensors.index.json"


# The dtypes a checkpoint's safetensors headers name that a judge is loaded from and written in.
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")


class CheckpointError(UsageError):
    """A checkpoint directory that cannot be loaded; the message says what was expected. The user's to
    fix (a wrong --model_path, a broken or unsupported checkpoint), so commands exit with code 2."""


@dataclass(frozen=True)
class JudgeSettings:
    """How the judge expects its input: chat template, system message and image processing.

    Read from the checkpoint (an original config's `template`, `max_dynamic_patch`...; a native one's chat
    template and processor config), then from `judge_config.json` where one lies beside it;
    `system_message=None` means the template's default."""

    template: ChatTemplate
    system_message: str | None
    images: ImageProcessing

    @property
    def system(self) -> str | None:
        """The system message the judge is given: its own, or its template's default (None: no system turn)."""
        return self.template.default_system_message if self.system_message is None else self.system_message

    def to_json(self) -> dict:
        return SettingsFile.of(self).model_dump(exclude_none=True)


class TemplateFields(BaseModel):
    """A chat template stored whole in judge_config.json: one that is not among InternVL's published ones by name
    (a -hf or Qwen-VL checkpoint's, read from its Jinja; one a conversation.py defines otherwise)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    system_template: str
    user_role: str
    assistant_role: str
    separator: str
    default_system_message: str | None = None
    trims: bool = False

    @field_validator("system_template")
    @classmethod
    def _one_slot(cls, text: str) -> str:
        if text.count("{system_message}") != 1:
            raise ValueError("must hold {system_message} exactly once")
        return text


class SettingsFile(BaseModel):
    """judge_config.json, beside a native checkpoint or an adapter: the judge's settings over its base's (a field
    left out is the base's). Its keys are named here only; `write_settings` and `read_settings` go through this
    model. The image fields are those of the backbone's image processing: InternVL's tiling (image_size,
    min_tiles, max_tiles, use_thumbnail) or Qwen-VL's smart resize (min_pixels, max_pixels)."""

    model_config = ConfigDict(extra="forbid")
    template: str | TemplateFields | None = None
    system_message: str | None = None
    image_size: PositiveInt | None = None
    min_tiles: PositiveInt | None = None
    max_tiles: PositiveInt | None = None
    use_thumbnail: bool | None = None
    min_pixels: PositiveInt | None = None
    max_pixels: PositiveInt | None = None

    @field_validator("template")
    @classmethod
    def _known_template(cls, template: str | TemplateFields | None) -> str | TemplateFields | None:
        if isinstance(template, str) and template not in TEMPLATES:
            raise ValueError(f"{template!r} is not one of {', '.join(TEMPLATES)} (or a template given whole)")
        return template

    @model_validator(mode="after")
    def _ranges(self) -> SettingsFile:
        for low, high in (("min_tiles", "max_tiles"), ("min_pixels", "max_pixels")):
            if getattr(self, low) is not None and getattr(self, high) is not None and getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} {getattr(self, low)} is above {high} {getattr(self, high)}")
        return self

    @classmethod
    def of(cls, settings: JudgeSettings) -> SettingsFile:
        template = settings.template
        stored = template.name if TEMPLATES.get(template.name) == template else TemplateFields(**asdict(template))
        return cls(template=stored, system_message=settings.system_message, **settings.images.stored())

    def judge_settings(self, base: JudgeSettings) -> JudgeSettings:
        """These settings over `base`'s; a ValueError names an image field the base's backbone has no use for."""
        fields = self.model_dump(exclude_none=True, include={"image_size", "min_tiles", "max_tiles", "use_thumbnail", "min_pixels", "max_pixels"})
        template = base.template if self.template is None else TEMPLATES[self.template] if isinstance(self.template, str) \
            else ChatTemplate(**self.template.model_dump())
        return JudgeSettings(template, self.system_message, base.images.restored(fields))


def load_tokenizer(path: Path, image_tokens: tuple[str, ...]) -> PreTrainedTokenizerBase:
    # Resolve the class named in tokenizer_config.json ourselves: AutoTokenizer would also read the
    # original config.json, whose auto_map names remote code that must never run.
    from mmjudge.judge.internlm2_tokenizer import InternLM2Tokenizer

    config_file = path / "tokenizer_config.json"
    name = read_json_object(config_file).get("tokenizer_class") if config_file.is_file() else None
    # Where transformers knows a family's released tokenizer_config.json to name the wrong class, AutoTokenizer takes
    # the family's own (Qwen3.5 names Qwen2Tokenizer, whose split rule leaves combining marks out of words), and so do we.
    model_type = read_json_object(path / "config.json").get("model_type") if (path / "config.json").is_file() else None
    if model_type in MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS and TOKENIZER_MAPPING_NAMES.get(model_type) not in (None, "TokenizersBackend"):
        name = TOKENIZER_MAPPING_NAMES[model_type]
    # InternLM2's tokenizer is remote code in its checkpoints; this toolkit carries its own (judge/internlm2_tokenizer.py).
    tokenizer_class = InternLM2Tokenizer if name == "InternLM2Tokenizer" else tokenizer_class_from_name(name) if name else None
    try:
        if tokenizer_class is not None:
            tokenizer = tokenizer_class.from_pretrained(path)
        else:
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path}: cannot load the tokenizer ({err})") from None
    missing = [t for t in image_tokens if t not in tokenizer.get_vocab()]
    if missing:
        raise CheckpointError(f"{path}: the tokenizer lacks the backbone's image tokens {missing}")
    # A tokenizer whose vocabulary file is missing still loads, with its added tokens only, and encodes
    # every word to nothing or <unk>: the judge would then read prompts without text and score garbage.
    probe = tokenizer(f"{SCORE_HEADING}\nImage quality: 4", add_special_tokens=False).input_ids
    if not probe or all(i == tokenizer.unk_token_id for i in probe):
        raise CheckpointError(f"{path}: the tokenizer encodes text to nothing; its vocabulary file "
                              "(tokenizer.model, tokenizer.json or vocab.json) is missing or empty")
    return tokenizer


def one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:500]


def built(path: Path, build):
    """A config object (or a model on the meta device) built from config.json; a value of the wrong type, or
    counts that do not fit together, is a CheckpointError naming it."""
    try:
        return build()
    except (StrictDataclassError, TypeError, ValueError, KeyError, ZeroDivisionError) as err:
        raise CheckpointError(f"{path}/config.json: {' '.join(str(err).split())}") from None


def tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Each tensor's shape, by name, read from the weight files' headers."""
    shapes = {}
    for file in safetensors_files(path):
        with safe_open(file, framework="pt") as weights:
            shapes |= {key: weights.get_slice(key).get_shape() for key in weights.keys()}
    return shapes


# The keys that count a model's layers, in any part of a config (Qwen-VL's vision tower counts them in `depth`).
LAYER_KEYS = ("num_hidden_layers", "depth")


def check_counts(path: Path, raw: dict) -> None:
    """The counts config.json gives, checked by arithmetic on the JSON before any config object is built (a
    transformers config makes a list per layer: Qwen's num_hidden_layers 1e9 hung while its config was
    built). Each layer holds a tensor at least, so a config of more layers than the weight files hold tensors
    is refused; in each part, the attention heads divide the width, the key-value heads the heads, and a
    downsample ratio is a share."""
    parts = list(_parts(raw, f"{path}/config.json"))
    layers = sum(part[key] for _, part in parts for key in LAYER_KEYS if type(part.get(key)) is int)
    if layers > (tensors := len(tensor_shapes(path))):
        raise CheckpointError(f"{path}: config.json describes {layers:,} layers, and the weight files hold {tensors:,} tensors")
    for where, part in parts:
        if "downsample_ratio" in part:
            check_downsample_ratio(part["downsample_ratio"], where)
        width, heads, kv = part.get("hidden_size"), part.get("num_attention_heads", part.get("num_heads")), part.get("num_key_value_heads")
        if heads is None or type(width) is not int:
            continue
        if type(heads) is not int or heads < 1:
            raise CheckpointError(f"{where}: {heads!r} attention heads; a model has a whole number of at least 1")
        if "head_dim" not in part and width % heads:
            raise CheckpointError(f"{where}: hidden_size {width} is not a multiple of its {heads} attention heads")
        if kv is not None and (type(kv) is not int or kv < 1 or heads % kv):
            raise CheckpointError(f"{where}: num_key_value_heads {kv!r} does not divide its {heads} attention heads")


def check_downsample_ratio(ratio: object, where: str) -> None:
    """InternVL's pixel shuffle keeps this share of a tile's patches on each side: 0 divided by zero."""
    if type(ratio) not in (int, float) or not 0 < ratio <= 1:
        raise CheckpointError(f"{where}: downsample_ratio must be a number in (0, 1], got {ratio!r}")


def _parts(config: dict, where: str):
    """`config` and every object nested in it, each with where it stands."""
    yield where, config
    for key, value in config.items():
        if isinstance(value, dict):
            yield from _parts(value, f"{where} {key}")


MROPE_MODEL_TYPES = ("qwen2_5_vl", "qwen3_vl", "qwen3_5", "qwen3_5_moe")  # Qwen-VL's multimodal rotary embedding


def check_rope(path: Path, config) -> None:
    """A multimodal rotary embedding's sections (Qwen-VL's mrope_section: temporal, height, width) share the
    head's rotary half exactly (of the part of the head that is rotated: Qwen3.5's partial_rotary_factor of it):
    others were taken, and failed or misplaced positions at the first forward."""
    text = config.get_text_config()
    params = getattr(text, "rope_parameters", None) or {}
    sections = params.get("mrope_section")
    head = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    half = int(head * params.get("partial_rotary_factor", 1.0)) // 2
    if sections is None:
        if config.model_type in MROPE_MODEL_TYPES:  # transformers then takes a released model's sections, of another head size
            raise CheckpointError(f"{path}/config.json: rope_scaling: no mrope_section; a {config.model_type} config gives its rotary "
                                  f"sections (temporal, height, width), three positive whole numbers that add up to half the attention "
                                  f"head's size, {half}")
        return
    if not (isinstance(sections, list) and len(sections) == 3 and all(type(s) is int and s >= 1 for s in sections) and sum(sections) == half):
        raise CheckpointError(f"{path}/config.json: mrope_section {sections!r}; three positive whole numbers (temporal, height, width) "
                              f"that add up to half the attention head's size, {half}")


def check_size(path: Path, config) -> None:
    """The model the config describes holds as many numbers as the weight files, read from their headers,
    before anything is allocated: a config that describes another model would be allocated first and
    found out after (a 12-billion-parameter one is killed for memory first). A tied output layer is the
    input embeddings, counted once, whether or not the files also store it. The layers are counted before
    (check_counts): building a billion layers, even on the meta device, takes all time and memory."""
    cls = native_class(config.model_type)
    # What the class leaves out on load by design (Qwen3.5's multi-token-prediction block, `mtp.*`) is not its model's.
    ignored = [re.compile(pattern) for pattern in cls._keys_to_ignore_on_load_unexpected or ()]
    shapes = {key: shape for key, shape in tensor_shapes(path).items() if not any(p.search(key) for p in ignored)}
    stored = sum(math.prod(shape) for shape in shapes.values())
    with torch.device("meta"), no_init_weights():
        model = built(path, lambda: cls(config))
    described = sum(p.numel() for p in model.parameters())
    tied_rows = model.lm_head.weight.numel() if config.tie_word_embeddings else 0
    if tied_rows and model.lm_head.weight is not model.get_input_embeddings().weight:
        described -= tied_rows  # built untied here, tied when loaded
    if tied_rows and {"lm_head.weight", "language_model.lm_head.weight", "language_model.output.weight"} & set(shapes):
        stored -= tied_rows  # the files store the tied output layer as well
    if described != stored:
        raise CheckpointError(f"{path}: config.json describes a model of {described:,} weights, the weight files hold {stored:,}")


def check_image_token(path: Path, raw: dict, tokenizer: PreTrainedTokenizerBase, token: str) -> None:
    """config.json's image_token_id is the tokenizer's image token, which prompts spell: where they differ, the
    model looked for images where no prompt puts them."""
    wanted = tokenizer.convert_tokens_to_ids(token)
    if raw.get("image_token_id") != wanted:
        raise CheckpointError(f"{path}/config.json: image_token_id {raw.get('image_token_id')!r} is not the tokenizer's {token} ({wanted})")


# The sizes a config must give, each a whole number, for the model it describes to be known.
TEXT_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
# A mixture of experts has no dense width: its experts' and its shared expert's.
MOE_TEXT_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "moe_intermediate_size", "shared_expert_intermediate_size",
                  "num_experts", "num_experts_per_tok", "vocab_size")
VISION_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "image_size", "patch_size")
# Qwen-VL's vision tower names its own.
QWEN_VISION_SIZES = ("hidden_size", "depth", "num_heads", "intermediate_size", "patch_size", "out_hidden_size")


def require(config: object, keys: tuple[str, ...], where: str, kind: str = "an original InternVL2 config") -> None:
    """`keys` are in `config`, and those that are sizes are positive whole numbers."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{where} must be an object, got {type(config).__name__}: not {kind}")
    if missing := [k for k in keys if k not in config]:
        raise CheckpointError(f"{where} lacks {', '.join(missing)}: not {kind}")
    sizes = set(TEXT_SIZES) | set(MOE_TEXT_SIZES) | set(VISION_SIZES) | set(QWEN_VISION_SIZES)
    if wrong := [f"{k} {config[k]!r}" for k in keys if k in sizes and not _size(config[k])]:
        raise CheckpointError(f"{where}: {', '.join(wrong)}: sizes must be positive whole numbers")


def _size(value: object) -> bool:
    """A positive whole number, or (a native config's image and patch sizes) a pair of them."""
    values = value if isinstance(value, list) and value else [value]
    return all(type(v) is int and v >= 1 for v in values)


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
        return readable_safetensors([path / s for s in shards])
    if (path / "model.safetensors").is_file():
        return readable_safetensors([path / "model.safetensors"])
    if any(path.glob("*.bin")):
        raise CheckpointError(f"{path}: only .bin weights found; convert them to safetensors first")
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


def readable_safetensors(files: list[Path]) -> list[Path]:
    """The files, each with a whole safetensors header (a truncated or empty one is an interrupted copy)."""
    for file in files:
        try:
            with safe_open(file, framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{file}: not a complete safetensors file ({err}); copy or download it again") from None
    return files


def chat_template_of(path: Path, tokenizer: PreTrainedTokenizerBase) -> ChatTemplate | None:
    """A native checkpoint's own Jinja chat template (its processor's chat_template.jinja or chat_template.json,
    else its tokenizer's), as a ChatTemplate (judge/templates.py); None where it has none. The tokenizer is given
    that template, so that a judge saved from it (save_native, judge-train) carries it."""
    text = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    if (jinja := path / "chat_template.jinja").is_file():
        text, where = jinja.read_text(encoding="utf-8"), jinja
    elif (stored := path / "chat_template.json").is_file():
        text, where = read_json_object(stored).get("chat_template", text), stored
    else:
        where = path / "tokenizer_config.json"
    if text is not None and not isinstance(text, str):
        raise CheckpointError(f"{where}: chat_template is a {type(text).__name__}; a judge's chat template is one Jinja string")
    if text is not None and not text.strip():
        # an empty file silently gave way to InternVL's default template: another judge than the checkpoint's
        raise CheckpointError(f"{where}: the chat template is empty; give the checkpoint's template, or remove the file")
    if text is None:
        return None
    tokenizer.chat_template = text

    def render(messages: list[dict], add_generation_prompt: bool) -> str:
        with bounded_sandbox():  # no one expression may make gigabytes (templates.py)
            return tokenizer.apply_chat_template(messages, chat_template=text, tokenize=False, add_generation_prompt=add_generation_prompt)

    try:
        return template_from_jinja(render, tokenizer.bos_token)
    except Exception as err:  # noqa: BLE001 - a template's own error (raise_exception, a missing variable) or our layout check
        raise CheckpointError(f"{path}: its chat template does not render one user turn as this toolkit renders prompts: {one_line(err)}") from None


def save_tokenizer(tokenizer: PreTrainedTokenizerBase, out_dir: str | Path) -> None:
    """A judge's tokenizer files, copied from the checkpoint they were read from (`load_tokenizer`), so that a
    trained or merged judge is read and written exactly as its base is (merges.txt and tokenizer.json with the
    merges an original Qwen2 base is read by, `write_merges_as_read`). transformers 5's `save_pretrained`
    would write tokenizer.json and a tokenizer_config.json of its own, without tokenizer.model and without
    `"legacy": false`, from which judge/detokenize.py rebuilds the reference's encoding and decoding: every
    prompt would lose its word-start token and the judge's text would be decoded by transformers."""
    source = Path(tokenizer.name_or_path)
    files = [source / name for name in TOKENIZER_FILES if (source / name).is_file()]
    if not files:  # every judge's tokenizer comes from load_tokenizer, which reads a directory of these
        raise CheckpointError(f"{source}: no tokenizer files ({', '.join(TOKENIZER_FILES)}) to copy")
    for file in files:
        shutil.copyfile(file, Path(out_dir) / file.name)
    write_merges_as_read(tokenizer, source, Path(out_dir))  # an original Qwen2 base's 4.37 merges, kept in a native judge


def read_json_object(file: Path) -> dict:
    """A checkpoint's JSON file, which must hold an object; a broken one is a CheckpointError naming it."""
    try:
        value = read_json(file, MAX_SETTINGS_BYTES)
    except InputError as err:
        raise CheckpointError("; ".join(map(str, err.problems))) from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{file}: expected a JSON object, found a {type(value).__name__}")
    return value


def native_class(model_type: str):
    """transformers' class of a native family's model."""
    import transformers

    names = {"internvl": "InternVLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
             "qwen3_vl": "Qwen3VLForConditionalGeneration", "qwen3_5": "Qwen3_5ForConditionalGeneration",
             "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration"}
    return getattr(transformers, names[model_type])
