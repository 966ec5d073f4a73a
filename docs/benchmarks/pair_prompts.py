"""judge-score's prompts of a pairwise benchmark's pairs, as JSON, for the comparison with the prompts the
benchmark's own judge script builds (docs/benchmarks/pairwise_reference.py prompts): each order's user turn
as a chat API takes it (an image as "<image>") and, where the rubric has one, its system message.

    python docs/benchmarks/pair_prompts.py --format F --input_dir D --input_file I --rubric R [--against THEIRS]

With --against (pairwise_reference.py's prompts), it says how many of the benchmark's prompt texts it
compared, and shows each that differs.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mmjudge.judge.formats import FORMATS
from mmjudge.judge.preferences import ORDERS
from mmjudge.judge.prompts import build_pair_prompt, load_rubrics
from mmjudge.judge.templates import get_template
from mmjudge.judge.tiling import TilingConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", choices=list(FORMATS), required=True)
    parser.add_argument("--input_dir", type=Path, required=True)
    parser.add_argument("--input_file", required=True)
    parser.add_argument("--rubric", type=Path, nargs="+", required=True)
    parser.add_argument("--against", type=Path)
    args = parser.parse_args()
    fmt = FORMATS[args.format]
    bench = fmt.read(args.input_dir / args.input_file, args.input_dir, load_rubrics(args.rubric), None)
    prompts = {}
    for pair in bench.samples:
        rubric = bench.rubrics[pair.category]
        prompts[pair.id] = {}
        for order, first in ORDERS.items():
            prompt = build_pair_prompt(pair, first, rubric, get_template("phi3-chat"), None, args.input_dir, TilingConfig(max_tiles=1), 1)
            prompts[pair.id][order] = {"query": prompt.query, **({"system": rubric.system_message} if rubric.system_message is not None else {})}
    if args.against is None:
        print(json.dumps(prompts, indent=1, ensure_ascii=False))
        return
    theirs = json.loads(args.against.read_text())
    compared = [(key, order, field, text) for key, orders in theirs.items() for order, prompt in orders.items() for field, text in prompt.items()]
    differ = [(key, order, field, text) for key, order, field, text in compared if prompts.get(key, {}).get(order, {}).get(field) != text]
    for key, order, field, text in differ:
        print(f"{key} {order} {field} differs:\n  theirs: {text!r}\n  ours:   {prompts.get(key, {}).get(order, {}).get(field)!r}")
    print(f"{len(compared)} prompt texts compared, {len(differ)} differ")


if __name__ == "__main__":
    main()
