import json
import subprocess
import sys

from safetensors import safe_open

from judge.data import load_annotations, load_samples
from judge.model import load_tokenizer
from judge.testing import SIZES, human_scores, write_dataset, write_original_checkpoint, write_tokenizer

# Offsets above the base vocabulary, as in InternVL2-4B (base 32000: <|endoftext|> is 32000, <|end|> 32007, ...).
REAL_OFFSETS = {"<|endoftext|>": 0, "<|assistant|>": 1, "<|system|>": 6, "<|end|>": 7, "<|user|>": 10, "<img>": 11, "</img>": 12, "<IMG_CONTEXT>": 13}


def test_tokenizer_has_internvl_special_tokens_at_real_offsets(tmp_path):
    write_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path)  # the loader's own path, as for a real checkpoint
    for token, offset in REAL_OFFSETS.items():
        assert tok.convert_tokens_to_ids(token) == SIZES.base_vocab + offset
        assert tok(token, add_special_tokens=False).input_ids == [SIZES.base_vocab + offset]
    assert tok.eos_token == tok.pad_token == "<|endoftext|>" and tok.bos_token == "<s>"
    assert tok("hi").input_ids[0] == tok.bos_token_id


def test_byte_fallback_round_trips_any_text(tmp_path):
    tok = write_tokenizer(tmp_path)
    text = "Ünïcødé 日本語 🚀 tabs\tand\nnewlines ### Score\n5"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
    assert tok.unk_token_id not in tok(text).input_ids


def test_original_checkpoint_layout(tmp_path):
    ckpt = write_original_checkpoint(tmp_path, seed=1, shards=2)
    config = json.loads((ckpt / "config.json").read_text())
    assert config["architectures"] == ["InternVLChatModel"] and config["template"] == "phi3-chat"
    assert config["llm_config"]["rope_scaling"]["type"] == "su" and config["llm_config"]["tie_word_embeddings"] is False
    assert config["llm_config"]["vocab_size"] % 64 == 0
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
    shapes = {}
    for shard in set(index.values()):
        with safe_open(ckpt / shard, "pt") as f:
            shapes |= {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert set(shapes) == set(index)
    v = SIZES.vision_hidden
    assert shapes["vision_model.encoder.layers.0.attn.qkv.weight"] == (3 * v, v)
    assert shapes["vision_model.embeddings.position_embedding"] == (1, 1025, v)
    assert shapes["mlp1.1.weight"] == (SIZES.llm_hidden, 4 * v)
    assert shapes["language_model.lm_head.weight"] == (SIZES.vocab_size, SIZES.llm_hidden)


def test_same_seed_same_bytes(tmp_path):
    a = write_original_checkpoint(tmp_path / "a", seed=7)
    b = write_original_checkpoint(tmp_path / "b", seed=7)
    c = write_original_checkpoint(tmp_path / "c", seed=8)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.model").read_bytes() == (c / "tokenizer.model").read_bytes()


def test_dataset_is_valid_mmie_with_real_images(tmp_path):
    path = write_dataset(tmp_path, 12, seed=3)
    samples = load_samples(path, image_root=tmp_path)  # also decodes every image
    assert [s.category for s in samples[:3]] == ["SA", "PBL", "MSR"]
    assert any(s.images() for s in samples)
    raw = json.loads(path.read_text())
    assert any(isinstance(r["answer"], str) for r in raw)  # MMIE's plain-string answers occur too


def test_annotated_scores_follow_the_documented_rule(tmp_path):
    path = write_dataset(tmp_path, 16, seed=4, annotated=True)
    annotations = load_annotations(path, image_root=tmp_path)
    assert len({a.id for a in annotations}) == 16 and len(annotations) == 16 + 4  # every 4th has a second annotator
    for a in annotations:
        answer_text = " ".join(s.text or "" for s in a.answer)
        level = next(v for word, v in {"poor": 1, "average": 3, "excellent": 5}.items() if word in answer_text)
        expected = human_scores(level, sum(s.image is not None for s in a.answer))
        if a.annotator == "ann-2":
            expected |= {"overall": min(level + 1, 6), "text_quality": min(level + 1, 6)}
        assert a.human_scores.given() == expected


def test_command_line(tmp_path, capsys):
    from judge.testing.__main__ import build_parser, main

    help_text = build_parser().format_help()
    assert "checkpoint" in help_text and "dataset" in help_text
    assert main(["dataset", "--samples", "5", "--annotated", str(tmp_path / "data")]) == 0
    assert len(json.loads((tmp_path / "data" / "data.json").read_text())) == 5 + 2
    # one real `python -m` run, as a user would type it
    done = subprocess.run([sys.executable, "-m", "judge.testing", "checkpoint", "--format", "native", str(tmp_path / "native")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert {"config.json", "model.safetensors", "judge_config.json", "tokenizer.model"} <= {p.name for p in (tmp_path / "native").iterdir()}
