"""Pairs through the scoring engine and judge-score: both orders, verdict distributions, batch invariance,
resume, and a pointwise judge's verdicts (a tiny random judge, whose outputs never parse: its verdicts come
from the distributions read after a forced heading)."""

import json
from pathlib import Path

import pytest

from mmjudge.calibration.cli import main as calibrate
from mmjudge.configs import CONFIG_DIR, DEFAULT_RUBRICS
from mmjudge.infer.cli import main
from mmjudge.infer.engine import Scorer, prepare
from mmjudge.infer.options import MAX_SAMPLES, MAX_TILES, ScoreOptions
from mmjudge.judge.data import PairResult, UsageError, load_pairs
from mmjudge.judge.model import load_judge
from mmjudge.judge.preferences import pointwise_verdict
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_pairs

RUBRICS = [*DEFAULT_RUBRICS, CONFIG_DIR / "rubrics" / "pairwise.yaml"]
FAST = ["--max_new_tokens", "5", "--max_tiles", "1", "--workers", "2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_pairs(tmp_path_factory.mktemp("pairs"), 6, seed=1, annotated=True).parent


@pytest.fixture(scope="module")
def judge(checkpoint):
    return load_judge(checkpoint)


@pytest.fixture(scope="module")
def pairs(data):
    # Categories mixed: general pairs go to the pairwise rubric, SA and PBL ones to MMIE's pointwise rubrics.
    return [p.model_copy(update={"category": c}) for p, c in zip(load_pairs(data / "pairs.json"), ["general", "SA", "general", "PBL", "general", "general"])]


def same(one: dict, other: dict) -> None:
    """Two results, equal but for the last digits of their distributions: as a sample's record, each number
    computed alone and in a batch agrees to 1e-5 on a CPU, where the matrix kernels block by batch size, and
    every token written is the same (judge-score's batch-invariance tests)."""
    assert one.keys() == other.keys()
    for key, value in one.items():
        if key.endswith("distribution") and value is not None:
            assert other[key] == pytest.approx(value, abs=1e-5) and list(other[key]) == list(value)
        elif key == "expected_score" and value is not None:
            assert other[key] == pytest.approx(value, abs=1e-5)
        elif isinstance(value, dict) and key != "criteria":
            assert value.keys() == other[key].keys()
            for name in value:
                same(value[name], other[key][name])
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            assert len(value) == len(other[key])
            for a, b in zip(value, other[key]):
                same(a, b)
        else:
            assert other[key] == value, key


def judged(judge, pairs, data, options, indices=None):
    rubrics = load_rubrics(RUBRICS)
    chosen = list(enumerate(pairs)) if indices is None else [(i, pairs[i]) for i in indices]
    items = prepare(judge, chosen, rubrics, data, options)
    return {index: result for batch in Scorer(judge, rubrics, options, "cpu").judged(items) for index, result in batch}


@pytest.mark.parametrize("options", [ScoreOptions(max_new_tokens=5, max_tiles=1), ScoreOptions(mode="logits", max_tiles=1),
                                     ScoreOptions(max_new_tokens=4, max_tiles=1, samples=2, temperature=1.0, seed=3)],
                         ids=["generate", "logits", "sampled"])
def test_a_pair_judged_alone_is_the_pair_judged_in_a_batch_in_both_orders(judge, pairs, data, options):
    together = judged(judge, pairs, data, options)
    for index in (0, 1):  # a pairwise pair and a pointwise one
        alone = judged(judge, pairs, data, options, [index])[index]
        same(alone.model_dump(), together[index].model_dump())
    pairwise = together[0]
    assert len(pairwise.forward) == len(pairwise.reverse) == options.samples
    assert [j.first for j in pairwise.forward + pairwise.reverse] == ["A"] * options.samples + ["B"] * options.samples


def test_sampled_judgements_draw_from_the_nucleus_top_p_keeps(judge, pairs, data):
    """VL-RewardBench samples at top_p 0.2: a nucleus that holds only the likeliest token draws the greedy
    judgement every time, while the whole distribution of a random judge (nearly flat) draws others."""
    greedy = judged(judge, pairs, data, ScoreOptions(max_new_tokens=6, max_tiles=1), [0])[0]
    sampled = {top_p: judged(judge, pairs, data, ScoreOptions(max_new_tokens=6, max_tiles=1, samples=3, temperature=1.0, top_p=top_p), [0])[0]
               for top_p in (1e-6, 1.0)}
    for order in ("forward", "reverse"):
        expected = getattr(greedy, order)[0].feedback
        assert [j.feedback for j in getattr(sampled[1e-6], order)] == [expected] * 3
        assert [j.feedback for j in getattr(sampled[1.0], order)] != [expected] * 3


def test_a_top_p_outside_zero_to_one_is_refused():
    for top_p in (0, 1.5):
        with pytest.raises(UsageError, match=f"top_p {top_p:g} is a share of the probability"):
            ScoreOptions(samples=3, top_p=top_p)


def test_a_count_of_samples_past_the_bound_is_refused():
    """--samples 1e20 was taken, and the run never ended."""
    with pytest.raises(UsageError, match=f"samples must be a whole number of at least 1 and below {MAX_SAMPLES + 1}, got 100000000000000000000"):
        ScoreOptions(samples=10**20, temperature=1.0)
    assert ScoreOptions(samples=MAX_SAMPLES).samples == MAX_SAMPLES


def test_a_count_of_tiles_past_the_bound_is_refused():
    """--max_tiles 1e9 hung choosing the first image's grid."""
    with pytest.raises(UsageError, match=f"max_tiles must be a whole number of at least 1 and below {MAX_TILES + 1} or none, got 1000000000"):
        ScoreOptions(max_tiles=10**9)
    assert ScoreOptions(max_tiles=MAX_TILES).max_tiles == MAX_TILES


def test_every_verdict_distribution_sums_to_one_and_is_in_the_pairs_terms(judge, pairs, data):
    results = judged(judge, pairs, data, ScoreOptions(max_new_tokens=5, max_tiles=1))
    for result in results.values():
        distributions = [result.verdict_distribution, *[j.verdict_distribution for j in result.forward + result.reverse]]
        for distribution in distributions:
            assert list(distribution) == ["A", "B", "tie"] and sum(distribution.values()) == pytest.approx(1)
    # A random judge prefers whatever it sees first: in its own positions it leans the same way in both orders,
    # so in the pair's terms the two orders mirror each other.
    forward, reverse = results[0].forward[0].verdict_distribution, results[0].reverse[0].verdict_distribution
    assert forward["A"] > forward["B"] and reverse["B"] > reverse["A"]


def test_a_pointwise_rubric_scores_each_answer_and_derives_the_verdict(judge, pairs, data):
    options = ScoreOptions(max_new_tokens=5, max_tiles=1, tie_margin=0.01)
    result = judged(judge, pairs, data, options, [1])[1]
    assert result.rule == "expected_score" and result.forward == result.reverse == [] and result.swap_consistent is None
    a, b = result.scores["A"], result.scores["B"]
    assert (a.id, a.model, b.model) == (pairs[1].id, pairs[1].model_a, pairs[1].model_b)
    assert (result.verdict, result.verdict_distribution) == pointwise_verdict(a, b, 0.01)
    assert sum(result.verdict_distribution.values()) == pytest.approx(1)


def test_judge_score_writes_pair_results_and_resumes(checkpoint, data, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["--model_path", str(checkpoint), "--input_dir", str(data), "--input_file", "pairs.json", "--output_dir", str(out), *FAST,
            "--pair_rule", "mean_probability"]
    assert main(args) == 0
    results = [PairResult.model_validate(r) for r in json.loads((out / "eval_result.json").read_text())]
    assert [r.id for r in results] == [p.id for p in load_pairs(data / "pairs.json")]
    assert all(r.verdict in ("A", "B", "tie") and r.rule == "mean_probability" for r in results)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pairs"] == 6 and summary["judged"] == 6 and summary["agreement"]["n_with_ties"] == 6
    assert summary["first_shown_wins"]["forward"]["n"] == 6
    out_text = capsys.readouterr().out
    assert "Pairs: 6" in out_text and "first shown wins" in out_text
    before = (out / "eval_result.json").read_text()
    assert main(args) == 0
    assert "resuming: 6 sample(s) already scored" in capsys.readouterr().err
    assert (out / "eval_result.json").read_text() == before
    # another rule is another run: the journal refuses to be resumed under it
    assert main([*args[:-1], "agree"]) == 2
    assert "written by a run with other settings" in capsys.readouterr().err


def test_judge_score_marks_each_pair_kept_or_abstained_by_a_pair_calibrator(checkpoint, data, tmp_path, capsys):
    """judge-calibrate fits the selective threshold on the run's verdicts; judge-score --calibrator (resuming the same
    run: the calibrator is applied at the merge) writes each pair's abstained and uncertainty, and the summary counts them."""
    out = tmp_path / "out"
    args = ["--model_path", str(checkpoint), "--input_dir", str(data), "--input_file", "pairs.json", "--output_dir", str(out), *FAST,
            "--pair_rule", "mean_probability"]  # the tiny judge's text never parses: its verdicts come from its distributions
    assert main(args) == 0
    plain = json.loads((out / "eval_result.json").read_text())
    assert "abstained" not in plain[0]  # without a calibrator, the records are as before
    assert calibrate(["--predictions", str(out / "eval_result.json"), "--human", str(data / "pairs.json"), "--output_dir", str(tmp_path / "cal"),
                      "--bootstrap", "0"]) == 0
    fitted = json.loads((tmp_path / "cal" / "calibrator.json").read_text())
    assert fitted["kind"] == "pairs" and fitted["selective"]["threshold"] is None  # 6 labelled pairs: too few to keep any
    capsys.readouterr()
    assert main([*args, "--calibrator", str(tmp_path / "cal" / "calibrator.json")]) == 0
    records = json.loads((out / "eval_result.json").read_text())
    assert all(r["abstained"] for r in records) and "Selective (--calibrator): 0 kept, 6 abstained" in capsys.readouterr().out
    # a threshold halfway: a pair is kept where the probability of its verdict, averaged over both orders, reaches it
    (tmp_path / "half.json").write_text(json.dumps({**fitted, "selective": {**fitted["selective"], "threshold": 0.5}}))
    assert main([*args, "--calibrator", str(tmp_path / "half.json")]) == 0
    records = json.loads((out / "eval_result.json").read_text())
    for r in records:
        confidence = r["verdict_distribution"][r["verdict"]]
        assert r["abstained"] == (confidence < 0.5) and r["uncertainty"] == pytest.approx(1 - confidence)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["selective"]["kept"] == sum(not r["abstained"] for r in records)
    # a map of scores is refused for pairs, before the judge loads
    score_map = {"method": "linear", "source": "score", "x": [0, 6], "y": [0, 6], "scale": [0, 6]}
    (tmp_path / "scores.json").write_text(json.dumps(score_map))
    assert main([*args[:1], str(tmp_path / "none"), *args[2:], "--calibrator", str(tmp_path / "scores.json")]) == 2
    assert "was fitted on single answers' scores, and this run has verdicts on pairs" in capsys.readouterr().err


def test_flags_that_do_not_apply_to_pairs_are_refused_before_loading(data, tmp_path, capsys):
    base = ["--model_path", str(tmp_path / "none"), "--input_dir", str(data), "--input_file", "pairs.json", "--output_dir", str(tmp_path / "o")]
    assert main([*base, "--probe_images", "blank"]) == 2
    assert "--probe_images applies to samples, not pairs" in capsys.readouterr().err
    assert main([*base, "--backend", "openai", "--base_url", "http://127.0.0.1:9/v1"]) == 2
    assert "--backend openai scores samples only" in capsys.readouterr().err


def test_the_options_of_pairs_given_for_single_answers_are_refused_before_loading(tmp_path, capsys):
    """--samples 3 on MMIE's answers did nothing and said nothing; a preset's values (the default) are no matter."""
    (tmp_path / "samples.json").write_text(json.dumps([{"id": "SA_1", "question": "Q?", "answer": "A."}]))
    args = ["--model_path", str(tmp_path / "none"), "--input_dir", str(tmp_path), "--input_file", "samples.json", "--output_dir", str(tmp_path / "o")]
    assert main([*args, "--samples", "3", "--tie-margin", "1"]) == 2
    err = capsys.readouterr().err
    assert "--tie_margin, --samples apply to pairs of answers; " in err and "holds single answers (mmie)" in err
    assert main(args) == 2 and "none" in capsys.readouterr().err  # without them, on to the checkpoint (which is missing)


def test_a_sample_under_a_pairwise_rubric_is_refused_before_loading(tmp_path, capsys):
    (tmp_path / "samples.json").write_text(json.dumps([{"id": "SA_1", "question": "Q?", "answer": "A."}]))
    (tmp_path / "sa.yaml").write_text("kind: pairwise\ncategory: SA\ninstructions: Which?\ntemplate: '{instructions}{question}{answer_a}{answer_b}'\n")
    args = ["--model_path", str(tmp_path / "none"), "--input_dir", str(tmp_path), "--input_file", "samples.json", "--rubric", str(tmp_path / "sa.yaml"),
            "--output_dir", str(tmp_path / "o")]
    assert main(args) == 2
    assert "the rubric of category SA compares two answers (kind: pairwise), but its 1 sample(s) each have one" in capsys.readouterr().err
