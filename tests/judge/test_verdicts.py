"""Each verdict format reads what it writes, and reads the benchmarks' own outputs by their own rules."""

import pytest

from mmjudge.judge.verdicts import VERDICT_FORMATS, VERDICT_HEADING

LABELS = {"text_quality": "Text quality"}


@pytest.mark.parametrize("name, verdicts", [("mmjudge", ["A", "B", "tie"]), ("brackets", ["A", "B", "tie"]), ("vlrewardbench", ["A", "B"]),
                                            ("mmrb2", ["A", "B"]), ("opening", ["A", "B"]), ("think", ["A", "B", "tie"])])
def test_every_format_reads_back_what_it_writes(name, verdicts):
    fmt = VERDICT_FORMATS[name]
    for verdict in verdicts:
        text = fmt.write(verdict, {"text_quality": verdict} if name == "mmjudge" else {}, LABELS, "Both try; one is better.")
        reading = fmt.read(text, LABELS if name == "mmjudge" else {})
        assert reading.verdict == verdict and reading.error is None
        # the offset points at the character that says it, where the distribution is read
        assert text[reading.offset:].lower().startswith(fmt.options[verdict].strip().lower())
        if name == "mmjudge":
            assert reading.criteria == {"text_quality": verdict}


def test_unwritable_verdicts_are_refused():
    for name in ("vlrewardbench", "mmrb2", "opening"):
        with pytest.raises(ValueError, match="no way to write 'tie'"):
            VERDICT_FORMATS[name].write("tie", {}, {}, None)


def test_mmjudge_reads_the_first_word_after_its_heading_only():
    read = VERDICT_FORMATS["mmjudge"].read
    assert read(f"A is better here.\n{VERDICT_HEADING}\n**B**", {}).verdict == "B"
    assert read(f"{VERDICT_HEADING}\nTie", {}).verdict == "tie"
    assert read(f"{VERDICT_HEADING}\nAnswer A", {}).error == f"no A, B or tie after '{VERDICT_HEADING}'"
    assert read("A", {}).error == f"no '{VERDICT_HEADING}' heading in the judge's output"
    reading = read(f"- **Text quality**: B\nText quality: a\n{VERDICT_HEADING}\nA", LABELS)  # the last criterion line wins
    assert reading.criteria == {"text_quality": "A"}


def test_brackets_read_as_multimodal_rewardbench_reads_them():
    read = VERDICT_FORMATS["brackets"].read
    assert read("B looks good [[B]] but then [[A]]", {}).verdict == "A"  # [[A]] is looked for first, wherever it stands
    assert read("final: [[C]]", {}).verdict == "tie"
    assert read("[A]", {}).verdict is None


def test_vlrewardbench_reads_its_regular_expression_on_the_cleaned_text():
    read = VERDICT_FORMATS["vlrewardbench"].read
    text = "**Overall Judgment**:\nAnswer 1 is slightly better, but on reflection\nAnswer 2 is better."
    reading = read(text, {})
    assert (reading.verdict, reading.label) == ("B", "2") and text[reading.offset] == "2"  # the greedy .* takes the last one
    assert read("Therefore, Answer 3 is better", {}).label == "3" and read("Therefore, Answer 3 is better", {}).verdict is None
    assert read("Answer 1 is better", {}).verdict is None  # neither Overall Judgment nor Therefore before it


def test_mmrb2_reads_better_response_from_fenced_or_broken_json():
    read = VERDICT_FORMATS["mmrb2"].read
    assert read('```json\n{"reasoning": "x", "better_response": "B"}\n```', {}).verdict == "B"
    broken = '{"reasoning": "unterminated, "better_response": "A", "confidence": 0.3'
    reading = read(broken, {})
    assert reading.verdict == "A" and broken[reading.offset] == "A"
    assert read('{"better_response": "tie"}', {}).label == "tie" and read('{"better_response": "tie"}', {}).verdict is None
    assert read("no json", {}).error == "no \"better_response\" in the judge's JSON"


# Broken JSON as MMRB2's evaluators read it (json_repair): ours read it otherwise, 0.36 against their 0.30 on 20 pairs.
# (text, verdict, label): label None where their evaluate.py records no judgement, or one its scorer does not count.
BROKEN = [
    ("{'reasoning': 'single quotes', 'better_response': 'B'}", "B", "B"),
    ('{"reasoning": "a bare letter", "better_response": A}', "A", "A"),
    ('{"reasoning": "a number for a letter", "better_response": 1}', None, "1"),
    ('{"better_response": 2.5, "score": 3}', None, "2.5"),
    ('My verdict: {"better_response": "B"}, as shown.', "B", "B"),
    ('[{"better_response": "A"}]', None, None),  # a list: its evaluator fails on it
    ('{"better_response": null}', None, None),
    ('{"better_response": ""}', None, None),
    ('{"better_response": "a"}', None, "a"),  # never right: "a" is not "A"
    ('{"reasoning": "no verdict"}', None, None),
]


@pytest.mark.parametrize("text, verdict, label", BROKEN)
def test_mmrb2_reads_broken_json_as_its_evaluators_do(text, verdict, label):
    reading = VERDICT_FORMATS["mmrb2"].read(text, {})
    assert (reading.verdict, reading.label) == (verdict, label)
    if verdict is not None:  # the letter's place, where its distribution is read
        assert text[reading.offset] == verdict


def test_opening_reads_as_intjudge_reads():
    read = VERDICT_FORMATS["opening"].read
    assert (read("A is better", {}).label, read("B is better", {}).verdict) == ("A", "B")
    assert (read("Tie(B is better)", {}).label, read("Tie(B is better)", {}).verdict) == ("Tie(B)", "tie")
    assert read("tie (A", {}).label == "tie ()"  # the first five characters and a ")", as IntJudge writes them
    assert read("I think B wins", {}).label == "Tie(B)"  # no verdict up front: a tie leaning to the first A or B
    drawn = read("no letters here", {})
    assert drawn.verdict is None and drawn.label in ("Tie(A)", "Tie(B)") and read("no letters here", {}).label == drawn.label


def test_think_reads_a_verdict_only_in_the_whole_layout():
    read = VERDICT_FORMATS["think"].read
    assert read("<think>A names the marker; B does not.</think>\n<answer> B </answer>\n", {}).verdict == "B"
    assert read("<think>\nclose call\n</think><answer>Tie</answer>", {}).verdict == "tie"
    for broken in ("<answer>A</answer>",  # no reasoning
                   "<think>B is worse</think> A",  # no answer tags
                   "Sure! <think>x</think><answer>A</answer>",  # text before the layout
                   "<think>x</think><answer>A</answer> and also B",  # text after it
                   "<think>x</think><answer>A or B</answer>"):  # no single verdict
        reading = read(broken, {})
        assert reading.verdict is None and "<think>" in reading.error
