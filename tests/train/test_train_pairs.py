"""judge-train on pairs: both orders of every pair, the verdict in the order shown after people's rationale,
what a verdict format cannot write refused before the model loads, and a real short run evaluated per
checkpoint by pairwise accuracy."""

import json

import pytest

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.data import InputError, load_pairs
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_pairs
from mmjudge.judge.preferences import in_pair_terms
from mmjudge.judge.verdicts import VERDICT_FORMATS, VERDICT_HEADING
from mmjudge.train.cli import main as train_main
from mmjudge.train.data import IGNORE_INDEX, build_dataset, merge_pair_annotators, pair_target

TINY_RUBRIC = [str(CONFIG_DIR / "rubrics" / "tiny")]


@pytest.fixture(scope="module")
def base(checkpoint):
    return checkpoint


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    records = json.loads(write_pairs(root, 10, seed=3, annotated=True, text_only=True).read_text())
    ids = sorted({r["id"] for r in records})
    (root / "train.json").write_text(json.dumps([r for r in records if r["id"] not in ids[:3]]))
    (root / "heldout.json").write_text(json.dumps([r for r in records if r["id"] in ids[:3]]))
    return root


def test_every_pair_is_learnt_in_both_orders_with_people_s_verdict_as_shown(base, data):
    judge = load_judge(base)
    pairs = load_pairs(data / "train.json", data, preferred=True)
    rubrics = load_rubrics(TINY_RUBRIC)
    dataset = build_dataset(judge, pairs, rubrics, data, max_length=8192, image_token_budget=None, source="train.json")
    rated = merge_pair_annotators(pairs)
    assert len(dataset) == 2 * len(rated) < 2 * len(pairs)  # annotators merged, then swapped
    assert [row["id"] for row in dataset][:2] == [f"{rated[0].pair.id}#forward", f"{rated[0].pair.id}#reverse"]
    flipped = {"A": "B", "B": "A", "tie": "tie"}
    # the rationale names the answers as the order shows them ("Answer A is poor and answer B is excellent.")
    swapped = lambda text: text.replace("Answer A", "Answer #").replace("answer B", "answer A").replace("Answer #", "Answer B")  # noqa: E731
    for k, r in enumerate(rated):
        forward, reverse = dataset[2 * k], dataset[2 * k + 1]
        for row, shown, rationale in ((forward, r.preference, r.rationale), (reverse, flipped[r.preference], swapped(r.rationale))):
            first = next(i for i, label in enumerate(row["labels"]) if label != IGNORE_INDEX)
            target = judge.tokenizer.decode(row["input_ids"][first:])
            assert target.startswith(rationale) and target.removesuffix("<|end|>").endswith(f"{VERDICT_HEADING}\n{shown}")
            assert all(label == IGNORE_INDEX for label in row["labels"][:first])
    assert pair_target(rated[0], rubrics["general"], "B") == f"{swapped(rated[0].rationale)}\n{VERDICT_HEADING}\n{flipped[rated[0].preference]}"


def test_what_the_judge_learns_to_write_is_read_back_as_people_s_verdict(base, data):
    """Every target, read by the verdict format and put back in the pair's terms, is people's verdict."""
    pairs = load_pairs(data / "train.json", data, preferred=True)
    rubric = load_rubrics(TINY_RUBRIC)["general"]
    for r in merge_pair_annotators(pairs):
        for first in ("A", "B"):
            reading = VERDICT_FORMATS[rubric.verdict_format].read(pair_target(r, rubric, first), rubric.criteria)
            assert in_pair_terms(reading.verdict, first) == r.preference


def test_pairs_without_a_rationale_teach_the_verdict_alone(tmp_path):
    """The demo's pairs (write_pairs(rationale=False)): the target is the verdict in the order shown, nothing
    before it from which the judge could read it."""
    pairs = load_pairs(write_pairs(tmp_path, 6, seed=3, annotated=True, text_only=True, rationale=False), tmp_path, preferred=True)
    assert all(p.rationale is None and p.preference for p in pairs)
    rubric = load_rubrics(TINY_RUBRIC)["general"]
    flipped = {"A": "B", "B": "A", "tie": "tie"}
    for r in merge_pair_annotators(pairs):
        assert [pair_target(r, rubric, first) for first in "AB"] == [f"{VERDICT_HEADING}\n{r.preference}", f"{VERDICT_HEADING}\n{flipped[r.preference]}"]


def test_a_preference_its_verdict_format_cannot_write_is_refused_naming_the_pair(base, data, tmp_path):
    rubric = tmp_path / "vlrb.yaml"
    rubric.write_text("kind: pairwise\ncategory: general\nverdict_format: vlrewardbench\ninstructions: Which?\n"
                      "template: '{instructions}{question}{answer_a}{answer_b}'\n")
    pairs = load_pairs(data / "train.json", data, preferred=True)
    assert any(p.preference == "tie" for p in pairs)
    with pytest.raises(InputError) as info:
        build_dataset(load_judge(base), pairs, load_rubrics([rubric]), data, 8192, None, "train.json")
    problem = next(p for p in info.value.problems)
    assert problem.field == "preference" and "the vlrewardbench verdict format has no way to write 'tie'" in problem.message


def test_pairs_need_a_pairwise_rubric_and_a_preference_before_the_model_loads(data, tmp_path, capsys):
    args = ["--model_path", str(tmp_path / "no-model"), "--train_file", str(data / "train.json"), "--input_dir", str(data),
            "--output_dir", str(tmp_path / "out"), "--config", str(CONFIG_DIR / "train" / "tiny.yaml")]
    pointwise = tmp_path / "general.yaml"
    pointwise.write_text("category: general\ninstructions: Rate.\ntemplate: '{instructions}{question}{answer}'\n")
    assert train_main([*args, "--rubric", str(pointwise)]) == 2
    assert "the rubric of category general is of kind pointwise; judge-train learns pairs' verdicts with a pairwise rubric" in capsys.readouterr().err
    (tmp_path / "bare.json").write_text(json.dumps([{"id": "x", "question": "Q", "answer_a": "A", "answer_b": "B"}]))
    assert train_main([*args[:2], "--train_file", str(tmp_path / "bare.json"), *args[4:]]) == 2
    assert "preference: no preference" in capsys.readouterr().err


@pytest.mark.slow
def test_a_short_run_on_pairs_evaluates_each_checkpoint_by_pairwise_accuracy(base, data, tmp_path, capsys):
    out = tmp_path / "out"
    assert train_main(["--model_path", str(base), "--train_file", str(data / "train.json"), "--eval_file", str(data / "heldout.json"),
                       "--input_dir", str(data), "--output_dir", str(out), "--config", str(CONFIG_DIR / "train" / "tiny.yaml"),
                       "--rubric", *TINY_RUBRIC, "--max_steps", "4", "--save_steps", "2", "--eval_max_new_tokens", "8"]) == 0
    history = json.loads((out / "eval_history.json").read_text())
    assert [h["step"] for h in history] == [2, 4]
    assert all(h["pairs"] == 3 and {"accuracy_with_ties", "accuracy_without_ties", "swap_consistency", "first_shown_wins"} <= set(h) for h in history)
    assert "best pairwise accuracy, ties counted as a verdict" in capsys.readouterr().out
    assert (out / "judge_config.json").is_file()
