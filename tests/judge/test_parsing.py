import pytest

from judge.parsing import format_judgement, parse_judgement

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
    assert parse_judgement("### Score\n9", {}, scale=(0, 10)).score == 9
