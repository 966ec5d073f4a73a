"""judge-score on each benchmark's own files, end to end on the tiny random judge: the format is detected,
its preset and rubrics apply, and its result files agree with eval_result.json record by record."""

import csv
import json

import pytest
from PIL import Image

from mmjudge.infer.cli import main
from mmjudge.judge import model
from mmjudge.judge.cli import EXIT_BAD_INPUT
from mmjudge.judge.formats.milebench import rouge_l

FAST = ["--max_new_tokens", "6", "--workers", "2"]


def write(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))
    return path


def score(checkpoint, input_dir, input_file, out, *extra):
    return main(["--model_path", str(checkpoint), "--input_dir", str(input_dir), "--input_file", str(input_file),
                 "--output_dir", str(out), *FAST, *extra])


def results(out):
    return {r["id"]: r for r in json.loads((out / "eval_result.json").read_text())}


def test_instit(checkpoint, tmp_path, capsys, monkeypatch):
    items = [{"question_id": k, "question": f"What does [{k}] do?", "model_prediction": "It waves.", "ground_truth": "It waves.",
              "split": "image" if k % 2 else "video"} for k in range(3)]
    write(tmp_path / "image_oe_inference.json", items)
    assert score(checkpoint, tmp_path, "image_oe_inference.json", tmp_path / "out") == 0
    assert "instit: " in capsys.readouterr().out
    scored = results(tmp_path / "out")
    assert {r["category"] for r in scored.values()} == {"instit_image", "instit_video"}
    assert all(r["score_distribution"] is None for r in scored.values())  # a score of 0-1 in tenths is several tokens
    log = json.loads((tmp_path / "out" / "instit_evaluate.json").read_text())
    assert log["total_num"] == 3
    for entry in log["model_predictons"]:
        mine = scored[str(entry["question_id"])]
        assert entry["valid"] == (mine["score"] is not None)
        assert entry["score"] == (mine["score"] if entry["valid"] else 0)
    # Inst-It's scores take several tokens (0.7): logits mode cannot read them, and says so before the weights
    # load (read from the judge's tokenizer alone).
    monkeypatch.setattr(model, "load_judge", lambda *a, **k: pytest.fail("the weights were loaded"))
    assert score(checkpoint, tmp_path, "image_oe_inference.json", tmp_path / "logits", "--mode", "logits") == EXIT_BAD_INPUT
    assert "--mode logits reads the score from one token" in capsys.readouterr().err


@pytest.mark.slow
def test_milebench_cuts_the_oldest_context_and_writes_eval_json(checkpoint, tmp_path):
    images = tmp_path / "data" / "MileBench" / "ALFRED" / "images"
    images.mkdir(parents=True)
    for k in range(8):
        Image.new("RGB", (600, 300), (30 * k, 90, 0)).save(images / f"f{k}.png")  # 2 tiles + thumbnail unless max_tiles is 1
    write(images.parent / "ALFRED.json", {"meta_data": {"task_instruction": ["Follow the frames."], "question_type": "open-ended"},
                                          "data": [{"sample_id": sid, "task_instruction_id": 0, "response": "Open the door.",
                                                    "task_instance": {"context": "", "images_path": [f"f{k}.png" for k in range(n)]}}
                                                   for sid, n in ((1, 2), (2, 8))]})
    record = lambda sid, n: {"sample_id": sid, "image": [f"data/MileBench/ALFRED/images/f{k}.png" for k in range(n)], "gen_model_id": "m",  # noqa: E731
                             "question": "Follow the frames.\n" + "".join(f"Frame {k}: <ImageHere> " for k in range(n)) + "What next?",
                             "gt_response": "Open the door.", "pred_response": "Open it."}
    write(tmp_path / "outputs" / "m" / "ALFRED" / "pred.json", [record(1, 2), record(2, 8)])
    assert score(checkpoint, tmp_path, "outputs/m/ALFRED/pred.json", tmp_path / "whole") == 0
    whole = results(tmp_path / "whole")
    assert whole["1"]["n_tiles"] == 2 and whole["2"]["n_tiles"] == 8  # the preset's one tile per image
    budget = (whole["1"]["prompt_tokens"] + whole["2"]["prompt_tokens"]) // 2  # the long sample's context must be cut
    out = tmp_path / "out"
    assert score(checkpoint, tmp_path, "outputs/m/ALFRED/pred.json", out, "--prompt_token_budget", str(budget)) == 0
    scored = results(out)
    kept = ("n_tiles", "prompt_tokens", "truncated")
    assert [scored["1"][k] for k in kept] == [whole["1"][k] for k in kept] and scored["1"]["truncated"] == []  # it fits: untouched
    assert scored["2"]["prompt_tokens"] <= budget + 1  # + the BOS token the prompt text does not count
    assert scored["2"]["truncated"][0].startswith(f"oldest question context omitted to fit {budget} prompt tokens")
    assert 0 < scored["2"]["n_tiles"] < 8
    figures = json.loads((out / "eval.json").read_text())
    judge_scored = {"Judge score"} if any(r["score"] is not None for r in scored.values()) else set()  # else left out, not null
    assert set(figures) == {"Rouge-L f", "image_quantity_level-Accuracy", "image_quantity_level-Result"} | judge_scored
    rouge = rouge_l("Open it.", "Open the door.")
    assert figures["image_quantity_level-Result"] == {"Few": [rouge, 1], "Medium": [rouge, 1], "Many": [0, 0]}  # 2 and 8 images
    judged = json.loads((out / "eval_judge.json").read_text())
    assert judged["judged"] == 2 and judged["unscored"] == sum(r["score"] is None for r in scored.values())
    assert list(csv.reader((out / "result.csv").open()))[0] == ["Model", "ALFRED (Rouge-L f)"] + [f"ALFRED ({k})" for k in judge_scored]


def megabench_rows(path, judge_model_type):
    """The task's rows of MEGA-Bench's dataset, JSON Lines as `datasets` exports them."""
    info = {"field_score_function": {"caption": "gpt_4o_as_judge"}, "aggregation": {"function": "mean", "field_weights": {"caption": 1}},
            "response_parse_function": "answer_string",
            "gpt4o_eval_configs": {"judge_model_type": judge_model_type, "eval_criteria_prompt": "Is {response} an accurate caption?",
                                   "template_mapping": {"response": "model_output"}}}
    path.write_text("".join(json.dumps({"task_name": "caption", "id": str(k), "metric_info": str(info), "eval_context": "{}"}) + "\n"
                            for k in range(2)))


def test_megabench(checkpoint, tmp_path):
    Image.new("RGB", (64, 48), "green").save(tmp_path / "q.png")
    task = {"task_name": "caption", "global_description": "", "global_images": [], "example_info": {"image_paths": [], "example_text": ""},
            "query_response": [{"response": f"Answer: A green card {k}.", "correct_answer": {"caption": "A green card."}, "global_idx": str(k),
                                "query_idx": k, "images": ["q.png"], "query_text": "Caption <image> in a few words."} for k in range(2)]}
    write(tmp_path / "open.json", [task])
    megabench_rows(tmp_path / "rows.jsonl", "with image")
    out = tmp_path / "out"
    assert score(checkpoint, tmp_path, "open.json", out, "--criteria_file", str(tmp_path / "rows.jsonl")) == 0
    scored = results(out)
    assert set(scored) == {"caption/0", "caption/1"} and all(r["n_images"] == 1 for r in scored.values())
    [written] = json.loads((out / "data_with_scores_open.json").read_text())["data"]
    # Under both breakdown tools' names, and the summary says so.
    assert json.loads((out / "summary.json").read_text())["benchmark_files"] == ["data_with_scores_open.json", "megabench_open_data_with_scores.json"]
    for k, query in enumerate(written["query_response"]):
        mine = scored[f"caption/{k}"]["score"]
        assert query["scores"]["query"] == (-1 if mine is None else mine / 10)  # no score: MEGA-Bench's -1, never a 0
    # The same criteria for a text-only judge: other prompts (no image), so this run's journal must not be resumed.
    megabench_rows(tmp_path / "rows.jsonl", "text only")
    assert score(checkpoint, tmp_path, "open.json", out, "--criteria_file", str(tmp_path / "rows.jsonl")) == EXIT_BAD_INPUT


def test_format_flags_that_cannot_work_are_refused_before_loading(tmp_path, capsys):
    write(tmp_path / "p.json", [{"question_id": 1, "question": "q", "model_prediction": "a", "ground_truth": "a", "split": "image"}])
    args = ["--model_path", str(tmp_path / "no-model"), "--input_dir", str(tmp_path), "--input_file", "p.json"]
    write(tmp_path / "c.json", [])
    assert main([*args, "--criteria_file", str(tmp_path / "c.json")]) == EXIT_BAD_INPUT
    assert "--criteria_file applies to --format megabench only, not instit" in capsys.readouterr().err
    assert main([*args, "--output_dir", str(tmp_path), "--output_file", "p.json"]) == EXIT_BAD_INPUT
    assert "this run would overwrite" in capsys.readouterr().err
    assert main([*args, "--format", "megabench"]) == EXIT_BAD_INPUT
    assert "give --criteria_file" in capsys.readouterr().err


def test_mmie_annotation_file_scores_each_sample_once_and_says_so(checkpoint, tmp_path, capsys):
    record = {"id": "SA_1", "question": [{"text": "What next?"}], "answer": "It sails.", "model": "m"}
    write(tmp_path / "rated.json", [{**record, "annotator": "a"}, {**record, "annotator": "b"}, {**record, "id": "PBL_2"}])
    assert score(checkpoint, tmp_path, "rated.json", tmp_path / "out") == 0
    assert list(results(tmp_path / "out")) == ["SA_1", "PBL_2"]
    assert "note: " in (err := capsys.readouterr().err) and "1 record(s) repeat a sample read before" in err
