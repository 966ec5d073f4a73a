"""Structured outputs through judge-serve, driven by the official openai SDK (issue 31, item 1): OpenAI's
response_format (json_schema, json_object) and the SDK's parse, vLLM's structured_outputs and guided_*
(choice, regex, json, grammar), whole and streamed, the same alone and batched."""

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx2
import openai
import pydantic
import pytest

from mmjudge.judge.testing import HANG_S
from mmjudge.serve.process import free_port, start_server
from tests.serve.test_serve import FAST, HELLO, SERVED, checkpoint, client_of, dataset, files, pairs_of, post, server, server_log  # noqa: F401 - fixtures

pytestmark = pytest.mark.slow


class Verdict(pydantic.BaseModel):
    better: Literal["A", "B", "tie"]
    score: int = pydantic.Field(ge=0, le=6)
    sure: bool


VERDICT = {"type": "object", "properties": {"better": {"enum": ["A", "B", "tie"]}, "score": {"type": "integer", "minimum": 0, "maximum": 6},
                                            "sure": {"type": "boolean"}},
           "required": ["better", "score", "sure"], "additionalProperties": False}
AS_SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True}}


def valid_verdict(text: str) -> bool:
    value = json.loads(text)
    return (set(value) == {"better", "score", "sure"} and value["better"] in ("A", "B", "tie") and type(value["score"]) is int
            and 0 <= value["score"] <= 6 and type(value["sure"]) is bool)


def test_a_json_schema_answer_is_json_valid_against_the_schema_and_the_sdk_parses_it(server):
    client = client_of(server)
    for sampling in ({}, {"temperature": 1.0, "seed": 3}):
        answer = client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=200, response_format=AS_SCHEMA, **sampling)
        assert answer.choices[0].finish_reason == "stop" and valid_verdict(answer.choices[0].message.content), answer
    parsed = client.chat.completions.parse(model=SERVED, messages=HELLO, max_tokens=200, response_format=Verdict)
    assert isinstance(parsed.choices[0].message.parsed, Verdict), parsed
    assert parsed.choices[0].message.parsed == Verdict.model_validate_json(parsed.choices[0].message.content)
    # several choices, each valid on its own
    several = client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=200, response_format=AS_SCHEMA, n=3, temperature=1.0, seed=5)
    assert all(valid_verdict(c.message.content) for c in several.choices) and len({c.message.content for c in several.choices}) > 1
    # without constraint the same request writes no JSON: the grammar is what makes it
    free = client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=40)
    with pytest.raises(ValueError):
        json.loads(free.choices[0].message.content)


# Integers of no range (a judge's number whose digits never ended, cut at max_tokens: issue 56), a string and a
# nested object; the string's length is the schema's own (one of no maxLength gets infer/grammar.py's 256 characters).
STRICT = {"type": "object", "additionalProperties": False, "required": ["score", "label", "detail"], "properties": {
    "score": {"type": "integer"}, "label": {"type": "string", "maxLength": 8},
    "detail": {"type": "object", "additionalProperties": False, "required": ["level"], "properties": {"level": {"type": "integer"}}}}}


def test_a_hundred_sampled_answers_of_a_strict_schema_end_within_64_tokens_and_validate(server):
    """issue 56, item 5: numbers of no range are bounded (infer/grammar.py's `bounded`), so a sampled answer ends."""
    client = client_of(server)
    schema = {"type": "json_schema", "json_schema": {"name": "judgement", "schema": STRICT, "strict": True}}
    ask = lambda seed: client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=64, temperature=1.0, seed=seed,  # noqa: E731
                                                      response_format=schema)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(100)))

    def valid(text: str) -> bool:
        value = json.loads(text)
        return (set(value) == {"score", "label", "detail"} and type(value["score"]) is int and isinstance(value["label"], str)
                and len(value["label"]) <= 8 and set(value["detail"]) == {"level"} and type(value["detail"]["level"]) is int)

    ended = [a for a in answers if a.choices[0].finish_reason == "stop" and a.usage.completion_tokens <= 64 and valid(a.choices[0].message.content)]
    assert len(ended) >= 95, [a.choices[0].message.content for a in answers if a not in ended][:5]


def test_json_mode_answers_an_object_and_a_bare_schema_any_json(server):
    client = client_of(server)
    answer = client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=30, response_format={"type": "json_object"})
    content = answer.choices[0].message.content
    # the random judge's own keys run on until max_tokens; what it wrote is an object's start
    assert content.startswith("{") and (answer.choices[0].finish_reason == "length" or isinstance(json.loads(content), dict)), content
    bare = client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=60,
                                          response_format={"type": "json_schema", "json_schema": {"name": "flag", "schema": {"type": "boolean"}}})
    assert bare.choices[0].message.content in ("true", "false")


def test_vllms_choice_regex_json_and_grammar_constrain_the_answer(server):
    client = client_of(server)

    def ask(**extra):
        return client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=120, extra_body=extra).choices[0]

    options = ["good", "bad", "cannot tell"]
    for field in ({"structured_outputs": {"choice": options}}, {"guided_choice": options}):
        assert ask(**field).message.content in options
    pattern = r"Score: [0-6]"
    for field in ({"structured_outputs": {"regex": pattern}}, {"guided_regex": pattern}):
        assert re.fullmatch(pattern, ask(**field).message.content)
    for field in ({"structured_outputs": {"json": VERDICT}}, {"guided_json": json.dumps(VERDICT)},
                  {"structured_outputs": {"json": VERDICT, "disable_any_whitespace": True}}):
        choice = ask(**field)
        assert choice.finish_reason == "stop" and valid_verdict(choice.message.content), choice
    assert " " not in ask(structured_outputs={"json": VERDICT, "disable_any_whitespace": True}).message.content
    # issue 45, item 5: compact JSON unless asked otherwise (vLLM's disable_any_whitespace: false, its default there)
    def verdicts(**fields):
        return [client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=120, temperature=1.0, seed=seed, extra_body=fields)
                .choices[0].message.content for seed in range(4)]

    compact = r'\{"better":"(A|B|tie)","score":[0-6],"sure":(true|false)\}'
    assert all(re.fullmatch(compact, text) for text in verdicts(structured_outputs={"json": VERDICT}) + verdicts(guided_json=VERDICT))
    assert any(re.search(r"\s", text) for text in verdicts(structured_outputs={"json": VERDICT, "disable_any_whitespace": False}))
    lark = 'start: "Verdict: " ("A" | "B") " wins"'
    gbnf = 'root ::= "Verdict: " ("A" | "B") " wins"'
    for field in ({"structured_outputs": {"grammar": lark}}, {"guided_grammar": gbnf}):
        assert ask(**field).message.content in ("Verdict: A wins", "Verdict: B wins")


def test_a_constrained_answer_is_the_same_alone_batched_and_streamed(server):
    client = client_of(server)
    asks = [{"response_format": AS_SCHEMA, "temperature": 1.0, "seed": 11}, {"response_format": AS_SCHEMA},
            {"extra_body": {"guided_regex": r"(Yes|No), [0-6] points?"}, "temperature": 0.8, "seed": 4},
            {"extra_body": {"guided_choice": ["A", "B", "tie"]}, "temperature": 1.5, "seed": 9}, {"temperature": 0.7, "seed": 2}]

    def ask(fields):
        return client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=120, **fields).choices[0].message.content

    alone = [ask(fields) for fields in asks]
    with ThreadPoolExecutor(len(asks) * 2) as pool:
        batched = list(pool.map(ask, asks * 2))
    assert batched == alone * 2
    for fields, whole in zip(asks, alone):
        with client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=120, stream=True, **fields) as stream:
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == whole


REFUSED = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}}, "response_format", "does not compile"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs its json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "'text', 'json_object' or 'json_schema'"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs.regex", "does not compile"),
    ({"structured_outputs": {"grammar": "start: ??"}}, "structured_outputs.grammar", "does not compile"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "Extra inputs are not permitted"),
    ({"structured_outputs": {}}, "structured_outputs", "give one of json, regex, choice, grammar, json_object"),
    ({"guided_json": "{not json"}, "guided_json", "must be JSON"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex", "one structured output per request"),
    ({"guided_choice": []}, "guided_choice", "at least 1 item"),
    ({"guided_decoding_backend": "xgrammar", "guided_regex": "a"}, "guided_decoding_backend", "llguidance"),
    # issue 45, item 5: past a limit, refused before anything is compiled (each was a 500 after minutes on a judge's vocabulary)
    ({"guided_choice": [f"option {k}" for k in range(10_000)]}, "guided_choice", "over this server's limit of 65,536 (--max_grammar_chars)"),
    ({"structured_outputs": {"json": {"type": "object", "properties": {f"p{k}": {"type": "integer"} for k in range(10_000)}}}},
     "structured_outputs.json", "over this server's limit of 65,536 (--max_grammar_chars)"),
    ({"structured_outputs": {"grammar": "start: " + " | ".join(f'"w{k}"' for k in range(50_000))}}, "structured_outputs.grammar",
     "over this server's limit of 65,536 (--max_grammar_chars)"),
    # ... and a grammar no text satisfies, which answered 200 with empty content and finish_reason "stop"
    ({"guided_json": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}}, "guided_json", "no text satisfies it"),
    ({"structured_outputs": {"regex": r"[^\s\S]"}}, "structured_outputs.regex", "no text satisfies it"),
]


@pytest.mark.parametrize("fields, param, message", REFUSED, ids=[p for _, p, _ in REFUSED])
def test_a_structured_output_that_cannot_work_is_refused_by_field(server, fields, param, message):
    response = post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 4, **fields})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and message in error["message"], error
    neutral = post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 4, "response_format": {"type": "text"},
                                                    "guided_decoding_backend": "guidance"})
    assert neutral.status_code == 200, neutral.text


# Compiles, and its first mask allows "a" alone; after "a" nothing satisfies it, so the stop token alone is allowed.
DEAD_END = {"structured_outputs": {"grammar": 'start: "a" X\nX: /[^\\s\\S]/'}}


def test_a_grammar_that_dead_ends_mid_answer_is_a_400_whole_and_an_error_event_streamed(server):
    """The answer "a" ended by the only token its grammar then allowed was a 200 whose finish_reason said "stop"."""
    whole = post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 8, **DEAD_END})
    assert whole.status_code == 400, whole.text
    error = whole.json()["error"]
    assert error["param"] == "structured_outputs.grammar" and "came, after 1 tokens, to text no continuation of satisfies" in error["message"], error
    streamed = post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 8, "stream": True, **DEAD_END})
    events = [json.loads(line[len("data: "):]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["error"]["param"] == "structured_outputs.grammar", events
    assert not any(choice["finish_reason"] for event in events[:-1] for choice in event.get("choices", [])), events
    assert streamed.text.rstrip().endswith("data: [DONE]")


def test_a_structured_server_starts_with_its_default_rubrics_and_refuses_only_pairs_a_pairwise_rubric_judges(checkpoint, dataset, tmp_path):  # noqa: F811
    """judge-serve --structured: its default rubrics hold the pairwise one, which holds nothing up until a pair
    of its category comes; a pair under a pointwise rubric is scored, each answer held to the score lines."""
    port = free_port()
    process = start_server(["--model_path", str(checkpoint), "--image_root", str(dataset), "--structured", *FAST], port, tmp_path / "serve.log",
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        server = f"http://127.0.0.1:{port}"
        sample = json.loads((dataset / "data.json").read_text())[0]
        assert httpx2.post(f"{server}/v1/score", json={"samples": [sample]}, timeout=HANG_S).status_code == 200
        pairs = pairs_of(dataset)
        refused = httpx2.post(f"{server}/v1/score", json={"pairs": pairs[:1]}, timeout=HANG_S)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "pairs[0].category", refused.text
        assert "asks for a verdict" in refused.json()["error"]["message"]
        pointwise = httpx2.post(f"{server}/v1/score", json={"pairs": [pairs[3]]}, timeout=HANG_S)
        assert pointwise.status_code == 200 and pointwise.json()["results"][0]["rule"] == "expected_score", pointwise.text
    finally:
        process.terminate()
        process.wait(timeout=HANG_S)
