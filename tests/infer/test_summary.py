"""The end-of-run summary: MMIE's figures (count, mean score, its share of the scale, per category) and
ours (per model, per criterion, parse failures, truncations, skipped records), from known results."""

import pytest

from infer.summary import format_summary, summarize
from judge.data import JudgeResult, Problem
from judge.parsing import ScoreScale


def result(id, category, model, score, criteria=None, parse_error=None, truncated=()):
    return JudgeResult(id=id, model=model, category=category, feedback="", score=score, criteria=criteria or {},
                       parse_error=parse_error, truncated=list(truncated), n_images=1, n_tiles=1, prompt_tokens=10, generated_tokens=5)


def test_summary_means_count_only_scored_results_in_each_group():
    results = [
        result("SA_1", "SA", "a", 6, {"text_quality": 5}),
        result("SA_2", "SA", "b", 3, {"text_quality": 4, "image_quality": 2}, truncated=["image 3 of 3"]),
        result("PBL_1", "PBL", "a", 2, {"text_quality": None}),
        result("MSR_1", "MSR", "b", None, parse_error="no '### Score' heading in the judge's output"),
    ]
    summary = summarize(results, [Problem("data.json", "image not found: x.png", 7, "SA_9")], ScoreScale(0, 6))
    assert (summary["samples"], summary["scored"], summary["parse_failures"], summary["truncated"]) == (4, 3, 1, 1)
    assert summary["mean_score"] == pytest.approx(11 / 3) and summary["percent"] == pytest.approx(100 * 11 / 18)
    assert summary["by_category"] == {"PBL": {"n": 1, "mean_score": 2}, "SA": {"n": 2, "mean_score": 4.5}}  # MSR: nothing scored
    assert summary["by_model"] == {"a": {"n": 2, "mean_score": 4}, "b": {"n": 1, "mean_score": 3}}
    assert summary["by_criterion"] == {"text_quality": {"n": 2, "mean_score": 4.5}, "image_quality": {"n": 1, "mean_score": 2}}
    assert summary["skipped_invalid"] == ["data.json: record 7 (id 'SA_9'): image not found: x.png"]
    text = format_summary(summary)
    assert "Samples: 4  scored: 3  parse failures: 1  truncated: 1  skipped (invalid): 1" in text
    assert "Mean score: 3.667  (61.111% of the scale)" in text and "  category SA: 4.500 (n=2)" in text


def test_the_share_of_the_scale_starts_at_its_low_end():
    summary = summarize([result("x", "instit", "m", 0.75)], [], ScoreScale(0.5, 1.0, 0.05))
    assert summary["percent"] == pytest.approx(50)
    assert summarize([result("x", "SA", "m", None)], [], ScoreScale())["percent"] is None
