"""MEGA-Bench's scoring without a judge (judge/formats/megabench_rules.py). Each expected value is the one
MEGA-Bench's own code (megabench/metrics/) gives for the same input, quirks included; docs/benchmarks.md
shows the full comparison, on every query of a real scored file and on 1,800 generated pairs."""

import pytest

from mmjudge.judge.formats.megabench_rules import UNSCORED, aggregate, field_part, numeric_match, parse_json, parse_response


@pytest.mark.parametrize("response, target, expected", [
    (r"$\frac{1}{3}$", "0.3333", 1.0),  # LaTeX read as a number, within 1%
    ("0.3775", "0.695635", 0.0),
    ("e - 1.5", "$e - 1.5$", 0),  # no number: a string match, and the target keeps its $ signs
    (r"\boxed{0.3775}", "0.3775", 0),  # \boxed is not unwrapped
    ("(1, 2)", "(1, 2)", 0.0),  # tuples never match: MEGA-Bench compares lists only
    ("[2, 1]", "[1, 2]", 1.0),  # lists: the same numbers in any order
    ("x \\approx 15120", "15840", 0.0),  # what follows \approx, more than 1% off
    ("1,000", "1000", 1.0),
    ("50%", "0.5", 1.0),
    (r"\frac{2\pi}{15}", r"$\frac{2\pi}{15}$", 1.0),  # \pi read as 3.14 on both sides
    ("B.", "b", 1),  # a one-letter answer: the letter of "B." is compared
    ("__import__('os').system('true')", "0", 0),  # MEGA-Bench would eval() this; here it is no number
    ("9^{9^{99}}", "1", 0),  # a power MEGA-Bench would compute until its 5 s limit: no number here, at once
])
def test_general_single_numerical_match_is_megabench_s(response, target, expected):
    score = numeric_match(response, target)
    assert score == expected and type(score) is type(expected)


@pytest.mark.parametrize("response, single_line, expected", [
    ("**Answer:** Paris", True, ""),  # MEGA-Bench's bold pattern closes at once: an empty answer
    ("Answer: Paris\n\nBecause it is the capital.", True, "Paris"),  # a one-line answer keeps its first paragraph
    ("I think so.\nAnswer: Paris", False, "Paris"),
    ("```\nline one\nline two\n```", False, "line one\nline two"),
    ("Answer: {'a': 1}", True, "{'a': 1}"),
    ("Answer: 'quoted'", True, "quoted"),
    ("answer: first. Answer: second", True, "second"),  # the last "Answer:" counts
])
def test_answer_string_parse_is_megabench_s(response, single_line, expected):
    answer = {"reference": "one line" if single_line else "two\nlines"}
    assert parse_response("answer_string", response, answer) == {"reference": expected}


def test_json_parse_is_megabench_s():
    assert parse_json("```json\n{'Answer': '0.5', 'Solution': 'Integrate.'}\n```") == {"Answer": "0.5", "Solution": "Integrate."}
    assert parse_json('Answer: {"Answer": "1", "Solution": "It is \\"one\\"."}') == {"Answer": "1", "Solution": 'It is "one".'}
    assert parse_json("no json here") == {}
    assert parse_json('{"a": {"b": 1}} then {"c": 2}') == {"c": 2}  # the last one wins
    # A response that is no JSON: every field reads the whole response; dummy: the whole text, stripped.
    assert parse_response("json", "just text", {"Answer": "1", "Solution": "s"}) == {"Answer": "just text", "Solution": "just text"}
    assert field_part(parse_response("dummy", "  I refuse.  ", {"##answer": "x"}), "##answer") == "I refuse."


def test_aggregation_leaves_out_fields_without_a_score():
    assert aggregate("mean", {"Answer": 1.0, "Solution": 0.4}, {"Answer": 1, "Solution": 1}) == pytest.approx(0.7)
    assert aggregate("mean", {"Answer": 1.0, "Solution": 0.4}, {"Answer": 1, "Solution": 3}) == pytest.approx(0.55)
    assert aggregate("min", {"Answer": 1.0, "Solution": 0.4}, {}) == 0.4
    assert aggregate("mean", {"Answer": UNSCORED, "Solution": 0.4}, {"Answer": 1, "Solution": 1}) == 0.4
    assert aggregate("mean", {}, {}) == UNSCORED
