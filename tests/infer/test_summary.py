"""The end-of-run summary: MMIE's figures (count, mean score, its share of the scale, per category) and
ours (per model, per criterion, parse failures, truncations, skipped records), from known results."""

import pytest

from mmjudge.infer.summary import format_summary, summarize
from mmjudge.judge.data import JudgeResult, Problem
from mmjudge.judge.parsing import COLLAPSE_SHARE, ScoreScale


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


def test_collapse_is_flagged_above_the_threshold_and_not_at_it():
    def scored(levels):
        return [result(f"SA_{i}", "SA", "a", score, {"image_quality": score}) for i, score in enumerate(levels)]

    at_threshold = scored([3] * 8 + [2, 5])  # 80%: not more than COLLAPSE_SHARE
    assert COLLAPSE_SHARE == 0.8
    summary = summarize(at_threshold, [], ScoreScale())
    assert summary["collapse"] == {} and "collapse" not in format_summary(summary)

    above = scored([3] * 9 + [2])  # 90%
    summary = summarize(above, [], ScoreScale())
    histogram = {"0": 0, "1": 0, "2": 1, "3": 9, "4": 0, "5": 0, "6": 0}
    assert summary["collapse"] == {name: {"level": "3", "share": 0.9, "n": 10, "histogram": histogram}
                                   for name in ("overall", "image_quality")}
    text = format_summary(summary)
    assert "warning: overall scores collapse: 90% of 10 are 3" in text and "histogram 0: 0  1: 0  2: 1  3: 9  4: 0" in text
    assert "warning: image_quality scores collapse" in text


def test_collapse_counts_scored_records_only_on_any_scale():
    # parse failures are no level: 5 of 6 scored records on 0.5 is collapse however many failed
    results = [result(f"x{i}", "instit", "m", 0.5) for i in range(5)] + [result("y", "instit", "m", 0.6)]
    results += [result(f"z{i}", "instit", "m", None, parse_error="no score") for i in range(10)]
    found = summarize(results, [], ScoreScale(0, 1, 0.1))["collapse"]["overall"]
    assert (found["level"], found["n"], found["histogram"]["0.5"], found["histogram"]["0.6"]) == ("0.5", 6, 5, 1)
    assert summarize([result("x", "SA", "m", None)], [], ScoreScale())["collapse"] == {}


def test_a_run_none_of_whose_outputs_parsed_says_so_loudly_with_why():
    failed = [result(f"SA_{i}", "SA", "a", None, parse_error="no '### Score' heading in the judge's output") for i in range(3)]
    failed.append(result("SA_9", "SA", "a", None, parse_error="score 9 is outside the scale 0-6"))
    summary = summarize(failed, [], ScoreScale())
    assert summary["parse_errors"] == {"no '### Score' heading in the judge's output": 3, "score 9 is outside the scale 0-6": 1}
    text = format_summary(summary)
    assert "warning: NONE of the 4 outputs parsed: no record has a score, and the mean score is undefined." in text
    assert "why: 3 x no '### Score' heading in the judge's output; 1 x score 9 is outside the scale 0-6" in text
    assert "NONE" not in format_summary(summarize(failed + [result("SA_10", "SA", "a", 4)], [], ScoreScale()))
    assert "NONE" not in format_summary(summarize([], [], ScoreScale()))  # nothing to score is not a failure to parse
