"""Inputs for the downstream check of docs/benchmarks.md: each benchmark's files in exactly the shapes its
own code writes, for judge-score to read and the benchmark's own tools to read back.

    python docs/benchmarks/make_inputs.py OUT --megabench MEGA-Bench/ --instit inst-it/ [--queries_per_task N]

OUT/milebench     MileBench's layout, made here: data/MileBench/<dataset>/{<dataset>.json, images/} and
                  outputs/my-model/<dataset>/pred.json as generate.py writes it (one sample's context cut to
                  its last 3 of 40 images), for an open-ended and a multi-choice dataset.
OUT/megabench     the real Grok-2 open-set results (or the first --queries_per_task queries of each task) of MEGA-Bench's repository as a submission (scores
                  removed), the tasks' dataset rows (metric_info as the repository's task list gives it;
                  the judge's criteria, which only the Hugging Face dataset holds, written here), a random
                  image at every path a query names, and MEGA-Bench's core-set results for the same model
                  as its breakdown tool reads them (rebuilt from the repository's published task_results.json).
OUT/instit        a mixed file: 40 of the repository's real video open-ended predictions and 20 image ones
                  made here; and the repository's real multiple-choice file, as it is.

Nothing of the benchmarks is copied into this repository: the script reads their repositories at run time.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import zlib
from pathlib import Path

from PIL import Image

GROK = "megabench/results/SI_results/Grok-2-vision-1212"


def image(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    Image.new("RGB", (rng.randint(40, 400), rng.randint(40, 300)), tuple(rng.randrange(256) for _ in range(3))).save(path)


def write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, ensure_ascii=False, indent=1))


def milebench(out: Path) -> None:
    """Two datasets, MileBench's own shapes: an open-ended one (judged) and a multi-choice one (not)."""
    rng = random.Random(0)
    answers = ["Put the mug in the sink.", "Open the fridge, then take the apple.", "Turn left at the table.", "Pick up the red book."]
    for dataset, question_type in (("ALFRED", "open-ended"), ("ActionLocalization", "multi-choice")):
        folder = out / "data" / "MileBench" / dataset
        data, preds = [], []
        for sid, n in enumerate((2, 3, 5, 6, 7, 12, 31, 32, 40, 4), start=1):
            for k in range(n):
                image(folder / "images" / f"{sid}_{k}.jpg", sid * 100 + k)
            instance = {"context": "".join(f"Frame {k + 1}: {{image#{k + 1}}} " for k in range(n)) + "What is the next step?",
                        "images_path": [f"{sid}_{k}.jpg" for k in range(n)]}
            gt = rng.choice(answers)
            if question_type == "multi-choice":
                instance["choice_list"] = answers
            data.append({"sample_id": sid, "task_instruction_id": 0, "task_instance": instance, "response": gt,
                         "image_quantity_level": "Few" if n < 6 else "Many" if n > 31 else "Medium"})
            kept = n if n < 40 else 3  # generate.py cut this one's context to its last 3 images
            context = "".join(f"Frame {k + 1}: <ImageHere> " for k in range(n - kept, n)) + "What is the next step?"
            pred = rng.choice(["", "put the mug in the sink", "Open the fridge.", "B", gt, "I do not know, sorry"])
            preds.append({"sample_id": sid, "image": [f"data/MileBench/{dataset}/images/{sid}_{k}.jpg" for k in range(n - kept, n)],
                          "question": f"Follow the frames.\n{context}", "gt_response": gt, "gen_model_id": "llava-v1.5-7b",
                          "pred_response": pred, "gen_kwargs": {"max_new_tokens": 32}})
        write(folder / f"{dataset}.json", {"meta_data": {"task_instruction": ["Follow the frames."], "question_type": question_type}, "data": data})
        write(out / "outputs" / "my-model" / dataset / "pred.json", preds)


def task_list(megabench_repo: Path) -> dict[str, dict]:
    """Each task's metric_info and example eval_context, from the repository's task_examples/*/README.md."""
    found = {}
    for readme in megabench_repo.glob("task_examples/**/README.md"):
        text = readme.read_text()
        field = lambda name: re.search(rf"\*\*{re.escape(name)}\*\*: (.*)", text).group(1).strip()  # noqa: E731
        found[readme.parent.name] = {
            "metric_info": {"field_score_function": ast.literal_eval(field("Field Score Function")),
                            "aggregation": ast.literal_eval(field("Aggregation")), "response_parse_function": field("Response Parse Function")},
            "eval_context": ast.literal_eval(field("Eval Context (for this query sample)")),
        }
    return found


def megabench(out: Path, repo: Path, per_task: int | None) -> None:
    scored = json.loads((repo / GROK / "data_with_scores_open.json").read_text())
    tasks = task_list(repo)
    submission, rows = [], []
    for task in scored["data"]:
        name, spec = task["task_name"], tasks[task["task_name"]]
        queries = [{k: v for k, v in q.items() if k != "scores"} for q in task["query_response"][:per_task]]
        submission.append({**{k: v for k, v in task.items() if k not in ("task_score", "mean_task_score", "eval_type")}, "query_response": queries})
        context = spec["eval_context"]
        mapping = {"response": "model_output", "question": "example_question"}
        mapping.update({f"context_{key}": f"eval_context.{key}" for key in context})
        judged = [f for f, m in spec["metric_info"]["field_score_function"].items() if m == "gpt_4o_as_judge"]
        mapping.update({"reference": f"answers.{judged[0]}"} if judged else {})
        prompt = ("Grade {response}, the answer to {question}, against {reference}." if judged else "Grade {response}.")
        prompt += "".join(f" Expected behaviour: {{context_{key}}}." for key in context)
        metric = {**spec["metric_info"], "gpt4o_eval_configs": {"judge_model_type": "with image", "eval_criteria_prompt": prompt,
                                                                 "template_mapping": mapping, "reference_type": "free-form"}}
        for q in queries:
            rows.append({"task_name": name, "id": q["global_idx"], "metric_info": str(metric), "eval_context": str(context)})
            for k, path in enumerate(q["images"]):
                image(out / path, zlib.crc32(f"{name}/{q['global_idx']}/{k}".encode()))
    write(out / "open_all_query_responses.json", submission)
    (out / "megabench_open.jsonl").write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    # The core set's scored tasks as the breakdown tool reads them: name, mean_task_score, eval_type, a demonstration or not, the query count.
    published = json.loads((repo / GROK / "analysis" / "task_results.json").read_text())
    core = [{"task_name": t["name"], "eval_type": t["eval_type"], "mean_task_score": t["score"], "task_score": t["score"] * t["num_query"],
             "example_info": {"example_text": "demonstration" if t["num_demo"] else "", "image_paths": []},
             "query_response": [{}] * t["num_query"]} for t in published if t["eval_type"] == "rule"]
    write(out / "data_with_scores_core.json", {"data": core, "summary": {}})


def instit(out: Path, repo: Path) -> None:
    video = json.loads((repo / "inst-it-bench" / "output" / "video_oe_inference.json").read_text())[:40]
    images = [{"question_id": f"img-{k:03d}", "question": f"What is [{k % 5 + 1}] doing?", "model_prediction": "It is holding a cup.",
               "ground_truth": f"[{k % 5 + 1}] is drinking from a cup.", "split": "image"} for k in range(20)]
    write(out / "mixed_oe_inference.json", images[:10] + video + images[10:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--megabench", type=Path, required=True, help="a checkout of TIGER-AI-Lab/MEGA-Bench")
    parser.add_argument("--instit", type=Path, required=True, help="a checkout of inst-it/inst-it")
    parser.add_argument("--queries_per_task", type=int, help="MEGA-Bench: the first N queries of each task (default: all; a CPU judges slowly)")
    args = parser.parse_args()
    milebench(args.out / "milebench")
    megabench(args.out / "megabench", args.megabench, args.queries_per_task)
    instit(args.out / "instit", args.instit)
    print(args.out)


if __name__ == "__main__":
    main()
