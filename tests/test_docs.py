"""The README stays a front door and the docs hold together: the README within 200 lines; every relative link of
the README and of docs/ reaches a file, and a heading where it names one (as the site's build resolves them,
and as GitHub shows the files); the demo's figures on the pages are what benchmarks/docs_figures.py renders from
the record of its run, so no figure is typed by hand; the tables of formats, bundled files and flags are what
docs/tables.py renders from the code, judge-serve's endpoints table names its routes, and every flag a command line of
the docs gives is that command's. `make docs` (CI) builds the site in strict mode besides."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from mmjudge.calibration.cli import build_parser as calibrate_parser
from mmjudge.demo.cli import build_parser as demo_parser
from mmjudge.infer.cli import build_parser as score_parser
from mmjudge.judge.rubric_cli import build_parser as rubric_parser
from mmjudge.judge.testing import HANG_S
from mmjudge.serve.cli import build_parser as serve_parser
from mmjudge.train.cli import build_parser as train_parser
from mmjudge.train.cli import merge_parser, mine_parser

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)


def _load_script(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docs_figures = _load_script("docs_figures", ROOT / "benchmarks" / "docs_figures.py")
docs_tables = _load_script("docs_tables", ROOT / "docs" / "tables.py")


def prose(text: str) -> str:
    """The text outside code blocks and code spans, where a link is a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc extension makes it (the site's), which is GitHub's for the
    plain headings used here."""
    text = re.sub(r"[`*_]", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", page.read_text()), re.MULTILINE):
        base = slug(heading)
        found.add(base if base not in seen else f"{base}_{seen[base]}")
        seen[base] = seen.get(base, 0) + 1
    return found


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(root)}")
    return broken


def test_the_readme_is_a_front_door():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move the detail to a page under docs/"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_link_check_finds_a_missing_page_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## The `x` flag's rules (in short)\n")
    (tmp_path / "b.md").write_text("[ok](a.md#the-x-flags-rules-in-short) [gone](c.md) [no heading](a.md#other)\n"
                                   "`[in code](d.md)`\n```\n[in a block](e.md)\n```\n[site](https://example.org/x.md)\n")
    assert broken_links(tmp_path / "b.md", tmp_path) == ["c.md: no such file", "a.md#other: no heading #other in a.md"]



def test_the_docs_tables_are_the_codes():
    assert docs_tables.stale(ROOT) == [], "run python docs/tables.py"


def test_a_table_that_disagrees_with_the_code_is_found(tmp_path):
    for page, _ in docs_tables.TABLES.values():
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / page, tmp_path / page)
    formats = tmp_path / "docs" / "formats.md"
    row = next(line for line in formats.read_text().splitlines() if line.startswith("| `opening` |"))
    formats.write_text(formats.read_text().replace(row + "\n", ""))  # a format the code has and the page lacks
    assert docs_tables.stale(tmp_path) == ["docs/formats.md (<!-- table:formats -->)"]
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "tables.py"), "--check", "--root", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 1 and "docs/formats.md" in done.stderr
    assert subprocess.run([sys.executable, str(ROOT / "docs" / "tables.py"), "--root", str(tmp_path)]).returncode == 0
    assert docs_tables.stale(tmp_path) == [] and row in formats.read_text()


def test_every_harness_summary_the_page_quotes_is_in_a_record():
    """A `== summary:` or verdict line docs/harnesses.md quotes from a driver's output is a line of a record in
    docs/harnesses/output/, word for word (the table of runs is rendered from them: test_the_docs_tables_are_the_codes)."""
    records = "\n".join(path.read_text() for path in docs_tables.HARNESS_RECORDS.glob("*.txt")).splitlines()
    quoted = [line for line in (ROOT / "docs" / "harnesses.md").read_text().splitlines() if re.match(r"(== summary: |OK: |FAILED: )", line)]
    assert quoted and [line for line in quoted if line not in records] == []


def test_a_harness_records_verdict_is_its_drivers_last(tmp_path):
    record = tmp_path / "run.txt"
    record.write_text("# server: main abc: JUDGE_KEY=k judge-serve --model_path ckpt --served_model_name x --api_key_env JUDGE_KEY --port 5\n"
                      "== summary: 3 HTTP calls, 1 answered 200, 2 not; temperatures sent: {'mmvet': [0.0], 'pope': [0]}\n"
                      "FAILED: 2 calls not answered 200; 2 documents scored without the judge's answer: ['mmvet 0', 'pope 1']\n")
    assert docs_tables.harness_run(record) == {"record": "run.txt", "at": "main abc", "serve": "judge-serve --model_path ckpt --served_model_name x (a key)",
                                               "tasks": ["mmvet", "pope"], "calls": 3, "answered": 1,
                                               "verdict": "FAILED: 2 calls not answered 200; 2 documents scored without the judge's answer (2)"}


def command_flags() -> dict[str, set[str]]:
    """Every flag of every command (and subcommand), in each spelling it takes."""
    parsers = {"judge-score": score_parser(), "judge-train": train_parser(), "judge-train merge": merge_parser(), "judge-train mine": mine_parser(),
               "judge-calibrate": calibrate_parser(),
               "judge-serve": serve_parser(), "judge-demo": demo_parser(), "judge-rubric": rubric_parser()}
    flags = {}
    for name, parser in parsers.items():
        subparsers = [a.choices.values() for a in parser._actions if isinstance(a.choices, dict)]
        flags[name] = {flag for p in [parser, *(sub for group in subparsers for sub in group)] for flag in p._option_string_actions}
    return flags


def documented_flags(page: Path) -> list[tuple[str, str]]:
    """(command, flag) of every command line in the page's code blocks: `judge-score --max_tiles 1 ...`, a line
    continued with a backslash read as one."""
    found = []
    for block in FENCE.finditer(page.read_text()):
        for line in block.group(0).replace("\\\n", " ").splitlines():
            words = line.split("#")[0].removeprefix("$ ").split()
            command = Path(words[0]).name if words else None
            if command == "judge-train" and words[1:2] in (["merge"], ["mine"]):
                command = f"judge-train {words[1]}"
            found += [(command, word.split("=")[0]) for word in words if command and command.startswith("judge-") and word.startswith("--")]
    return found


def test_every_flag_on_a_docs_command_line_is_the_commands():
    flags = command_flags()
    unknown = [f"{page.relative_to(ROOT)}: {command} {flag}" for page in PAGES for command, flag in documented_flags(page)
               if flag not in flags.get(command, ())]
    assert unknown == []
    assert ("judge-calibrate", "--calibrator_of") in documented_flags(ROOT / "docs" / "quickstart.md")


def test_the_flag_check_finds_a_flag_no_command_has(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```bash\njudge-score --model_path m \\\n  --max_tile 1   # one tile\n.venv/bin/judge-train merge --adapter a\n```\n")
    flags = command_flags()
    assert [(c, f) for c, f in documented_flags(page) if f not in flags[c]] == [("judge-score", "--max_tile")]



def endpoints(table: str) -> set[tuple[str, str]]:
    """The `METHOD /path` a table names, a path parameter's name and type left out: /v1/models/{}."""
    return {(method, re.sub(r"\{[^}]*\}", "{}", path)) for method, path in re.findall(r"`(GET|POST) (/[^`\s]*)`", table)}


def test_the_endpoints_table_names_every_route_of_judge_serve_and_no_other():
    from types import SimpleNamespace

    from mmjudge.serve.app import build_app

    app = build_app(SimpleNamespace(metrics=None))  # the routes only: no model, nothing served
    routes = {("POST" if "POST" in route.methods else "GET", re.sub(r"\{[^}]*\}", "{}", route.path)) for route in app.app.routes}
    text = (ROOT / "docs" / "serving.md").read_text()
    start = text.index("| endpoint | what it does |")
    assert endpoints(text[start:text.index("\n\n", start)]) == routes


def test_the_pages_figures_are_their_runs_record():
    record = json.loads((ROOT / docs_figures.RECORD).read_text())
    assert not record["source"]["dirty"], "the figures were made from uncommitted code"
    assert re.fullmatch(r"[0-9a-f]{40}", record["source"]["commit"])
    assert docs_figures.stale_pages(ROOT) == []
    for image in docs_figures.IMAGES.values():
        assert (ROOT / image).stat().st_size > 0


def test_a_figure_edited_by_hand_is_found(tmp_path):
    for path in [docs_figures.RECORD, docs_figures.SEEDS, *docs_figures.PAGES.values()]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, tmp_path / path)
    demo = tmp_path / docs_figures.PAGES["demo"]
    record = json.loads((tmp_path / docs_figures.RECORD).read_text())
    after = f"{record['pearson']['after']['value']:.3f}"
    assert after in demo.read_text()
    demo.write_text(demo.read_text().replace(after, "0.999" if after != "0.999" else "0.998", 1))
    assert docs_figures.stale_pages(tmp_path) == [f"{docs_figures.PAGES['demo']} (<!-- figures:demo -->)"]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "docs_figures.py"), "--check", "--root", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "docs/demo.md" in done.stderr


def test_the_seed_table_says_how_many_seeds_learnt_and_shows_each():
    machine, source = {"cpu": "AMD EPYC", "cores": 2}, {"commit": "0123456789" * 4, "version": "0.1.0"}
    runs = [{"seed": seed, "pearson_after": after, "seconds": seconds, "load_before": 1.5, "load_after": load, "machine": machine, "source": source}
            for seed, after, seconds, load in [(0, 0.995, 301.2, 2.0), (1, 0.41, 280.7, 3.3), (2, None, 290.0, 1.0)]]
    lines = docs_figures.seed_table({"command": "judge-demo --seed N", "min_pearson": 0.95, "seeds": runs})
    assert "N = 0, 1, 2" in lines[0] and "at 0123456" in lines[0] and "load average 1.0-3.3" in lines[0]
    assert "1 of 3 seeds reach a test Pearson of 0.95 or more" in lines[0]
    assert lines[2:] == ["| seed | 0 | 1 | 2 |", "|---|---:|---:|---:|", "| Pearson | 0.995 | 0.410 | undefined |", "| seconds | 301 | 281 | 290 |"]


def test_a_page_without_its_figures_region_is_refused():
    with pytest.raises(SystemExit, match="no <!-- figures:demo -->"):
        docs_figures.rewrite("# The demo\n", "demo", "figures")


def test_the_demos_summary_is_read_as_it_prints_it_without_this_machines_paths():
    stdout = ("\n== 1a: write a tiny judge\n$ python -m mmjudge.judge.testing checkpoint out\n   ok in 5s (log: out/logs/1a.log)\n"
              "\nDone in 75s. Agreement ...:\n  before: Pearson -0.115, n = 80\n\nScore sets: ...\n\nTrained judge: /tmp/x\nReport: /tmp/x/r.html\n")
    assert docs_figures.printed_summary(stdout) == ["Done in 75s. Agreement ...:", "  before: Pearson -0.115, n = 80", "", "Score sets: ..."]


def test_the_run_is_named_by_a_commit_whose_code_it_is(tmp_path):
    """The checkout's code must be its commit's: a changed tracked file is refused by name, while the pages and
    images the script itself rewrites may differ (a changed first line of `git status` included)."""
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True, capture_output=True)
    git("init", "-q")
    for path in ["README.md", "benchmarks/docs_figures.py", "docs/demo.md"]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("v1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "v1")
    (tmp_path / "README.md").write_text("figures\n")
    (tmp_path / "docs" / "demo.md").write_text("figures\n")
    assert docs_figures.source(False, tmp_path)["dirty"] is False
    (tmp_path / "benchmarks" / "docs_figures.py").write_text("v2\n")
    with pytest.raises(SystemExit, match=r"tracked files differ from commit [0-9a-f]+: benchmarks/docs_figures.py;"):
        docs_figures.source(False, tmp_path)
    assert docs_figures.source(True, tmp_path)["dirty"] is True


@pytest.mark.slow
def test_the_figures_script_runs_the_demo_and_writes_the_pages(tmp_path):
    """The script end to end on a small demo: the record of the run, the run's scatter plots, the pages'
    regions rewritten from the record (and only those)."""
    for path in [docs_figures.SEEDS, *docs_figures.PAGES.values()]:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, tmp_path / path)
    (tmp_path / "docs" / "images").mkdir()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "docs_figures.py"), "--root", str(tmp_path), "--allow_dirty",
                           "--demo_dir", str(tmp_path / "demo"), "--", "--samples", "40", "--max_steps", "2", "--pairs", "20", "--pair_steps", "2"],
                          capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((tmp_path / docs_figures.RECORD).read_text())
    report = json.loads((tmp_path / "demo" / "report" / "report.json").read_text())
    for judge in ("before", "after"):
        assert record["pearson"][judge]["value"] == report["judges"][judge]["criteria"]["overall"]["all"]["pearson"]["value"]
        assert (tmp_path / docs_figures.IMAGES[judge]).read_bytes() == (tmp_path / "demo" / "report" / "plots" / f"{judge}_scatter.png").read_bytes()
    assert record["splits"] == {"train": 24, "validation": 8, "test": 8} and record["training_steps"] == 2
    assert record["command"] == "judge-demo --output_dir demo --samples 40 --max_steps 2 --pairs 20 --pair_steps 2"
    assert list(record["seconds"]["steps"]) == ["1a: write a tiny judge", "1b: write a dataset", "2: score before training", "3: train",
                                                "4: score after training", "5: calibrate", "6a: write pairs", "6b: judge pairs before training",
                                                "6c: train on pairs", "6d: judge pairs after training", "7a: train a reward model",
                                                "7b: judge pairs by reward", "7c: calibrate the verdicts"]
    assert record["printed"][0].startswith("Done in")
    assert docs_figures.stale_pages(tmp_path) == []
    readme = (tmp_path / "README.md").read_text()
    assert readme.replace(docs_figures.rendered_records(tmp_path)["readme"], "") == (ROOT / "README.md").read_text().replace(
        docs_figures.rendered_records(ROOT)["readme"], "")
    # the figures are the ones the demo wrote, not recomputed
    written = json.loads((tmp_path / "demo" / "figures.json").read_text())
    assert (record["pearson"], record["pairs"], record["validation_pearson_best"]) == (written["pearson"], written["pairs"], written["validation_pearson_best"])
