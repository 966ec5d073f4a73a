"""Pairs as data, their prompts, and how a pair's verdict is decided (judge/data.py, judge/prompts.py,
judge/preferences.py)."""

import json
from itertools import product

import pytest
from PIL import Image

from mmjudge.judge.data import VERDICTS, InputError, OrderJudgement, Pair, flip, load_pairs, majority, people_majority, validate_samples
from mmjudge.judge.preferences import first_wins, order_verdict, pairwise_verdict, pointwise_verdict
from mmjudge.judge.prompts import Rubric, build_pair_prompt, load_rubrics
from mmjudge.judge.templates import get_template
from mmjudge.judge.testing import judge_result
from mmjudge.judge.tiling import TilingConfig
from mmjudge.configs import CONFIG_DIR

TEMPLATE = get_template("phi3-chat")
TILE = "<img>" + "<IMG_CONTEXT>" * 256 + "</img>"
PAIRWISE = Rubric(kind="pairwise", category="general", instructions="Compare.",
                  template="{instructions}\n### Question\n{question}\n### Answer A\n{answer_a}\n### Answer B\n{answer_b}\n### Review\n")


@pytest.fixture
def images(tmp_path):
    for name, colour in (("q.png", "red"), ("a.png", "green"), ("b.png", "blue")):
        Image.new("RGB", (448, 448), colour).save(tmp_path / name)
    return tmp_path


def pair(**overrides):
    data = {"id": "p1", "question": [{"text": "What next?", "image": "q.png"}], "answer_a": [{"text": "It sails.", "image": "a.png"}],
            "answer_b": "It sinks.", "model_a": "m1", "model_b": "m2"}
    return Pair.model_validate({**data, **overrides})


def write(path, records):
    path.write_text("\n".join(json.dumps(r) for r in records) if path.suffix == ".jsonl" else json.dumps(records))
    return path


# -- the data -----------------------------------------------------------------------------------------

def test_a_pair_reads_strings_as_text_and_names_its_category_and_verdicts():
    p = pair(id="SA_0003", preference="Tie", criteria={"text_quality": "b"})
    assert p.answer_b[0].text == "It sinks." and p.category == "SA" and p.preference == "tie" and p.criteria == {"text_quality": "B"}
    assert pair().category == "general" and pair(category="pbl").category == "PBL"
    assert p.images() == ["q.png", "a.png"]
    sample = p.as_sample("A")
    assert (sample.id, sample.model, sample.category, sample.answer) == ("SA_0003", "m1", "SA", p.answer_a)


def test_every_problem_of_a_pairs_file_is_named_with_record_and_field(tmp_path):
    path = write(tmp_path / "pairs.jsonl", [
        {"id": "ok", "question": "Q", "answer_a": "A", "answer_b": "B", "preference": "A"},
        {"id": "no-b", "question": "Q", "answer_a": "A"},
        {"id": "bad", "question": "Q", "answer_a": "A", "answer_b": "B", "preference": "C", "criteria": {"x": "maybe"}},
        {"id": "img", "question": "Q", "answer_a": [{"image": "missing.png"}], "answer_b": "B"},
    ])
    _, problems, _ = validate_samples(path, tmp_path, Pair)
    shown = [str(p) for p in problems]
    assert any("record 1 (id 'no-b'): answer_b: Field required" in s for s in shown)
    assert any("record 2 (id 'bad'): preference: Input should be 'A', 'B' or 'tie'" in s for s in shown)
    assert any("record 2 (id 'bad'): criteria.x: Input should be 'A', 'B' or 'tie'" in s for s in shown)
    assert any("record 3 (id 'img'): answer_a[0].image: image not found" in s for s in shown)


def test_annotators_of_one_pair_are_one_pair_with_their_majority_preference(tmp_path):
    same = {"question": "Q", "answer_a": "A", "answer_b": "B"}
    path = write(tmp_path / "pairs.json", [{"id": "x", **same, "preference": "A", "annotator": "1"}, {"id": "x", **same, "preference": "A", "annotator": "2"},
                                            {"id": "x", **same, "preference": "B", "annotator": "3"}, {"id": "y", **same, "preference": "A", "annotator": "1"},
                                            {"id": "y", **same, "preference": "B", "annotator": "2"}, {"id": "z", **same, "answer_b": "other"}])
    pairs, problems, notes = validate_samples(path, None, Pair)
    assert [(p.id, p.preference) for p in pairs] == [("x", "A"), ("y", "tie"), ("z", None)] and problems == []
    assert "3 record(s) repeat a pair read before" in notes[0] and "each pair is judged once" in notes[0]
    path = write(tmp_path / "clash.json", [{"id": "x", **same}, {"id": "x", **same, "answer_a": "changed"}])
    assert "record 1 (id 'x'): duplicate id with a different pair than record 0" in str(validate_samples(path, None, Pair)[1][0])


def test_people_are_the_majority_of_the_annotators_who_gave_a_preference_each_once(tmp_path):
    """An annotator without a preference was a vote (A and a missing one: a tie); an annotator repeated counted
    twice (A, A, B: A); the same annotator with two preferences is refused, naming the record."""
    same = {"question": "Q", "answer_a": "A", "answer_b": "B"}
    path = write(tmp_path / "pairs.json", [{"id": "x", **same, "preference": "A", "annotator": "1"}, {"id": "x", **same, "annotator": "2"},
                                           {"id": "y", **same, "preference": "A", "annotator": "1"}, {"id": "y", **same, "preference": "A", "annotator": "1"},
                                           {"id": "y", **same, "preference": "B", "annotator": "2"}, {"id": "z", **same, "annotator": "1"},
                                           {"id": "w", **same, "preference": "A"}, {"id": "w", **same, "preference": "B"}])
    pairs, problems, _ = validate_samples(path, None, Pair)
    assert [(p.id, p.preference) for p in pairs] == [("x", "A"), ("y", "tie"), ("z", None), ("w", "A")]
    [problem] = problems
    assert (problem.index, problem.field) == (7, "preference") and "duplicate id with another preference; if these are two annotators" in problem.message
    assert people_majority(["A", None, None]) == "A" and people_majority([None]) is None and people_majority(["A", "B", None]) == "tie"


def test_training_pairs_need_a_preference_and_one_record_per_annotator(tmp_path):
    same = {"question": "Q", "answer_a": "A", "answer_b": "B"}
    path = write(tmp_path / "train.json", [{"id": "x", **same, "preference": "A", "annotator": "1"}, {"id": "x", **same, "preference": "B", "annotator": "1"},
                                           {"id": "y", **same}])
    with pytest.raises(InputError) as info:
        load_pairs(path, preferred=True)
    shown = [str(p) for p in info.value.problems]
    assert any("record 1 (id 'x'): duplicate record: same as record 0" in s for s in shown)
    assert any("record 2 (id 'y'): preference: no preference" in s for s in shown)


def test_majority_and_flip():
    assert majority(["A"]) == "A" and majority(["A", "A", "B"]) == "A" and majority(["A", "B"]) == "tie"
    assert majority(["A", None, None]) == "tie" and majority([None]) is None and majority([]) is None
    assert [flip(v) for v in (*VERDICTS, None)] == ["B", "A", "tie", None]


# -- prompts ------------------------------------------------------------------------------------------

def test_a_pair_prompt_shows_the_answers_in_either_order_with_images_numbered_as_shown(images):
    forward = build_pair_prompt(pair(), "A", PAIRWISE, TEMPLATE, None, images, TilingConfig(max_tiles=1))
    reverse = build_pair_prompt(pair(), "B", PAIRWISE, TEMPLATE, None, images, TilingConfig(max_tiles=1))
    assert forward.query == ("Compare.\n### Question\nWhat next?\nImage-0: <image>\n\n### Answer A\nIt sails.\nImage-1: <image>\n\n"
                             "### Answer B\nIt sinks.\n\n### Review\n")
    assert reverse.query == ("Compare.\n### Question\nWhat next?\nImage-0: <image>\n\n### Answer A\nIt sinks.\n\n"
                             "### Answer B\nIt sails.\nImage-1: <image>\n\n### Review\n")
    assert [i.path.name for i in forward.images] == [i.path.name for i in reverse.images] == ["q.png", "a.png"]
    assert forward.text == TEMPLATE.render(forward.query.replace("<image>", TILE))


def test_a_benchmark_layout_puts_parts_and_images_where_its_message_does(images):
    parts = PAIRWISE.model_copy(update={"layout": "parts", "separator": "", "images": "end",
                                        "template": "{instructions} Q: {question}\nA1: {answer_a}\nA2: {answer_b}"})
    prompt = build_pair_prompt(pair(answer_a="It sails."), "B", parts, TEMPLATE, None, images, TilingConfig(max_tiles=1))
    assert prompt.query == "Compare. Q: What next?\nA1: It sinks.\nA2: It sails.<image>"  # the question's image after the text, as [text, image]
    tagged = PAIRWISE.model_copy(update={"layout": "tagged", "system_message": "You judge.",
                                         "template": "<IN>: {question}<A>: {answer_a}\n<B>: {answer_b}{instructions}"})
    prompt = build_pair_prompt(pair(answer_b=[{"text": "", "image": "b.png"}]), "A", tagged, TEMPLATE, None, images, TilingConfig(max_tiles=1))
    assert prompt.query == "<IN>: What next? <IMG_0></IMG_0><image><A>: It sails. <IMG_1></IMG_1><image>\n<B>:  <IMG_2></IMG_2><image>Compare."
    assert prompt.text.startswith("<|system|>\nYou judge.<|end|>")  # the rubric's system message, not the checkpoint's


def test_the_image_budget_cuts_the_answer_shown_last_first(images):
    both = pair(answer_b=[{"text": "It sinks.", "image": "b.png"}])
    prompt = build_pair_prompt(both, "B", PAIRWISE, TEMPLATE, None, images, TilingConfig(max_tiles=1), image_token_budget=512)
    assert prompt.truncated == ["Image-0 (question) omitted"]
    prompt = build_pair_prompt(both, "B", PAIRWISE, TEMPLATE, None, images, TilingConfig(max_tiles=1), image_token_budget=256)
    assert prompt.truncated == ["Image-0 (question) omitted", "Image-2 (answer A) omitted"]  # A is shown second: its image goes first
    assert "Image-1: <image>" in prompt.query and "Image-2: [image omitted]" in prompt.query


def test_pairwise_rubrics_are_checked_when_they_load(tmp_path):
    (tmp_path / "r.yaml").write_text("- {kind: pairwise, category: c, instructions: x, template: '{instructions}{question}{answer}'}\n"
                                     "- {kind: pairwise, category: d, verdict_format: nope, instructions: x, template: '{instructions}{question}{answer_a}{answer_b}'}\n"
                                     "- {category: e, layout: parts, instructions: x, template: '{instructions}{question}{answer}'}\n")
    with pytest.raises(InputError) as info:
        load_rubrics([tmp_path / "r.yaml"])
    shown = [str(p) for p in info.value.problems]
    assert "record 0: template: unknown field(s) {answer}; a template may use {instructions} {question} {answer_a} {answer_b}" in shown[0]
    assert "record 1: verdict_format: 'nope' is none of mmjudge, brackets" in shown[1]
    assert "record 2: layout: for a pairwise rubric only" in shown[2]


def test_the_shipped_pairwise_rubrics_load():
    rubrics = load_rubrics([CONFIG_DIR / "rubrics" / "pairwise.yaml"])
    assert rubrics["general"].kind == "pairwise" and rubrics["general"].verdict_format == "mmjudge"
    assert load_rubrics([CONFIG_DIR / "rubrics" / "tiny"])["general"].kind == "pairwise"


# -- verdicts -----------------------------------------------------------------------------------------

def order(verdict, first, distribution=None):
    return OrderJudgement(first=first, feedback="", verdict=verdict, label=None, verdict_distribution=distribution,
                          n_tiles=0, prompt_tokens=1, generated_tokens=1)


@pytest.mark.parametrize("ahead, behind", list(product([*VERDICTS, None], repeat=2)))
def test_the_agree_rule_and_swap_consistency_against_a_plain_count(ahead, behind):
    verdict, _, consistent = pairwise_verdict([order(ahead, "A")], [order(behind, "B")], "agree")
    if ahead is None or behind is None:
        assert verdict is None and consistent is None
    else:
        assert consistent == (ahead == behind)
        assert verdict == (ahead if ahead == behind else "tie")


def test_the_mean_probability_rule_averages_the_orders():
    forward = order(None, "A", {"A": 0.5, "B": 0.2, "tie": 0.3})
    reverse = order("B", "B", {"A": 0.1, "B": 0.6, "tie": 0.3})
    verdict, distribution, consistent = pairwise_verdict([forward], [reverse], "mean_probability")
    assert distribution == pytest.approx({"A": 0.3, "B": 0.4, "tie": 0.3}) and verdict == "B"
    assert consistent is False  # forward's likeliest is A, reverse's B
    assert order_verdict([forward], "agree") is None and order_verdict([forward], "mean_probability") == "A"


def test_k_sampled_judgements_vote():
    assert order_verdict([order("A", "A"), order("A", "A"), order("B", "A")], "agree") == "A"
    assert order_verdict([order("A", "A"), order(None, "A")], "agree") == "tie"


def test_position_bias_counts_the_answer_shown_first():
    assert first_wins("A", "A") and first_wins("B", "B") and not first_wins("A", "B")
    assert first_wins("tie", "A") is None and first_wins(None, "B") is None


def test_a_pointwise_judge_prefers_the_higher_expected_score_beyond_the_margin():
    def scored(expected, distribution=None):
        return judge_result("p", None, expected_score=expected, score_distribution=distribution)

    assert pointwise_verdict(scored(4.6), scored(4.0), 0.5)[0] == "A"
    assert pointwise_verdict(scored(4.5), scored(4.0), 0.5)[0] == "tie"  # a difference of exactly the margin is a tie
    assert pointwise_verdict(scored(3.0), scored(4.0), 0.5)[0] == "B"
    assert pointwise_verdict(judge_result("p", 5), judge_result("p", 3), 0.5)[0] == "A"  # the written score where no distribution is
    assert pointwise_verdict(scored(None), scored(4.0), 0.5) == (None, None)
    # The distribution of the difference of two independent draws, counted cell by cell.
    a, b = {"3": 0.5, "4": 0.5}, {"3": 0.25, "4": 0.25, "5": 0.5}
    expected = {"A": 0.5 * 0.25, "B": 0.5 * 0.25 + 0.5 * 0.5 + 0.5 * 0.5, "tie": 0.5 * 0.25 + 0.5 * 0.25}
    _, distribution = pointwise_verdict(scored(3.5, a), scored(4.25, b), 0.5)
    assert distribution == pytest.approx(expected) and sum(distribution.values()) == pytest.approx(1)
