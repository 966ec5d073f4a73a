"""Every backbone family's adapter against the real thing it stands in for: transformers' own processors and rope
index, InternLM2's own attention layout and rotary rule, and the tokenizers of transformers 4.37 that InternVL's
code runs (tests/judge/reference/tokenizers_transformers_4.37.json, made by docs/reference/backbones/tokenizers_437.py
in a venv with that version). The end-to-end checks against InternVL's code and transformers' `generate` are in
docs/backbones.md; the engine's equality with `generate` is also checked here, on a few samples (slow)."""

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from einops import rearrange
from PIL import Image
from safetensors import safe_open

from mmjudge.judge.backbones.internvl import KeyMap, save_original
from mmjudge.judge.detokenize import text_decoder, without_hash_merges
from mmjudge.judge.checkpoint import load_tokenizer, save_tokenizer
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import render_query
from mmjudge.judge.rope import RowwiseDynamicRope
from mmjudge.judge.smart_resize import SmartResize
from mmjudge.judge.testing.families import FAMILIES, write_family_checkpoint, write_family_tokenizer
from mmjudge.judge.tiling import TilingConfig, load_tiles
from mmjudge.judge.vision import load_pixels, placeholder

REFERENCE = Path(__file__).parent / "reference" / "tokenizers_transformers_4.37.json"


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    """Each family's tiny checkpoint, written once, loaded when first asked for."""
    root, written = tmp_path_factory.mktemp("families"), {}

    def get(name: str):
        if name not in written:
            path = write_family_checkpoint(name, root / name)
            written[name] = (path, load_judge(path))
        return written[name]

    return get


RELEASED_KEYS = {  # a key each layout stores, and one it never does
    "original": ("vision_model.embeddings.class_embedding", "model.vision_tower.embeddings.cls_token"),
    "internvl": ("vision_tower.embeddings.cls_token", "vision_model.embeddings.class_embedding"),
    "qwen2_5_vl": ("visual.patch_embed.proj.weight", "model.visual.patch_embed.proj.weight"),
    "qwen3_vl": ("model.visual.patch_embed.proj.weight", "visual.patch_embed.proj.weight"),
    "qwen3_5": ("model.language_model.layers.0.linear_attn.in_proj_qkv.weight", "visual.patch_embed.proj.weight"),
    "qwen3_5_moe": ("model.language_model.layers.0.mlp.experts.0.gate_proj.weight", "model.language_model.layers.0.mlp.experts.gate_up_proj"),
}
EXPECTED = {  # native class, template's default system message (None: no system turn), image processing
    "internvl2-4b": ("InternVLForConditionalGeneration", "你是由上海", TilingConfig),
    "internvl2-1b": ("InternVLForConditionalGeneration", "你是由上海", TilingConfig),
    "internvl2-8b": ("InternVLForConditionalGeneration", "你是由上海", TilingConfig),
    "internvl2.5-8b": ("InternVLForConditionalGeneration", "你是书生·万象", TilingConfig),
    "internvl3-2b": ("InternVLForConditionalGeneration", "你是书生·万象", TilingConfig),
    "internvl3-1b-hf": ("InternVLForConditionalGeneration", None, TilingConfig),
    "qwen2.5-vl-3b": ("Qwen2_5_VLForConditionalGeneration", "You are a helpful assistant.", SmartResize),
    "qwen2.5-vl-7b": ("Qwen2_5_VLForConditionalGeneration", "You are a helpful assistant.", SmartResize),
    "qwen3-vl-4b": ("Qwen3VLForConditionalGeneration", None, SmartResize),
    "qwen3-vl-8b": ("Qwen3VLForConditionalGeneration", None, SmartResize),
    "qwen3.5-4b": ("Qwen3_5ForConditionalGeneration", None, SmartResize),
    "qwen3.5-9b": ("Qwen3_5ForConditionalGeneration", None, SmartResize),
    "qwen3.5-35b-a3b": ("Qwen3_5MoeForConditionalGeneration", None, SmartResize),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_loads_from_its_released_layout(families, name):
    path, judge = families(name)
    family = FAMILIES[name]
    native, system, images = EXPECTED[name]
    assert type(judge.model).__name__ == native and judge.source_format == family.layout
    assert (judge.settings.system or "").startswith(system or "") and (judge.settings.system is None) == (system is None)
    assert isinstance(judge.settings.images, images)
    stored, never = RELEASED_KEYS["original" if family.layout == "original" else family.llm]
    with safe_open(path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert stored in keys and never not in keys
    shared = judge.model.lm_head.weight.data_ptr() == judge.model.get_input_embeddings().weight.data_ptr()
    assert shared == family.tied and (not family.tied or not any(k.endswith("lm_head.weight") for k in keys))


def test_internlm2s_fused_wqkv_splits_into_its_own_query_key_value_heads():
    """InternLM2's attention (its modeling_internlm2.py) reads q, k, v from one wqkv projection, grouped by key-value
    head; the split gives each native projection exactly the rows that attention reads, and fusing undoes it."""
    heads, kv_heads, head_dim, hidden = 8, 2, 4, 16
    llm = {"model_type": "internlm2", "num_attention_heads": heads, "num_key_value_heads": kv_heads}
    wqkv = torch.randn((heads + 2 * kv_heads) * head_dim, hidden)
    x = torch.randn(1, 3, hidden)
    grouped = rearrange(x @ wqkv.T, "b q (h gs d) -> b q h gs d", gs=2 + heads // kv_heads, d=head_dim)  # as InternLM2Attention
    q, k, v = rearrange(grouped[..., : heads // kv_heads, :], "b q h gs d -> b q (h gs) d"), grouped[..., -2, :], grouped[..., -1, :]
    keys = KeyMap.of(llm)
    parts = dict(keys.native_tensors("language_model.model.layers.0.attention.wqkv.weight", wqkv))
    prefix = "model.language_model.layers.0.self_attn."
    for name, expected in (("q", q), ("k", k), ("v", v)):
        torch.testing.assert_close((x @ parts[f"{prefix}{name}_proj.weight"].T).view(1, 3, -1, head_dim), expected, rtol=0, atol=0)
    assert torch.equal(keys.original_tensors(parts)["language_model.model.layers.0.attention.wqkv.weight"], wqkv)


def _reference_dynamic_rope(base: float, factor: float, longest: int, dim: int, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """InternLM2's dynamic NTK rope for one sequence whose positions are `positions` (its modeling_internlm2.py)."""
    length = max(positions) + 1
    if length > longest:
        base = base * ((factor * length / longest) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
    freqs = torch.einsum("i,j->ij", torch.arange(length).to(inv_freq.dtype), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[positions], emb.sin()[positions]


def test_internlm2s_dynamic_rope_is_each_rows_own_on_both_sides_of_the_switch():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=100,
                         rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1000000.0})
    rope = RowwiseDynamicRope(LlamaRotaryEmbedding(config))
    lengths = [60, 100, 101, 250]  # below, at and beyond the switch at 100 positions
    width = max(lengths)
    positions = torch.stack([torch.minimum(torch.arange(width), torch.tensor(n - 1)) for n in lengths])  # pads repeat the last
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), positions)
    for row, n in enumerate(lengths):
        expected_cos, expected_sin = _reference_dynamic_rope(1000000.0, 2.0, 100, 16, list(range(n)))
        assert torch.equal(cos[row, :n], expected_cos) and torch.equal(sin[row, :n], expected_sin)
    # a token written at position 300 of its row: the base of a 301-token sequence
    cos, _ = rope(torch.zeros(1), torch.tensor([[300]]))
    assert torch.equal(cos[0, 0], _reference_dynamic_rope(1000000.0, 2.0, 100, 16, [300])[0][0])


def _images(tmp_path: Path, count: int, seed: int) -> list[Path]:
    """Images of every mode and of sizes around the least and most pixels of the tiny processors."""
    rng = random.Random(seed)
    paths = []
    for k in range(count):
        mode = ["RGB", "RGBA", "L", "P", "LA"][k % 5]
        width, height = rng.choice([20, 33, 56, 64, 97, 140, 211, 400, 1000]), rng.choice([17, 28, 60, 90, 150, 333, 512])
        image = Image.effect_noise((width, height), 60).convert(mode if mode != "P" else "RGB")
        if mode == "P":
            image = image.convert("P", palette=Image.Palette.ADAPTIVE)
        if mode in ("RGBA", "LA"):
            image.putalpha(Image.linear_gradient("L").resize((width, height)))
        path = tmp_path / f"image_{k}.png"
        image.save(path)
        paths.append(path)
    return paths


@pytest.mark.parametrize("name", ["qwen2.5-vl-7b", "qwen3-vl-8b"])
def test_smart_resize_is_qwens_own_image_processor(tmp_path, name):
    """The same pixels and grids as transformers' Qwen2VLImageProcessor (its PIL backend: the default one needs
    torchvision), over images below, within and above its least and most pixels, with and without transparency."""
    from transformers import AutoImageProcessor

    from mmjudge.judge.backbones.qwen_vl import native_settings
    from mmjudge.judge.testing.families import _native_config, _processor_config

    family = FAMILIES[name]
    write_family_tokenizer(family, tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(_processor_config(family)))
    (tmp_path / "config.json").write_text(json.dumps(_native_config(family, {"<|endoftext|>": 1, "<|im_end|>": 2, "<|image_pad|>": 3,
                                                                             "<|video_pad|>": 4, "<|vision_start|>": 5, "<|vision_end|>": 6})))
    from transformers import AutoConfig

    resize = native_settings(tmp_path, AutoConfig.from_pretrained(tmp_path), load_tokenizer(tmp_path, ())).images
    official = AutoImageProcessor.from_pretrained(tmp_path)
    assert type(official).__name__ == "Qwen2VLImageProcessorPil"
    for path in _images(tmp_path, 15, seed=3):
        with Image.open(path) as image:
            expected = official(images=[image], return_tensors="pt")
            planned = resize.plan(*image.size)
        ours = load_pixels(path, resize)
        assert torch.equal(ours.values, expected["pixel_values"]) and torch.equal(ours.grids, expected["image_grid_thw"])
        assert planned == (1, ours.tokens) == (1, int(expected["image_grid_thw"].prod()) // resize.merge_size**2)


def test_an_hf_internvl_checkpoints_tiles_are_its_processors(tmp_path):
    """InternVL's tiling as transformers' GotOcr2 processor does it for a -hf checkpoint: the same grid and
    thumbnail as InternVL's own code, transparency composited onto white."""
    from transformers import AutoImageProcessor

    from mmjudge.judge.testing.families import _processor_config

    (tmp_path / "preprocessor_config.json").write_text(json.dumps(_processor_config(FAMILIES["internvl3-1b-hf"])))
    official = AutoImageProcessor.from_pretrained(tmp_path)
    tiling = TilingConfig(image_size=56, max_tiles=6, on_white=True)
    for path in _images(tmp_path, 10, seed=4):
        with Image.open(path) as image:
            expected = official(images=[image], crop_to_patches=True, max_patches=6, return_tensors="pt")["pixel_values"]
        assert torch.equal(load_tiles(path, tiling), expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-vl-7b", "qwen3-vl-4b"])
def test_mrope_positions_are_the_models_own_rope_index(families, name):
    """Each row's 3-D positions and delta, as the native model's get_rope_index computes them for one sequence."""
    _, judge = families(name)
    backbone, model = judge.backbone, judge.model.model
    rng = random.Random(0)
    for _ in range(5):
        grids, ids = [], []
        for _ in range(rng.randint(0, 3)):
            ids += [rng.randrange(100, 200) for _ in range(rng.randint(1, 6))]
            t, h, w = 1, 2 * rng.randint(1, 5), 2 * rng.randint(1, 5)
            grids.append([t, h, w])
            ids += [judge.image_token_id] * (h * w // 4)
        ids += [rng.randrange(100, 200) for _ in range(rng.randint(1, 6))]
        input_ids = torch.tensor(ids)
        grid = torch.tensor(grids) if grids else None
        positions, delta = backbone.positions(input_ids, grid)
        if grid is None:
            assert torch.equal(positions, torch.arange(len(ids)).expand(3, -1)) and delta == 0
            continue
        expected, deltas = model.get_rope_index(input_ids[None], mm_token_type_ids=(input_ids == judge.image_token_id).int()[None], image_grid_thw=grid)
        assert torch.equal(positions, expected[:, 0]) and delta == int(deltas[0, 0])


QWEN_CONTENT = [{"type": "text", "text": "Question: what?\nImage-0: "}, {"type": "image"}, {"type": "text", "text": "\nAnswer:  two  spaces\n"}]


@pytest.mark.parametrize("name", ["qwen2.5-vl-7b", "qwen3-vl-8b", "qwen3.5-9b", "internvl3-1b-hf", "internvl2-8b"])
@pytest.mark.parametrize("system", [None, "Judge strictly."])
def test_a_checkpoints_jinja_template_is_read_as_data(tmp_path, name, system):
    """The template read off the checkpoint's Jinja renders a user turn as the checkpoint's own template renders it
    (its apply_chat_template), system message given or not; Qwen3.5's as it renders a turn before an answer (thinking
    off), each message's ends stripped."""
    from mmjudge.judge.checkpoint import chat_template_of

    family = FAMILIES[name]
    write_family_tokenizer(family, tmp_path)
    tokenizer = load_tokenizer(tmp_path, ())
    template = chat_template_of(tmp_path, tokenizer)
    messages = [{"role": "system", "content": system}] if system else []
    if family.llm in ("qwen2_5_vl", "qwen3_vl", "qwen3_5"):
        images = (("<|vision_start|>", "<|image_pad|>", "<|vision_end|>"), QWEN_CONTENT)
        rendered = tokenizer.apply_chat_template(messages + [{"role": "user", "content": images[1]}], tokenize=False, add_generation_prompt=True,
                                                 enable_thinking=False)
        ours, _ = render_query(template, ["Question: what?\nImage-0: ", None, "\nAnswer:  two  spaces\n"],
                               [placeholder(SmartResize(1, 1), 1)], system)
    else:
        query = "Question: what?\nAnswer:  two  spaces\n"
        rendered = tokenizer.apply_chat_template(messages + [{"role": "user", "content": query}], tokenize=False, add_generation_prompt=True)
        rendered = rendered.removeprefix(tokenizer.bos_token or "")
        ours, _ = render_query(template, [query], [], system)
    assert ours == rendered


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """Each family's tiny checkpoint, written once, not loaded."""
    root = tmp_path_factory.mktemp("family_dirs")
    return lambda name: (root / name) if (root / name).is_dir() else write_family_checkpoint(name, root / name)


def _set(part: str = "", **values):
    """An edit of a config: `values` set at its top, or in its object `part`."""
    return lambda config: (config[part] if part else config).update(values)


# What a checkpoint's files may ask, each of which hung (a config of a billion layers built a list per layer; a
# billion tiles or pixels an image) or failed with a traceback at load or at the first image.
@pytest.mark.parametrize("name, file, edit, message", [
    ("qwen2.5-vl-7b", "config.json", _set(num_hidden_layers=10**9), r"config.json describes 1,000,000,002 layers, and the weight files hold \d+ tensors"),
    ("qwen2.5-vl-7b", "config.json", _set("vision_config", depth=10**9), "config.json describes 1,000,000,002 layers"),
    ("internvl3-1b-hf", "config.json", _set("text_config", num_hidden_layers=10**9), "config.json describes 1,000,000,002 layers"),
    ("internvl2-1b", "config.json", _set("llm_config", num_hidden_layers=10**9), "config.json describes 1,000,000,002 layers"),
    ("qwen2.5-vl-7b", "config.json", _set("rope_scaling", mrope_section=[1, 1, 1]), r"mrope_section \[1, 1, 1\]; three positive whole numbers .* add up to .* 16"),
    # Qwen3.5 rotates a quarter of each 64-wide head: its sections share 8, not 32
    ("qwen3.5-9b", "config.json", lambda config: config["text_config"]["rope_parameters"].update(mrope_section=[11, 11, 10]),
     r"mrope_section \[11, 11, 10\]; three positive whole numbers .* add up to .* 8$"),
    # issue 56: each was an internal error at the first image (transformers' own sections; the string's characters as numbers)
    ("qwen2.5-vl-7b", "config.json", lambda config: config.pop("rope_scaling"), r"config.json: rope_scaling: no mrope_section; a qwen2_5_vl config"),
    ("qwen2.5-vl-7b", "preprocessor_config.json", _set(image_mean="0.5"), r"preprocessor_config.json: image_mean '0.5': three finite numbers"),
    ("qwen2.5-vl-7b", "preprocessor_config.json", _set(image_std=[0.5, 0, 0.5]), r"image_std \[0.5, 0, 0.5\]: three finite numbers.*none of them 0"),
    ("qwen2.5-vl-7b", "config.json", _set(num_attention_heads=3), "config.json: hidden_size 128 is not a multiple of its 3 attention heads"),
    ("qwen2.5-vl-7b", "config.json", _set(num_key_value_heads=0), "config.json: num_key_value_heads 0 does not divide its 4 attention heads"),
    ("qwen2.5-vl-7b", "config.json", _set("vision_config", num_heads=3), "config.json vision_config: hidden_size 32 is not a multiple of its 3 attention heads"),
    ("internvl2-1b", "config.json", _set("llm_config", num_attention_heads=3), "config.json llm_config: hidden_size 128 is not a multiple"),
    ("qwen2.5-vl-7b", "config.json", _set(image_token_id=10**6), r"config.json: image_token_id 1000000 is not the tokenizer's <\|image_pad\|> \(\d+\)"),
    ("internvl3-1b-hf", "config.json", _set(image_token_id=-1), r"config.json: image_token_id -1 is not the tokenizer's <IMG_CONTEXT>"),
    ("internvl3-1b-hf", "config.json", _set(downsample_ratio=0.0), r"config.json: downsample_ratio must be a number in \(0, 1\], got 0.0"),
    ("qwen2.5-vl-7b", "preprocessor_config.json", _set(min_pixels=10**9, max_pixels=10**9),
     "an image at its 1,000,000,000 pixels takes 1,275,510 image tokens, more than the judge's context of 128,000 tokens"),
    ("qwen2.5-vl-7b", "preprocessor_config.json", _set(min_pixels=10**9), "preprocessor_config.json: min_pixels 1000000000 is above max_pixels"),
    ("qwen2.5-vl-7b", "preprocessor_config.json", _set(patch_size=0), "preprocessor_config.json: patch_size 0: a positive whole number"),
    ("internvl3-1b-hf", "preprocessor_config.json", _set(max_patches=10**9), "an image at its 1,000,000,000 tiles takes [\\d,]+ image tokens, more than"),
    ("internvl3-1b-hf", "preprocessor_config.json", _set(max_patches="12"), "preprocessor_config.json: max_patches '12': a positive whole number"),
    ("internvl2-1b", "config.json", _set(max_dynamic_patch=10**9), "an image at its 1,000,000,000 tiles takes [\\d,]+ image tokens, more than"),
])
def test_what_a_checkpoint_may_ask_is_bounded_and_checked_at_load(family_dirs, tmp_path, name, file, edit, message):
    from mmjudge.judge.checkpoint import CheckpointError

    checkpoint = tmp_path / name
    shutil.copytree(family_dirs(name), checkpoint)
    config = json.loads((checkpoint / file).read_text())
    edit(config)
    (checkpoint / file).write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        load_judge(checkpoint)


# Templates that render forever, that write gigabytes, and that are empty: each refused at load by name.
LOOPING = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
WRITING = "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endfor %}"


@pytest.mark.parametrize("file, text, said", [
    ("chat_template.jinja", LOOPING, "takes more than 0.5 s to render"),
    ("chat_template.jinja", WRITING, "writes more than 1,000,000 characters"),
    # issue 56: one expression, made by Python's own code in one step (and folded by Jinja at compile time): 10.6 GB
    ("chat_template.jinja", "{{ 'x' * 4000000000 }}", r"an expression of it \(\*\) makes a value of more than 1,000,000 characters"),
    ("chat_template.jinja", "{% set n = 400000 %}{{ ([1] * 3 + [2]) * n }}", r"an expression of it \(\*\) makes a value of more than"),
    ("chat_template.jinja", "{{ 10 ** 1000000000 }}", r"an expression of it \(\*\*\) makes a value of more than"),
    ("chat_template.jinja", "", "chat_template.jinja: the chat template is empty"),
    ("chat_template.json", json.dumps({"chat_template": " \n"}), "chat_template.json: the chat template is empty"),
    ("chat_template.json", json.dumps({"chat_template": [{"name": "default", "template": "x"}]}), "chat_template is a list"),
])
def test_a_checkpoints_jinja_template_is_rendered_within_limits_and_never_empty(tmp_path, monkeypatch, file, text, said):
    """A template with nested loops rendered at load for 200 s and counting, one wrote a 4 GB string, and an empty
    chat_template.jinja silently gave way to InternVL's default template (another judge than the checkpoint's)."""
    from mmjudge.judge import templates
    from mmjudge.judge.checkpoint import CheckpointError, chat_template_of

    monkeypatch.setattr(templates, "RENDER_SECONDS", 0.5)  # the loop runs for hours: any limit finds it
    write_family_tokenizer(FAMILIES["qwen2.5-vl-7b"], tmp_path)
    (tmp_path / "chat_template.json").unlink()
    (tmp_path / file).write_text(text)
    tokenizer = load_tokenizer(tmp_path, ())
    with pytest.raises(CheckpointError, match=said):
        chat_template_of(tmp_path, tokenizer)


@pytest.mark.parametrize("name, family", [("internlm2", "internvl2-8b"), ("qwen2", "internvl3-2b")])
def test_the_tokenizers_encode_and_decode_as_internvls_pinned_transformers_does(tmp_path, name, family):
    """InternLM2's tokenizer (its remote code, carried here) and Qwen2's slow one, as transformers 4.37.2 runs them
    for InternVL's chat(): the ids of 54 texts and the text of 150 id sequences. Qwen2's slow tokenizer of that
    version never merges a run of "#" (judge/detokenize.py): without that rule, 1 of the texts ("### Score")
    would be encoded otherwise."""
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))[name]
    write_family_tokenizer(FAMILIES[family], tmp_path)
    loaded = load_tokenizer(tmp_path, ())
    tokenizer = without_hash_merges(loaded, tmp_path)
    decode = text_decoder(tokenizer)
    assert [tokenizer(text).input_ids for text, _ in reference["encode"]] == [ids for _, ids in reference["encode"]]
    assert [decode(ids) for ids, _ in reference["decode"]] == [text for _, text in reference["decode"]]
    if name == "qwen2":
        plain = load_tokenizer(tmp_path, ())
        assert sum(plain(text).input_ids != ids for text, ids in reference["encode"]) == 1


def test_a_judge_saved_from_an_original_qwen2_base_is_read_by_the_merges_its_base_is_read_by(tmp_path):
    """save_tokenizer writes the merges the tokenizer reads: a native judge trained or merged from InternVL3-2B's
    original layout read "###" as one token where training read three (8 tokens fewer a prompt); any loader of
    the files (transformers, vLLM) now reads what judge-train trained on. A native Qwen2 tokenizer is copied as is."""
    text = "### Question\nWhat? ## a # b\n#### Score\n"
    (tmp_path / "base").mkdir()
    write_family_tokenizer(FAMILIES["internvl3-2b"], tmp_path / "base")
    as_read = without_hash_merges(load_tokenizer(tmp_path / "base", ()), tmp_path / "base")
    (tmp_path / "saved").mkdir()
    save_tokenizer(as_read, tmp_path / "saved")
    ids = as_read(text).input_ids
    assert load_tokenizer(tmp_path / "saved", ())(text).input_ids == ids != load_tokenizer(tmp_path / "base", ())(text).input_ids
    (tmp_path / "native").mkdir()
    save_tokenizer(load_tokenizer(tmp_path / "base", ()), tmp_path / "native")
    assert all((tmp_path / "native" / f.name).read_bytes() == f.read_bytes() for f in (tmp_path / "base").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["internvl2-8b", "internvl2-1b"])
def test_an_original_layout_is_written_back_as_it_was(families, tmp_path, name):
    """Loaded and exported again untrained, every original tensor comes back bit for bit: InternLM2's fused wqkv
    regrouped, Qwen2's biases, the vision tower's fused qkv."""
    path, judge = families(name)
    out = save_original(judge, path, tmp_path / "exported")
    with safe_open(path / "model.safetensors", "pt") as a, safe_open(out / "model.safetensors", "pt") as b:
        assert set(a.keys()) == set(b.keys()) and all(torch.equal(a.get_tensor(k), b.get_tensor(k)) for k in a.keys())
    assert json.loads((out / "config.json").read_text()) == json.loads((path / "config.json").read_text())


class ImagesAndText:
    """transformers' official processor of a native family for text and images (its video processor, which needs
    torchvision, left out; its image processor's PIL backend)."""

    def __new__(cls, path: Path, model_type: str):
        from transformers import AutoImageProcessor, AutoTokenizer, InternVLProcessor, Qwen2_5_VLProcessor, Qwen3VLProcessor

        official = {"qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor, "qwen3_5": Qwen3VLProcessor, "qwen3_5_moe": Qwen3VLProcessor, "internvl": InternVLProcessor}[model_type]
        processor = type("Processor", (official,), {"get_attributes": classmethod(lambda c: ["image_processor", "tokenizer"])})
        tokenizer = AutoTokenizer.from_pretrained(path)
        return processor(AutoImageProcessor.from_pretrained(path), tokenizer, None, chat_template=tokenizer.chat_template,
                         **({"image_seq_length": 4} if model_type == "internvl" else {}))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen2.5-vl-7b", "qwen3-vl-4b", "internvl3-1b-hf", "qwen3.5-9b"])
def test_the_engine_writes_what_transformers_generate_writes_with_the_official_processor(families, tmp_path, name):
    """Batch size 1, greedy, the checkpoint loaded by transformers itself and its inputs made by the official
    processor from the same user turn: the same prompt ids and pixels, the same tokens and logits at every step."""
    from concurrent.futures import Future

    from transformers import AutoModelForImageTextToText

    from mmjudge.infer.scheduler import Request
    from mmjudge.infer.engine import _load_pixels, judge_decoder, prepare
    from mmjudge.infer.options import ScoreOptions
    from mmjudge.judge.data import load_samples
    from mmjudge.judge.prompts import build_prompt, load_rubrics
    from mmjudge.judge.testing import write_dataset

    path, judge = families(name)
    data = write_dataset(tmp_path / "data", 4, seed=5).parent
    samples, rubrics = load_samples(data / "data.json", data), load_rubrics()
    items = prepare(judge, list(enumerate(samples)), rubrics, data, ScoreOptions(max_tiles=2))
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    processor = ImagesAndText(path, model.config.model_type)
    vocabulary = model.config.get_text_config().vocab_size
    decoder = judge_decoder(judge, "cpu", None, columns=list(range(vocabulary)))
    for item, sample in zip(items, samples):
        pixels = _load_pixels(item, torch.float32, pin=False)
        future = Future()
        future.set_result(pixels)
        ours = next(c for done in decoder.generate([Request(0, item.input_ids.long())], lambda r: future, 6) for c in done)
        query = build_prompt(sample, rubrics[sample.category], judge.settings.template, None, data, judge.settings.images.with_max_tiles(2)).query
        if model.config.model_type == "internvl":
            content = query.replace("<image>", processor.image_token)
        else:
            pieces = query.split("<image>")  # the texts around each image, and the images, as content items
            content = [item for k, piece in enumerate(pieces)
                       for item in [{"type": "text", "text": piece}] * bool(piece) + [{"type": "image"}] * (k < len(pieces) - 1)]
        # Qwen3.5's judge is prompted as its template renders a turn before an answer: thinking off (judge/templates.py)
        text = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True,
                                             enable_thinking=False)
        images = [Image.open(image.path) for image in item.images]
        inputs = processor(text=[text], images=images or None, return_tensors="pt", **({"max_patches": 2} if model.config.model_type == "internvl" else {}))
        assert inputs["input_ids"][0].tolist() == item.input_ids.tolist()
        if pixels is not None:
            assert torch.equal(inputs["pixel_values"], pixels.values)
        with torch.no_grad():
            reference = model.generate(**inputs, max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
        written = reference.sequences[0, inputs["input_ids"].shape[1]:].tolist()
        # up to a row of the output layer past the tokenizer, which the reference may write and the engine never does
        # (the tiny judges' rows are rounded up to a multiple of 64, as real ones are): the step's logits still compare
        cut = next((k for k, token in enumerate(written) if token >= len(judge.tokenizer)), len(written))
        assert ours.tokens[:cut] == written[:cut] and (cut < len(written) or len(ours.tokens) == len(written))
        torch.testing.assert_close(ours.logits[: cut + 1], torch.stack(reference.logits)[: cut + 1, 0], rtol=0, atol=2e-5)


def test_the_testing_command_writes_a_family_checkpoint(tmp_path, capsys):
    from mmjudge.judge.testing.__main__ import main

    assert main(["checkpoint", "--family", "qwen3-vl-4b", str(tmp_path / "q")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == str(tmp_path / "q")  # the path it wrote, last
    assert json.loads((tmp_path / "q" / "config.json").read_text())["model_type"] == "qwen3_vl"
    assert main(["checkpoint", "--family", "qwen3-vl-4b", "--shards", "2", str(tmp_path / "r")]) == 2
    assert "--shards, --dtype and --system_message apply to --format original only" in capsys.readouterr().err


def test_the_testing_command_gives_a_judge_its_own_system_message(tmp_path, capsys):
    """The demo's judge says "You are a judge." rather than InternVL2's default, 156 of the tiny tokenizer's tokens: half
    of each prompt the demo trains on. config.json carries it, and the loaded judge prompts with it."""
    from mmjudge.judge.testing.__main__ import main

    assert main(["checkpoint", "--format", "original", "--system_message", "You are a judge.", str(tmp_path / "j")]) == 0
    assert load_judge(tmp_path / "j").settings.system == "You are a judge."
    assert main(["checkpoint", "--format", "native", "--system_message", "You are a judge.", str(tmp_path / "n")]) == 2
    assert "--system_message apply to --format original only" in capsys.readouterr().err
