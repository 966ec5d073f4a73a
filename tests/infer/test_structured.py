"""Structured outputs in the decoder (infer/grammar.py, infer/decoding.py) on the tiny judge: every row's
text follows its own grammar, chosen or drawn after its mask, and a constrained answer is the same alone
and batched beside unconstrained and other constrained rows."""

import json
import re

import pytest
import torch

from mmjudge.infer import grammar
from mmjudge.infer.decoding import Request, Sampling
from mmjudge.infer.engine import judge_vocabulary
from tests.infer.test_decoding import answers, chat_decoder, chat_ids, judge, prompts  # noqa: F401 - fixtures


@pytest.fixture(scope="module")
def vocabulary(judge):  # noqa: F811
    return judge_vocabulary(judge)


VERDICT = {"type": "object", "properties": {"better": {"enum": ["A", "B", "tie"]}, "score": {"type": "integer", "minimum": 0, "maximum": 6},
                                            "sure": {"type": "boolean"}},
           "required": ["better", "score", "sure"], "additionalProperties": False}


def text(judge, completion):  # noqa: F811
    return judge.decode([t for t in completion.tokens if t != judge.tokenizer.convert_tokens_to_ids("<|end|>")])


def test_the_mask_of_a_row_allows_exactly_its_bits():
    masks = torch.tensor([[0b1011, 0], [-1, -1]], dtype=torch.int32)
    allowed = grammar.allowed_tokens(masks, 40)
    assert allowed.shape == (2, 40)
    assert allowed[0].nonzero().flatten().tolist() == [0, 1, 3] and bool(allowed[1].all())
    assert grammar.allowed_tokens(torch.tensor([[-(1 << 31)]], dtype=torch.int32), 32)[0].nonzero().flatten().tolist() == [31]  # the sign bit


def test_invalid_grammars_are_refused_with_the_reason(vocabulary):
    for build, why in [(lambda: grammar.json_schema(vocabulary, {"type": "nope"}), "nope"), (lambda: grammar.regex(vocabulary, "(a"), "regex"),
                       (lambda: grammar.grammar(vocabulary, "start: ??"), "Expected")]:
        with pytest.raises(grammar.GrammarError, match=why):
            build()
    assert grammar.json_schema(vocabulary, VERDICT) is grammar.json_schema(vocabulary, json.loads(json.dumps(VERDICT)))  # compiled once


def test_each_row_follows_its_own_grammar_and_the_same_rows_write_the_same_alone_and_batched(judge, prompts, vocabulary):  # noqa: F811
    """Greedy and seeded sampled rows under a JSON schema, a regex, a choice and none, in one batch and each alone."""
    kinds = {
        "schema": grammar.json_schema(vocabulary, VERDICT),
        "regex": grammar.regex(vocabulary, r"(Score|Rating): [0-6]\.?"),
        "choice": grammar.choice(vocabulary, ["yes", "no", "cannot tell"]),
        "object": grammar.json_object(vocabulary),
    }
    specs = [(kind, sampling) for kind in [*kinds, None] for sampling in (Sampling(), Sampling(temperature=1.0, seed=7))]
    requests = lambda: [Request(k, prompts[k % len(prompts)], max_new_tokens=160, sampling=sampling, grammar=kinds.get(kind))  # noqa: E731
                        for k, (kind, sampling) in enumerate(specs)]
    batched = answers(chat_decoder(judge), requests())
    alone = {key: c for r in requests() for key, c in answers(chat_decoder(judge), [r]).items()}
    assert {key: c.tokens for key, c in batched.items()} == {key: c.tokens for key, c in alone.items()}
    for k, (kind, sampling) in enumerate(specs):
        completion, written = batched[k, 0], text(judge, batched[k, 0])
        if kind is None:
            continue
        if kind == "object" and completion.finish_reason == "length":  # a key of its own making runs on: the random judge's strings never end
            assert written.startswith('{"'), written
            continue
        assert completion.finish_reason == "stop", (kind, written)  # the grammar reached its end, and only the stop token was left
        if kind == "schema":
            verdict = json.loads(written)
            assert set(verdict) == {"better", "score", "sure"} and verdict["better"] in ("A", "B", "tie") and 0 <= verdict["score"] <= 6
        elif kind == "regex":
            assert re.fullmatch(r"(Score|Rating): [0-6]\.?", written), written
        elif kind == "choice":
            assert written in ("yes", "no", "cannot tell")
        else:
            assert isinstance(json.loads(written), dict)
    unconstrained = [text(judge, batched[k, 0]) for k, (kind, _) in enumerate(specs) if kind is None]
    assert not any(w in ("yes", "no", "cannot tell") for w in unconstrained)  # the random judge left alone writes gibberish


def test_a_constrained_row_writes_the_likeliest_allowed_token_and_logprobs_stay_the_models(judge, prompts, vocabulary):  # noqa: F811
    free = answers(chat_decoder(judge), [Request(0, prompts[0], max_new_tokens=1)], top_logprobs=5)[0, 0]
    options = ["yes", "no"]
    constrained = answers(chat_decoder(judge), [Request(0, prompts[0], max_new_tokens=1, grammar=grammar.choice(vocabulary, options))],
                          top_logprobs=5)[0, 0]
    first = {judge.tokenizer("x" + o, add_special_tokens=False).input_ids[-1] for o in options} | {
        t for o in options for t in judge.tokenizer(o, add_special_tokens=False).input_ids if judge.tokenizer.convert_ids_to_tokens(t) != "▁"}
    assert constrained.tokens[0] != free.tokens[0] and free.tokens[0] not in first
    # the log-probabilities shown are the model's own (vLLM's raw_logprobs): the unconstrained top is still listed
    assert free.tokens[0] in constrained.top_ids[0].tolist()
    assert constrained.top_logprobs[0, 0] < free.top_logprobs[0, 0]
