import pytest

from mmjudge.judge.parsing import ScoreScale, format_judgement, parse_judgement

LABELS = {
    "text_quality": "Text quality",
    "image_quality": "Image quality",
    "text_image_coherence": "Text-image coherence",
    "style_consistency": "Stylistic consistency",
}


def test_round_trip_of_the_training_target():
    criteria = {"text_quality": 4, "image_quality": 2.6, "style_consistency": 5}
    text = format_judgement(3.4, criteria, LABELS, feedback="  The images drift in style.\n")
    parsed = parse_judgement(text, LABELS)
    assert parsed.score == 3
    assert parsed.criteria == {"text_quality": 4, "image_quality": 3, "text_image_coherence": None, "style_consistency": 5}
    assert parsed.feedback == "The images drift in style."
    assert parsed.error is None


@pytest.mark.parametrize(
    "output, score",
    [
        ("Good.\n### Score\n5", 5),
        ("### Score: 4.6 out of 6", 5),  # MMIE rounds the first number after the heading
        ("### Score\n**2**\nThen 6 more words", 2),
        ("### Score 0", 0),
        ("### Score\n6\n### Score\n1", 6),  # the first heading decides
    ],
)
def test_overall_score_follows_mmie_rule(output, score):
    assert parse_judgement(output, LABELS).score == score


@pytest.mark.parametrize(
    "output, reason",
    [
        ("A fine answer, I would give it 5.", "no '### Score' heading"),
        ("### Score\nnone", "no number after '### Score'"),
        ("### Score\n7", "score 7 is outside the scale 0-6"),
        ("### Score\n-1", "score -1 is outside the scale 0-6"),
        ("", "no '### Score' heading"),
    ],
)
def test_failures_give_a_reason_not_an_exception(output, reason):
    parsed = parse_judgement(output, LABELS)
    assert parsed.score is None
    assert reason in parsed.error


def test_criteria_lines_tolerate_markdown_and_take_the_last_restatement():
    output = "Critique.\n- **Text quality**: 3\nimage quality : 9\nText quality: 4\n### Score\n4"
    parsed = parse_judgement(output, LABELS)
    assert parsed.criteria["text_quality"] == 4
    assert parsed.criteria["image_quality"] is None  # 9 is off the 0-6 scale
    assert parsed.feedback == "Critique."


def test_custom_scale():
    assert parse_judgement("### Score\n9", {}, scale=ScoreScale(0, 10)).score == 9


INSTIT = ScoreScale(0, 1, 0.1)


@pytest.mark.parametrize(
    "output, score",
    [
        ("### Score\n0.7", 0.7),
        ("### Score\n0.74", 0.7),  # to the nearest step, as MMIE rounds to the nearest whole number
        ("### Score\n1", 1.0),
        ("### Score\n0", 0.0),
        ("### Score\n1.04", 1.0),
    ],
)
def test_fractional_scale_snaps_to_its_steps(output, score):
    parsed = parse_judgement(output, {}, scale=INSTIT)
    assert parsed.score == score and parsed.error is None
    assert repr(parsed.score) == repr(score)  # 0.7, not 0.7000000000000001


def test_fractional_scale_rejects_what_lies_outside_it():
    parsed = parse_judgement("### Score\n7", {}, scale=INSTIT)
    assert parsed.score is None and parsed.error == "score 7 is outside the scale 0-1 in steps of 0.1"


def test_training_target_speaks_the_rubric_scale():
    text = format_judgement(0.66, {"text_quality": 0.31}, LABELS, scale=INSTIT)
    assert text == "Text quality: 0.3\n### Score\n0.7"
    assert parse_judgement(text, LABELS, INSTIT).score == 0.7
