"""Inst-It's own metric code on judge-score's log: for the downstream check of docs/benchmarks.md.

    python docs/benchmarks/instit_metric.py INST_IT_BENCH_DIR OUR_LOG THEIR_LOG

Runs compute_metric_oe of Inst-It's evaluate.py (imported from a checkout of inst-it/inst-it's
inst-it-bench folder, unchanged) on the items of judge-score's instit_evaluate.json, with a stand-in for its
GPT-4o client that answers each item, in order, with the score judge-score's log gives it, and fails (as an
API error does) where that log marks the item invalid. Inst-It's code then writes its own log, THEIR_LOG, from the
same scores; the script prints both logs' figures side by side and exits 1 if they differ.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace


def main() -> int:
    bench_dir, ours_path, theirs_path = sys.argv[1:4]
    sys.path.insert(0, bench_dir)
    import evaluate  # Inst-It's evaluate.py

    ours = json.load(open(ours_path, encoding="utf-8"))
    answers = iter(ours["model_predictons"])  # one worker (num_process=1): Inst-It asks about the items in order

    class StandIn:
        """GPTEvaluator's interface: eval(prompt, eval_input) -> an object with sample_score."""

        def __init__(self, **_):
            pass

        def eval(self, prompt: str, eval_input: str):
            item = next(answers)
            assert json.loads(eval_input)["question"] == item["question"], "asked out of order"
            if not item["valid"]:
                raise RuntimeError(item["error_in_gpt_eval"])
            return SimpleNamespace(sample_score=item["score"])

    evaluate.GPTEvaluator = StandIn
    items = [{k: v for k, v in item.items() if k not in ("score", "valid", "error_in_gpt_eval")} for item in ours["model_predictons"]]
    evaluate.compute_metric_oe(items, theirs_path, num_process=1)
    theirs = json.load(open(theirs_path, encoding="utf-8"))
    their_split = next((split for split, prompt in evaluate.PROMPTS.items() if prompt == theirs["gpt_prompt"]), None)
    figures = lambda log, split: {  # noqa: E731
        "keys": list(log), "accuracy": log["accuracy"], "total_num": log["total_num"], "valid_num": log["valid_num"],
        "items": [(i["question_id"], i["score"], i["valid"]) for i in log["model_predictons"]],
        "gpt_prompt": f"{type(log['gpt_prompt']).__name__} of the {split} split"}
    theirs, ours = figures(theirs, their_split), figures(ours, ours["model_predictons"][-1]["split"] if isinstance(ours["gpt_prompt"], str) else None)
    for key in theirs:
        shown = lambda v: f"{len(v)} items" if key == "items" else v  # noqa: E731
        print(f"{key:10} Inst-It: {shown(theirs[key])}\n{'':10} ours:    {shown(ours[key])}   {'same' if theirs[key] == ours[key] else 'DIFFERENT'}")
    return int(theirs != ours)


if __name__ == "__main__":
    sys.exit(main())
