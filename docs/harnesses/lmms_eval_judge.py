"""lmms-eval's own judge code pointed at judge-serve: each task's process_results, as lmms-eval calls it.

Run it with the Python of a venv that has lmms-eval installed (docs/harnesses.md says how), never with the
repository's venv; nothing of this repository is imported. The judge is configured as each task reads it,
from the environment, when its module loads; tasks that read it differently run in processes of their own
(docs/harnesses.md's table gives each task's settings):

    OPENAI_API_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=none MODEL_VERSION=mmjudge \
        python docs/harnesses/lmms_eval_judge.py --tasks mmvet llava_in_the_wild_french llava_in_the_wild

The task configs are read with lmms-eval's own load_yaml_config (which resolves `!function utils...`), and each
task's process_results is called with documents in the shape of its Hugging Face dataset and a model answer,
as lmms-eval's ConfigurableTask.process_results calls it; then the task's own aggregation:

    mmvet                     the shared judge client (OPENAI_API_URL the API's base); temperature 0, then
                              0.5 ... 2.0 while the answer is not a number in 0-1, max_tokens 128
    llava_in_the_wild(_french) the shared judge client; a review at temperature 0 (english) or 0.2 (french)
    wildvision                its own client (requests): OPENAI_API_URL the whole endpoint, the judge named by
                              its yaml (gpt-4o), an image as "data:image/jpeg;base64, <data>", temperature 0
    mia_bench                 its own client (requests): OPENAI_API_URL the whole endpoint, MODEL_VERSION
    live_bench                the openai SDK (OPENAI_BASE_URL the API's base), the judge named gpt-4o,
                              response_format json_object, answers read as JSON with Rating and Explanation

Nothing here changes how lmms-eval calls the judge. Two observers record every HTTP exchange (the openai SDK's
httpx2.Client.send, and requests.Session.send) with the fields sent and the status answered. The script exits
1 when a call was not answered 200 or a document was scored without a judge's answer: by the task's own
record where it keeps one (mmvet: no eval_model; LLaVA-Bench: an empty review or "Failed to Get a Proper
Review."; wildvision: no judge's response), and otherwise when none of the document's calls was answered 200.
"""

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx2
import lmms_eval
import requests
from lmms_eval.utils import load_yaml_config
from PIL import Image

from judge_calls import CallLog, short

TASKS = Path(lmms_eval.__file__).resolve().parent / "tasks"


def image(colour: str):
    return Image.new("RGB", (64, 48), colour)


@dataclass
class Task:
    """A task's config, documents (each with a model answer), the metric of process_results to read, a line
    describing a document's result, and whether the task's own record says it was scored without a judge's
    answer (None: it keeps no such record; the calls tell)."""

    yaml: Path
    docs: list
    metric: str
    describe: Callable[[dict], str]
    unscored: Callable[[dict], bool] | None = None  # besides: none of the document's calls answered 200


TASK_DEFINITIONS = {
    # Documents in the shape of lmms-lab's MMVet dataset (question_id, question, answer, comma-joined capability).
    "mmvet": Task(TASKS / "mmvet" / "mmvet.yaml", [
        ({"question_id": "v1_1", "question": "What is the sum of the two numbers written on the board?",
          "answer": "12", "capability": "ocr,math", "image": None}, "The sum is 12."),
        ({"question_id": "v1_2", "question": "Which colour is the boat in the harbour?", "answer": "red",
          "capability": "rec", "image": None}, "The boat is blue."),
        ({"question_id": "v1_3", "question": "What are the two words on the shop sign?", "answer": "open<AND>daily",
          "capability": "ocr,spat", "image": None}, "It says open daily."),
        ({"question_id": "v1_4", "question": "Name a fruit shown in the picture.", "answer": "apple<OR>pear",
          "capability": "rec,know,gen", "image": None}, "There is a pear on the table."),
    ], "gpt_eval_score", lambda r: f"score {r['score']}, eval_model {r['eval_model']!r}", lambda r: not r["eval_model"]),
}
# Documents in the shape of the LLaVA-Bench (in-the-wild) datasets (question_id, question, caption, gpt_answer, category).
LLAVA_DOCS = [
    ({"question_id": 1, "question": "What is the man doing?", "caption": "A man rows a small red boat across a calm harbour.",
      "gpt_answer": "He is rowing a boat across the harbour.", "category": "conv", "image": image("teal")}, "He is fishing."),
    ({"question_id": 2, "question": "Describe the scene in detail.",
      "caption": "A garden with three trees, a white house and a blue sky.",
      "gpt_answer": "A white house stands behind a garden with three trees under a clear blue sky.",
      "category": "detail", "image": image("green")}, "There is a house and some trees."),
]
LLAVA = dict(metric="gpt_eval_llava_all", describe=lambda r: f"scores {r['scores']}, eval_model {r['eval_model']!r}, review {short(r['review'])}",
             unscored=lambda r: r["review"] in ("", "Failed to Get a Proper Review."))
TASK_DEFINITIONS["llava_in_the_wild_french"] = Task(TASKS / "multilingual-llava-bench-in-the-wild" / "french_llava_in_the_wild.yaml", LLAVA_DOCS, **LLAVA)
TASK_DEFINITIONS["llava_in_the_wild"] = Task(TASKS / "llava-in-the-wild" / "llava-in-the-wild.yaml", LLAVA_DOCS, **LLAVA)
# Documents in the shape of WildVision/wildvision-arena-data's release_bench_0630_with_modelresponse (instruction,
# image, the baseline model's answer under its name).
TASK_DEFINITIONS["wildvision"] = Task(TASKS / "wild_vision_bench" / "wild_vision_bench0630.yaml", [
    ({"instruction": "What should I cook with what is on this table?", "image": image("orange"),
      "claude-3-sonnet-20240229": "You could make a vegetable soup with the carrots and onions."}, "A carrot cake."),
    ({"instruction": "Is this chart going up or down?", "image": image("navy"),
      "claude-3-sonnet-20240229": "The chart goes up from left to right."}, "It goes down."),
], "elo_scores", lambda r: f"judgement {r['judgement']!r}, judge's response {short(r['gpt_resps'])}", lambda r: r["gpt_resps"] == "")
# Documents in the shape of lmms-lab-encoder/MIA-Bench (instruction, components, component_weight, image).
TASK_DEFINITIONS["mia_bench"] = Task(TASKS / "mia_bench" / "mia_bench.yaml", [
    ({"instruction": "Describe the boat in two sentences, the second naming its colour.", "image": image("red"),
      "components": ["two sentences", "the second names the colour"], "component_weight": [4, 6]},
     "A small boat floats in the harbour. It is red."),
    ({"instruction": "List three objects in the picture as a numbered list.", "image": image("white"),
      "components": ["three objects", "a numbered list"], "component_weight": [5, 5]}, "1. a table 2. a cup"),
], "gpt_eval_score", lambda r: f"scores {r}")
# Documents in the shape of lmms-eval/LiveBench's 2024-09 split (id, images, question, answer, criteria, subtask).
TASK_DEFINITIONS["live_bench"] = Task(TASKS / "live_bench" / "live_bench_2409.yaml", [
    ({"id": 1, "images": [image("gray")], "question": "What is the headline of this page about?", "answer": "A new bridge opens in the city.",
      "criteria": "10 if the answer names the bridge opening, 0 otherwise.", "subtask": "Concrete Recognition"}, "A bridge opened."),
    ({"id": 2, "images": [image("yellow")], "question": "Why might the market fall tomorrow?", "answer": "Because rates rise.",
      "criteria": "Full marks for naming the rate rise.", "subtask": "Analytical Questions"}, "Rates are going up."),
], "gpt4_eval_score", lambda r: f"rating {r['rating']}, model_name {r['model_name']!r}, explanation {short(str(r['explanation']))}")


def observed(send, body_of, log: CallLog):
    """`send` of an HTTP client, recording each exchange in `log`."""

    def observed_send(client, request, **kwargs):
        try:
            response = send(client, request, **kwargs)
        except Exception as error:
            log.record(body_of(request), None, f"{type(error).__name__}: {error}")
            raise
        if isinstance(response, httpx2.Response):
            response.read()  # a streamed body is read once and kept, so the SDK reads it as it would
        log.record(body_of(request), response.status_code, response.text)
        return response

    return observed_send


def aggregation(config: dict, metric: str):
    return next(entry["aggregation"] for entry in config["metric_list"] if entry["metric"] == metric)


def run(name: str, task: Task, log: CallLog, unscored: list) -> None:
    config = load_yaml_config(str(task.yaml))
    log.step = name
    print(f"\n== {name} ({config['task']}): process_results per document", flush=True)
    results = []
    for k, (doc, prediction) in enumerate(task.docs):
        before = len(log.calls)
        result = config["process_results"](doc, [prediction])[task.metric]
        results.append(result)
        answered = [call for call in log.calls[before:] if call["status"] == 200]
        print(f"{k}: {task.describe(result)}; {len(log.calls) - before} call(s), {len(answered)} answered 200", flush=True)
        if not answered or (task.unscored is not None and task.unscored(result)):
            unscored.append(f"{name} {k}")
    aggregate = aggregation(config, task.metric)
    try:
        print(f"{name} {task.metric} aggregated ({aggregate.__name__}): {aggregate(results)}")
    except Exception as error:  # the task's own aggregation, on what the judge gave it
        print(f"{name} {task.metric}: the task's aggregation ({aggregate.__name__}) raised {type(error).__name__}: {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", choices=list(TASK_DEFINITIONS), default=["mmvet", "llava_in_the_wild_french"])
    args = parser.parse_args()
    log = CallLog()
    # the openai SDK's client (the shared judge client, live_bench) and requests (wildvision, mia_bench, API_TYPE=local)
    httpx2.Client.send = observed(httpx2.Client.send, lambda request: request.content, log)
    requests.Session.send = observed(requests.Session.send, lambda request: request.body, log)
    unscored = []
    for name in args.tasks:
        run(name, TASK_DEFINITIONS[name], log, unscored)
    problems = [f"{len(unscored)} documents scored without the judge's answer: {unscored}"] if unscored else []
    return log.report(args.tasks, problems)


if __name__ == "__main__":
    sys.exit(main())
