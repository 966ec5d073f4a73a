"""benchmarks/structured_outputs.py's recorded cases and how it counts an answer (its run is recorded in docs/serve.md)."""

import jsonschema
import pytest


@pytest.fixture(scope="module")
def cases(benchmark_module):
    return benchmark_module("structured_outputs")


def test_the_41_cases_are_well_formed_and_cover_every_kind(cases):
    CASES, request = cases.CASES, cases.request
    assert len(CASES) == 41 and len({name for name, *_ in CASES}) == 41
    assert {kind for _, kind, _, _ in CASES} == {"json_schema", "json_object", "regex", "choice"}
    for name, kind, spec, max_tokens in CASES:
        if kind == "json_schema":
            jsonschema.Draft202012Validator.check_schema(spec)
            assert request(kind, spec, name)["response_format"]["json_schema"]["strict"] is True
        assert 0 < max_tokens <= 400


def test_an_answer_counts_only_where_it_validates(cases):
    CASES, valid = cases.CASES, cases.valid
    schema = next(spec for name, _, spec, _ in CASES if name == "nested object")
    assert valid("json_schema", schema, '{"verdict":{"score":4,"sure":true}}')
    assert not valid("json_schema", schema, '{"verdict":{"score":11,"sure":true}}') and not valid("json_schema", schema, '{"verdict":')
    assert valid("json_object", None, '{"a":1}') and not valid("json_object", None, "[1]")
    assert valid("regex", r"Score: ([0-9]|10)/10", "Score: 10/10") and not valid("regex", r"Score: ([0-9]|10)/10", "Score: 10/10 ok")
    assert valid("choice", ["A", "B"], "B") and not valid("choice", ["A", "B"], "C")
    date = next(spec for name, _, spec, _ in CASES if name == "date string")
    assert valid("json_schema", date, '{"when":"2026-12-08"}') and not valid("json_schema", date, '{"when":"yesterday"}')
