"""Every family's Bradley-Terry export read by plain transformers, without mmjudge, as docs/reward-models.md says.

    python benchmarks/plain_transformers.py --python /tmp/plain/bin/python [--out DIR] [--pairs 4]

Here, with mmjudge: the tiny reward export of each family (InternVL2-4B's original layout exported, Qwen2.5-VL,
Qwen3-VL, Qwen3.5), synthetic pairs with images, judge-score's rewards of them under a pointwise rubric, and each answer's
prompt as mmjudge builds it: its token ids, and its user turn as chat messages (text parts and image parts, in
order). Then `--python` (a venv with torch, transformers, Pillow and no mmjudge) runs benchmarks/plain_rewards.py
on them, which loads each export as the docs do and compares prompt ids (equal) and rewards (within 1e-5); its
table is printed and its exit code returned.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

FAMILIES = ("internvl2-4b", "qwen2.5-vl-3b", "qwen3-vl-4b", "qwen3.5-4b")
RUBRIC = 'category: general\ninstructions: Rate the answer.\ntemplate: "{instructions}\\n### Question\\n{question}\\n### Answer\\n{answer}\\n"\n'


def cases(out: Path, n_pairs: int) -> list[dict]:
    from mmjudge.infer.cli import main as score_main
    from mmjudge.infer.engine import prepare
    from mmjudge.infer.options import ScoreOptions
    from mmjudge.judge.data import Pair
    from mmjudge.judge.model import load_judge
    from mmjudge.judge.prompts import build_prompt, load_rubrics
    from mmjudge.judge.testing.families import write_reward_checkpoint
    from mmjudge.judge.testing.synthetic import write_pairs

    pairs_file = write_pairs(out / "data", n_pairs, seed=0)
    (out / "general.yaml").write_text(RUBRIC)
    rubrics = load_rubrics([out / "general.yaml"])
    found = []
    for family in FAMILIES:
        export = write_reward_checkpoint(out / family, family=family, seed=0)
        scored = out / family / "scored"
        if score_main(["--model_path", str(export), "--input_file", str(pairs_file), "--input_dir", str(out / "data"), "--output_dir",
                       str(scored), "--rubric", str(out / "general.yaml")]) != 0:
            raise SystemExit(f"judge-score failed on {export}")
        rewards = {(r["id"], side): r["scores"][side]["reward"] for r in json.loads((scored / "eval_result.json").read_text()) for side in "AB"}
        judge = load_judge(export)
        items = [(k, Pair.model_validate(record)) for k, record in enumerate(json.loads(pairs_file.read_text()))]
        for prepared in prepare(judge, items, rubrics, out / "data", ScoreOptions()):
            prompt = build_prompt(prepared.sample, rubrics["general"], judge.settings.template, judge.settings.system_message, out / "data",
                                  judge.settings.images)
            found.append({"family": family, "export": str(export), "pair": prepared.pair.id, "side": prepared.view,
                          "messages": [{"role": "user", "content": prompt.chat_content()}],
                          "input_ids": prepared.input_ids.tolist(), "reward": rewards[(prepared.pair.id, prepared.view)]})
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", required=True, help="the Python of a venv with torch, transformers and Pillow, and no mmjudge")
    p.add_argument("--out", default="plain-transformers", help="directory for the exports, pairs and cases (default: %(default)s)")
    p.add_argument("--pairs", type=int, default=4, help="synthetic pairs with images (default: %(default)s)")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "cases.json").write_text(json.dumps(cases(out, args.pairs)))
    check = Path(__file__).with_name("plain_rewards.py")
    return subprocess.run([args.python, str(check), str(out / "cases.json")], cwd=out).returncode


if __name__ == "__main__":
    sys.exit(main())
