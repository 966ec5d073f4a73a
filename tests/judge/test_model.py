"""The loader against an independent forward pass of the original InternVL2 architecture.

`original_forward` below is written from InternVL's published design, reading the ORIGINAL state dict
(fused qkv, ls1/ls2, mlp1.*, pixel shuffle v2) with no code shared with judge/model.py. If a key rename,
the qkv split, the projector or the config mapping were wrong, the logits would differ.
"""

import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from einops import rearrange
from safetensors.torch import load_file, save_file
from transformers import Phi3Config, Phi3ForCausalLM

from mmjudge.judge.data import InputError
from mmjudge.judge.backbones.internvl import KeyMap, original_config, settings_from_original
from mmjudge.judge.checkpoint import CheckpointError, JudgeSettings
from mmjudge.judge.model import check_adapter_files, load_judge, read_settings, save_native, stored_dtypes, write_settings
from mmjudge.judge.templates import TEMPLATES
from mmjudge.judge.testing import write_native_checkpoint, write_original_checkpoint
from mmjudge.judge.testing.checkpoints import SIZES
from mmjudge.judge.tiling import TilingConfig


@pytest.fixture(scope="module")
def original_dir(tmp_path_factory):
    return write_original_checkpoint(tmp_path_factory.mktemp("original"), seed=3)


def original_state_dict(path):
    state = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(file))
    return state


def intern_vit(pixels, sd, cfg):
    """InternViT-300M as published: conv patches, CLS, position embeddings, pre-norm blocks with layer scale."""
    v = "vision_model."
    x = F.conv2d(pixels, sd[v + "embeddings.patch_embedding.weight"], sd[v + "embeddings.patch_embedding.bias"], stride=cfg["patch_size"])
    x = rearrange(x, "b c h w -> b (h w) c")
    cls = sd[v + "embeddings.class_embedding"].expand(x.shape[0], -1, -1)
    x = torch.cat([cls, x], dim=1) + sd[v + "embeddings.position_embedding"]
    heads = cfg["num_attention_heads"]
    for i in range(cfg["num_hidden_layers"]):
        p = f"{v}encoder.layers.{i}."
        h = F.layer_norm(x, x.shape[-1:], sd[p + "norm1.weight"], sd[p + "norm1.bias"], eps=cfg["layer_norm_eps"])
        qkv = rearrange(F.linear(h, sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"]), "b n (three h d) -> three b h n d", three=3, h=heads)
        scores = qkv[0] @ qkv[1].transpose(-1, -2) / math.sqrt(qkv.shape[-1])
        attn = rearrange(scores.softmax(-1) @ qkv[2], "b h n d -> b n (h d)")
        x = x + F.linear(attn, sd[p + "attn.proj.weight"], sd[p + "attn.proj.bias"]) * sd[p + "ls1"]
        h = F.layer_norm(x, x.shape[-1:], sd[p + "norm2.weight"], sd[p + "norm2.bias"], eps=cfg["layer_norm_eps"])
        h = F.linear(F.gelu(F.linear(h, sd[p + "mlp.fc1.weight"], sd[p + "mlp.fc1.bias"])), sd[p + "mlp.fc2.weight"], sd[p + "mlp.fc2.bias"])
        x = x + h * sd[p + "ls2"]
    return x


def image_embeddings(pixels, sd, config):
    x = intern_vit(pixels, sd, config["vision_config"])[:, 1:]  # select_layer -1, CLS dropped
    side = int(math.sqrt(x.shape[1]))
    # pixel shuffle v2 with ratio 0.5: each 2x2 block of patches becomes one token of 4x the width
    x = rearrange(x, "n (a1 a2 b1 b2) c -> n (a1 b1) (a2 b2 c)", a1=side // 2, a2=2, b1=side // 2, b2=2)
    x = F.layer_norm(x, x.shape[-1:], sd["mlp1.0.weight"], sd["mlp1.0.bias"], eps=1e-5)
    return F.linear(F.gelu(F.linear(x, sd["mlp1.1.weight"], sd["mlp1.1.bias"])), sd["mlp1.3.weight"], sd["mlp1.3.bias"])


def original_llm(sd, config):
    """Phi-3 with "su" (long) rope as InternVL2-4B's own modeling_phi3 defines it: short factors below the
    original 4096 context, attention scaled by sqrt(1 + ln(max / original) / ln(original))."""
    llm_config = {k: v for k, v in config["llm_config"].items() if k not in ("architectures", "auto_map", "rope_scaling", "rope_theta", "torch_dtype")}
    su = config["llm_config"]["rope_scaling"]
    rope = {"rope_type": "longrope", "short_factor": su["short_factor"], "long_factor": su["long_factor"],
            "rope_theta": config["llm_config"]["rope_theta"], "original_max_position_embeddings": llm_config["original_max_position_embeddings"]}
    llm = Phi3ForCausalLM(Phi3Config(**llm_config, rope_parameters=rope))
    llm.load_state_dict({k.removeprefix("language_model."): v for k, v in sd.items() if k.startswith("language_model.")})
    return llm.float().eval()


def original_forward(input_ids, pixels, sd, config, llm, image_token_id):
    embeds = llm.get_input_embeddings()(input_ids).clone()
    mask = input_ids == image_token_id
    embeds[mask] = image_embeddings(pixels, sd, config).reshape(-1, embeds.shape[-1])
    return llm(inputs_embeds=embeds).logits


def prompt_ids(judge, n_tiles, text="Is this a good answer?"):
    tok = judge.tokenizer
    query = "<img>" + "<IMG_CONTEXT>" * (judge.settings.images.tokens_per_tile * n_tiles) + "</img>\n" + text
    return tok(f"<|user|>\n{query}<|end|><|assistant|>\n", return_tensors="pt").input_ids


def test_original_checkpoint_matches_independent_forward(original_dir):
    judge = load_judge(original_dir)
    config = json.loads((original_dir / "config.json").read_text())
    sd = original_state_dict(original_dir)
    torch.manual_seed(0)
    pixels = torch.randn(2, 3, SIZES.image_size, SIZES.image_size)
    ids = prompt_ids(judge, n_tiles=2)
    llm = original_llm(sd, config)
    with torch.no_grad():
        expected = original_forward(ids, pixels, sd, config, llm, judge.image_token_id)
        actual = judge.model(input_ids=ids, pixel_values=pixels).logits
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)
    assert judge.source_format == "original"
    assert judge.model.lm_head.weight.data_ptr() != judge.model.get_input_embeddings().weight.data_ptr()


def test_greedy_generation_matches_independent_loop(original_dir):
    judge = load_judge(original_dir)
    config = json.loads((original_dir / "config.json").read_text())
    sd = original_state_dict(original_dir)
    llm = original_llm(sd, config)
    torch.manual_seed(1)
    pixels = torch.randn(1, 3, SIZES.image_size, SIZES.image_size)
    ids = prompt_ids(judge, n_tiles=1)
    with torch.no_grad():
        generated = judge.model.generate(input_ids=ids, pixel_values=pixels, max_new_tokens=8, do_sample=False, eos_token_id=None)
        loop = ids
        for _ in range(8):  # no cache: every step recomputes the whole sequence
            next_id = original_forward(loop, pixels, sd, config, llm, judge.image_token_id)[:, -1].argmax(-1, keepdim=True)
            loop = torch.cat([loop, next_id], dim=1)
    assert generated.tolist() == loop.tolist()


def test_one_key_map_reads_both_ways(original_dir):
    """native_tensors gives the native model's own names; original_tensors undoes it exactly, fused qkv included."""
    original = original_state_dict(original_dir)
    keys = KeyMap.of(_config(original_dir)["llm_config"])
    native = dict(pair for key, tensor in original.items() for pair in keys.native_tensors(key, tensor))
    assert native.keys() == dict(load_judge(original_dir).model.named_parameters()).keys()
    back = keys.original_tensors(native)
    assert back.keys() == original.keys() and all(torch.equal(back[k], original[k]) for k in original)
    del native["model.vision_tower.encoder.layer.1.attention.k_proj.bias"]
    with pytest.raises(CheckpointError, match=r"vision_model.encoder.layers.1.attn.qkv.bias: the model has no k projection"):
        keys.original_tensors(native)


@pytest.mark.parametrize("changes", [{}, {"system_message": "Judge strictly."}, {"template": TEMPLATES["Hermes-2"]},
                                     {"images": TilingConfig(image_size=SIZES.image_size, min_tiles=2, max_tiles=4, use_thumbnail=False, tokens_per_tile=SIZES.tokens_per_tile)}])
def test_original_config_carries_the_judges_settings_back(original_dir, changes):
    judge = load_judge(original_dir)
    config = json.loads((original_dir / "config.json").read_text())
    settings = dataclasses.replace(judge.settings, **changes)
    written = original_config(config, settings, judge.settings)
    assert settings_from_original(original_dir, written, judge.model.config) == settings
    assert ("system_message" in written) == ("system_message" in changes)  # the base's conversation.py says the rest


def test_settings_come_from_the_original_config(original_dir):
    settings = load_judge(original_dir).settings
    assert settings.template.name == "phi3-chat"
    assert settings.images.max_tiles == 6 and settings.images.use_thumbnail and settings.images.image_size == SIZES.image_size
    assert settings.images.tokens_per_tile == SIZES.tokens_per_tile
    assert settings.system_message is None  # no override: the template's default applies


def test_sharded_original_loads_the_same_weights(original_dir, tmp_path):
    sharded = write_original_checkpoint(tmp_path / "sharded", seed=3, shards=3)
    assert len(list(sharded.glob("model-*-of-00003.safetensors"))) == 3
    a, b = load_judge(original_dir).model.state_dict(), load_judge(sharded).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_save_native_round_trip_keeps_logits_and_settings(original_dir, tmp_path):
    judge = load_judge(original_dir)
    save_native(judge, tmp_path / "native")
    again = load_judge(tmp_path / "native")
    assert again.source_format == "native" and again.settings == judge.settings
    ids = prompt_ids(judge, n_tiles=1)
    pixels = torch.randn(1, 3, SIZES.image_size, SIZES.image_size)
    with torch.no_grad():
        torch.testing.assert_close(again.model(input_ids=ids, pixel_values=pixels).logits, judge.model(input_ids=ids, pixel_values=pixels).logits)


def test_native_checkpoint_written_by_transformers_loads(tmp_path):
    judge = load_judge(write_native_checkpoint(tmp_path / "native", seed=1))
    assert judge.source_format == "native" and judge.settings.template.name == "phi3-chat"
    assert judge.model.config.tie_word_embeddings is False


def test_bf16_load_keeps_dtype(original_dir):
    judge = load_judge(original_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in judge.model.parameters()} == {torch.bfloat16}


def test_system_message_read_from_conversation_py_without_executing_it(original_dir, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(original_dir, ckpt)
    (ckpt / "conversation.py").write_text(
        "raise SystemExit('this file must never run')\n"
        "register_conv_template(Conversation(name='phi3-chat', system_template='<|system|>\\n{system_message}',"
        " system_message='You are a careful judge.', roles=('<|user|>\\n', '<|assistant|>\\n'), sep='<|end|>'))\n"
    )
    assert load_judge(ckpt).settings.system == "You are a careful judge."


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda d: (d / "config.json").unlink(), "no config.json or adapter_config.json"),
        (lambda d: (d / "config.json").write_text('{"template": }'), r"config.json: invalid JSON at line 1, column 14"),
        (lambda d: _edit_config(d, architectures=["LlavaForConditionalGeneration"], model_type="llava"), "unsupported architecture"),
        (lambda d: _edit_config(d, llm_config={**_config(d)["llm_config"], "model_type": "internlm3"}), "unsupported language model 'internlm3'"),
        (lambda d: _edit_config(d, ps_version="v1"), "unsupported ps_version"),
        (lambda d: _edit_config(d, template="vicuna"), "template 'vicuna' is not one of"),
        (lambda d: [f.unlink() for f in d.glob("*.safetensors")], "no model.safetensors"),
        # found from the files' headers, before a model of the config's size is allocated
        (lambda d: _edit_config(d, vision_config={**_config(d)["vision_config"], "hidden_size": 48}), "config.json describes a model of"),
        # a billion layers took every second and byte before: by arithmetic now
        (lambda d: _edit_config(d, llm_config={**_config(d)["llm_config"], "num_hidden_layers": 10**9}),
         r"config.json describes 1,000,000,\d+ layers, and the weight files hold \d+ tensors"),
        (lambda d: _drop_config_key(d, "llm_config"), "config.json lacks llm_config"),
        (lambda d: _drop_config_key(d, "downsample_ratio"), "config.json lacks downsample_ratio"),
        (lambda d: (d / "tokenizer.model").unlink(), "the tokenizer encodes text to nothing"),
        (lambda d: (d / "conversation.py").write_text("def broken(:\n"), "conversation.py: not valid Python at line 1"),
        (lambda d: (d / "conversation.py").write_text("-" * 200_000 + "1\n"), "conversation.py: nested too deeply for Python's parser"),
        # an interrupted copy, and values of the wrong type: one line each, where they were tracebacks
        (lambda d: _truncate(d / "model.safetensors"), "model.safetensors: not a complete safetensors file"),
        (lambda d: (d / "model.safetensors").write_bytes(b""), "model.safetensors: not a complete safetensors file"),
        (lambda d: _edit_config(d, vision_config={**_config(d)["vision_config"], "hidden_size": "32"}),
         r"config.json vision_config: hidden_size '32': sizes must be positive whole numbers"),
        (lambda d: _edit_config(d, max_dynamic_patch="six"), "config.json: max_dynamic_patch: Input should be a valid integer"),
        (lambda d: _edit_config(d, use_thumbnail="sometimes"), "config.json: use_thumbnail: Input should be a valid boolean"),
        (lambda d: _edit_config(d, downsample_ratio="half"), "config.json: downsample_ratio must be a number in"),
        (lambda d: _edit_weights(d, nan="language_model.model.norm.weight"), "weights hold NaN or Infinity: model.language_model.norm.weight"),
    ],
)
def test_broken_checkpoints_fail_with_what_was_expected(original_dir, tmp_path, breakage, message):
    assert_refused(original_dir, tmp_path, breakage, message)


def assert_refused(checkpoint, tmp_path, breakage, message):
    """A copy of `checkpoint`, broken by `breakage`, does not load, and the error says `message`."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoint, ckpt)
    breakage(ckpt)
    with pytest.raises(CheckpointError, match=message):
        load_judge(ckpt)


def _config(d):
    return json.loads((d / "config.json").read_text())


def _edit_config(d, **changes):
    (d / "config.json").write_text(json.dumps({**_config(d), **changes}))


def _drop_config_key(d, key):
    (d / "config.json").write_text(json.dumps({k: v for k, v in _config(d).items() if k != key}))


def _truncate(file):
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _edit_weights(d, drop: str = "", nan: str = "", rename: tuple[str, str] = ("", ""), add: str = ""):
    """Damage model.safetensors: drop the tensors whose names hold `drop`, put a NaN in `nan`, rename one
    tensor, or add one of 2 numbers that the model does not have."""
    weights = {k: v for k, v in load_file(d / "model.safetensors").items() if not (drop and drop in k)}
    if nan:
        weights[nan] = weights[nan].clone()
        weights[nan].view(-1)[0] = float("nan")
    if rename[0]:
        weights[rename[1]] = weights.pop(rename[0])
    if add:
        weights[add] = torch.zeros(2)
    save_file(weights, d / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture(scope="module")
def native_dir(tmp_path_factory):
    return write_native_checkpoint(tmp_path_factory.mktemp("native"), seed=1)


@pytest.mark.parametrize("breakage, message", [
    # the projector was left at a random initialisation, and the judge scored with it, exit 0
    (lambda d: _edit_weights(d, drop="multi_modal_projector"), r"config.json describes a model of [\d,]+ weights, the weight files hold"),
    (lambda d: _edit_weights(d, add="bogus.weight"), r"config.json describes a model of [\d,]+ weights, the weight files hold"),
    (lambda d: _edit_weights(d, rename=("multi_modal_projector.linear_2.bias", "multi_modal_projector.linear_9.bias")),
     r"weights do not match the config: missing \['model.multi_modal_projector.linear_2.bias'\], unexpected \['model.multi_modal_projector.linear_9.bias'\]"),
    # NaN weights wrote a bare NaN into eval_result.json
    (lambda d: _edit_weights(d, nan="multi_modal_projector.linear_1.weight"), "weights hold NaN or Infinity: model.multi_modal_projector.linear_1.weight"),
    (lambda d: _truncate(d / "model.safetensors"), "model.safetensors: not a complete safetensors file"),
    # transformers filled the gap with the defaults of a 12-billion-parameter model, and the kernel killed it for memory
    (lambda d: _drop_config_key(d, "text_config"), "config.json lacks text_config: not a native InternVL config"),
    (lambda d: _edit_config(d, text_config={k: v for k, v in _config(d)["text_config"].items() if k != "hidden_size"}),
     "config.json text_config lacks hidden_size"),
    (lambda d: _edit_config(d, text_config={**_config(d)["text_config"], "num_hidden_layers": 200}), r"config.json describes 2\d\d layers, and"),
    (lambda d: _edit_config(d, text_config={**_config(d)["text_config"], "num_hidden_layers": 3}), r"config.json describes a model of"),
    (lambda d: _edit_config(d, vision_config={**_config(d)["vision_config"], "hidden_size": "32"}), "hidden_size '32': sizes must be positive"),
])
def test_a_damaged_native_checkpoint_is_refused_before_it_scores(native_dir, tmp_path, breakage, message):
    assert_refused(native_dir, tmp_path, breakage, message)


def adapter_over(base, out, **damage):
    """A LoRA adapter of `base` as PEFT saves it, optionally damaged like _edit_weights."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_judge(base).model, LoraConfig(r=2, target_modules=r".*language_model.*\.(qkv_proj|o_proj)"))
    model.save_pretrained(out)
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(base)}))
    if damage:
        weights = load_file(out / "adapter_model.safetensors")
        if (drop := damage.get("drop")):
            weights = {k: v for k, v in weights.items() if drop not in k}
        if (nan := damage.get("nan")):
            name = next(k for k in weights if nan in k)
            weights[name] = torch.full_like(weights[name], float("nan"))
        if damage.get("add"):
            weights[damage["add"]] = torch.zeros(2)
        save_file(weights, out / "adapter_model.safetensors", metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("damage, message", [
    # PEFT left a missing LoRA weight at its initialisation (B at zero: no adapter at all), with a warning
    ({"drop": "layers.1.self_attn.o_proj.lora_B"}, r"weights do not match the config: missing \['base_model.model.model.language_model.layers.1.self_attn.o_proj.lora_B.weight'\]"),
    ({"add": "base_model.model.bogus.lora_A.weight"}, r"unexpected \['base_model.model.bogus.lora_A.weight'\]"),
    ({"nan": "lora_A"}, "weights hold NaN or Infinity"),
])
def test_a_damaged_adapter_is_refused(original_dir, tmp_path, damage, message):
    assert load_judge(adapter_over(original_dir, tmp_path / "whole")).source_format == "adapter"
    with pytest.raises(CheckpointError, match=message):
        load_judge(adapter_over(original_dir, tmp_path / "damaged", **damage))


def test_every_weight_is_known_in_the_dtype_its_checkpoint_stores_it_in(tmp_path, native_dir):
    """What an adapter's merged weights are rounded to (merge_adapter): an original checkpoint's dtypes per
    tensor (here bfloat16, InternViT's fused qkv split in three), a native checkpoint's one dtype."""
    base = write_original_checkpoint(tmp_path / "bf16", seed=1, dtype="bfloat16")
    names = list(dict(load_judge(base).model.named_parameters()))
    assert stored_dtypes(base, names) == dict.fromkeys(names, torch.bfloat16)
    names = list(dict(load_judge(native_dir).model.named_parameters()))
    assert stored_dtypes(native_dir, names) == dict.fromkeys(names, torch.float32)


def test_an_adapter_loads_merged_into_its_base(original_dir, tmp_path):
    """No LoRA layer is left to run at every token: the adapter is folded into the weights it changes."""
    judge = load_judge(adapter_over(original_dir, tmp_path / "adapter"))
    assert not hasattr(judge.model, "peft_config") and not any("lora" in name for name, _ in judge.model.named_parameters())


def edited_adapter(adapter, config: dict | None = None, weights=None):
    """The adapter with its config's keys replaced by `config` and its weights passed through `weights`."""
    if config:
        (adapter / "adapter_config.json").write_text(json.dumps({**json.loads((adapter / "adapter_config.json").read_text()), **config}))
    if weights:
        save_file(weights(load_file(adapter / "adapter_model.safetensors")), adapter / "adapter_model.safetensors", metadata={"format": "pt"})
    return adapter


def _grown(weights: dict, part: str, dim: int) -> dict:
    """The weights with one more row (dim 0) or column (dim 1) in every LoRA `part` matrix."""
    return {k: torch.cat([v, v[:1] if dim == 0 else v[:, :1]], dim) if part in k else v for k, v in weights.items()}


# Each was an "internal failure" of judge-train merge and judge-score (exit 1, a traceback's last line), or a 512 GB allocation.
HOSTILE_ADAPTERS = {
    "a LoRA rank the config does not give": (dict(weights=lambda w: _grown(w, "lora_A", 0)),
                                             r"adapter_model.safetensors: holds LoRA rank 3, which adapter_config.json does not give \(r 2\)"),
    "a LoRA output of another size than the layer's": (dict(weights=lambda w: _grown(w, "lora_B", 0)),
                                                       r"adapter_model.safetensors: does not fit the base .*size mismatch for .*lora_B"),
    "target_modules that match nothing": (dict(config={"target_modules": "nothing_matches_this"}),
                                          r"adapter_config.json: does not fit the base .*Target modules nothing_matches_this not found"),
    "a rank of 1e9": (dict(config={"r": 10**9}), r"holds LoRA rank 2, which adapter_config.json does not give \(r 1000000000\)"),
    "a rank that is no number": (dict(config={"r": "2"}), r"adapter_config.json: r '2'; a LoRA rank is a whole number"),
    "an unknown peft_type": (dict(config={"peft_type": "FROBNICATE"}), r"adapter_config.json: peft_type 'FROBNICATE'; a judge's adapter is a LoRA adapter"),
    "modules_to_save the weights lack": (dict(config={"modules_to_save": ["lm_head"]}),
                                         r"adapter_model.safetensors: lacks base_model.model.lm_head.weight, which its config makes"),
    # 79 s of PEFT matching each entry against each layer, before any word
    "target_modules of 30,000 entries": (dict(config={"target_modules": [f"layer_{i}" for i in range(30_000)] + ["qkv_proj"]}),
                                         r"adapter_config.json: target_modules holds 30,001 entries; an adapter names its layers' kinds or patterns, at most 1,000"),
    "a pattern of a million characters": (dict(config={"target_modules": "(qkv_proj|" + "x" * 1_000_000 + ")"}),
                                          r"adapter_config.json: target_modules is 1,000,011 characters long; at most 10,000"),
    "a rank_pattern of 5,000 patterns": (dict(config={"rank_pattern": {f"layers.{i}.": 2 for i in range(5_000)}}), r"rank_pattern holds 5,000 entries"),
    "weights with no LoRA matrix": (dict(weights=lambda w: {"language_model.lm_head.weight": torch.zeros(2, 2)}),
                                    r"adapter_model.safetensors: holds no LoRA weights \(lora_A, lora_B\); is it a whole model's weights\?"),
}


@pytest.mark.parametrize("name", list(HOSTILE_ADAPTERS))
def test_a_hostile_adapter_is_refused_naming_its_file(original_dir, tmp_path, name):
    edits, message = HOSTILE_ADAPTERS[name]
    with pytest.raises(CheckpointError, match=message):
        load_judge(edited_adapter(adapter_over(original_dir, tmp_path / "adapter"), **edits))


def test_adapter_weights_linked_to_a_whole_models_file_are_refused_before_the_base_loads(original_dir, tmp_path, monkeypatch):
    adapter = adapter_over(original_dir, tmp_path / "adapter")
    (adapter / "adapter_model.safetensors").unlink()
    (adapter / "adapter_model.safetensors").symlink_to(original_dir / "model.safetensors")
    monkeypatch.setattr("mmjudge.judge.model.load_judge", None)  # the base is never loaded
    with pytest.raises(CheckpointError, match=r"adapter_model.safetensors: holds no LoRA weights"):
        check_adapter_files(adapter)


def test_an_adapter_config_of_300_mb_is_refused_unread(original_dir, tmp_path):
    adapter = adapter_over(original_dir, tmp_path / "adapter")
    with (adapter / "adapter_config.json").open("r+b") as f:
        f.truncate(300 * 2**20)  # read whole, it took 1 GB of memory
    with pytest.raises(CheckpointError, match=r"adapter_config.json: 314,572,800 bytes; a file of this kind holds a few kilobytes, and more than 16,777,216 is refused unread"):
        load_judge(adapter)


def test_a_refused_adapter_is_one_line_without_the_libraries_warnings(original_dir, tmp_path):
    """PEFT warns of a missing LoRA weight, and transformers of a deprecation, before the refusal that names it:
    four lines of a library's words above one of ours."""
    adapter = adapter_over(original_dir, tmp_path / "adapter", drop="layers.1.self_attn.o_proj.lora_B")
    (tmp_path / "s.json").write_text(json.dumps([{"id": "SA_1", "question": "q", "answer": "a"}]))
    done = subprocess.run([sys.executable, "-m", "mmjudge.infer.cli", "--model_path", str(adapter), "--input_dir", str(tmp_path),
                           "--input_file", "s.json", "--output_dir", str(tmp_path / "out")], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {adapter}: weights do not match the config: missing "
                                        "['base_model.model.model.language_model.layers.1.self_attn.o_proj.lora_B.weight'], unexpected []"]


def test_an_adapter_with_only_pickled_weights_is_refused_by_merge_and_never_unpickled(original_dir, tmp_path, capsys):
    from mmjudge.train.cli import main as train_main

    adapter = adapter_over(original_dir, tmp_path / "adapter")
    torch.save(load_file(adapter / "adapter_model.safetensors"), adapter / "adapter_model.bin")
    (adapter / "adapter_model.safetensors").unlink()
    assert train_main(["merge", "--adapter", str(adapter), "--output_dir", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (f"error: {adapter}: no adapter_model.safetensors (only adapter_model.bin, pickled weights, which are "
                                       "never unpickled here: save the adapter as safetensors)\n")
    assert not (tmp_path / "out").exists()


def test_an_adapter_whose_base_is_an_adapter_is_refused_not_a_recursion(original_dir, tmp_path):
    adapter = adapter_over(original_dir, tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(adapter)}))  # itself
    with pytest.raises(CheckpointError, match=r"adapter_config.json: base_model_name_or_path '.*adapter' is an adapter itself"):
        load_judge(adapter)


SETTINGS = {"template": "phi3-chat", "image_size": 448, "min_tiles": 1, "max_tiles": 6, "use_thumbnail": True}
BASE = JudgeSettings(TEMPLATES["Hermes-2"], None, TilingConfig(max_tiles=12))


@pytest.mark.parametrize("content, message", [
    ('{"template": "phi3-chat",', "invalid JSON at line 1"),
    ({**SETTINGS, "max_tiles": 0}, "max_tiles: Input should be greater than 0"),
    ({**SETTINGS, "template": "vicuna"}, "template: 'vicuna' is not one of phi3-chat"),
    ({**SETTINGS, "min_tiles": 7}, "min_tiles 7 is above max_tiles 6"),
    ({"min_tiles": 13}, "min_tiles 13 is above max_tiles 12"),  # over the base's
    ({**SETTINGS, "tiles": 6}, "tiles: Extra inputs are not permitted"),
    ({**SETTINGS, "max_pixels": 1000}, "max_pixels: settings of another backbone's image processing"),
])
def test_a_malformed_judge_config_is_named(tmp_path, content, message):
    (tmp_path / "judge_config.json").write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises((CheckpointError, InputError), match=f"judge_config.json: .*{message}"):
        read_settings(tmp_path, BASE)


def test_judge_config_is_read_as_written(tmp_path):
    (tmp_path / "judge_config.json").write_text(json.dumps({**SETTINGS, "system_message": "Be fair."}))
    settings = read_settings(tmp_path, BASE)
    assert settings.template == TEMPLATES["phi3-chat"] and settings.images.max_tiles == 6 and settings.system == "Be fair."
    again = tmp_path / "again"
    again.mkdir()
    write_settings(settings, again)
    assert json.loads((again / "judge_config.json").read_text()) == {**SETTINGS, "system_message": "Be fair."}
    assert read_settings(again, BASE) == settings


def test_a_judge_config_left_out_field_is_the_bases(tmp_path):
    (tmp_path / "judge_config.json").write_text(json.dumps({"max_tiles": 3}))
    assert read_settings(tmp_path, BASE) == dataclasses.replace(BASE, images=TilingConfig(max_tiles=3))


def su_rope(config: dict, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi-3's "su" rotary embedding as InternVL2-4B's own modeling_phi3.py computes it, from the original
    llm_config: long factors once the sequence passes original_max_position_embeddings, short below, and
    cos/sin scaled by sqrt(1 + ln(max / original) / ln(original))."""
    llm = config["llm_config"]
    dim = llm["hidden_size"] // llm["num_attention_heads"]
    original, longest = llm["original_max_position_embeddings"], llm["max_position_embeddings"]
    factors = llm["rope_scaling"]["long_factor" if positions.max() + 1 > original else "short_factor"]
    inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * llm["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    scale = math.sqrt(1 + math.log(longest / original) / math.log(original))
    return emb.cos() * scale, emb.sin() * scale


@pytest.fixture(scope="module")
def rotary(original_dir):
    return load_judge(original_dir).model.model.language_model.rotary_emb


@pytest.mark.parametrize("length", [100, 4096, 4097, 6000])  # either side of the 4096-token switch to long factors
def test_rope_is_phi3_su_below_and_beyond_the_original_context(original_dir, rotary, length):
    config = _config(original_dir)
    positions = torch.arange(length)
    cos, sin = rotary(torch.zeros(1, length, 8), positions[None])
    expected_cos, expected_sin = su_rope(config, positions)
    torch.testing.assert_close(cos[0], expected_cos, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin[0], expected_sin, rtol=1e-5, atol=1e-5)
