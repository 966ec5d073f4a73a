"""The docs' tables of what the code declares, rendered from the code, never typed by hand:

    formats    docs/formats.md      every input format judge-score reads: its rubric, its scoring preset, what it writes
    bundled    docs/quickstart.md   every bundled file a flag takes by name: rubrics, scoring and training presets, DeepSpeed
    calibrate  docs/calibration.md  judge-calibrate's flags, their defaults and help, from its parser
    probes     docs/calibration.md  the bias suite's probes: what each changes, its gate, its source (judge/probes.py)
    demo       docs/demo.md         judge-demo's flags (configs/demo.yaml's settings and its defaults), from its parser
    harness-runs  docs/harnesses.md  every recorded run of a harness's own judge code against judge-serve, from its record
                                    in docs/harnesses/output/ (the server, the tasks, the calls answered, the verdict)
    families   docs/backbones.md    every family's tiny checkpoint (`python -m mmjudge.judge.testing checkpoint --family`)

    .venv/bin/python docs/tables.py            rewrite what lies between <!-- table:NAME --> and <!-- /table:NAME -->
    .venv/bin/python docs/tables.py --check    exit 1 where a page's table is not the code's (tests/test_docs.py runs it)
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

from mmjudge.calibration.cli import build_parser as calibrate_parser
from mmjudge.configs import CONFIG_DIR, bundled
from mmjudge.demo.cli import build_parser as demo_parser
from mmjudge.judge.formats import FORMATS
from mmjudge.judge.probes import PROBES
from mmjudge.judge.testing.family_table import FAMILIES

ROOT = Path(__file__).resolve().parents[1]
# What a flag takes by name, per kind of bundled file (mmjudge.configs.KINDS).
BUNDLED_FLAGS = {"rubrics": "`--rubric` (judge-score, judge-train, judge-serve)", "score": "`--config` (judge-score, judge-serve)",
                 "train": "`--config` (judge-train)", "deepspeed": "`--deepspeed` (judge-train)"}


def _names(paths) -> str:
    return ", ".join(f"`{bundled_name(path)}`" for path in paths) or "–"


def bundled_name(path: Path) -> str:
    """A bundled file's name as a flag takes it: `sa`, or `tiny` for the folder configs/rubrics/tiny/."""
    return path.stem if path.parent.parent == CONFIG_DIR else path.parent.name


def formats_table() -> list[str]:
    presets = bundled("score")
    rows = ["| `--format` | rubric (default) | scoring preset | writes, besides judge-score's own files |", "|---|---|---|---|"]
    for name, f in FORMATS.items():
        rubric = _names(f.default_rubrics) if f.default_rubrics else f"its own, by `judge-rubric import --benchmark {name}` from {f.prompt_source}"
        preset = f"`{name}` (configs/score/{name}.yaml)" if name in presets else "none: judge-score's defaults"
        writes = ", ".join(f"`{output}`" for output in f.outputs) or "nothing more"
        rows.append(f"| `{name}` | {rubric} | {preset} | {writes} |")
    return rows


def bundled_table() -> list[str]:
    rows = ["| bundled | taken by | names |", "|---|---|---|"]
    for kind, flag in BUNDLED_FLAGS.items():
        rows.append(f"| configs/{kind}/ | {flag} | {', '.join(f'`{name}`' for name in bundled(kind))} |")
    return rows


def flags_table(parser: argparse.ArgumentParser) -> list[str]:
    """A command's flags as its --help gives them, default included: the snake_case spelling (each also takes its
    kebab-case one) and the help; --help and --version aside."""
    rows = ["| flag | what it sets |", "|---|---|"]
    for action in parser._actions:
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        text = ((action.help or "") % {"default": action.default}).replace("|", "\\|")  # a table cell's end, kept as text
        rows.append(f"| `{action.option_strings[0]}` | {'(required) ' if action.required else ''}{text} |")
    return rows


GATES = {"moves": "the score changes on at least `--probe_threshold` of the samples", "drops": "the mean shift's 95% interval lies below 0",
         "holds": "the mean shift is at most `--probe_max_shift` levels (verbosity: upwards; paraphrase: either way)"}


def probes_table() -> list[str]:
    rows = ["| `--probe` | what the copy changes | passes where | source, and how ours differs |", "|---|---|---|---|"]
    rows += [f"| `{kind}` | {p.changes} | {GATES[p.expects]} | {p.source} |" for kind, p in PROBES.items()]
    return rows


HARNESS_RECORDS = ROOT / "docs" / "harnesses" / "output"
SUMMARY = re.compile(r"^== summary: (\d+) HTTP calls, (\d+) answered 200, (\d+) not; temperatures sent: (\{.*\})$", re.MULTILINE)


def harness_run(path: Path) -> dict:
    """One record's server, tasks, calls and verdict, as its driver printed them (docs/harnesses/*.py)."""
    text = path.read_text()
    server = re.search(r"^# server: (.*?): (?:\w+=\S+ )*(judge-serve .*)$", text, re.MULTILINE)
    summary = SUMMARY.search(text)
    verdict = re.findall(r"^(?:OK|FAILED): .*$", text, re.MULTILINE)
    if summary is None:  # the driver died before its summary: its last error and exit code
        lines = [line for line in text.splitlines() if line.strip()]
        verdict = [f"died: {lines[-2].strip()} ({lines[-1].strip()})"]
    verdict[-1] = re.sub(r": \[('[^']*'(?:, )?|\d+(?:, )?)+\]$", lambda m: f" ({m[0].count(',') + 1})", verdict[-1])
    return {"record": path.name, "at": server[1], "serve": re.sub(r" --port \d+", "", server[2]).replace("--api_key_env JUDGE_KEY", "(a key)"),
            "tasks": list(ast.literal_eval(summary[4])) if summary else [], "calls": int(summary[1]) if summary else None,
            "answered": int(summary[2]) if summary else None, "verdict": verdict[-1]}


def harness_runs_table() -> list[str]:
    rows = ["| record (docs/harnesses/output/) | judge-serve at | started as | tasks | calls answered 200 | the driver's verdict |",
            "|---|---|---|---|---|---|"]
    for path in sorted(HARNESS_RECORDS.glob("*.txt")):
        run = harness_run(path)
        calls = "none recorded" if run["calls"] is None else f"{run['answered']} of {run['calls']}"
        cells = [f"`{run['record']}`", run["at"], f"`{run['serve']}`", ", ".join(run["tasks"]) or "-", calls, run["verdict"]]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return rows


def families_table() -> list[str]:
    rows = ["| `--family` | layout | language model (`model_type`) | tokenizer | tied embeddings |", "|---|---|---|---|---|"]
    for name, f in FAMILIES.items():
        rows.append(f"| `{name}` | {f.layout} | `{f.llm}` | {f.tokenizer} | {'yes' if f.tied else 'no'} |")
    return rows


TABLES = {"formats": (Path("docs/formats.md"), formats_table), "bundled": (Path("docs/quickstart.md"), bundled_table),
          "calibrate": (Path("docs/calibration.md"), lambda: flags_table(calibrate_parser())),
          "probes": (Path("docs/calibration.md"), probes_table),
          "demo": (Path("docs/demo.md"), lambda: flags_table(demo_parser())),
          "harness-runs": (Path("docs/harnesses.md"), harness_runs_table),
          "families": (Path("docs/backbones.md"), families_table)}


def region(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- table:{name} -->\n)(.*?)(<!-- /table:{name} -->)", re.DOTALL)


def rendered(root: Path, name: str) -> tuple[str, str]:
    """The page's text as it is and with the table rendered from the code."""
    page, render = TABLES[name]
    text = (root / page).read_text()
    if not region(name).search(text):
        raise SystemExit(f"error: {page} has no <!-- table:{name} --> ... <!-- /table:{name} --> region")
    return text, region(name).sub(lambda m: m[1] + "\n".join(render()) + "\n" + m[3], text)


def stale(root: Path = ROOT) -> list[str]:
    """The tables whose page says other than the code."""
    return [f"{TABLES[name][0]} (<!-- table:{name} -->)" for name in TABLES if len(set(rendered(root, name))) > 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 where a table is not the code's")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose pages to read (default: this one)")
    args = parser.parse_args(argv)
    if args.check:
        found = stale(args.root)
        for table in found:
            print(f"stale: {table}; run python docs/tables.py", file=sys.stderr)
        return 1 if found else 0
    for name, (page, _) in TABLES.items():
        (args.root / page).write_text(rendered(args.root, name)[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
