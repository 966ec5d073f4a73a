"""mmjudge.judge.testing: the tiny checkpoints and synthetic datasets every other test builds on must look like
the real thing (InternVL2-4B's files, keys, token ids; MMIE's records) and be reproducible."""

import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from transformers import AutoTokenizer, InternVLForConditionalGeneration

from mmjudge.judge.data import SCORE_FIELDS, load_annotations, load_samples
from mmjudge.judge.testing import SIZES, human_scores, write_dataset, write_native_checkpoint, write_original_checkpoint, write_tokenizer
from mmjudge.judge.testing.synthetic import FEEDBACK

# Offsets above the base vocabulary, as in InternVL2-4B (base 32000: <|endoftext|> is 32000, <|end|> 32007, ...).
REAL_OFFSETS = {"<|endoftext|>": 0, "<|assistant|>": 1, "<|system|>": 6, "<|end|>": 7, "<|user|>": 10, "<img>": 11, "</img>": 12, "<IMG_CONTEXT>": 13}
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1"}


def expected_original_shapes() -> dict[str, tuple[int, ...]]:
    """InternVL2-4B's original key names, written out independently of the generator."""
    v, h, vi, hi, vocab = SIZES.vision_hidden, SIZES.llm_hidden, SIZES.vision_intermediate, SIZES.llm_intermediate, SIZES.vocab_size
    shapes = {
        "vision_model.embeddings.class_embedding": (1, 1, v),
        "vision_model.embeddings.position_embedding": (1, (SIZES.image_size // 14) ** 2 + 1, v),  # the patches + CLS
        "vision_model.embeddings.patch_embedding.weight": (v, 3, 14, 14),
        "vision_model.embeddings.patch_embedding.bias": (v,),
        "mlp1.0.weight": (4 * v,), "mlp1.0.bias": (4 * v,),
        "mlp1.1.weight": (h, 4 * v), "mlp1.1.bias": (h,),
        "mlp1.3.weight": (h, h), "mlp1.3.bias": (h,),
        "language_model.model.embed_tokens.weight": (vocab, h),
        "language_model.model.norm.weight": (h,),
        "language_model.lm_head.weight": (vocab, h),
    }
    for i in range(SIZES.vision_layers):
        pre = f"vision_model.encoder.layers.{i}."
        shapes |= {pre + "attn.qkv.weight": (3 * v, v), pre + "attn.qkv.bias": (3 * v,), pre + "attn.proj.weight": (v, v), pre + "attn.proj.bias": (v,),
                   pre + "mlp.fc1.weight": (vi, v), pre + "mlp.fc1.bias": (vi,), pre + "mlp.fc2.weight": (v, vi), pre + "mlp.fc2.bias": (v,),
                   pre + "norm1.weight": (v,), pre + "norm1.bias": (v,), pre + "norm2.weight": (v,), pre + "norm2.bias": (v,), pre + "ls1": (v,), pre + "ls2": (v,)}
    for i in range(SIZES.llm_layers):
        pre = f"language_model.model.layers.{i}."
        shapes |= {pre + "self_attn.qkv_proj.weight": (3 * h, h), pre + "self_attn.o_proj.weight": (h, h), pre + "mlp.gate_up_proj.weight": (2 * hi, h),
                   pre + "mlp.down_proj.weight": (h, hi), pre + "input_layernorm.weight": (h,), pre + "post_attention_layernorm.weight": (h,)}
    return shapes


def read_safetensors(path):
    with safe_open(path, "pt") as f:
        return f.metadata(), {k: f.get_tensor(k) for k in f.keys()}


def test_tokenizer_loads_with_auto_tokenizer_and_has_special_tokens_at_real_offsets(tmp_path):
    write_tokenizer(tmp_path)
    assert {"tokenizer.model", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"} <= {p.name for p in tmp_path.iterdir()}
    tok = AutoTokenizer.from_pretrained(tmp_path)  # no remote code, as the real tokenizer needs none
    for token, offset in REAL_OFFSETS.items():
        assert tok.convert_tokens_to_ids(token) == SIZES.base_vocab + offset
        assert tok(token, add_special_tokens=False).input_ids == [SIZES.base_vocab + offset]
    assert len(tok) == SIZES.base_vocab + 20 <= SIZES.vocab_size and SIZES.vocab_size % 64 == 0
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == ("<s>", "<|endoftext|>", "<|endoftext|>", "<unk>")
    assert (tok.bos_token_id, tok.unk_token_id) == (1, 0)
    assert tok("hi").input_ids[0] == tok.bos_token_id  # Llama-style: BOS added, no EOS
    assert tok("hi").input_ids[-1] != tok.eos_token_id
    image = "<img>" + "<IMG_CONTEXT>" * 3 + "</img>"
    assert tok(image, add_special_tokens=False).input_ids == [SIZES.base_vocab + o for o in (11, 13, 13, 13, 12)]
    for digit in "0123456789":  # every score is one token
        assert len(tok(digit, add_special_tokens=False).input_ids) in (1, 2)  # "▁" + digit at a word start
        assert tok.convert_tokens_to_ids(digit) != tok.unk_token_id
    for word in ("Question", "Answer", "Feedback", "Score", "Image"):
        assert tok.tokenize(word) == [f"▁{word}"]


def test_byte_fallback_round_trips_any_text(tmp_path):
    tok = write_tokenizer(tmp_path)
    text = "Ünïcødé 日本語 🚀 tabs\tand\nnewlines ### Score\n5<|end|>"
    ids = tok(text, add_special_tokens=False).input_ids
    assert tok.decode(ids) == text
    assert tok.unk_token_id not in ids
    assert tok.convert_tokens_to_ids("<0x0A>") in ids  # a newline is a byte piece, as in Llama's model


def test_original_checkpoint_has_internvl2_keys_config_and_shards(tmp_path):
    ckpt = write_original_checkpoint(tmp_path, seed=1, shards=3)
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    shapes, total = {}, 0
    for shard in sorted(set(index["weight_map"].values())):
        metadata, tensors = read_safetensors(ckpt / shard)
        assert metadata == {"format": "pt"}
        assert all(index["weight_map"][k] == shard for k in tensors)  # every key is where the index says
        shapes |= {k: tuple(t.shape) for k, t in tensors.items()}
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        assert all(t.dtype == torch.float32 for t in tensors.values())
    assert shapes == expected_original_shapes()
    assert index["metadata"]["total_size"] == total
    assert not (ckpt / "model.safetensors").exists()

    config = json.loads((ckpt / "config.json").read_text())
    assert (config["architectures"], config["model_type"], config["template"], config["ps_version"]) == (["InternVLChatModel"], "internvl_chat", "phi3-chat", "v2")
    assert (config["force_image_size"], config["downsample_ratio"], config["max_dynamic_patch"], config["tie_word_embeddings"]) == (SIZES.image_size, 0.5, 6, False)
    assert all(isinstance(v, str) for v in config["auto_map"].values())
    llm, vision = config["llm_config"], config["vision_config"]
    assert (llm["architectures"], llm["model_type"], llm["tie_word_embeddings"], llm["vocab_size"]) == (["Phi3ForCausalLM"], "phi3", False, SIZES.vocab_size)
    assert (llm["max_position_embeddings"], llm["original_max_position_embeddings"], llm["rope_theta"]) == (131072, 4096, 10000.0)
    rope, half_head = llm["rope_scaling"], SIZES.llm_hidden // SIZES.llm_heads // 2
    assert rope["type"] == "su" and len(rope["long_factor"]) == len(rope["short_factor"]) == half_head
    assert max(rope["long_factor"]) > 1 and max(rope["short_factor"]) > 1  # the longrope path really scales
    assert (llm["bos_token_id"], llm["eos_token_id"], llm["pad_token_id"]) == (1, SIZES.base_vocab, SIZES.base_vocab)
    assert (vision["model_type"], vision["qkv_bias"], vision["qk_normalization"], vision["image_size"], vision["patch_size"]) == ("intern_vit_6b", True, False, SIZES.image_size, 14)
    stops = json.loads((ckpt / "generation_config.json").read_text())["eos_token_id"]
    assert stops == [2, SIZES.base_vocab, SIZES.base_vocab + 7]  # </s>, <|endoftext|>, <|end|> as [2, 32000, 32007]


def test_same_seed_same_bytes(tmp_path):
    a = write_original_checkpoint(tmp_path / "a", seed=7)
    b = write_original_checkpoint(tmp_path / "b", seed=7)
    c = write_original_checkpoint(tmp_path / "c", seed=8, dtype="bfloat16")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.model").read_bytes() == (c / "tokenizer.model").read_bytes()
    _, wa = read_safetensors(a / "model.safetensors")
    _, wc = read_safetensors(c / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in wc.values())
    assert not torch.equal(wa["mlp1.1.weight"].bfloat16(), wc["mlp1.1.weight"])
    assert all((t > 0).all() for k, t in wa.items() if k.endswith(("ls1", "ls2")))


def test_native_checkpoint_loads_untied_and_runs_one_tile(tmp_path):
    ckpt = write_native_checkpoint(tmp_path, seed=1)
    assert json.loads((ckpt / "judge_config.json").read_text()) == {
        "template": "phi3-chat", "image_size": SIZES.image_size, "min_tiles": 1, "max_tiles": 6, "use_thumbnail": True}
    raw = json.loads((ckpt / "config.json").read_text())
    assert raw["tie_word_embeddings"] is False and raw["text_config"]["tie_word_embeddings"] is False
    model = InternVLForConditionalGeneration.from_pretrained(ckpt).eval()
    config = model.config
    assert config.text_config.model_type == "phi3" and config.image_token_id == SIZES.base_vocab + 13 and config.image_seq_length == SIZES.tokens_per_tile
    rope = config.text_config.rope_parameters
    assert rope["rope_type"] == "longrope" and rope["original_max_position_embeddings"] == 4096 and max(rope["long_factor"]) > 1
    assert config.vision_config.use_mean_pooling and not config.vision_config.use_qk_norm and config.vision_config.attention_bias
    embed, head = model.get_input_embeddings().weight, model.lm_head.weight
    assert head.data_ptr() != embed.data_ptr() and not torch.equal(head, embed)

    tok = AutoTokenizer.from_pretrained(ckpt)
    prompt = "<|user|>\n<img>" + "<IMG_CONTEXT>" * SIZES.tokens_per_tile + "</img>\nScore?<|end|><|assistant|>\n"
    ids = tok(prompt, return_tensors="pt").input_ids
    assert (ids == config.image_token_id).sum() == SIZES.tokens_per_tile
    with torch.no_grad():
        logits = model(input_ids=ids, pixel_values=torch.randn(1, 3, SIZES.image_size, SIZES.image_size)).logits
    assert logits.shape == (1, ids.shape[1], SIZES.vocab_size) and torch.isfinite(logits).all()


def test_dataset_is_valid_mmie_with_real_images(tmp_path):
    path = write_dataset(tmp_path, 15, seed=3)
    samples = load_samples(path, image_root=tmp_path)  # validates every record and decodes every image
    assert [s.id for s in samples[:4]] == ["SA_0001", "PBL_0002", "MSR_0003", "SA_0004"]
    assert all(s.gt_answer and s.model in ("model-a", "model-b", "model-c") for s in samples)
    raw = json.loads(path.read_text())
    assert any(isinstance(r["answer"], str) for r in raw)  # MMIE's plain-string answers occur too
    assert all(sum(g.image is not None for g in s.question) <= 2 and sum(g.image is not None for g in s.answer) <= 3 for s in samples)
    images = [tmp_path / image for s in samples for image in s.images()]
    assert {p.suffix for p in images} == {".png", ".jpg"}
    assert all(image.startswith("images/") for s in samples for image in s.images())  # relative to the data directory
    sizes = set()
    for p in images:
        with Image.open(p) as img:
            assert img.format == {".png": "PNG", ".jpg": "JPEG"}[p.suffix]
            assert 32 <= min(img.size) and max(img.size) <= 200
            sizes.add(img.size)
    assert len(sizes) > len(images) // 2  # varied sizes and aspect ratios


def test_annotated_scores_follow_the_documented_rule(tmp_path):
    path = write_dataset(tmp_path, 16, seed=4, annotated=True)
    annotations = load_annotations(path, image_root=tmp_path)
    assert len({a.id for a in annotations}) == 16 and len(annotations) == 16 + 4  # samples 1, 5, 9, 13 have a second annotator
    first = {a.id: a for a in annotations if a.annotator == "ann-1"}
    assert all(a.feedback for a in first.values())
    levels = set()
    for a in annotations:
        answer_text = " ".join(s.text or "" for s in a.answer)
        marker = next(word for word in ("poor", "average", "excellent") if f"answer is {word}." in answer_text)
        n_images = sum(s.image is not None for s in a.answer)
        expected = human_scores(marker, n_images)
        assert expected["overall"] == {"poor": 0, "average": 3, "excellent": 5}[marker] + (n_images > 0)
        scores = a.human_scores.given()
        assert set(scores) == set(SCORE_FIELDS) and all(0 <= v <= 6 for v in scores.values())
        if a.annotator == "ann-1":
            assert scores == expected
        else:
            assert a.annotator == "ann-2"
            diff = {k: abs(scores[k] - first[a.id].human_scores.given()[k]) for k in SCORE_FIELDS}
            assert diff["overall"] == diff["text_quality"] == 1 and max(diff.values()) == 1
        levels.add(scores["overall"])
    assert len(levels) >= 4  # the rule spreads the scale, so a judge has something to learn
    assert all(isinstance(v, int) for r in json.loads(path.read_text()) for v in r["human_scores"].values())  # whole numbers, as people rate


@pytest.mark.parametrize("rating", ["image", "text"])
def test_the_colour_twins_score_by_what_the_image_shows_or_what_the_text_claims_and_the_other_tells_nothing(tmp_path, rating):
    """dataset --rating image|text (the bias suite's must-show): one image per answer, mostly red or blue, and a claimed
    colour drawn apart from it; the scores follow the one the rating names, and the other carries no information."""
    import numpy as np

    path = write_dataset(tmp_path, 80, seed=5, annotated=True, rating=rating)
    annotations = load_annotations(path, image_root=tmp_path)
    assert len(annotations) == 80 and {a.annotator for a in annotations} == {"ann-1"}
    rows = []
    for a in annotations:
        (image,) = [s.image for s in a.answer if s.image is not None]
        with Image.open(tmp_path / image) as opened:
            red, _, blue = np.asarray(opened.convert("RGB"), dtype=float).reshape(-1, 3).mean(0)
        shown = "red" if red > blue else "blue"
        claimed = a.answer[-1].text.removeprefix("Overall, the picture is ").rstrip(".")
        assert claimed in ("red", "blue") and abs(red - blue) > 80  # the colour dominates the picture
        assert set(a.human_scores.given().values()) == {5 if (shown if rating == "image" else claimed) == "red" else 1}
        rows.append((shown == "red", claimed == "red", a.human_scores.given()["overall"] == 5))
    shown_red, claimed_red, high = np.array(rows).T
    other = claimed_red if rating == "image" else shown_red
    assert 0.3 < high.mean() < 0.7 and abs(np.corrcoef(other, high)[0, 1]) < 0.3  # both colours occur; the other tells little
    assert not any(s.image for a in annotations for s in a.question)  # no question image to look at instead


def test_the_critique_gives_none_of_the_facts_the_scores_follow_from(tmp_path):
    """A critique naming the quality word let a judge in training read its scores from its own critique, always
    right in the targets, rather than from the answer: where it had not learnt to write the word, it scored by
    a wrong one (judge/testing/synthetic.py). Every answer, whatever its word and images, gets one critique."""
    path = write_dataset(tmp_path, 30, seed=2, annotated=True)
    records = [r for r in json.loads(path.read_text()) if r["annotator"] == "ann-1"]
    assert len({r["human_scores"]["overall"] for r in records}) >= 4
    assert {r["feedback"] for r in records} == {FEEDBACK}
    assert not any(word in FEEDBACK for word in ("poor", "average", "excellent"))


@pytest.mark.slow
def test_command_line(tmp_path, capsys, monkeypatch):
    from mmjudge.judge.testing.__main__ import main

    monkeypatch.setenv("COLUMNS", "300")  # one line per flag, so the help reads as a whole
    for command, flags in (("checkpoint", ("--format", "--seed", "--shards", "--dtype", "(default: float32)")), ("dataset", ("--samples", "--seed", "--annotated", "--rating"))):
        with pytest.raises(SystemExit) as shown:
            main([command, "--help"])
        text = capsys.readouterr().out
        assert shown.value.code == 0 and all(f in text for f in flags)
    assert main(["dataset", "--samples", "5", "--annotated", "--seed", "1", str(tmp_path / "data")]) == 0
    records = json.loads((tmp_path / "data" / "data.json").read_text())
    assert len(records) == 5 + 2 and all("human_scores" in r for r in records)
    assert main(["dataset", "--samples", "5", "--annotated", "--rating", "image", str(tmp_path / "image")]) == 0
    assert json.loads((tmp_path / "image" / "data.json").read_text()) == json.loads(write_dataset(tmp_path / "api-image", 5, annotated=True, rating="image").read_text())
    assert main(["checkpoint", "--format", "native", "--shards", "2", str(tmp_path / "bad")]) == 2  # a usage error, not a crash
    # one real `python -m` run, as a user would type it
    done = subprocess.run([sys.executable, "-m", "mmjudge.judge.testing", "checkpoint", "--format", "original", "--shards", "2", "--seed", "5",
                           str(tmp_path / "ckpt")], capture_output=True, text=True, env=OFFLINE)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("ckpt")
    written = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors", "tokenizer.model", "tokenizer_config.json"} <= written
    api = write_original_checkpoint(tmp_path / "api", seed=5, shards=2)
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        assert (api / shard).read_bytes() == (tmp_path / "ckpt" / shard).read_bytes()  # the CLI is the API


@pytest.mark.parametrize("call", [lambda d: write_original_checkpoint(d, shards=0), lambda d: write_dataset(d, 0)])
def test_rejects_impossible_sizes(tmp_path, call):
    with pytest.raises(ValueError):
        call(tmp_path)
