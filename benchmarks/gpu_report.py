"""The GPU check's figures as one short table: reads the JSON files benchmarks/gpu_check.sh wrote in a
folder (a missing one is a step that did not finish, shown as such) and writes summary.md and summary.json
beside them.

    python benchmarks/gpu_report.py OUT
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path


def _read(folder: Path, name: str) -> dict | None:
    try:
        return json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return None


def _tests(folder: Path) -> dict | None:
    try:
        suite = ElementTree.parse(folder / "gpu_tests.xml").getroot().find("testsuite")
    except (OSError, ElementTree.ParseError):
        return None
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}


def summary(folder: Path) -> dict:
    return {"limits": _read(folder, "limits.json"), "gpu_tests": _tests(folder), "score": _read(folder, "score.json"),
            "train": _read(folder, "train.json"), "train_zero2": _read(folder, "train_zero2.json"), "serve": _read(folder, "serve.json")}


def rows(figures: dict) -> list[tuple[str, str]]:
    """(what, figure) pairs; a step without figures says so."""
    missing = "did not finish (log.txt)"
    out = []
    if limits := figures["limits"]:
        out += [("device", limits["device"]), ("matrix products (bf16)", f"{limits['matmul_tflops']:.0f} TFLOP/s"),
                ("copy bandwidth", f"{limits['copy_tb_s']:.2f} TB/s")]
    else:
        out.append(("limits", missing))
    tests = figures["gpu_tests"]
    out.append(("GPU tests (pytest)", missing if tests is None else
                f"{tests['tests'] - tests['failures'] - tests['errors'] - tests['skipped']} passed, {tests['failures']} failed, "
                f"{tests['errors']} errors, {tests['skipped']} skipped"))
    if score := figures["score"]:
        against = f", {score['speedup']:.1f}x the reference loop" if score.get("speedup") else ""
        passes = f", {score['decode_steps']:,} decoding steps, {score['prefill_passes']:,} prefill passes" if "decode_steps" in score else ""
        attention = score.get("decoding_attention", "SDPA")
        exact = score.get("deterministic", False)
        mode = ", deterministic" if exact else ""
        out += [(f"generate mode ({attention} decoding{mode})", f"{score['engine_samples_per_s']:.2f} samples/s{against}, "
                                                         f"{score['mmie_hours_generate']:.2f} h for MMIE{passes}"),
                ("... against its floor", f"{score['generate_floor_ratio']:.2f}x the floor ({score['mmie_hours_generate_floor']:.2f} h for MMIE)"),
                *([("... with SDPA decoding", f"{score['engine_samples_per_s_sdpa']:.2f} samples/s")] if "engine_samples_per_s_sdpa" in score else []),
                ("logits mode", f"{score['logits_samples_per_s']:.2f} samples/s, prefill at {100 * score['prefill_utilisation']:.1f}% "
                                f"of the matrix rate, {score['mmie_hours_logits']:.2f} h for MMIE"),
                ("greedy agreement with the reference loop", score["greedy_agreement"] if against else "not run")]
        if "engine_samples_per_s_other" in score:
            out.append((f"... {'not ' if exact else ''}deterministic", f"generate {score['engine_samples_per_s_other']:.2f} samples/s, logits "
                                                                   f"{score['logits_samples_per_s_other']:.2f} samples/s; deterministic "
                                                                   f"takes {score['deterministic_cost_generate']:.2f}x the time in generate "
                                                                   f"mode, {score['deterministic_cost_logits']:.2f}x in logits mode"))
        if "invariance_samples" in score:
            out.append((f"bf16 batch invariance{mode}",
                        f"{score['generate_tokens_differ']} of {score['invariance_samples']} generated texts differ alone"
                        f"{' (%d score distributions)' % score['generate_distribution_differs'] if 'generate_distribution_differs' in score else ''}; "
                        f"logits: {score['logits_score_differs']} scores differ, largest gap {score['logits_max_distribution_gap']:.2g}"))
    else:
        out.append(("scoring benchmark", missing))
    for key, label in (("train", "LoRA step"), ("train_zero2", "LoRA step, ZeRO-2")):
        train = figures[key]
        out.append((label, missing if train is None else
                    f"{train['ms_per_step']:.0f} ms, MFU {100 * train['mfu']:.1f}%, peak {train['peak_gpu_memory_gib'] or 0:.1f} GiB"))
    if serve := figures["serve"]:
        out += [(f"judge-serve, {level['clients']} clients", f"{level['requests_per_s']:.1f} req/s, p50 {level['p50_s']:.3f} s, "
                                                            f"p99 {level['p99_s']:.3f} s, {level['failed']} failed")
                for level in serve["levels"]]
    else:
        out.append(("judge-serve load", missing))
    return out


def main() -> None:
    folder = Path(sys.argv[1])
    figures = summary(folder)
    table = "| what | figure |\n|---|---|\n" + "".join(f"| {what} | {value} |\n" for what, value in rows(figures))
    (folder / "summary.md").write_text(table)
    (folder / "summary.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
