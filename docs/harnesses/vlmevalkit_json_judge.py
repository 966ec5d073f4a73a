"""VLMEvalKit's JSON-mode judge pointed at judge-serve: MathCanvas-Bench's evaluation, as MathCanvas.evaluate runs it.

MathCanvas judges with the openai SDK's `client.beta.chat.completions.parse` and a pydantic response_format
(EvaluationResult: analysis, gt_answers, pred_answers, correctness), temperature 0, max_completion_tokens 2048.
Its client is `OpenAI(base_url=OPENAI_API_BASE)`: the variable is read as the API's base (.../v1), where
VLMEvalKit's other judges read the same variable as the whole endpoint (.../v1/chat/completions), and
run.py's --judge-base-url does not reach it. The judge's name is run.py's --judge (its default for
MathCanvas: gpt-4.1-2025-04-14).

Run it with the Python of a venv that has VLMEvalKit installed (docs/harnesses.md says how):

    OPENAI_API_BASE=http://127.0.0.1:8000/v1 OPENAI_API_KEY=none \
        python docs/harnesses/vlmevalkit_json_judge.py --work_dir /tmp/vlmeval-json --judge mmjudge

Flags after --work_dir are run.py's; the judge's settings come from run.py's parse_args and get_judge_kwargs
with MathCanvas.evaluate's own updates, and evaluate_with_judge judges a prediction file in the shape
VLMEvalKit's inference writes, against ground-truth rows in the shape of the benchmark's TSV (without its
download). Nothing here changes how VLMEvalKit calls the judge: an observer records every HTTP exchange
(the SDK's httpx2.Client.send). The script exits 1 when a call was not answered 200 or an item was left
without the judge's answer because of one (MathCanvas records it with status "error" and the reason).
"""

import argparse
import sys
from pathlib import Path

import httpx2
import pandas as pd
import vlmeval
from vlmeval.dataset.utils.mathcanvas import evaluate_with_judge, summarize_mathcanvas_results
from vlmeval.smp import dump

from judge_calls import CallLog, short

RUN_PY = Path(vlmeval.__file__).resolve().parent.parent / "run.py"
MODEL = "judge-serve-check"
DATASET = "MathCanvas-Bench"
# Rows in the shape of MathCanvas_Bench_VLMEvalKit.tsv (index, question, answer, knowledges), with predictions.
RECORDS = [
    (1, "A square has side 3. What is its area?", "9", ["Geometry"], "The area is 3 * 3 = 9."),
    (2, "Solve x + 2 = 5, then give 2x.", "(1) 3 (2) 6", ["Algebra"], "x = 3, so 2x = 6."),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work_dir", required=True, type=Path, help="a new directory for the files")
    args, run_argv = parser.parse_known_args()
    args.work_dir.mkdir(parents=True, exist_ok=False)

    sys.path.insert(0, str(RUN_PY.parent))
    import run
    sys.argv = [str(RUN_PY), "--data", DATASET, "--model", MODEL, "--mode", "eval", *run_argv]
    judge_kwargs = run.get_judge_kwargs(DATASET, "VQA", run.parse_args())
    judge_kwargs.update({"max_tokens": 2048, "temperature": 0.0})  # as MathCanvas.evaluate updates them
    print(f"== {DATASET}: judge kwargs {judge_kwargs}", flush=True)

    ground_truth = pd.DataFrame([(i, q, a, k) for i, q, a, k, _ in RECORDS], columns=["index", "question", "answer", "knowledges"])
    predictions = args.work_dir / f"{MODEL}_{DATASET}.xlsx"
    dump(pd.DataFrame([(i, p) for i, _, _, _, p in RECORDS], columns=["index", "prediction"]), str(predictions))

    log = CallLog()
    log.step = DATASET
    send = httpx2.Client.send

    def observed_send(client, request, **kwargs):
        response = send(client, request, **kwargs)
        response.read()
        log.record(request.content, response.status_code, response.text)
        return response

    httpx2.Client.send = observed_send
    results = evaluate_with_judge(str(predictions), ground_truth, **judge_kwargs)
    print(f"\n== {DATASET}: each item as MathCanvas recorded it")
    failed = []
    for item in results:
        detail = item["evaluation"] if item["status"] == "success" else short(item["reason"], 300)
        print(f"index {item['index']}: status {item['status']}: {detail}")
        if item["status"] != "success" and ("Error code:" in item["reason"] or "Connection" in item["reason"]):
            failed.append(item["index"])  # the SDK's APIStatusError / APIConnectionError: no answer from the judge
    print(f"\n{DATASET} summary (summarize_mathcanvas_results): {summarize_mathcanvas_results(results)['overall_summary']}")
    unread = [item["index"] for item in results if item["status"] != "success" and item["index"] not in failed]
    if unread:
        print(f"{len(unread)} item(s) {unread}: the judge answered 200, and MathCanvas could not read the answer (its own rule: a "
              "processing error, left out of its accuracy)")
    problems = [f"{len(failed)} items left without the judge's answer by an HTTP failure: {failed}"] if failed else []
    return log.report([DATASET], problems)


if __name__ == "__main__":
    sys.exit(main())
