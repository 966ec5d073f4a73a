"""lmms-eval's hallusion_bench and egothink judge code pointed at judge-serve: the two tasks whose judge name
is not the user's to choose. hallusion_bench's evaluate_by_chatgpt always asks for `gpt-4` (MODEL_VERSION is
not read); egothink's chat_compeletion_openai sends no `model` at all, as to an Azure deployment, and its key
in Azure's `api-key` header.

Both tasks' modules import only requests, numpy, tqdm, loguru and yaml, so they run from an lmms-eval
checkout in a small venv of their own (docs/harnesses.md, "Judge names"), without installing lmms-eval:
`lmms_eval` and `lmms_eval.tasks` are made bare packages over the checkout, so that importing the two task
modules runs the tasks' code and not lmms-eval's registry. Nothing of this repository is imported.

    OPENAI_API_URL=http://127.0.0.1:8000/v1/chat/completions OPENAI_API_KEY=none \
        python docs/harnesses/lmms_eval_names.py --lmms_eval /tmp/harness-src/lmms --output_dir /tmp/hb-check

hallusion_bench runs as lmms-eval aggregates it: hb_process_results on each document and a model answer, then
hb_aggregation_result for aAcc, which calls the judge once per document (max_tokens 16) and counts an answer
it could not get as "unclear". egothink runs egothink_process_results on each document, which calls the judge
at temperature 0 with max_tokens 2048 and keeps the answering model's name (`eval_model`). The script exits 1
when a call was not answered 200, or when a document was scored without the judge's answer.
"""

import argparse
import importlib
import sys
import types
from pathlib import Path

import requests

from judge_calls import CallLog, observed_requests

# HallusionBench-shaped documents (its Hugging Face dataset's fields, without the image) with a model answer.
HALLUSION_DOCS = [
    {"category": "VD", "subcategory": "illusion", "set_id": "0", "figure_id": "0", "question_id": "0", "filename": "0.png",
     "question": "Are the two lines the same length?", "gt_answer": "1", "gt_answer_details": "The two lines are the same length.",
     "visual_input": "1", "sample_note": "lines", "prediction": "Yes, they are equally long."},
    {"category": "VD", "subcategory": "illusion", "set_id": "0", "figure_id": "1", "question_id": "0", "filename": "1.png",
     "question": "Are the two lines the same length?", "gt_answer": "0", "gt_answer_details": "The upper line is longer.",
     "visual_input": "1", "sample_note": "lines", "prediction": "Yes, they are equally long."},
    {"category": "VS", "subcategory": "chart", "set_id": "1", "figure_id": "0", "question_id": "0", "filename": "2.png",
     "question": "Is the bar for 2020 higher than the bar for 2019?", "gt_answer": "1", "gt_answer_details": "The 2020 bar is higher.",
     "visual_input": "1", "sample_note": "bars", "prediction": "No, the 2019 bar is higher."},
]
# EgoThink-shaped documents (id, question, answer) with a model answer.
EGOTHINK_DOCS = [
    ({"id": "1", "question": "What am I holding in my left hand?", "answer": "A red cup."}, "A cup."),
    ({"id": "2", "question": "How many chairs are in front of me?", "answer": "Three."}, "There are two chairs."),
]


def task_modules(checkout: Path):
    """hallusion_bench's evaluate_hb and egothink's utils, imported from the checkout as lmms-eval imports them."""
    for name in ("lmms_eval", "lmms_eval.tasks"):
        package = types.ModuleType(name)
        package.__path__ = [str(checkout / name.replace(".", "/"))]
        sys.modules[name] = package
    return importlib.import_module("lmms_eval.tasks.hallusion_bench.evaluate_hb"), importlib.import_module("lmms_eval.tasks.egothink.utils")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lmms_eval", type=Path, required=True, help="an lmms-eval checkout (its top folder)")
    parser.add_argument("--output_dir", type=Path, required=True, help="where hallusion_bench writes its gpt_response files")
    args = parser.parse_args()
    hallusion, egothink = task_modules(args.lmms_eval)
    log = CallLog()
    requests.Session.send = observed_requests(requests.Session.send, log)
    unscored = []

    log.step = "hallusion_bench"
    results = [hallusion.hb_process_results(doc, [doc["prediction"]])["aAcc"] for doc in HALLUSION_DOCS]
    accuracy = hallusion.hb_aggregation_result(results, "aAcc", argparse.Namespace(output_path=str(args.output_dir)))
    answered = [call for call in log.calls if call["step"] == "hallusion_bench" and call["status"] == 200]
    print(f"hallusion_bench: aAcc {accuracy} over {len(results)} documents, {len(answered)} judge answers")
    if len(answered) < len(results):  # the task scores a document whose call failed as "unclear", silently
        unscored += [f"hallusion_bench: {len(results) - len(answered)} of {len(results)} documents judged from no answer"]

    log.step = "egothink"
    for doc, prediction in EGOTHINK_DOCS:
        result = egothink.egothink_process_results(doc, [prediction])["gpt_eval_score"]
        print(f"egothink {doc['id']}: score {result['score']}, eval_model {result['eval_model']!r}, judge {result['judge'][:60]!r}")
        if not result["eval_model"]:  # chat_compeletion_openai gave up: ("", "")
            unscored.append(f"egothink {doc['id']}")
    problems = [f"documents scored without the judge's answer: {unscored}"] if unscored else []
    return log.report(["hallusion_bench", "egothink"], problems)


if __name__ == "__main__":
    sys.exit(main())
