"""Inputs for the pairwise benchmarks' check of docs/benchmarks.md: each benchmark's files in exactly the
shapes its own code reads, made here with this project's own texts and random images, and a judge's
stand-in outputs that take every path of each benchmark's reading of a verdict.

    python docs/benchmarks/make_pairs.py OUT --opening OpenING/

OUT/vlrewardbench   test-00000-of-00001.parquet as the released file holds it (its images as bytes): 3 records of each
                    of the 7 id prefixes its cal.py tells apart; outputs.json: 1 judgement a pair and order, 3 for two pairs
                    (as --samples 3 writes them), each agreeing with people, rejecting their answer, or unmatched.
OUT/mmrewardbench   data/all_data.json as its 0_download_data.py leaves it, 2 records per domain, and the images;
                    outputs.json: forward texts with [[A]], [[B]], both, or neither (which its scorer settles by coin).
OUT/mmrb2           interleaved.json as its build_from_hf.py writes it (prompt and response images), and outputs.json:
                    JSON verdicts fenced, broken, without better_response, "tie", and pairs left unjudged; half of
                    them broken as json_repair, which its evaluators read them with, repairs them (single quotes,
                    a bare letter, a number for a letter, text around, a list).
OUT/opening         Interleaved_Arena/: the first 16 battles of the repository's real judge_modelAB_results.json (people's
                    winners) and data_instance_modelAB.json, each model's answer as IntJudge reads it (<name>_output/,
                    some images missing, a first step without text), the question images in OpenING-benchmark/images/;
                    outputs.json: IntJudge-style answers of every kind its rule reads.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import zlib
from pathlib import Path

from PIL import Image

WORDS = "a boat leaves the harbour at dawn while gulls circle the quiet water and the town wakes slowly".split()


def sentence(rng: random.Random, n: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def png(seed: int) -> bytes:
    rng = random.Random(seed)
    buffer = io.BytesIO()
    Image.new("RGB", (rng.randint(40, 300), rng.randint(40, 300)), tuple(rng.randrange(256) for _ in range(3))).save(buffer, format="PNG")
    return buffer.getvalue()


def image(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png(seed))


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False))


PLANS = [("reject", "reject"), ("agree", "reject"), ("agree", "unmatched"), ("unmatched", "unmatched"), ("reject", "agree"),
         ("unmatched", "reject"), ("reject", "reject")]


def vlrewardbench(out: Path, rng: random.Random) -> None:
    import pyarrow
    import pyarrow.parquet

    prefixes = ["RLAIF-V-Dataset", "RLHF-V-Dataset", "hallucination_pair", "mathverse", "mmmu_pro", "wildvision-battle", "vlfeedback"]
    rows, outputs = [], {}
    agreeing = ["The first is vague.\n\n**Overall Judgment**: Answer {n} is better.", "Therefore, Answer {n} is the better one.",
                "Overall Judgment: Answer {n} is slightly better\nthan the other."]
    unmatched = ["Both are fine.", "Therefore, Answer 3 is better."]
    for k in range(21):
        rid = f"{prefixes[k % 7]}_{k}" if prefixes[k % 7] != "vlfeedback" else f"{900 + k}"
        ranking = [0, 1] if k % 3 else [1, 0]
        rows.append({"id": rid, "query": ("<image>\n" if k % 4 == 0 else "") + sentence(rng) + " What is shown?",
                     "response": [sentence(rng, 12), sentence(rng, 10)], "image": {"bytes": png(k), "path": f"{k}.png"},
                     "human_ranking": ranking, "models": ["model-x", "model-y"], "judge": "human", "rationale": sentence(rng),
                     "query_source": prefixes[k % 7], "meta": "{}", "human_error_analysis": [], "ground_truth": ""})
        better = 0 if ranking[0] < ranking[1] else 1  # people's answer, as the record orders them
        # Every id prefix's first pair agrees in both orders (cal.py divides by its decided pairs); the second takes
        # each of the other ways two judgements can go; the third goes at random.
        plan = [("agree", "agree"), PLANS[k % 7], (None, None)][k // 7]
        outputs[rid] = {}
        for order, planned in zip(("forward", "reverse"), plan):
            texts = []
            for _ in range(3 if k in (2, 9) else 1):  # as --samples 3 writes them
                status = planned or rng.choice(["agree", "agree", "reject", "unmatched"])
                shown = better if order == "forward" else 1 - better  # its place (0, 1) in the order shown
                number = shown + 1 if status == "agree" else 2 - shown
                if status == "unmatched":  # "Answer 3" matches cal.py's pattern and, being no rejected answer, counts as agreeing
                    texts.append(unmatched[0] if planned else rng.choice(unmatched))
                else:
                    texts.append(rng.choice(agreeing).format(n=number))
            outputs[rid][order] = texts
    (out / "vlrewardbench").mkdir(parents=True, exist_ok=True)
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), out / "vlrewardbench" / "test-00000-of-00001.parquet")
    write_json(out / "vlrewardbench" / "outputs.json", outputs)


def mmrewardbench(out: Path, rng: random.Random) -> None:
    domains = [("nocaps", "open_generation/correctness_task"), ("visitbench", "open_generation/preference_task"), ("mmmu-s", "knowledge"),
               ("mathvista", "reasoning"), ("EMMA-Coding", "reasoning"), ("pairs", "safety"), ("hateful-memes", "safety"), ("MMBench", "vqa")]
    records, outputs = [], {}
    texts = ["Assistant A is more precise.\n\nFinal verdict: [[A]]", "[[B]]", "B is close, but [[A]] and not [[B]]", "I cannot decide.",
             "Final Verdict: [[B]]", "neither"]
    for k in range(16):
        source, category = domains[k % len(domains)]
        rid = f"{source}_{k}"
        image(out / "mmrewardbench" / "data" / "images" / source / f"{k}.jpg", 100 + k)
        records.append({"ID": rid, "Text": sentence(rng) + " Describe it.", "Image": f"images/{source}/{k}.jpg", "Output1": sentence(rng, 14),
                        "Output2": sentence(rng, 11), "Better": "Output2" if k % 3 else "Output1", "Category": category})
        outputs[rid] = {"forward": [rng.choice(texts)], "reverse": [rng.choice(texts)]}
    write_json(out / "mmrewardbench" / "data" / "all_data.json", records)
    write_json(out / "mmrewardbench" / "outputs.json", outputs)


def mmrb2(out: Path, rng: random.Random) -> None:
    root = out / "mmrb2"
    pairs, outputs = [], {}
    sources = ["isgbench", "chameleon", "interleavedeval", "mmmg"]
    texts = ['{"reasoning": {"text_quality": "fine"}, "score": 5, "better_response": "A", "confidence": 0.4}',
             '```json\n{"reasoning": "B shows the steps", "better_response": "B"}\n```', '{"reasoning": "cut off, "better_response": "B", "score": 2',
             '{"reasoning": "no verdict"}', '{"better_response": "tie"}', '{"better_response": ""}']
    broken = ["{'reasoning': 'single quotes', 'better_response': 'B'}", "{'better_response': 'A'}", '{"reasoning": "bare", "better_response": A}',
              '{"better_response": 1}', '{"better_response": 2, "score": 4}', 'My verdict: {"better_response": "B"} as shown.',
              '[{"better_response": "A"}]', '{"better_response": "a"}', "{'better_response': 'B', 'confidence': 0.9"]
    breaks = random.Random(4)  # its own draws: the pairs, and the prompts checked above, stay those of rng
    for k in range(10):
        pid = f"{sources[k % 4]}_{k}_model-a_{k}_model-b_{k}"
        image(root / "input_images" / f"{pid}_prompt_0.png", 200 + k)
        response = {}
        for side in ("a", "b"):
            content = []
            for step in range(rng.randint(1, 3)):
                name = f"images/{pid}_{side}_{step}.png"
                image(root / name, 300 + 10 * k + step)
                content += [["text", sentence(rng)], ["image", name]]
            response[side] = {"model_name": f"model-{side}", "response_content": content}
        pairs.append({"id": pid, "prompt_content": [["text", sentence(rng) + " Show it in steps."], ["image", f"input_images/{pid}_prompt_0.png"]],
                      "prompt_source": sources[k % 4], "prompt_metadata": {"id": k}, "response_a": response["a"], "response_b": response["b"],
                      "chosen": "A" if k % 3 else "B", "human_annotations": [rng.randint(1, 6) for _ in range(3)]})
        if k != 7:  # pair 7 unjudged: a missing pair
            outputs[pid] = {order: [breaks.choice(broken) if breaks.random() < 0.5 else text] for order, text in
                            (("forward", rng.choice(texts)), ("reverse", rng.choice(texts)))}
    write_json(root / "interleaved.json", {"pairs": pairs})
    write_json(root / "outputs.json", outputs)


def opening(out: Path, rng: random.Random, repository: Path) -> None:
    import subprocess

    def real(name: str) -> list:
        text = subprocess.run(["git", "-C", str(repository), "show", f"HEAD:Interleaved_Arena/{name}"], capture_output=True, check=True).stdout
        return json.loads(text)[:16]

    arena = out / "opening" / "Interleaved_Arena"
    battles = real("judge_modelAB_results.json")
    write_json(arena / "judge_modelAB_results.json", battles)
    write_json(arena / "data_instance_modelAB.json", real("data_instance_modelAB.json"))
    texts = ["A is better", "B is better", "Tie(A is better)", "Tie(B is better)", "tie, both weak", "Maybe B.", "no idea"]
    outputs = {}
    for k, battle in enumerate(battles):
        data_id = battle["data_id"]
        steps_in = [{"image": f"./images/Task {k % 3}/{data_id}-i-{i}.jpg", "text": ("Continue the story. <BEGIN> " if i == 1 else "") + sentence(rng) + " <image>"}
                    for i in (1, 2)]
        for i in (1, 2):
            image(out / "opening" / "OpenING-benchmark" / "images" / f"Task {k % 3}" / f"{data_id}-i-{i}.jpg", zlib.crc32(f"{data_id}{i}".encode()))
        for name in (battle["model_A"]["name"], battle["model_B"]["name"]):
            folder = arena / f"{name}_output"
            steps_out = []
            for i in range(rng.randint(1, 3)):
                file = f"./{name}_output/{data_id}-o-{i}.jpg"
                if rng.random() < 0.8:  # the rest are missing, as some models' images are
                    image(folder / Path(file).name, zlib.crc32(f"{name}{data_id}{i}".encode()))
                steps_out.append({"text": "" if (i == 0 and k % 5 == 4) else sentence(rng) + " <image>", "image": file})
            write_json(folder / f"{data_id}.json", {"meta_task_id": "3", "meta_task_name": f"Task {k % 3}", "subtask_id": "1", "data_id": data_id,
                                                    "conversations": [{"input": steps_in}, {"output": steps_out}]})
        key = f"{data_id}_{battle['model_A']['name']}_{battle['model_B']['name']}"
        outputs[key] = {"forward": [rng.choice(texts)], "reverse": [rng.choice(texts)]}
    write_json(out / "opening" / "outputs.json", outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--opening", type=Path, required=True, help="a clone of LanceZPF/OpenING, for its real battles")
    args = parser.parse_args()
    vlrewardbench(args.out, random.Random(1))
    mmrewardbench(args.out, random.Random(2))
    mmrb2(args.out, random.Random(3))
    opening(args.out, random.Random(4), args.opening)
    print(args.out)


if __name__ == "__main__":
    main()
