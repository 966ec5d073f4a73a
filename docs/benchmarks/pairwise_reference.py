"""The pairwise benchmarks' own code, run on the check's files (docs/benchmarks.md), in a venv of its own:
their metric functions called as their scripts call them, and the prompts their judge scripts build, each
printed as JSON for the comparison with judge-score's. Nothing of theirs is copied: their files are
imported, or parsed with `ast` and run from the clone given, where importing them would load a model or
call an API at import time.

    python pairwise_reference.py vlrewardbench-metric VL_RewardBench/ inference.jsonl K
    python pairwise_reference.py opening-metric OpenING/ human.json judge.json
    python pairwise_reference.py prompts BENCHMARK REPO INPUT [--image_root D]
    python pairwise_reference.py mmrb2-judgements MMRB2/ interleaved.json outputs.json

mmrb2-judgements: the predictions MMRB2's evaluate.py writes where its judge answered the texts of
make_pairs.py's outputs.json, each read by its evaluator's own parse (json_repair), a failed one left out.

The prompts are printed as their messages hold them: a text part as it is, an image part as "<image>", the
parts joined as the chat templates of their judges join them (with nothing between); OpenING's with its
system message.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import random
import sys
import types
from pathlib import Path


def module(path: Path, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(loaded)
    return loaded


def definitions(path: Path, names: set[str], namespace: dict) -> dict:
    """The named functions and assignments of a file, run in `namespace` without the rest of the file."""
    tree = ast.parse(path.read_text())
    kept = [node for node in tree.body if (isinstance(node, ast.FunctionDef) and node.name in names)
            or (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets))]
    exec(compile(ast.Module(body=kept, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def joined(parts: list[tuple[str, str]]) -> str:
    return "".join("<image>" if kind == "image" else text for kind, text in parts)


def vlrewardbench_metric(repo: Path, inference: Path, k: int) -> dict:
    cal = module(repo / "cal.py", "cal")
    random.seed(1234)  # cal.py's main() seeds so before its first shuffle
    classified = cal.classify(cal.distribution(str(inference), k=k, reparse=True, use_llm_parse=False), k=k)
    return {"datasets": cal.distribution_dataset(classified)}


def opening_metric(repo: Path, human: Path, judge: Path) -> dict:
    agreement = module(repo / "calculate_agreement.py", "calculate_agreement")
    people, model = agreement.load_evaluation_results(str(human)), agreement.load_evaluation_results(str(judge))
    figures = {}
    for rule, overall, by_type in (("force_divide", agreement.calculate_agreement_force_divide, agreement.calculate_agreement_by_model_type_force_divide),
                                   ("with_tie", agreement.calculate_agreement_with_tie, agreement.calculate_agreement_by_model_type_with_tie),
                                   ("without_tie", agreement.calculate_agreement_without_tie, agreement.calculate_agreement_by_model_type_without_tie)):
        value, total = overall(people, model)
        types_ = by_type(people, model)
        unseen, seen = types_["unseen_models"]["agreement"], types_["seen_models"]["agreement"]
        figures[rule] = {"agreement": value, "total": total, **types_, "harmonic_mean": 2 * (unseen * seen) / (unseen + seen)}
    return figures


def vlrewardbench_prompts(repo: Path, parquet: Path) -> dict:
    import pyarrow.parquet

    build = module(repo / "prompt.py", "vlrb_prompt").prompt
    prompts = {}
    for row in pyarrow.parquet.read_table(parquet).to_pylist():
        # inference_hf.py: the prompt less "<image>\n", then the image, as the message's two parts
        prompts[row["id"]] = {order: {"query": joined([("text", build(row, number).replace("<image>\n", "")), ("image", "")])}
                              for order, number in (("forward", 0), ("reverse", 1))}
    return prompts


def mmrewardbench_prompts(repo: Path, data: Path) -> dict:
    script = repo / "scripts" / "1_run_model_as_judge_gpt4o.py"  # importing it makes an Azure client, which wants a key
    prepare = definitions(script, {"judge_prompt", "prepare_judge_example"}, {})["prepare_judge_example"]
    prompts = {}
    for record in json.loads(data.read_text()):
        example = prepare(record)
        prompts[record["ID"]] = {"forward": {"query": joined([("text", example["Text"]), ("image", "")])}}  # its message: [Text, image]
    return prompts


def mmrb2_evaluator(repo: Path, manager: object) -> object:
    """MMRB2's LocalPairwiseEvaluator, its model `manager` (what generate_response(content_list) answers)."""
    judges = repo / "evaluate" / "generate_judgements" / "evaluator_apis" / "llm_judges"
    namespace = {name: getattr(module(judges / "evaluation_prompts.py", "mmrb2_prompts"), name) for name in
                 ("get_image_edit_prompt", "get_image_gen_prompt", "get_interleaved_prompt", "get_reasoning_prompt")}
    namespace |= {"json": json, "re": __import__("re"), "json_repair": __import__("json_repair"), "List": list,
                  "EvaluatorResult": lambda judgement, metadata: {"judgement": judgement, "metadata": metadata}}
    evaluate = definitions(judges / "local_pairwise_evaluator.py", set(), namespace)
    tree = ast.parse((judges / "local_pairwise_evaluator.py").read_text())
    for node in ast.walk(tree):  # LocalPairwiseEvaluator's methods, without its base class (which imports its model APIs)
        if isinstance(node, ast.ClassDef) and node.name == "LocalPairwiseEvaluator":
            node.bases = []
            exec(compile(ast.Module(body=[node], type_ignores=[]), "local_pairwise_evaluator.py", "exec"), evaluate)
    evaluator = evaluate["LocalPairwiseEvaluator"].__new__(evaluate["LocalPairwiseEvaluator"])
    evaluator.model_manager = manager
    return evaluator


def mmrb2_task(pairs_file: Path) -> str:
    return {"t2i": "image"}.get(pairs_file.stem, pairs_file.stem)


def mmrb2_prompts(repo: Path, pairs_file: Path) -> dict:
    messages = []

    class Manager:  # stands for the model: keeps the message, answers a verdict
        def generate_response(self, content_list):
            messages.append(content_list)
            return '{"better_response": "A"}'

    evaluator = mmrb2_evaluator(repo, Manager())
    task = mmrb2_task(pairs_file)
    prompts = {}
    for pair in json.loads(pairs_file.read_text())["pairs"]:
        a, b = pair["response_a"]["response_content"], pair["response_b"]["response_content"]
        queries = {}
        for order, (first, second) in (("forward", (a, b)), ("reverse", (b, a))):  # evaluate.py judges both, swapping the responses
            evaluator.pairwise_evaluate(prompt_content=pair["prompt_content"], response_a=first, response_b=second, task_type=task)
            queries[order] = {"query": joined([(kind, value) for kind, value in messages.pop()])}
        prompts[pair["id"]] = queries
    return prompts


def mmrb2_judgements(repo: Path, pairs_file: Path, outputs: Path) -> dict:
    """evaluate.py's predictions (its loop, one judgement a pair and order) where the judge answered the texts of
    `outputs` ({pair id: {"forward": [text], "reverse": [text]}}): each read by pairwise_evaluate, as it reads its
    model's answer; one whose reading raises is left out, as evaluate.py leaves it out."""
    answers = []

    class Manager:  # stands for the model: answers the text given
        def generate_response(self, content_list):
            return answers.pop()

    evaluator = mmrb2_evaluator(repo, Manager())
    task = mmrb2_task(pairs_file)
    predictions = {}
    for pair in json.loads(pairs_file.read_text())["pairs"]:
        texts = json.loads(outputs.read_text()).get(pair["id"])
        if texts is None:
            continue
        a, b = pair["response_a"]["response_content"], pair["response_b"]["response_content"]
        predictions[pair["id"]] = {}
        for order, (first, second) in (("forward", (a, b)), ("reverse", (b, a))):
            judged = []
            for text in texts[order]:
                answers.append(text)
                try:
                    judged += evaluator.pairwise_evaluate(prompt_content=pair["prompt_content"], response_a=first, response_b=second, task_type=task)
                except Exception:  # noqa: BLE001 - evaluate.py's own rule: any failure is no judgement
                    pass
            predictions[pair["id"]][order] = [{**j, "evaluator": "theirs"} for j in judged]
    return predictions


def opening_prompts(repo: Path, battles: Path, opening_dir: Path) -> dict:
    """IntJudge_judge_AB.py run as it is, but for its model: its functions and its main block, with a stand-in
    processor that keeps each message and a model that answers "A is better"."""
    script = repo / "IntJudge_judge_AB.py"
    tree = ast.parse(script.read_text())
    main = next(node for node in tree.body if isinstance(node, ast.If))
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    messages = []

    class Inputs(dict):  # what the processor gives: passed to generate as keywords, and on its way to the GPU
        input_ids = [[]]

        def to(self, device):
            return self

    class Processor:
        def apply_chat_template(self, message, tokenize, add_generation_prompt):
            messages.append(json.loads(json.dumps(message)))
            return ""

        def __call__(self, **kwargs):
            return Inputs()

        def batch_decode(self, ids, **kwargs):
            return ["A is better"]

    output = battles.parent / "intjudge_reference_results.json"
    output.unlink(missing_ok=True)
    namespace = {"os": __import__("os"), "json": json, "re": __import__("re"), "random": random, "tqdm": lambda items, **_: items,
                 "processor": Processor(), "process_vision_info": lambda message: (None, None),
                 "model": types.SimpleNamespace(generate=lambda **kwargs: [[]]), "ROOT_DIR": str(battles.parent.parent),
                 "RESULT_DIR": str(battles.parent), "OPENING_DIR": str(opening_dir), "PK_FILE_NAME": str(battles), "OUTPUT_FILE": str(output)}
    exec(compile(ast.Module(body=[*functions, *main.body], type_ignores=[]), str(script), "exec"), namespace)
    judged = json.loads(output.read_text())
    prompts = {}
    for battle, message in zip(judged, messages):
        parts = [("image", "") if part["type"] == "image" else ("text", part["text"]) for part in message[1]["content"]]
        key = f"{battle['data_id']}_{battle['model_A']['name']}_{battle['model_B']['name']}"
        prompts[key] = {"forward": {"system": message[0]["content"], "query": joined(parts)}}
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    vlrb = sub.add_parser("vlrewardbench-metric")
    vlrb.add_argument("repo", type=Path), vlrb.add_argument("inference", type=Path), vlrb.add_argument("k", type=int)
    opening = sub.add_parser("opening-metric")
    opening.add_argument("repo", type=Path), opening.add_argument("human", type=Path), opening.add_argument("judge", type=Path)
    prompts = sub.add_parser("prompts")
    prompts.add_argument("benchmark", choices=["vlrewardbench", "mmrewardbench", "mmrb2", "opening"])
    prompts.add_argument("repo", type=Path), prompts.add_argument("input", type=Path), prompts.add_argument("--image_root", type=Path)
    judgements = sub.add_parser("mmrb2-judgements")
    judgements.add_argument("repo", type=Path), judgements.add_argument("input", type=Path), judgements.add_argument("outputs", type=Path)
    args = parser.parse_args()
    if args.command == "mmrb2-judgements":
        result = mmrb2_judgements(args.repo, args.input, args.outputs)
    elif args.command == "vlrewardbench-metric":
        result = vlrewardbench_metric(args.repo, args.inference, args.k)
    elif args.command == "opening-metric":
        result = opening_metric(args.repo, args.human, args.judge)
    elif args.benchmark == "opening":
        result = opening_prompts(args.repo, args.input, args.image_root)
    else:
        result = {"vlrewardbench": vlrewardbench_prompts, "mmrewardbench": mmrewardbench_prompts, "mmrb2": mmrb2_prompts}[args.benchmark](args.repo, args.input)
    print(json.dumps(result, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
