"""The judge's tokens as text, and a prompt's text as tokens, the way MMIE's reference does both.

MMIE's `main.py` loads the judge's tokenizer with `use_fast=False`: for InternVL2-4B (and MMIE-Eval) that
is the SentencePiece tokenizer of the transformers release InternVL's code targets (4.37), and
`model.chat` encodes the prompt and decodes the judge's output with it, skipping special tokens.
transformers 5 has no such tokenizer any more, and its own differs from it in two places:

- Decoding: its fast tokenizer turns the same ids into other text where the judge wrote byte-fallback
  pieces (`<0xE2>`...) that are not valid UTF-8: it renders such a run as replacement characters as a
  whole, where SentencePiece keeps each valid byte and replaces only the invalid ones.
- Encoding: 4.37's tokenizer, when not 'legacy' (Phi-3's is not), starts every text with a word-start
  marker and drops it again only before one of its special tokens (bos, eos, unk, pad, additional ones).
  A phi3-chat prompt begins with `<|system|>`, an added token that is none of these, so the marker stays a
  token of its own: the reference reads `<s> ▁ <|system|> ...`, where transformers 5 gives `<s> <|system|>
  ...`, one token less. Every prompt is then read by a judge shifted by one position from what it was
  trained on and scored with by the reference (InternVL's fine-tuning code encodes with the same 4.37
  tokenizer), and a greedy answer can take another token wherever two were close.

`text_decoder` and `reference_ids` rebuild the reference's tokenizer from the checkpoint's own files: its
`tokenizer.model` and `tokenizer_config.json`. In decoding, special tokens are skipped; other added
tokens stand alone, joined to the text around them by a space; each run of SentencePiece pieces loses the
word-start marker of its first piece and is decoded by SentencePiece itself. InternLM2's tokenizer (its
checkpoints' own `tokenization_internlm2.py`, InternVL2-2B/8B) decodes each run with SentencePiece as the model
file says (which drops a first word-start marker only where the model adds one when encoding) and always
cleans the spaces before punctuation of each run, whatever the config says. A tokenizer without a
SentencePiece model (Qwen2, Llama 3) encodes and decodes with its own methods, which is what the reference
does too.

`chat_answer` is the rest of what InternVL's `chat()` does to that text before MMIE writes it.

Qwen2's tokenizer (InternVL2-1B, InternVL2.5-1B/4B, InternVL3 in their original layout): 4.37's slow Qwen2Tokenizer
reads merges.txt skipping every line that starts with "#", taking the merges of "#" runs for comments (fixed in
transformers 4.40, its PR #29929), so 121 tokens of Qwen2's vocabulary are never made: "### Question" is three
"#" tokens there, one "###" token in transformers 5. InternVL's code pins 4.37.2, and its chat() and fine-tuning
encode with that tokenizer; `without_hash_merges` gives the loaded tokenizer the same merges. A judge trained or
merged from such a checkpoint and saved in the native layout carries those merges in its own files
(`write_merges_as_read`): a native checkpoint is read as its files say, by this toolkit and by vLLM alike.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import sentencepiece as spm

if TYPE_CHECKING:  # judge.prompts imports this module, and the command lines load no transformers (tests/test_console_scripts.py)
    from transformers import PreTrainedTokenizerBase

WORD_START = "\u2581"  # SentencePiece's word-start marker


def text_decoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[int]], str]:
    reference = _reference_tokenizer(tokenizer)
    if reference is None:
        return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    processor, config, added, special = reference
    if config.get("tokenizer_class") == "InternLM2Tokenizer":
        decode_run = lambda pieces: _clean_up(processor.decode_pieces(pieces))  # noqa: E731
    else:
        decode_run = functools.partial(_decode_pieces, processor)
    # each id's piece looked up once: SentencePiece's Python wrapper cost a few microseconds a call, with which decoding
    # took a tenth of the engine's host time (benchmarks/host_overhead.py's profile); at most one entry per vocabulary id
    piece = functools.cache(processor.id_to_piece)

    def decode(ids: list[int]) -> str:
        texts, pieces = [], []
        for i in ids:
            if i in special:
                continue
            if i in added:
                if pieces and (text := decode_run(pieces)):
                    texts.append(text)
                pieces = []
                texts.append(added[i])
            else:
                pieces.append(piece(i))
        if pieces:
            texts.append(decode_run(pieces))
        text = " ".join(texts)
        return _clean_up(text) if config.get("clean_up_tokenization_spaces", True) else text

    return decode


def chat_answer(text: str, stop_text: str) -> str:
    """The decoded answer as InternVL's `chat()` returns it: cut at the first place the text spells the
    template's separator (`<|end|>` written as plain pieces), then stripped by Python's `str.strip()`, which
    also takes the control characters \\x1c-\\x1f and every other character `str.isspace()` accepts."""
    return text.split(stop_text)[0].strip()


def reference_ids(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> list[int]:
    """A whole prompt's ids (bos first, as `tokenizer(text)` gives them) as the reference's tokenizer gives
    them: with the word-start marker of its own before a first token that is added but not special (module
    doc). The same ids for a legacy or a non-SentencePiece tokenizer."""
    lead = _prompt_lead(tokenizer)
    start = 1 if ids[:1] == [tokenizer.bos_token_id] else 0
    if lead is None or len(ids) <= start:
        return ids
    marker, added_not_special = lead
    return [*ids[:start], *marker, *ids[start:]] if ids[start] in added_not_special else ids


def reference_lead(tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    """What the reference's tokenizer reads after BOS at the start of `text` (a rendered prompt) and transformers
    5's does not, as text: the lone word-start marker spelled as its piece, which transformers 5 reads as that
    token where it follows an added token such as BOS (a chat template writes it after BOS: templates.jinja);
    "" where the two read alike."""
    ids = tokenizer(text).input_ids
    start = 1 if ids[:1] == [tokenizer.bos_token_id] else 0
    extra = len(reference_ids(tokenizer, ids)) - len(ids)
    return "".join(tokenizer.convert_ids_to_tokens(reference_ids(tokenizer, ids)[start:start + extra]))


@functools.cache
def _prompt_lead(tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], frozenset[int]] | None:
    """The reference's lone word-start marker as ids, and the tokens it stays before; None where it never
    stands alone (a legacy tokenizer keeps SentencePiece's own dummy prefix, as transformers 5 does)."""
    reference = _reference_tokenizer(tokenizer)
    if reference is None or reference[1].get("legacy") is not False:
        return None
    processor, config, added, special = reference
    # 4.37 encodes the marker as text after its unk token, then drops the unk's pieces
    unk = processor.encode(_content(config.get("unk_token")) or "<unk>")
    marker = processor.encode((_content(config.get("unk_token")) or "<unk>") + WORD_START)[len(unk):]
    return marker, frozenset(set(added) - special)


def _reference_tokenizer(tokenizer: PreTrainedTokenizerBase) -> tuple[spm.SentencePieceProcessor, dict, dict[int, str], set[int]] | None:
    """The reference's SentencePiece processor, tokenizer config, added tokens (id -> text) and special
    token ids, from the checkpoint's files; None for a tokenizer without a SentencePiece model."""
    model_file = Path(getattr(tokenizer, "vocab_file", None) or "")
    config_file = model_file.parent / "tokenizer_config.json"
    if model_file.suffix != ".model" or not model_file.is_file() or not config_file.is_file():
        return None
    config = json.loads(config_file.read_text(encoding="utf-8"))
    processor = _processor(model_file, legacy=config.get("legacy") is not False)
    added = {int(i): entry["content"] for i, entry in (config.get("added_tokens_decoder") or {}).items()}
    special_names = [config.get(key) for key in ("bos_token", "eos_token", "unk_token", "pad_token")]
    special_names += config.get("additional_special_tokens") or []
    by_name = {name: i for i, name in added.items()}
    special = {by_name.get(name, processor.piece_to_id(name)) for name in map(_content, special_names) if name}
    return processor, config, added, special


def _processor(model_file: Path, legacy: bool) -> spm.SentencePieceProcessor:
    """The SentencePiece model as the reference loads it: without its dummy word-start prefix when the
    tokenizer is not 'legacy' (Phi-3's is not)."""
    processor = spm.SentencePieceProcessor()
    if legacy:
        processor.Load(str(model_file))
        return processor
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto.FromString(model_file.read_bytes())
    proto.normalizer_spec.add_dummy_prefix = False
    processor.LoadFromSerializedProto(proto.SerializeToString())
    return processor


def _decode_pieces(processor: spm.SentencePieceProcessor, pieces: list[str]) -> str:
    if pieces[0].startswith(WORD_START):
        pieces = [pieces[0][1:], *pieces[1:]]
    return processor.decode_pieces(pieces)


def _clean_up(text: str) -> str:
    """The reference's optional clean-up: no space before punctuation and English contractions."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
                           (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text


def _content(token) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken's dict."""
    return token.get("content") if isinstance(token, dict) else token


def without_hash_merges(tokenizer: PreTrainedTokenizerBase, path: Path) -> PreTrainedTokenizerBase:
    """A Qwen2 tokenizer with the merges 4.37's slow Qwen2Tokenizer reads from the checkpoint's merges.txt (every
    line starting with "#" skipped; module doc); any other tokenizer as it is."""
    merges_file = path / "merges.txt"
    if type(tokenizer).__name__ != "Qwen2Tokenizer" or not merges_file.is_file():
        return tokenizer
    from tokenizers import Tokenizer

    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    backend["model"]["merges"] = _merges_4_37(merges_file.read_text(encoding="utf-8").splitlines())
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(backend))
    return tokenizer


def _merges_4_37(lines: list[str]) -> list[list[str]]:
    """merges.txt's lines as 4.37 reads them: every one that starts with "#" skipped, its "#version" header too."""
    stripped = (line.strip() for line in lines)
    return [line.split() for line in stripped if line and not line.startswith("#")]


def write_merges_as_read(tokenizer: PreTrainedTokenizerBase, source: Path, out_dir: Path) -> None:
    """Where `tokenizer` reads the merges of `source` (its checkpoint) by 4.37's rule (`without_hash_merges`), its
    merges.txt and tokenizer.json in `out_dir` (copies of source's) rewritten to hold only those merges, so that a
    loader that follows the files, as every loader of a native checkpoint does, reads the same tokens."""
    merges_file = source / "merges.txt"
    if type(tokenizer).__name__ != "Qwen2Tokenizer" or not merges_file.is_file():
        return
    lines = merges_file.read_text(encoding="utf-8").splitlines()
    read = _merges_4_37(lines)
    dropped = any(line.strip().startswith("#") for line in lines[1:])  # the first line is the file's "#version" header
    if not dropped or len(json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]) != len(read):
        return  # nothing to drop, or a tokenizer that reads every merge (a native checkpoint's, as transformers reads it)
    header = lines[:1] if lines and lines[0].startswith("#version") else []
    (out_dir / "merges.txt").write_text("\n".join(header + [" ".join(pair) for pair in read]) + "\n", encoding="utf-8")
    if (source / "tokenizer.json").is_file():
        whole = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
        as_strings = bool(whole["model"]["merges"]) and isinstance(whole["model"]["merges"][0], str)
        whole["model"]["merges"] = [" ".join(pair) for pair in read] if as_strings else read
        (out_dir / "tokenizer.json").write_text(json.dumps(whole, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
