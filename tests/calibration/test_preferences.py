"""judge-calibrate on verdicts: each figure against a count made another way, the ranking against a known
order, and the command end to end on judge-score's pair results and on OpenING's battle files."""

import json
import subprocess
import sys
from itertools import product

import numpy as np
import pytest

from mmjudge.calibration.cli import main
from mmjudge.calibration.preferences import (TIE_RULES, People, analyse, bradley_terry, cohen_kappa, outcome, position_bias, ranking, read_judge,
                                             read_people, win_rates)
from mmjudge.judge.data import VERDICTS, OrderJudgement, PairResult


def write(path, value):
    path.write_text(json.dumps(value))
    return str(path)


def order(verdict, first):
    return OrderJudgement(first=first, feedback="", verdict=verdict, label=None, n_tiles=0, prompt_tokens=1, generated_tokens=1,
                          verdict_distribution=None if verdict is None else {v: 0.8 if v == verdict else 0.1 for v in VERDICTS})


def pair_result(pid, forward, reverse, models=("m1", "m2"), group="g", rule="agree"):
    orders = {"forward": [order(forward, "A")], "reverse": [order(reverse, "B")]}
    verdict = None if None in (forward, reverse) else forward if forward == reverse else "tie"
    return PairResult(id=pid, model_a=models[0], model_b=models[1], category="general", group=group, verdict=verdict, rule=rule,
                      swap_consistent=None if verdict is None else forward == reverse, n_images=0, **orders).model_dump()


@pytest.fixture
def files(tmp_path):
    """Twelve pairs judged in both orders; people's preferences, two annotators on some."""
    rng = np.random.default_rng(1)
    models = ["m1", "m2", "m3"]
    results, people = [], []
    for k in range(40):
        a, b = rng.choice(models, 2, replace=False)
        forward, reverse = rng.choice(["A", "B", "tie", None], 2, p=[0.4, 0.3, 0.2, 0.1])
        results.append(pair_result(f"p{k}", forward, reverse, (a, b), group=f"g{k % 2}"))
        preference = str(rng.choice(["A", "B", "tie"], p=[0.45, 0.35, 0.2]))
        people.append({"id": f"p{k}", "preference": preference, "annotator": "x", "model_a": a, "model_b": b})
        if k % 5 == 0:
            people.append({"id": f"p{k}", "preference": "B", "annotator": "y"})
    return write(tmp_path / "eval_result.json", results), write(tmp_path / "people.json", people), tmp_path


def test_every_figure_against_a_plain_count(files):
    predictions, human, _ = files
    report = analyse([predictions], ["judge"], human, "category", 200, 0)
    judged, _ = read_judge(predictions)
    people, _ = read_people(human)
    j = report.judges["judge"]
    reference = {rid: p.reference for rid, p in people.items()}
    rows = [(judged[r].verdict, reference[r]) for r in judged if judged[r].verdict is not None and reference[r] is not None]
    assert j.n_with_ties == len(rows) and j.accuracy_with_ties.value == pytest.approx(np.mean([a == b for a, b in rows]))
    decisive = [(a, b) for a, b in rows if "tie" not in (a, b)]
    assert j.accuracy_without_ties.value == pytest.approx(np.mean([a == b for a, b in decisive]))
    low, high = j.accuracy_with_ties.bootstrap_95.low, j.accuracy_with_ties.bootstrap_95.high
    assert low <= j.accuracy_with_ties.value <= high
    assert sum(sum(row.values()) for row in j.confusion.values()) == len(rows) and j.confusion["A"]["B"] == rows.count(("B", "A"))
    # position bias: in the forward order A is shown first, in the reverse B
    raw = json.loads(open(predictions).read())
    forward_first = [r["forward"][0]["verdict"] == "A" for r in raw if r["forward"][0]["verdict"] in ("A", "B")]
    reverse_first = [r["reverse"][0]["verdict"] == "B" for r in raw if r["reverse"][0]["verdict"] in ("A", "B")]
    assert (j.position_bias["forward"].n, j.position_bias["forward"].first_wins) == (len(forward_first), sum(forward_first))
    assert (j.position_bias["reverse"].n, j.position_bias["reverse"].first_wins) == (len(reverse_first), sum(reverse_first))
    both = [r["forward"][0]["verdict"] == r["reverse"][0]["verdict"] for r in raw if None not in (r["forward"][0]["verdict"], r["reverse"][0]["verdict"])]
    assert j.swap_consistency.value == pytest.approx(np.mean(both))
    assert set(j.groups) == {"g0", "g1"} and sum(g.n for g in j.groups.values()) == len(rows)
    assert people["p0"].verdicts == [people["p0"].verdicts[0], "B"]  # two annotators: their majority is the reference
    assert report.most_annotators == 2


@pytest.mark.parametrize("judge, human", [(["A", "A", "B", "tie"], ["A", "B", "B", "tie"]), (["A"] * 5, ["A", "B", "A", "A", "B"])])
def test_cohen_kappa_against_its_definition(judge, human):
    observed = np.mean([a == b for a, b in zip(judge, human)])
    expected = sum(judge.count(v) / len(judge) * human.count(v) / len(human) for v in VERDICTS)
    assert cohen_kappa(judge, human).value == pytest.approx((observed - expected) / (1 - expected))
    assert cohen_kappa(["A"] * 4, ["A"] * 4).value is None


def test_each_tie_rule_against_a_plain_count():
    battles = [("x", "y", "A", None), ("y", "x", "tie", "A"), ("x", "z", "tie", None), ("z", "x", "B", None), ("x", "y", "tie", "B")]
    x = {rule: win_rates(battles, rule)["x"] for rule in TIE_RULES}
    # x: won, tie leaning to y (y is A), tie with no lean (forced to A: x), won as B, tie leaning to y (y is B)
    assert x["forced"] == 3 / 5 and x["excluded"] == 2 / 2 and x["zero"] == 2 / 5 and x["half"] == (2 + 1.5) / 5
    assert all(outcome(v, lean, rule) is None or sum(outcome(v, lean, rule)) in (0, 1) for v, lean, rule in product(VERDICTS, ("A", "B", None), TIE_RULES))


def test_bradley_terry_recovers_a_known_order_with_its_intervals():
    rng = np.random.default_rng(0)
    strengths = {"best": 1.0, "good": 0.3, "fair": -0.2, "weak": -1.1}
    names = list(strengths)
    battles = []
    for _ in range(1500):
        a, b = rng.choice(names, 2, replace=False)
        p_a = 1 / (1 + np.exp(strengths[b] - strengths[a]))
        battles.append((a, b, "A" if rng.random() < p_a else "B", None))
    ranked = ranking(battles, 100, 0)
    assert list(ranked.models) == names  # best first
    truth = np.array(list(strengths.values())) - np.mean(list(strengths.values()))
    for name, true in zip(names, truth):
        s = ranked.models[name]
        assert s.low < s.log_strength < s.high and abs(s.log_strength - true) < 0.25 and s.high - s.low < 0.6
    # a model that never wins keeps a finite strength (the prior's tenth of a tie)
    lone = bradley_terry(np.array([0, 0]), np.array([1, 1]), np.array([1.0, 1.0]), 2)
    assert np.isfinite(lone).all() and lone[0] > lone[1]


def test_position_bias_tests_against_half():
    assert position_bias([True] * 9 + [False]).p_value < 0.05 and position_bias([True, False] * 5).p_value == 1.0
    assert position_bias([]).share is None


def test_the_command_writes_a_preference_report_with_its_plots(files, capsys):
    predictions, human, tmp = files
    assert main(["--predictions", predictions, "--human", human, "--output_dir", str(tmp / "report"), "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert "eval_result: accuracy" in out and "first shown wins" in out
    report = json.loads((tmp / "report" / "report.json").read_text())
    assert report["kind"] == "preferences" and set(report["judges"]["eval_result"]["win_rates"]) == set(TIE_RULES)
    text = (tmp / "report" / "report.md").read_text()
    for heading in ("## Agreement", "## Position bias and swap consistency", "## Ranking of the evaluated models", "### Win rates, a tie worth 0.5"):
        assert heading in text
    assert sorted(p.name for p in (tmp / "report" / "plots").iterdir()) == ["position_bias.png", "ranking.png"]
    assert "data:image/png;base64," in (tmp / "report" / "report.html").read_text()


def test_score_flags_are_refused_for_verdicts(files, capsys):
    predictions, human, tmp = files
    assert main(["--predictions", predictions, "--human", human, "--output_dir", str(tmp / "r"), "--fit", "linear"]) == 2
    assert "--fit: for scores; these predictions are verdicts on pairs" in capsys.readouterr().err


def test_opening_battle_files_of_people_and_of_a_judge(tmp_path):
    battle = lambda k, a, b, w: {"data_id": str(k), "model_A": {"id": "1", "name": a}, "model_B": {"id": "2", "name": b}, "winner": w}  # noqa: E731
    people = [battle(k, "x", "y", w) for k, w in enumerate(["A", "Tie(B)", "B", "Tie(A)"])]
    judge = [battle(k, "x", "y", w) for k, w in enumerate(["A", "B", "Tie(B)", "Tie(A)"])]
    report = analyse([write(tmp_path / "judge.json", judge)], ["j"], write(tmp_path / "people.json", people), "none", 0, 0)
    j = report.judges["j"]
    assert j.n_with_ties == 4 and j.accuracy_with_ties.value == 2 / 4  # A=A, tie vs B, B vs tie, tie=tie
    assert j.n_without_ties == 1 and j.accuracy_without_ties.value == 1.0
    assert j.win_rates["forced"]["x"] == 2 / 4  # A, and Tie(A); the judge's Tie(B) goes to y
    assert j.position_bias["forward"].n == 2 and j.position_bias["reverse"].n == 0
    assert j.selective.n == 0 and "no calibrator is written" in j.selective.reason and report.calibrators == {}  # no distribution to abstain by


def test_people_s_reference_is_the_majority_of_those_who_gave_a_preference(tmp_path):
    # An annotator without a preference was a vote: A and a missing one made a tie.
    assert People(["A", None]).reference == "A" and People([None]).reference is None
    people, problems = read_people(write(tmp_path / "people.json", [{"id": "q", "preference": "B", "annotator": "x"}, {"id": "q", "preference": "B", "annotator": "x"},
                                                                    {"id": "q", "preference": "A", "annotator": "y"}]))
    assert problems == [] and people["q"].reference == "tie"  # x once: B against A


def test_opening_winners_other_than_a_b_and_a_tie_are_named(tmp_path):
    battle = lambda k, w: {"data_id": str(k), "model_A": {"id": "1", "name": "x"}, "model_B": {"id": "2", "name": "y"}, "winner": w}  # noqa: E731
    people, problems = read_people(write(tmp_path / "people.json", [battle(0, "A"), battle(1, "X"), battle(2, "B "), battle(3, "Tie(A)")]))
    assert {rid: p.reference for rid, p in people.items()} == {"0_x_y": "A", "3_x_y": "tie"}
    assert [(p.index, p.field) for p in problems] == [(1, "winner"), (2, "winner")]
    assert "'X' is no winner of OpenING's: A, B, or a tie" in problems[0].message


def test_preferences_import_and_run_without_torch(files):
    predictions, human, tmp = files
    code = ("import sys, importlib.abc\n"
            "class NoTorch(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] == 'torch': raise ImportError('torch is blocked')\n"
            "sys.meta_path.insert(0, NoTorch())\n"
            "import mmjudge.calibration.cli\n"
            f"assert mmjudge.calibration.cli.main(['--predictions', {predictions!r}, '--human', {human!r}, '--output_dir', {str(tmp / 'nt')!r},"
            " '--bootstrap', '0']) == 0\n"
            "assert 'torch' not in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
