"""The four pairwise benchmarks' files, both ways (judge/formats/{vlrewardbench,mmrewardbench,mmrb2,opening}.py),
and their prompts imported from files of their code's shape (judge/pairwise_prompts.py). Each benchmark's own
code is run against these readers and writers in docs/benchmarks.md; here each rule is checked against a
count made another way."""

import csv
import io
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from mmjudge.judge.cli import run
from mmjudge.judge.data import InputError, OrderJudgement, PairResult
from mmjudge.judge.formats import FORMATS, detect_format
from mmjudge.judge.formats import mmrb2, mmrewardbench, opening, vlrewardbench
from mmjudge.judge.pairwise_prompts import IMPORTERS
from mmjudge.judge.preferences import POINTWISE_RULE, pointwise_verdict
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.rubric_cli import main as rubric_main
from mmjudge.judge.testing import judge_result
from mmjudge.judge.verdicts import VERDICT_FORMATS


def png_bytes(colour="red") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def result(pair_id, forward=(), reverse=()) -> PairResult:
    """A pair's result whose judge wrote these labels (and texts) in each order."""
    def judged(items, first):
        return [OrderJudgement(first=first, feedback=text, verdict=None, label=label, n_tiles=0, prompt_tokens=1, generated_tokens=1)
                for label, text in items]
    return PairResult(id=pair_id, model_a=None, model_b=None, category="c", verdict=None, rule="agree", forward=judged(forward, "A"),
                      reverse=judged(reverse, "B"), n_images=0)


# -- VL-RewardBench -----------------------------------------------------------------------------------

def vlrb_record(rid, ranking=(0, 1), **extra):
    return {"id": rid, "query": "<image>\nWhat is it?", "response": ["A cat.", "A dog."], "human_ranking": list(ranking),
            "models": ["m1", "m2"], "judge": "human", "rationale": "r", "query_source": "s", **extra}


def test_vlrewardbench_reads_its_parquet_and_caches_the_images_it_holds(tmp_path, monkeypatch):
    import pyarrow
    import pyarrow.parquet

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rows = [vlrb_record("RLAIF-V_1", image={"bytes": png_bytes(), "path": "x.png"}), vlrb_record("mathverse-2", (1, 0), image={"bytes": png_bytes(), "path": None}),
            vlrb_record("123", image={"bytes": png_bytes("blue"), "path": None})]
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "test.parquet")
    assert detect_format(tmp_path / "test.parquet").name == "vlrewardbench"
    bench = vlrewardbench.read(tmp_path / "test.parquet", tmp_path, {})
    assert bench.problems == []
    assert [(p.group, p.preference) for p in bench.samples] == [("hallucination", "A"), ("reasoning", "B"), ("general", "A")]
    assert bench.samples[0].question[0].text == "What is it?"  # "<image>\n" is out: the image goes apart
    images = [Path(p.question[0].image) for p in bench.samples]
    assert images[0] == images[1] != images[2] and images[0].parent == tmp_path / "cache" / "mmjudge" / "images" and images[0].suffix == ".png"


def test_vlrewardbench_json_records_name_their_image_and_problems_name_their_record(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    (tmp_path / "v.jsonl").write_text("\n".join(json.dumps(r) for r in [
        vlrb_record("ok", image_path="a.png"), vlrb_record("two", image_path="a.png", response=["one"]), vlrb_record("none")]))
    bench = vlrewardbench.read(tmp_path / "v.jsonl", tmp_path, {})
    assert [p.id for p in bench.samples] == ["ok"]
    shown = [str(p) for p in bench.problems]
    assert any("record 1 (id 'two'): response: List should have at least 2 items" in s for s in shown)
    assert any("record 2 (id 'none'): no image" in s for s in shown)


@pytest.mark.parametrize("ranking, random_number, rejected", [((0, 1), 0, 2), ((0, 1), 1, 1), ((1, 0), 0, 1), ((1, 0), 1, 2)])
def test_vlrewardbench_rejected_position_is_the_lower_ranked_answer_in_the_order_shown(ranking, random_number, rejected):
    shown = list(ranking) if random_number == 0 else list(reversed(ranking))
    assert vlrewardbench.rejected_position(list(ranking), random_number) == rejected == shown.index(1) + 1


def test_vlrewardbench_writes_a_line_per_judgement_and_votes_per_pair(tmp_path):
    records = [vlrb_record("RLAIF-V_1"), vlrb_record("RLAIF-V_2"), vlrb_record("mathverse_3", (1, 0)), vlrb_record("wildvision_4")]
    bench = vlrewardbench.BenchmarkInput(tmp_path / "v.jsonl", [], [], {}, records)
    results = {  # (label, text): 1 or 2 as written, None unmatched; ranking (0, 1) rejects 2 in the forward order, 1 in the reverse
        "RLAIF-V_1": result("RLAIF-V_1", [("1", "f")], [("2", "r")]),  # agree, agree: agree
        "RLAIF-V_2": result("RLAIF-V_2", [("2", "f")], [("2", "r")]),  # reject, agree: other
        "mathverse_3": result("mathverse_3", [("1", "f"), ("1", "f"), (None, "f")], [("1", "r"), (None, "r"), ("2", "r")]),
        "wildvision_4": result("wildvision_4", [(None, "f")], [(None, "r")]),  # doesntMatch twice
    }
    vlrewardbench.write(bench, results, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / vlrewardbench.INFERENCE).read_text().splitlines()]
    assert len(lines) == 12 and [line["meta"]["random_number"] for line in lines[:2]] == [0, 1]
    assert lines[0]["ranking"] == [0, 1] and lines[0]["meta"]["filter_choice"] == "f" and lines[0]["meta"]["filter_number"] == 1
    # mathverse_3, ranking (1, 0): forward rejects 1, reverse rejects 2 -> reject, reject, doesntMatch, agree, doesntMatch, reject
    assert [line["meta"]["flag_status"] for line in lines[4:10]] == ["reject", "reject", "doesntMatch", "agree", "doesntMatch", "reject"]
    figures = json.loads((tmp_path / vlrewardbench.ACCURACY).read_text())
    assert figures["datasets"]["rlaif-v"] == {"agree_number": 1, "reject_number": 0, "doesntMatch_number": 0, "other_number": 1, "accept_rate": 1.0}
    assert figures["datasets"]["reasoning_tasks"]["other_number"] == 1  # 3 rejects of 6 is no majority
    assert figures["datasets"]["wildvision-battle"]["doesntMatch_number"] == 1
    assert figures["groups"]["hallucination"] == {"correct": 1, "total": 1, "accuracy": 1.0}
    assert figures["overall_accuracy"] == 1.0 and figures["macro_average_accuracy"] is None  # a group with no decided pair


# -- Multimodal RewardBench ---------------------------------------------------------------------------

def mmrb_record(rid, category, better="Output1"):
    return {"ID": rid, "Text": "Describe.", "Image": "i.png", "Output1": "One.", "Output2": "Two.", "Better": better, "Category": category}


def test_mmrewardbench_reads_its_records_with_its_label_and_domain_rules(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "i.png")
    records = [mmrb_record("pairs_1", "safety"), mmrb_record("hateful_2", "safety", "Output2"), mmrb_record("mathvista_3", "reasoning", "output2"),
               mmrb_record("EMMA_4", "reasoning"), mmrb_record("x_5", "vqa")]
    (tmp_path / "all_data.json").write_text(json.dumps(records))
    assert detect_format(tmp_path / "all_data.json").name == "mmrewardbench"
    bench = mmrewardbench.read(tmp_path / "all_data.json", tmp_path, {})
    assert [(p.group, p.preference) for p in bench.samples] == [("safety/bias", "A"), ("safety/toxicity", "B"), ("reasoning/math", "A"),
                                                                 ("reasoning/coding", "A"), ("vqa", "A")]  # "output2" is not "Output2": A


def test_mmrewardbench_accuracy_flips_its_seeded_coin_for_outputs_without_a_mark(tmp_path):
    records = [mmrb_record(f"k_{k}", "vqa" if k % 2 else "knowledge", "Output2" if k % 3 else "Output1") for k in range(8)]
    outputs = ["[[A]]", "x [[B]] y [[A]]", "none", "[[B]]", "no", "[[A]]", "?", "[[B]]"]
    bench = mmrewardbench.BenchmarkInput(tmp_path / "d.json", [], [], {}, records)
    mmrewardbench.write(bench, {r["ID"]: result(r["ID"], [(None, text)]) for r, text in zip(records, outputs)}, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / mmrewardbench.ANSWERS).read_text().splitlines()]
    assert [line["output"] for line in lines] == outputs and lines[0]["Meta"] == records[0]
    coin = random.Random(123)
    predicted = ["A" if "[[A]]" in o else "B" if "[[B]]" in o else ("A" if coin.random() < 0.5 else "B") for o in outputs]
    hits = [p == ("B" if r["Better"] == "Output2" else "A") for p, r in zip(predicted, records)]
    figures = json.loads((tmp_path / mmrewardbench.ACCURACY).read_text())
    assert list(figures) == ["all", "knowledge", "vqa"]
    assert figures["all"] == {"correct": sum(hits), "total": 8, "accuracy": sum(hits) / 8}
    assert figures["vqa"]["correct"] == sum(hits[1::2])


# -- MMRB2 --------------------------------------------------------------------------------------------

def mmrb2_pair(pid, source="chameleon", chosen="A"):
    response = lambda side: {"model_name": f"m{side}", "response_content": [["text", f"Answer {side}."], ["image", "i.png"]]}  # noqa: E731
    return {"id": pid, "prompt_content": [["text", "Tell it."]], "response_a": response("a"), "response_b": response("b"), "chosen": chosen,
            "human_annotations": [5, 5, 4], "prompt_source": source, "prompt_metadata": {}}


def test_mmrb2_reads_a_task_file_each_pair_of_its_source_s_task(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "i.png")
    (tmp_path / "interleaved.json").write_text(json.dumps({"pairs": [mmrb2_pair("p1"), mmrb2_pair("p2", "blink", "B"), mmrb2_pair("p3", "nowhere")]}))
    assert detect_format(tmp_path / "interleaved.json").name == "mmrb2"
    bench = mmrb2.read(tmp_path / "interleaved.json", tmp_path, {})
    assert [(p.category, p.preference, p.model_a) for p in bench.samples] == [("mmrb2_interleaved", "A", "ma"), ("mmrb2_reasoning", "B", "ma")]
    assert [s.image for s in bench.samples[0].answer_a] == [None, "i.png"]
    assert "record 2 (id 'p3'): prompt_source: 'nowhere' is no source" in str(bench.problems[0])


def test_mmrb2_s_choice_is_a_or_b_or_none_and_anything_else_is_named(tmp_path):
    # "C" was read as no preference, silently; build_from_hf.py writes "" where a row has no choice.
    Image.new("RGB", (8, 8)).save(tmp_path / "i.png")
    pairs = [mmrb2_pair("p1", chosen=""), mmrb2_pair("p2", chosen=None), mmrb2_pair("p3", chosen="C"), mmrb2_pair("p4", chosen="B")]
    (tmp_path / "interleaved.json").write_text(json.dumps({"pairs": pairs}))
    bench = mmrb2.read(tmp_path / "interleaved.json", tmp_path, {})
    assert [(p.id, p.preference) for p in bench.samples] == [("p1", None), ("p2", None), ("p4", "B")]
    [problem] = bench.problems
    assert (problem.index, problem.field) == (2, "chosen") and "'A', 'B'" in problem.message


def test_mmrb2_accuracy_counts_both_orders_the_reverse_flipped(tmp_path):
    pairs = [mmrb2_pair(f"p{k}", chosen="AB"[k % 2]) for k in range(5)]
    results = {"p0": result("p0", [("A", "{}")], [("B", "{}")]),  # both right
               "p1": result("p1", [("A", "{}")], [("A", "{}")]),  # forward wrong, reverse A is the pair's B: right
               "p2": result("p2", [("tie", "{}")], [(None, "no json")]),  # tie given and wrong; reverse without a judgement
               "p3": result("p3", [("", "{}")], [])}  # an empty judgement is no judgement; p4 missing
    bench = mmrb2.BenchmarkInput(tmp_path / "interleaved.json", [], [], {}, pairs)
    mmrb2.write(bench, results, tmp_path)
    predictions = json.loads((tmp_path / mmrb2.PREDICTIONS).read_text())
    assert predictions["p1"]["reverse"] == [{"judgement": "A", "evaluator": "mmjudge", "metadata": {}}] and predictions["p2"]["reverse"] == []
    figures = json.loads((tmp_path / mmrb2.ACCURACY).read_text())
    assert figures == {"task_name": "interleaved", "accuracy": 3 / 5, "total_pairs": 5, "evaluated_pairs": 4, "missing_pairs": 1,
                       "total_correct": 3, "total_evaluated": 5}


def test_mmrb2_s_metadata_is_the_json_its_evaluators_read(tmp_path):
    # Their metadata is what json_repair reads; a NaN in it (which JSON cannot write) crashed the writer after scoring.
    texts = {"p0": "{'better_response': 'A', 'score': 4}", "p1": '{"better_response": "B", "confidence": NaN}', "p2": "[1]"}
    bench = mmrb2.BenchmarkInput(tmp_path / "interleaved.json", [], [], {}, [mmrb2_pair(pid) for pid in texts])
    mmrb2.write(bench, {pid: result(pid, [("A", text)]) for pid, text in texts.items()}, tmp_path)
    predictions = json.loads((tmp_path / mmrb2.PREDICTIONS).read_text())
    assert [predictions[pid]["forward"][0]["metadata"] for pid in texts] == [{"better_response": "A", "score": 4}, {}, {}]


# -- OpenING ------------------------------------------------------------------------------------------

def battle(data_id, a, b, winner=None):
    return {"data_id": data_id, "model_A": {"id": "1", "name": a}, "model_B": {"id": "2", "name": b}, **({"winner": winner} if winner else {})}


def answer_file(arena, model, data_id, steps, question_images=("q.jpg",)):
    folder = arena / f"{model}_output"
    folder.mkdir(parents=True, exist_ok=True)
    inputs = [{"image": f"./images/{name}", "text": "Go on. <BEGIN> Once. <image>"} for name in question_images]
    (folder / f"{data_id}.json").write_text(json.dumps({"meta_task_name": "Story", "conversations": [{"input": inputs}, {"output": steps}]}))
    return folder


def test_opening_reads_a_battle_file_with_each_model_s_answers_as_intjudge_does(tmp_path):
    bench_dir, arena = tmp_path / "OpenING-benchmark", tmp_path / "Interleaved_Arena"
    (bench_dir / "images").mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(bench_dir / "images" / "q.jpg")
    folder = answer_file(arena, "m1", "7", [{"text": " First. <image>", "image": "./m1_output/7-o-0.jpg"}, {"text": "Gone.", "image": "./m1_output/7-o-1.jpg"}])
    Image.new("RGB", (8, 8)).save(folder / "7-o-0.jpg")
    answer_file(arena, "m2", "7", [{"text": "Other.", "image": None}])
    (arena / "battles.json").write_text(json.dumps([battle("7", "m1", "m2", "Tie(B)"), battle("8", "m1", "m3")]))
    assert detect_format(arena / "battles.json").name == "opening"
    bench = opening.read(arena / "battles.json", bench_dir, {})
    (pair,) = bench.samples
    assert (pair.id, pair.preference, pair.group, pair.model_b) == ("7_m1_m2", "tie", "Story", "m2")
    assert pair.question[0].text == "Go on.  Once. " and pair.question[0].image == "./images/q.jpg"  # stripped, less <image> and <BEGIN>
    assert [(s.text, Path(s.image).name if s.image else None) for s in pair.answer_a] == [("First. ", "7-o-0.jpg"), ("Gone.", None)]
    assert "1 answer image(s) not found" in bench.notes[0]
    assert all("record 1 (id '8_m1_m3'):" in str(p) for p in bench.problems)
    assert "m3_output/8.json: file not found" in str(bench.problems[1])


def test_opening_s_winners_and_model_names_and_answers_are_checked_naming_the_battle(tmp_path):
    """A winner other than A, B or a tie was read as no preference; a model name with a path in it read answers
    outside the arena folder; an answer whose input is a number was a traceback. Each is a problem of its battle."""
    arena = tmp_path / "arena"
    for model in ("m1", "m2", "../outside/m3"):
        answer_file(arena, model, "7", [{"text": "Said.", "image": None}], question_images=())
    assert (tmp_path / "outside" / "m3_output" / "7.json").is_file()  # what the name would read
    folder = answer_file(arena, "m4", "7", [{"text": "Said.", "image": None}], question_images=())
    (folder / "7.json").write_text(json.dumps({"conversations": [{"input": 5}, {"output": []}]}))
    (tmp_path / "outside" / "7.json").write_bytes((tmp_path / "outside" / "m3_output" / "7.json").read_bytes())  # what a data_id with a path would read
    battles = [battle("7", "m1", "m2", "A"), battle("7", "m1", "m2", "X"), battle("8", "m2", "m1", "B "), battle("7", "m1", "../outside/m3"),
               battle("7", "m4", "m1"), battle("7", "m2", "m1", "tie ()"), battle("../../outside/7", "m1", "m2")]
    (arena / "battles.json").write_text(json.dumps(battles))
    bench = opening.read(arena / "battles.json", tmp_path, {})
    assert [(p.id, p.preference) for p in bench.samples] == [("7_m1_m2", "A"), ("7_m2_m1", "tie")]
    named = {p.index: p for p in bench.problems}
    assert sorted(named) == [1, 2, 3, 4, 6] and named[6].field == "data_id" and "'../../outside/7' is no data_id" in named[6].message
    assert (named[1].field, named[2].field) == ("winner", "winner") and "'B ' is no winner of OpenING's" in named[2].message
    assert named[3].field == "model_B.name" and "'../outside/m3' is no model name" in named[3].message
    assert named[4].record_id == "7_m4_m1" and "conversations[0].input must be a list of steps, got int" in named[4].message


def test_opening_s_win_rate_csvs_hold_a_model_name_no_spreadsheet_reads_as_a_formula(tmp_path):
    names = ["=HYPERLINK(\"evil.example\",\"click\")", "+1", "-1", "@SUM(A1)", "\tx", "\rx", "plain"]
    battles = [battle(k, a, b, "A") for k, (a, b) in enumerate(zip(names, names[1:] + names[:1]))]
    out = tmp_path / "out"
    out.mkdir()
    opening.write(opening.BenchmarkInput(tmp_path / "b.json", [], [], {}, battles), {opening.battle_key(opening.Battle.model_validate(b)):
                  result("x", [("A", "A")]) for b in battles}, out)
    for name in opening.WINRATE_CSVS.values():
        with open(out / name, newline="") as file:  # as a CSV is read: a \r inside a quoted cell stays one
            rows = list(csv.reader(file))
        assert sorted(rows[0][1:]) == sorted([row[0] for row in rows[1:]]) == sorted([f"'{n}" for n in names[:-1]] + ["plain"])
    assert set(json.loads((out / opening.WINRATES).read_text())["force_divide"]) == set(names)  # JSON holds the names as they are


def test_an_opening_battle_whose_judgement_names_no_winner_is_left_out_of_its_files(tmp_path):
    # Judged under another verdict format than IntJudge's (the toolkit's pairwise rubric), an unparsed output has
    # no label: the writer crashed on it after scoring, in the agreement and the win rates.
    battles = [battle("1", "x", "y", "A"), battle("2", "y", "x", "B")]
    opening.write(opening.BenchmarkInput(tmp_path / "b.json", [], [], {}, battles),
                  {"1_x_y": result("1_x_y", [(None, "no verdict")]), "2_y_x": result("2_y_x", [("B", "B")])}, tmp_path)
    assert json.loads((tmp_path / opening.RESULTS).read_text()) == [battles[1]]
    assert json.loads((tmp_path / opening.AGREEMENT).read_text())["force_divide"]["total"] == 1


WINNERS = ["A", "B", "Tie(A)", "Tie(B)", "Tie", "tie ()"]


def test_opening_agreement_rules_against_a_plain_count():
    rng = random.Random(0)
    models = ["anole", "m1", "SEED-LLaMA", "m2"]
    keys = [f"{k}_{rng.choice(models)}_{rng.choice(models)}" for k in range(60)]
    human = {key: rng.choice(WINNERS[:4]) for key in keys}
    judge = {key: rng.choice(WINNERS) for key in keys[5:]}
    figures = opening.agreement(human, judge)
    shared = [key for key in keys if key in judge]
    force = {"Tie(A)": "A", "Tie(B)": "B", "Tie": "A"}
    same = lambda rule, key: rule(human[key]) == rule(judge[key])  # noqa: E731
    assert figures["force_divide"]["agreement"] == sum(same(lambda w: force.get(w, w), k) for k in shared) / len(shared) * 100
    assert figures["with_tie"]["agreement"] == sum(same(lambda w: "Tie" if "tie" in w.lower() else w, k) for k in shared) / len(shared) * 100
    decisive = [k for k in shared if "tie" not in human[k].lower() and "tie" not in judge[k].lower()]
    assert figures["without_tie"] == {**figures["without_tie"], "agreement": sum(human[k] == judge[k] for k in decisive) / len(decisive) * 100,
                                      "total": len(decisive)}
    unseen = [k for k in shared if {k.split("_")[1], k.split("_")[2]} & {"anole", "SEED-LLaMA"}]
    assert figures["with_tie"]["unseen_models"]["total"] == len(unseen)


def test_opening_win_rates_under_each_tie_rule_against_a_plain_count():
    battles = [battle(k, a, b, w) for k, (a, b, w) in enumerate([("x", "y", "A"), ("y", "x", "Tie(A)"), ("x", "z", "Tie"), ("z", "y", "B"),
                                                                  ("x", "y", "Tie(B)"), ("y", "z", "A")])]
    overall = {rule: opening.win_rates(battles, rule)[0] for rule in opening.WINRATE_CSVS}
    # x: an A win; Tie(A) for y; a plain Tie with z; Tie(B) for y -> forced: 1 of 4; ties out: 1 of 1; tie 0: 1 of 4; tie 0.5: 2.5 of 4
    assert overall["force_divide"]["x"] == 1 / 4 and overall["without_tie"]["x"] == 1.0
    assert overall["tie_zero"]["x"] == 1 / 4 and overall["tie_half"]["x"] == 2.5 / 4
    assert overall["force_divide"]["y"] == 4 / 5  # of its 5: Tie(A) as A, B against z, Tie(B) as B, A against z; lost the first
    assert list(overall["tie_half"]) == sorted(overall["tie_half"], key=lambda m: -overall["tie_half"][m])
    text = opening.winrate_csv(*opening.win_rates(battles, "tie_half"))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert text.startswith("Model,") and "\r\n" in text
    assert next(r for r in rows if r["Model"] == "x")["y"] == "66.67%" and next(r for r in rows if r["Model"] == "x")["x"] == "N/A"


# -- what is written is what was judged ---------------------------------------------------------------

def opening_arena(tmp_path):
    arena = tmp_path / "arena"
    for model in ("m1", "m2"):
        answer_file(arena, model, "7", [{"text": f"{model} says.", "image": None}], question_images=())
    return arena


# Each benchmark's file holding one pair judged, and two records under its id set aside under --skip_invalid: one
# whole but for its repeated id (its people's preference the other way), one short of a field the writer reads.
DUPLICATED = {
    "vlrewardbench": ("v.jsonl", lambda tmp_path: [vlrb_record("RLAIF-V_1", image_path="i.png"), vlrb_record("RLAIF-V_1", (1, 0), image_path="i.png"),
                                                   {k: v for k, v in vlrb_record("RLAIF-V_1", image_path="i.png").items() if k != "human_ranking"}]),
    "mmrewardbench": ("all_data.json", lambda tmp_path: [mmrb_record("k_1", "vqa"), mmrb_record("k_1", "vqa", "Output2"),
                                                         {k: v for k, v in mmrb_record("k_1", "vqa").items() if k != "Image"}]),
    "mmrb2": ("interleaved.json", lambda tmp_path: {"pairs": [mmrb2_pair("p1"), mmrb2_pair("p1", chosen="B"),
                                                              {k: v for k, v in mmrb2_pair("p1").items() if k != "prompt_source"}]}),
    "opening": ("arena/battles.json", lambda tmp_path: opening_arena(tmp_path) and [battle("7", "m1", "m2", "A"), battle("7", "m1", "m2", "B"),
                                                                                    {**battle("7", "m1", "m2"), "winner": 3}]),
}


def written(tmp_path, benchmark, judged=None):
    """The benchmark's files written from its file of DUPLICATED, every pair read judged A in both orders (or
    given the PairResult `judged(pair id)`)."""
    Image.new("RGB", (8, 8)).save(tmp_path / "i.png")
    name, records = DUPLICATED[benchmark]
    path = tmp_path / name
    content = records(tmp_path)
    path.write_text("\n".join(json.dumps(r) for r in content) if name.endswith(".jsonl") else json.dumps(content))
    fmt = FORMATS[benchmark]
    bench = fmt.read(path, tmp_path, {})
    assert len(bench.samples) == 1 and sorted(p.index for p in bench.problems) == [1, 2]  # both set aside, named
    label = "1" if benchmark == "vlrewardbench" else "A"
    judged = judged or (lambda pair_id: result(pair_id, [(label, f"[[{label}]]")], [(label, f"[[{label}]]")]))
    out = tmp_path / "out"
    out.mkdir()
    fmt.write(bench, {p.id: judged(p.id) for p in bench.samples}, out)
    return out


@pytest.mark.parametrize("benchmark", DUPLICATED)
def test_a_record_set_aside_under_the_id_of_a_judged_one_is_written_nowhere(tmp_path, benchmark):
    """--skip_invalid: a record set aside that shares its id with a judged one was written with the judged one's
    judgements (VL-RewardBench: 4 lines of two opposite rankings, voted together; OpenING's battle twice in its
    win rates; MMRB2's 2 evaluated pairs for 1 judged), or crashed the writer on the field it lacks."""
    out = written(tmp_path, benchmark)
    if benchmark == "vlrewardbench":
        lines = [json.loads(line) for line in (out / vlrewardbench.INFERENCE).read_text().splitlines()]
        assert [(line["ranking"], line["meta"]["flag_status"]) for line in lines] == [([0, 1], "agree"), ([0, 1], "reject")]
        assert json.loads((out / vlrewardbench.ACCURACY).read_text())["datasets"]["rlaif-v"]["other_number"] == 1
    elif benchmark == "mmrewardbench":
        lines = [json.loads(line) for line in (out / mmrewardbench.ANSWERS).read_text().splitlines()]
        assert [(line["ID"], line["Label"], line["Image"]) for line in lines] == [("k_1", "A", "i.png")]
        assert json.loads((out / mmrewardbench.ACCURACY).read_text())["all"] == {"correct": 1, "total": 1, "accuracy": 1.0}
    elif benchmark == "mmrb2":
        figures = json.loads((out / mmrb2.ACCURACY).read_text())
        assert figures == {"task_name": "interleaved", "accuracy": 0.5, "total_pairs": 1, "evaluated_pairs": 1, "missing_pairs": 0,
                           "total_correct": 1, "total_evaluated": 2}
    else:
        assert json.loads((out / opening.RESULTS).read_text()) == [{**battle("7", "m1", "m2"), "winner": "A"}]
        assert json.loads((out / opening.AGREEMENT).read_text())["force_divide"]["total"] == 1
        assert json.loads((out / opening.WINRATES).read_text())["force_divide"] == {"m1": 1.0, "m2": 0.0}


def rewarded(pair_id: str, reward_a: float, reward_b: float) -> PairResult:
    """A pair as judge-score writes a reward model's (or any pointwise judge's): each answer scored alone, the
    verdict the reward difference against a tie margin of 0.5."""
    scores = {side: judge_result(pair_id, None, reward=reward, prompt_tokens=5) for side, reward in (("A", reward_a), ("B", reward_b))}
    verdict, _ = pointwise_verdict(scores["A"], scores["B"], 0.5)
    return PairResult(id=pair_id, model_a=None, model_b=None, category="c", verdict=verdict, rule=POINTWISE_RULE, scores=scores, n_images=0)


# Per benchmark and reward model's verdict on its DUPLICATED pair (people prefer A), what its files say: the verdict
# written in each order as the benchmark's judges write it, so that its own code reads it; a tie as it can.
REWARD_VERDICTS = {"A": (2.0, 0.5), "B": (0.5, 2.0), "tie": (1.2, 1.0)}


@pytest.mark.parametrize("verdict", REWARD_VERDICTS)
@pytest.mark.parametrize("benchmark", DUPLICATED)
def test_a_reward_models_verdict_is_written_as_each_benchmarks_judges_write_it(tmp_path, benchmark, verdict):
    """A pointwise pair record has no judgement of either order (its judge wrote no verdict): the four writers wrote
    nothing of it, and their figures counted no pair."""
    out = written(tmp_path, benchmark, lambda pair_id: rewarded(pair_id, *REWARD_VERDICTS[verdict]))
    if benchmark == "vlrewardbench":  # cal.py's status of each order's "Overall Judgment: Answer N is better"; a tie it has no words for
        lines = [json.loads(line) for line in (out / vlrewardbench.INFERENCE).read_text().splitlines()]
        status = {"A": "agree", "B": "reject", "tie": "doesntMatch"}[verdict]
        assert [(line["meta"]["random_number"], line["meta"]["flag_status"]) for line in lines] == [(0, status), (1, status)]
        assert [line["meta"]["filter_number"] for line in lines] == {"A": [1, 2], "B": [2, 1], "tie": [-1, -1]}[verdict]
    elif benchmark == "mmrewardbench":  # 2_get_accuracy.py's [[A]] / [[B]]; a tie, [[C]], is its coin flip
        lines = [json.loads(line) for line in (out / mmrewardbench.ANSWERS).read_text().splitlines()]
        assert [line["output"] for line in lines] == [{"A": "[[A]]", "B": "[[B]]", "tie": "[[C]]"}[verdict]]
        if verdict != "tie":
            assert json.loads((out / mmrewardbench.ACCURACY).read_text())["all"]["correct"] == (verdict == "A")
    elif benchmark == "mmrb2":  # each order's better_response in its positions (compute_accuracy.py flips the reverse); a tie none
        predictions = json.loads((out / mmrb2.PREDICTIONS).read_text())["p1"]
        assert {order: [j["judgement"] for j in predictions[order]] for order in predictions} == {
            "A": {"forward": ["A"], "reverse": ["B"]}, "B": {"forward": ["B"], "reverse": ["A"]}, "tie": {"forward": [], "reverse": []}}[verdict]
        assert predictions["forward"] == [] or predictions["forward"][0]["metadata"]["better_response"] == predictions["forward"][0]["judgement"]
        figures = json.loads((out / mmrb2.ACCURACY).read_text())
        assert (figures["total_correct"], figures["total_evaluated"]) == {"A": (2, 2), "B": (0, 2), "tie": (0, 0)}[verdict]
    else:  # IntJudge's winner; a tie leans to the higher reward, as IntJudge's ties lean
        assert json.loads((out / opening.RESULTS).read_text()) == [{**battle("7", "m1", "m2"), "winner": {"A": "A", "B": "B", "tie": "Tie(A)"}[verdict]}]


# -- the benchmarks' prompts ---------------------------------------------------------------------------

PROMPT_FILES = {
    "vlrewardbench": ("prompt.py", '''def prompt(data_obj, random_number):
    answers = [data_obj["response"][0], data_obj["response"][1]] if random_number == 0 else [data_obj["response"][1], data_obj["response"][0]]
    text = f""" Judge this {{kind}}.\\nQuestion: {data_obj["query"]}\\nAnswer 1: {answers[0]}\\nAnswer 2: {answers[1]}\\nOverall Judgment: Answer X is better."""
    return text
'''),
    "mmrewardbench": ("judge.py", '''import os
judge_prompt = """Compare them. Say "[[A]]" or "[[B]]".\\n[Q]\\n{question}\\n[A]\\n{answer_a}\\n[B]\\n{answer_b}"""
'''),
    "opening": ("judge_ab.py", '''def get_gpt4answer(input_text, input_images, modelA_output_textl, a_images, modelB_output_textl, b_images):
    content = []
    input_text[0] = "<IN>: " + input_text[0]
    modelA_output_textl[0] = "<A>: " + modelA_output_textl[0]
    modelB_output_textl[0] = "\\n<B>: " + modelB_output_textl[0]
    content.append({"type": "text", "text": "\\nWhich is better?"})
if __name__ == "__main__":
    SYSTEM_MESSAGE = "You judge {pairs}."
'''),
}


@pytest.mark.parametrize("benchmark", PROMPT_FILES)
def test_each_benchmark_s_prompt_is_imported_byte_for_byte(tmp_path, benchmark):
    name, code = PROMPT_FILES[benchmark]
    (tmp_path / name).write_text(code)
    assert rubric_main(["import", "--benchmark", benchmark, str(tmp_path / name), "-o", str(tmp_path / "r.yaml")]) == 0
    (rubric,) = load_rubrics([tmp_path / "r.yaml"]).values()
    assert rubric.kind == "pairwise" and rubric.category == benchmark
    fields = {"question": ["Q?"], "answer_a": ["first"], "answer_b": ["second"]}
    text = "".join(rubric.fill(fields))
    expected = {"vlrewardbench": " Judge this {kind}.\nQuestion: Q?\nAnswer 1: first\nAnswer 2: second\nOverall Judgment: Answer X is better.",
                "mmrewardbench": 'Compare them. Say "[[A]]" or "[[B]]".\n[Q]\nQ?\n[A]\nfirst\n[B]\nsecond',
                "opening": "<IN>: Q?<A>: first\n<B>: second\nWhich is better?"}[benchmark]
    assert text == expected
    assert (rubric.verdict_format, rubric.layout) == {"vlrewardbench": ("vlrewardbench", "parts"), "mmrewardbench": ("brackets", "parts"),
                                                     "opening": ("opening", "tagged")}[benchmark]
    if benchmark == "opening":
        assert rubric.system_message == "You judge {pairs}."


def write_mmrb2_prompt_files(folder, extra_task=None):
    """MMRB2's evaluation_prompts.py and, beside it, its local evaluator, in their shapes; `extra_task`: a branch
    of one more task_type, with a prompt of its own."""
    names = ["image_gen", "image_edit", "interleaved", "reasoning", *(["extra"] if extra_task is not None else [])]
    (folder / "evaluation_prompts.py").write_text("\n".join(f'def get_{name}_prompt():\n    return """{name} rubric {{json}}"""\n' for name in names))
    branch = f"        elif task_type == {extra_task!r}:\n            evaluation_prompt = get_extra_prompt()\n" if extra_task is not None else ""
    (folder / "local_pairwise_evaluator.py").write_text('''class E:
    def pairwise_evaluate(self, prompt_content, response_a, response_b, task_type):
        if task_type == "image":
            evaluation_prompt = get_image_gen_prompt()
        elif task_type == "edit":
            evaluation_prompt = get_image_edit_prompt()
        elif task_type == "interleaved":
            evaluation_prompt = get_interleaved_prompt()
        elif task_type in ("text", "reasoning"):
            evaluation_prompt = get_reasoning_prompt()
''' + branch + '''        content_list = []
        content_list.append(["text", evaluation_prompt])
        content_list.append(["text", "[PROMPT]"])
        content_list.extend(prompt_content)
        content_list.append(["text", "[A]"])
        content_list.extend(response_a)
        content_list.append(["text", "[B]"])
        content_list.extend(response_b)
''')


def test_mmrb2_s_four_prompts_and_its_evaluator_s_message_are_imported(tmp_path):
    write_mmrb2_prompt_files(tmp_path)
    rubrics = IMPORTERS["mmrb2"](tmp_path / "evaluation_prompts.py")
    assert [r.category for r in rubrics] == ["mmrb2_image", "mmrb2_edit", "mmrb2_interleaved", "mmrb2_reasoning"]
    assert rubrics[2].instructions == "interleaved rubric {json}" and rubrics[2].verdict_format == "mmrb2"
    assert "".join(rubrics[2].fill({"question": ["Q"], "answer_a": ["a"], "answer_b": ["b"]})) == "interleaved rubric {json}[PROMPT]Q[A]a[B]b"


VLRB_PROMPT = PROMPT_FILES["vlrewardbench"][1]
MMRB_PROMPT = PROMPT_FILES["mmrewardbench"][1]


@pytest.mark.parametrize("benchmark, code, refusal", [
    # a conversion or format spec was dropped: the rubric filled the field as text all the same
    ("vlrewardbench", VLRB_PROMPT.replace('{data_obj["query"]}', '{data_obj["query"]!r}'), 'the prompt\'s data_obj[\'query\'] has a conversion or format spec'),
    ("vlrewardbench", VLRB_PROMPT.replace("{answers[1]}", "{answers[1]:>99}"), "the prompt's answers[1] has a conversion or format spec"),
    ("mmrewardbench", MMRB_PROMPT.replace("{question}", "{question!r}"), "judge_prompt's field {question} has a conversion or format spec"),
    ("mmrewardbench", MMRB_PROMPT.replace("{answer_b}", "{answer_b:>9}"), "judge_prompt's field {answer_b} has a conversion or format spec"),
    # a lone brace and a prompt without fields were tracebacks
    ("mmrewardbench", MMRB_PROMPT.replace("[Q]", "[Q}"), "judge_prompt is no str.format template (Single '}' encountered"),
    ("mmrewardbench", 'judge_prompt = """Compare them."""\n', "judge_prompt has no field {question}, {answer_a}, {answer_b}"),
    ("mmrewardbench", MMRB_PROMPT.replace("{answer_b}", "b"), "judge_prompt has no field {answer_b}"),
], ids=["vlrb-conversion", "vlrb-spec", "mmrb-conversion", "mmrb-spec", "mmrb-lone-brace", "mmrb-no-field", "mmrb-no-answer_b"])
def test_a_prompt_the_rubric_cannot_hold_as_written_is_refused_in_one_line(tmp_path, capsys, benchmark, code, refusal):
    name = PROMPT_FILES[benchmark][0]
    (tmp_path / name).write_text(code)
    assert run(rubric_main, ["import", "--benchmark", benchmark, str(tmp_path / name), "-o", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / name}: ") and refusal in err, err
    assert not (tmp_path / "r.yaml").exists()


@pytest.mark.parametrize("task", ["x\ny", "../../evil", "Image"])
def test_mmrb2_task_names_are_mmrb2_s_four(tmp_path, capsys, task):
    # a task name becomes a rubric category (mmrb2_<task>): one not MMRB2's was taken, newline and path and all
    write_mmrb2_prompt_files(tmp_path, task)
    assert run(rubric_main, ["import", "--benchmark", "mmrb2", str(tmp_path / "evaluation_prompts.py"), "-o", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr().err
    assert f"task_type {task!r} is none of MMRB2's four tasks (image, edit, interleaved, reasoning)" in err and err.count("\n") == 1
    assert not (tmp_path / "r.yaml").exists()


# Few examples, each a parse of a short file: well under a second in all. Derandomized: the same examples every run.
FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PROMPT_DAMAGE = st.text(alphabet="{}!r:>0 \n\"'[]_.abquestionswer", max_size=12)


@pytest.mark.slow  # 40 imports: about 7 s on a busy 2-core machine
@FUZZ
@given(benchmark=st.sampled_from(sorted(PROMPT_FILES)), cut=st.floats(0, 1), inserted=PROMPT_DAMAGE, task=st.text(max_size=12))
def test_every_prompt_import_takes_or_refuses_a_damaged_file_in_one_line(tmp_path, capsys, benchmark, cut, inserted, task):
    """Braces, conversions, specs and quotes put anywhere in a benchmark's prompt, and any MMRB2 task name:
    imported (exit 0, every category one of the benchmark's) or refused in one line naming the file (exit 2),
    never a traceback."""
    if benchmark == "opening":
        benchmark = "mmrb2"  # its file's only texts are plain strings; MMRB2's task names are a door of their own
    if benchmark == "mmrb2":
        write_mmrb2_prompt_files(tmp_path, task)
        path = tmp_path / "evaluation_prompts.py"
    else:
        name, code = PROMPT_FILES[benchmark]
        start, end = code.index('"""') + 3, code.rindex('"""')  # inside the prompt's text
        at = start + int(cut * (end - start))
        path = tmp_path / name
        path.write_text(code[:at] + inserted + code[at:])
    code = run(rubric_main, ["import", "--benchmark", benchmark, str(path), "-o", str(tmp_path / "r.yaml")])
    err = capsys.readouterr().err
    assert code in (0, 2) and "Traceback" not in err, err
    if code == 2:
        assert err.startswith(f"error: {tmp_path}") and err.count("\n") == 1, err
    else:
        assert set(load_rubrics([tmp_path / "r.yaml"])) <= {benchmark, *mmrb2.CATEGORIES}


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.lists(st.sampled_from(['{', '}', '[', ']', '"', "'", ":", ",", "better_response", "A", "B", "1", "NaN",
                                                                      "```json\n", "\n```", " ", "reasoning", "tie", "null", "{" * 50]),
                                                     max_size=30).map("".join)))
def test_mmrb2_s_reading_takes_any_text(tmp_path, text):
    """Whatever the judge writes: a verdict of A, B or none, its offset on the letter, and the predictions written."""
    reading = VERDICT_FORMATS["mmrb2"].read(text, {})
    assert reading.verdict in ("A", "B", None)
    if reading.verdict is not None and reading.offset is not None:
        assert text[reading.offset] == reading.verdict
    mmrb2.write(mmrb2.BenchmarkInput(tmp_path / "interleaved.json", [], [], {}, [mmrb2_pair("p")]), {"p": result("p", [(reading.label, text)])}, tmp_path)
    assert json.loads((tmp_path / mmrb2.PREDICTIONS).read_text())["p"]["reverse"] == []


def test_a_file_of_another_shape_is_refused_naming_what_was_not_found(tmp_path, capsys):
    (tmp_path / "other.py").write_text("x = 1\n")
    for benchmark in IMPORTERS:
        code = run(rubric_main, ["import", "--benchmark", benchmark, str(tmp_path / "other.py"), "-o", str(tmp_path / "r.yaml")])
        assert code == 2 and "found no" in capsys.readouterr().err
    assert not (tmp_path / "r.yaml").exists()


@pytest.mark.slow  # a tiny judge loads and judges one pair
def test_judge_score_under_skip_invalid_writes_the_judged_record_and_names_the_ones_set_aside(tmp_path, checkpoint):
    from mmjudge.infer.cli import main

    name, code = PROMPT_FILES["mmrewardbench"]
    (tmp_path / name).write_text(code)
    assert rubric_main(["import", "--benchmark", "mmrewardbench", str(tmp_path / name), "-o", str(tmp_path / "r.yaml")]) == 0
    written(tmp_path, "mmrewardbench")  # the file of DUPLICATED, and the images
    assert main(["--model_path", str(checkpoint), "--input_dir", str(tmp_path), "--input_file", "all_data.json", "--rubric", str(tmp_path / "r.yaml"),
                 "--output_dir", str(tmp_path / "run"), "--skip_invalid", "--max_new_tokens", "4", "--max_tiles", "1"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [s.split(": ", 1)[1].split(":")[0] for s in summary["skipped_invalid"]] == ["record 1 (id 'k_1')", "record 2 (id 'k_1')"]
    lines = [json.loads(line) for line in (tmp_path / "run" / mmrewardbench.ANSWERS).read_text().splitlines()]
    assert [(line["ID"], line["Label"], line["Meta"]) for line in lines] == [("k_1", "A", mmrb_record("k_1", "vqa"))]


def test_a_benchmark_format_without_a_rubric_says_how_to_import_its_prompt(tmp_path, capsys):
    from mmjudge.infer.cli import main

    (tmp_path / "all_data.json").write_text(json.dumps([mmrb_record("a", "vqa")]))
    assert main(["--model_path", str(tmp_path / "none"), "--input_dir", str(tmp_path), "--input_file", "all_data.json"]) == 2
    err = capsys.readouterr().err
    assert "judge-rubric import --benchmark mmrewardbench multimodal_rewardbench/scripts/1_run_model_as_judge_gpt4o.py" in err


def test_every_pair_format_reads_without_torch():
    import subprocess
    import sys

    code = "import sys, mmjudge.judge.formats; assert 'torch' not in sys.modules, 'torch loaded'"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    assert {"vlrewardbench", "mmrewardbench", "mmrb2", "opening", "pairs"} <= set(FORMATS)
