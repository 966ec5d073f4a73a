"""Structured outputs through judge-serve as a real client sends them: 41 recorded cases (CASES: json_schema,
json_object, regex and choice over integers, numbers, strings, enums, nested objects, arrays and optional keys),
each sent by the installed openai SDK to judge-serve's /v1/chat/completions at temperature 1, on the tiny random
judge (a judge that has learnt nothing writes whatever the grammar allows: the worst case of an answer that must
end). An answer counts when it ends (finish_reason stop) within its max_tokens and validates: against its JSON
schema (jsonschema), as a JSON object, by its regex in full, or as one of its choices.

    python benchmarks/structured_outputs.py                  # each case once (seed 0): N of 41
    python benchmarks/structured_outputs.py --seeds 5        # each case with seeds 0-4: N of 205

Starts judge-serve on a free 127.0.0.1 port, prints one line per case (answers valid, and the first failure's
finish reason, tokens and text) and the total; the server is stopped at the end. Recorded in docs/serve.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import openai

from mmjudge.judge.testing import write_original_checkpoint
from mmjudge.serve.process import free_port, start_server

SERVED = "judge"
PROMPT = "Judge the answer to the question and give your verdict in the format asked for."


def obj(properties: dict, required: list[str] | None = None, closed: bool = True) -> dict:
    """An object schema of these properties, all required unless said, closed to others unless said (strict mode's)."""
    schema = {"type": "object", "properties": properties, "required": list(properties) if required is None else required}
    return schema | ({"additionalProperties": False} if closed else {})


INT, NUM, STR, BOOL = {"type": "integer"}, {"type": "number"}, {"type": "string"}, {"type": "boolean"}
SCORE = {"type": "integer", "minimum": 0, "maximum": 10}

# (name, kind, what constrains the answer, max_tokens): a client's own settings, as judges are asked in harnesses.
CASES = [
    # integers
    ("integer of no range", "json_schema", obj({"score": INT}), 64),
    ("integer in 0-10", "json_schema", obj({"score": SCORE}), 64),
    ("integer above an exclusive minimum", "json_schema", obj({"votes": {"type": "integer", "exclusiveMinimum": 0}}), 64),
    ("negative integers", "json_schema", obj({"delta": {"type": "integer", "minimum": -100, "maximum": -1}}), 64),
    ("two integers of no range", "json_schema", obj({"correct": INT, "total": INT}), 64),
    # numbers
    ("number of no range", "json_schema", obj({"confidence": NUM}), 64),
    ("number in 0-1", "json_schema", obj({"probability": {"type": "number", "minimum": 0, "maximum": 1}}), 64),
    ("number below an exclusive maximum", "json_schema", obj({"ratio": {"type": "number", "exclusiveMaximum": 100}}), 64),
    ("number or null", "json_schema", obj({"reward": {"type": ["number", "null"]}}), 64),
    ("integer and number", "json_schema", obj({"rank": SCORE, "weight": NUM}), 64),
    # strings
    ("string of no bound", "json_schema", obj({"reason": STR}), 400),
    ("string of at most 20 characters", "json_schema", obj({"label": {"type": "string", "maxLength": 20}}), 64),
    ("string of 2-5 characters", "json_schema", obj({"code": {"type": "string", "minLength": 2, "maxLength": 5}}), 64),
    ("string by pattern", "json_schema", obj({"grade": {"type": "string", "pattern": "^[A-F][+-]?$"}}), 64),
    ("date string", "json_schema", obj({"when": {"type": "string", "format": "date"}}), 64),
    ("score and short reason", "json_schema", obj({"score": SCORE, "reason": {"type": "string", "maxLength": 40}}), 96),
    # enums
    ("enum of verdicts", "json_schema", obj({"better": {"enum": ["A", "B", "tie"]}}), 64),
    ("enum of mixed values", "json_schema", obj({"level": {"enum": [1, 2, 3, "n/a", None]}}), 64),
    ("const", "json_schema", obj({"version": {"const": "v1"}, "pass": BOOL}), 64),
    ("boolean", "json_schema", obj({"correct": BOOL}), 64),
    # nested objects
    ("nested object", "json_schema", obj({"verdict": obj({"score": SCORE, "sure": BOOL})}), 64),
    ("three levels", "json_schema", obj({"a": obj({"b": obj({"c": SCORE})})}), 64),
    ("nested integers of no range", "json_schema", obj({"score": INT, "detail": obj({"level": INT})}), 64),
    ("$defs and $ref", "json_schema", {**obj({"first": {"$ref": "#/$defs/s"}, "second": {"$ref": "#/$defs/s"}}),
                                       "$defs": {"s": obj({"score": SCORE})}}, 96),
    ("anyOf", "json_schema", obj({"answer": {"anyOf": [SCORE, {"enum": ["cannot tell"]}]}}), 64),
    ("an object open to other keys", "json_schema", obj({"score": SCORE}, closed=False), 64),
    # arrays
    ("array of at most 5 integers", "json_schema", obj({"scores": {"type": "array", "items": SCORE, "maxItems": 5}}), 64),
    ("array of integers of no length", "json_schema", obj({"scores": {"type": "array", "items": SCORE}}), 128),
    ("array of objects", "json_schema", obj({"criteria": {"type": "array", "items": obj({"name": {"enum": ["SA", "PBL", "MSR"]},
                                                                                         "score": SCORE}), "maxItems": 3}}), 128),
    ("array of 1-3 short strings", "json_schema", obj({"tags": {"type": "array", "items": {"type": "string", "maxLength": 10},
                                                                "minItems": 1, "maxItems": 3}}), 96),
    ("pair as prefixItems", "json_schema", obj({"pair": {"type": "array", "prefixItems": [SCORE, SCORE], "items": False}}), 64),
    # optional keys
    ("one optional key", "json_schema", obj({"score": SCORE, "note": {"type": "string", "maxLength": 20}}, required=["score"]), 64),
    ("all keys optional", "json_schema", obj({"a": SCORE, "b": BOOL}, required=[]), 64),
    ("optional nested object", "json_schema", obj({"score": SCORE, "detail": obj({"sure": BOOL})}, required=["score"]), 64),
    ("optional integer of no range", "json_schema", obj({"score": SCORE, "extra": INT}, required=["score"]), 64),
    # JSON mode, regular expressions, choices
    ("json_object", "json_object", None, 128),
    ("json_object asked for a verdict", "json_object", None, 256),
    ("regex score line", "regex", r"Score: ([0-9]|10)/10", 16),
    ("regex verdict and reason", "regex", r"(A|B|tie) because [a-z ]{1,30}\.", 48),
    ("choice of verdicts", "choice", ["A", "B", "tie"], 8),
    ("choice of phrases", "choice", ["the first answer", "the second answer", "both equally"], 16),
]


def request(kind: str, spec, name: str) -> dict:
    """The SDK's arguments for a case: OpenAI's response_format, or vLLM's structured_outputs in extra_body."""
    if kind == "json_schema":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": re.sub(r"\W+", "_", name)[:64], "schema": spec, "strict": True}}}
    if kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    return {"extra_body": {"structured_outputs": {kind: spec}}}


def valid(kind: str, spec, text: str) -> bool:
    if kind == "regex":
        return re.fullmatch(spec, text) is not None
    if kind == "choice":
        return text in spec
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if kind == "json_object":
        return isinstance(value, dict)
    return jsonschema.Draft202012Validator(spec, format_checker=jsonschema.FormatChecker()).is_valid(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=1, help="answers per case, with seeds 0..N-1 (default: 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = write_original_checkpoint(Path(scratch) / "ckpt", seed=0)
        port = free_port()
        server = start_server(["--model_path", str(checkpoint), "--served_model_name", SERVED], port, Path(scratch) / "serve.log",
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)

            def ask(case_seed):
                (name, kind, spec, max_tokens), seed = case_seed
                answer = client.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": f"{PROMPT} ({name})"}],
                                                        max_tokens=max_tokens, temperature=1.0, seed=seed, **request(kind, spec, name))
                choice = answer.choices[0]
                ok = choice.finish_reason == "stop" and answer.usage.completion_tokens <= max_tokens and valid(kind, spec, choice.message.content)
                return ok, f"{choice.finish_reason}, {answer.usage.completion_tokens} tokens: {choice.message.content[:80]!r}"

            with ThreadPoolExecutor(4) as pool:
                outcomes = list(pool.map(ask, [(case, seed) for case in CASES for seed in range(args.seeds)]))
        finally:
            server.terminate()
            server.wait()
    total = 0
    for i, (name, kind, _, max_tokens) in enumerate(CASES):
        mine = outcomes[i * args.seeds:(i + 1) * args.seeds]
        passed = sum(ok for ok, _ in mine)
        total += passed
        failed = next((said for ok, said in mine if not ok), "")
        print(f"{passed}/{args.seeds}  {kind:<11} {name} (max_tokens {max_tokens}){'  first miss: ' + failed if failed else ''}")
    print(f"valid answers that ended within max_tokens: {total} of {len(CASES) * args.seeds} ({len(CASES)} cases x {args.seeds} seeds)")


if __name__ == "__main__":
    main()
