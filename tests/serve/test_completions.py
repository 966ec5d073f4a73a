"""A chat answer's text as it is written: stop sequences cut where the text first holds one, and a stream's
pieces put together are the whole text, with a decoder whose clean-up changes text already written (as
SentencePiece's and transformers' do: " ." becomes ".", a half-written character is U+FFFD)."""

import random

import pytest

from mmjudge.serve.completions import ChoiceText

PIECES = ["a", " b", "c", " .", " n't", " ", "\ufffd", "é", "d", " stop", "!", "x"]
STOP_ID = 99


def decode(ids: list[int]) -> str:
    text = "".join(PIECES[i] for i in ids)
    text = text.replace(" .", ".").replace(" n't", "n't")  # transformers' clean_up_tokenization
    return text.replace("\ufffdé", "é")  # a character whose first byte alone is U+FFFD


def streamed(tokens: list[int], stops: list[str]) -> tuple[str, ChoiceText]:
    """What a live stream sends token by token, then what the whole answer says."""
    live, sent = ChoiceText(decode, stops, (STOP_ID,)), ""
    for token in tokens:
        going = live.add(token)
        settled = live.settled()
        assert settled.startswith(sent)  # nothing sent is ever taken back
        sent = settled
        if not going:
            break
    return sent, ChoiceText.of(tokens, decode, stops, (STOP_ID,))


@pytest.mark.parametrize("seed", range(300))
def test_a_stream_puts_together_the_whole_answer_and_stops_where_the_text_first_holds_a_stop(seed):
    rng = random.Random(seed)  # random answers, the same on every run
    tokens = [rng.randrange(len(PIECES)) for _ in range(rng.randrange(1, 30))]
    if rng.random() < 0.2:
        tokens.insert(rng.randrange(len(tokens) + 1), STOP_ID)
    stops = rng.sample(["b c", ".", "n't", "d!", "stop", "zz"], rng.randrange(0, 3))
    sent, whole = streamed(tokens, stops)
    assert whole.text.startswith(sent)
    # the reference: the text after each token, the first that holds a stop sequence cut before it
    for k in range(1, len(tokens) + 1):
        if tokens[k - 1] == STOP_ID:
            text, reason = decode(tokens[: k - 1]), "stop"
            break
        prefix = decode(tokens[:k])
        if found := [prefix.find(s) for s in stops if s in prefix]:
            text, reason = prefix[: min(found)], "stop"
            break
    else:
        text, reason = decode(tokens), "length"
    assert whole.text == text and whole.finish_reason() == reason, (tokens, stops)


def test_text_that_may_still_change_is_held_back():
    choice = ChoiceText(decode, ["stop"], (STOP_ID,))
    # from the last whitespace on, text may still change ("b ." -> "b."), and so may a half-written character
    for token, settled in [(0, "a"), (1, "a"), (2, "a"), (3, "a"), (10, "a"), (5, "a bc.!"), (6, "a bc.!"), (7, "a bc.!"), (0, "a bc.!")]:
        choice.add(token)
        assert choice.settled() == settled, (token, choice.text)
    choice = ChoiceText(decode, ["d!"], (STOP_ID,))
    for token in (0, 8):
        choice.add(token)
    assert choice.text == "ad" and choice.settled() == "a"  # "d" may begin "d!"
    assert not choice.add(10) and choice.text == "a" and choice.settled() == "a" and choice.finish_reason() == "stop"


def test_the_bytes_of_an_answers_tokens_joined_spell_it_where_a_character_takes_byte_fallback_tokens(tmp_path):
    """OpenAI's logprobs `bytes` are there to rebuild characters split over tokens: a byte-fallback token's
    are its own byte, not those of the U+FFFD its text alone shows."""
    from types import SimpleNamespace

    import torch

    from mmjudge.infer.grammar import Vocabulary
    from mmjudge.judge.checkpoint import load_tokenizer
    from mmjudge.judge.testing import write_original_checkpoint
    from mmjudge.judge.tiling import IMAGE_TOKENS
    from mmjudge.serve.completions import logprob_entries

    tokenizer = load_tokenizer(write_original_checkpoint(tmp_path / "judge", seed=0), IMAGE_TOKENS)
    tokens = tokenizer("a ȝ b", add_special_tokens=False).input_ids
    assert any(tokenizer.convert_ids_to_tokens(t).startswith("<0x") for t in tokens)  # the character is spelled in bytes
    vocabulary = Vocabulary.of(tokenizer, len(tokenizer), tokenizer.eos_token_id)
    completion = SimpleNamespace(top_logprobs=torch.zeros(len(tokens), 1), top_ids=torch.tensor(tokens)[:, None])
    entries = logprob_entries(tokenizer.decode, tokens, completion, 1, lambda token: vocabulary.tokenizer.decode_bytes([token]))
    assert bytes(b for entry in entries for b in entry["bytes"]).decode("utf-8") == tokenizer.decode(tokens) == "a ȝ b"
    assert all(entry["top_logprobs"][0]["bytes"] == entry["bytes"] for entry in entries)
    without = logprob_entries(tokenizer.decode, tokens, completion, 1)  # no vocabulary: the text's bytes, as before
    assert bytes(b for entry in without for b in entry["bytes"]).decode("utf-8", errors="replace") != "a ȝ b"
