"""judge-train mine: the hard pairs of a training file, for GRPO (UnifiedReward-Think's rejection step): those a
judge gets wrong or is inconsistent on, read from judge-score's records of the same pairs judged k times per order.

    judge-score --model_path SFT --input_dir DATA --input_file pairs.json --samples 4 --output_dir scored
    judge-train mine --scores scored/eval_result.json --train_file DATA/pairs.json --output_file DATA/hard.json

A pair is hard where its final verdict is not people's (their majority; no verdict is a wrong one), or where its
two orders' verdicts disagree (swap_consistent false; each order's verdict from its k samples by judge-score's
--pair_rule). The kept records are the training file's own, every annotator's, in its order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from mmjudge.judge.data import InputError, PairResult, Problem, load_pairs, read_records, validation_problems, write_json_atomically
from mmjudge.train.data import merge_pair_annotators


@dataclass(frozen=True)
class Hardness:
    wrong: bool  # the final verdict is not people's
    inconsistent: bool  # the two orders' verdicts disagree

    @property
    def hard(self) -> bool:
        return self.wrong or self.inconsistent


def hardness(result: PairResult, preference: str) -> Hardness:
    """An order's k samples count through its verdict under judge-score's rule (agree: their majority, none
    without one), not one by one: sampled at temperature, nearly every pair has some sample apart (on the
    benchmark's SFT judge at temperature 1, all 160 training pairs did)."""
    return Hardness(result.verdict != preference, result.swap_consistent is False)


def read_scores(path: Path) -> dict[str, PairResult]:
    """judge-score's records of pairs, by id; every record that is not one is a problem naming it."""
    results, problems = {}, []
    for index, raw in enumerate(read_records(path)):
        try:
            result = PairResult.model_validate(raw)
        except ValidationError as err:
            problems += validation_problems(str(path), index, raw.get("id") if isinstance(raw, dict) else None, err)
            continue
        if result.scores is not None:
            problems.append(Problem(str(path), "a pointwise judge's record (scores of each answer): mining reads a pairwise judge's verdicts "
                                               "in both orders", index, result.id))
        results[result.id] = result
    if problems:
        raise InputError(problems)
    return results


def mine(scores: Path, train_file: Path, image_root: Path, output_file: Path) -> dict[str, int]:
    """Write the hard pairs' records of train_file to output_file; the counts of what was found."""
    records = read_records(train_file)
    pairs = load_pairs(train_file, image_root, preferred=True)
    results = read_scores(scores)
    rated = merge_pair_annotators(pairs)
    if missing := [r for r in rated if r.pair.id not in results]:
        raise InputError([Problem(str(train_file), f"not among --scores {scores}'s records: score the training file itself", r.index, r.pair.id)
                          for r in missing])
    found = {r.pair.id: hardness(results[r.pair.id], r.preference) for r in rated}
    kept = [record for record, pair in zip(records, pairs) if found[pair.id].hard]
    write_json_atomically(output_file, kept)
    return {"pairs": len(found), "hard": sum(h.hard for h in found.values()), "wrong": sum(h.wrong for h in found.values()),
            "inconsistent": sum(h.inconsistent for h in found.values()), "records": len(kept)}
