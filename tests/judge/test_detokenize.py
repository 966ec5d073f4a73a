"""The judge's output as text, as MMIE's reference decodes it (judge/detokenize.py)."""

import json
from pathlib import Path

import sentencepiece as spm
import torch

from mmjudge.infer.engine import Scorer, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import load_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import encode_prompt, load_rubrics
from mmjudge.judge.testing import write_dataset, write_original_checkpoint, write_tokenizer

# 80 id sequences and the text transformers 4.37's slow SentencePiece tokenizer gave them (MMIE's
# reference), on the tiny tokenizer; how they were made: docs/exactness.md.
RECORDED = Path(__file__).parent / "reference" / "decode_transformers_4.37.json"


def score_written(judge, script: list[int], tmp_path, ignore_stop: bool):
    """The record of one synthetic sample scored by a judge made to write `script`."""
    head, calls = judge.model.lm_head, []

    class WritesTheScript(torch.nn.Module):
        def forward(self, hidden):
            logits = head(hidden)
            logits[..., script[min(len(calls), len(script) - 1)]] += 1e4
            calls.append(1)
            return logits

    judge.model.lm_head = WritesTheScript()
    data = write_dataset(tmp_path / "data", 1, seed=0).parent
    rubrics, options = load_rubrics(), ScoreOptions(max_new_tokens=len(script), max_tiles=1, ignore_stop=ignore_stop)
    items = prepare(judge, list(enumerate(load_samples(data / "data.json", data))), rubrics, data, options)
    [[(_, result)]] = list(Scorer(judge, rubrics, options, "cpu").run(items))
    return result


def test_decoding_matches_the_recorded_reference_with_byte_pieces_and_added_tokens(tmp_path):
    write_tokenizer(tmp_path)
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt"))
    cases = json.loads(RECORDED.read_text())["cases"]
    assert all(judge.decode(case["ids"]) == case["text"] for case in cases)
    # transformers 5's own decoding renders these otherwise: that is what this decoder is for
    assert sum(judge.tokenizer.decode(case["ids"], skip_special_tokens=True) != case["text"] for case in cases) > 40


def test_a_judge_that_writes_invalid_bytes_gets_the_text_sentencepiece_decodes(tmp_path):
    """The judge writes a word, then a UTF-8 sequence cut short (E2 82 without its last byte), then an ASCII
    byte, then a valid euro sign (E2 82 AC): SentencePiece keeps the valid bytes and replaces the rest."""
    checkpoint = write_original_checkpoint(tmp_path / "ckpt")
    judge = load_judge(checkpoint)
    tokenizer = judge.tokenizer
    script = [tokenizer.convert_tokens_to_ids(t) for t in ("\u2581image", "<0xE2>", "<0x82>", "<0x41>", "<0xE2>", "<0x82>", "<0xAC>")]
    result = score_written(judge, script, tmp_path, ignore_stop=True)
    expected = spm.SentencePieceProcessor(model_file=str(checkpoint / "tokenizer.model")).decode(script)
    assert result.feedback == expected == "image\ufffd\ufffdA\u20ac"
    assert tokenizer.decode(script, skip_special_tokens=True) != expected


def test_feedback_is_what_internvl_chat_returns_cut_at_a_spelled_separator_and_stripped(tmp_path):
    """The judge writes a tab and \\x1e (whitespace to Python's str.strip(), which InternVL's chat() applies),
    a word, then `<|end|>` spelled in plain pieces, more text, and its stop token: chat() returns the text
    before the spelled separator, stripped."""
    checkpoint = write_original_checkpoint(tmp_path / "ckpt")
    judge = load_judge(checkpoint)
    tokenizer = judge.tokenizer
    spelled_end = tokenizer.convert_tokens_to_ids(["<", "<0x7C>", "en", "d", "<0x7C>", ">"])
    script = [tokenizer.convert_tokens_to_ids(t) for t in ("<0x09>", "<0x1E>", "\u2581image")] + spelled_end
    script += [tokenizer.convert_tokens_to_ids("\u2581image"), tokenizer.convert_tokens_to_ids("<|end|>")]
    result = score_written(judge, script, tmp_path, ignore_stop=False)
    decoded = spm.SentencePieceProcessor(model_file=str(checkpoint / "tokenizer.model")).decode(script[:-1])
    assert decoded == "\t\x1e image<|end|> image"
    assert result.feedback == decoded.split("<|end|>")[0].strip() == "image"


# Prompts as judge-score and judge-serve build them (MMIE and tiny rubrics, tiled images, three system
# messages, a chat turn) and the ids transformers 4.37's slow SentencePiece tokenizer gave them, as
# InternVL's chat() encodes its query for MMIE's main.py; how they were made: docs/exactness.md.
RECORDED_PROMPTS = Path(__file__).parent / "reference" / "encode_transformers_4.37.json"


def test_prompts_are_encoded_as_the_reference_tokenizer_encodes_them(tmp_path):
    tokenizer = write_tokenizer(tmp_path)
    prompts = json.loads(RECORDED_PROMPTS.read_text())["prompts"]
    assert all(encode_prompt(tokenizer, p["text"], tuple(map(tuple, p["controls"]))) == p["input_ids"] for p in prompts)
    # transformers 5's own encoding lacks the word-start marker the reference reads before <|system|>
    marker = tokenizer.convert_tokens_to_ids("\u2581")
    assert all(p["input_ids"][:3] == [tokenizer.bos_token_id, marker, tokenizer.convert_tokens_to_ids("<|system|>")] for p in prompts)
    assert all(tokenizer(p["text"]).input_ids == p["input_ids"][:1] + p["input_ids"][2:] for p in prompts)


def test_judge_score_reads_every_prompt_with_the_reference_marker_and_text_alone_without_it(tmp_path):
    """judge-score's prompts (whole, bos first) get the marker; a text encoded without special tokens (a
    training target, a forced heading) is left as it is."""
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt"))
    data = write_dataset(tmp_path / "data", 3, seed=1).parent
    rubrics, options = load_rubrics(), ScoreOptions(max_tiles=1)
    items = prepare(judge, list(enumerate(load_samples(data / "data.json", data))), rubrics, data, options)
    tokenizer = judge.tokenizer
    assert all(item.input_ids[:3].tolist() == tokenizer.convert_tokens_to_ids(["<s>", "\u2581", "<|system|>"]) for item in items)
    assert encode_prompt(tokenizer, "<|assistant|>\n### Score\n", ((0, 13),), add_special_tokens=False) == \
        tokenizer("<|assistant|>\n### Score\n", add_special_tokens=False).input_ids
