"""The report a maintainer reads: a summary first, the plots next with captions that say how they are drawn,
report.md readable as plain text, and report.html as Chromium shows it at 1400 and 800 px."""

import html
import json
import os
import re
import struct

import numpy as np
import pytest
from markdown_it import MarkdownIt

from mmjudge.calibration.cli import main
from mmjudge.calibration.report import WIDTH, Section, markdown
from mmjudge.judge.testing import browser

MODELS, CATEGORIES = ("model-a", "model-b", "model-c"), ("SA", "PBL", "MSR")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    """The demo's two judges, as judge-score writes them: an untrained one whose output never parses and
    whose expected score barely moves (3.265-3.353, a collapse), and a trained one close to people. Half of
    the ids have two annotators, so the human means lie on halves; a third of the ids only the judges scored."""
    tmp = tmp_path_factory.mktemp("report")
    rng = np.random.default_rng(0)
    human, before, after = [], [], []
    for i in range(120):
        rid, model, category = f"{CATEGORIES[i % 3]}_{i:04d}", MODELS[i % 3], CATEGORIES[i % 3]
        truth = int(rng.integers(0, 7))
        common = {"id": rid, "model": model, "category": category, "criteria": {}}
        before.append({**common, "score": None, "expected_score": float(rng.uniform(3.265, 3.353)), "parse_error": "no '### Score' heading"})
        written = int(np.clip(truth + rng.choice([-1, 0, 0, 0, 1]), 0, 6))
        after.append({**common, "score": written, "expected_score": float(np.clip(written + rng.normal(0, 0.2), 0, 6)), "parse_error": None})
        if i % 3 == 2:
            continue  # scored by the judges only
        human.append({"id": rid, "model": model, "overall": truth, "annotator": "x"})
        if i % 2:
            human.append({"id": rid, "model": model, "overall": int(np.clip(truth + 1, 0, 6)), "annotator": "y"})
    files = {}
    for name, records in (("before", before), ("after", after), ("human", human)):
        files[name] = tmp / f"{name}.json"
        files[name].write_text(json.dumps(records))
    out = tmp / "report"
    assert main(["--predictions", str(files["before"]), str(files["after"]), "--human", str(files["human"]), "--overall", "expected_score",
                 "--bootstrap", "200", "--output_dir", str(out)]) == 0
    return out


def tables(md: str) -> list[list[str]]:
    """The markdown's tables, each as its lines."""
    found, current = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    return found


def cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]


def test_the_summary_comes_first_with_each_judges_figures_and_the_ppi_estimates(report_dir):
    md = (report_dir / "report.md").read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[:3] == ["## Summary", "## Plots", "## Inputs and method"]
    summary = md[md.index("## Summary"):md.index("## Plots")]
    judges, ppi = tables(summary)
    assert cells(judges[0]) == ["judge", "n", "Pearson r [95% Fisher z]", "MSE", "quadratic weighted κ", "collapse", "parse failures"]
    report = json.loads((report_dir / "report.json").read_text())
    for line in judges[2:]:
        name, n, pearson, mse, kappa, collapse, failures = cells(line)
        overall = report["judges"][name]["criteria"]["overall"]["all"]
        r = overall["pearson"]
        assert n == "80" and pearson == f"{r['value']:.3f} [{r['fisher_95']['low']:.2f}, {r['fisher_95']['high']:.2f}]"
        assert mse == f"{overall['mse']['value']:.3f}" and kappa == f"{overall['quadratic_kappa']['value']:.3f}"
        assert collapse == (report["judges"][name]["criteria"]["overall"]["collapse"] or "no")
    assert [cells(line)[0] for line in judges[2:]] == ["before", "after"] and "score collapse" in cells(judges[2])[5]
    assert cells(judges[2])[6] == "120"  # every output of the untrained judge failed to parse
    assert cells(ppi[0]) == ["model", "before: PPI++ [95%]", "after: PPI++ [95%]"]
    estimate = report["judges"]["after"]["benchmark"]["models"]["model-b"]["ppi"]
    assert cells(ppi[3]) [0] == "model-b" and cells(ppi[3])[2] == f"{estimate['value']:.2f} [{estimate['low']:.2f}, {estimate['high']:.2f}]"


def test_report_md_reads_as_plain_text_and_renders_as_markdown(report_dir):
    md = (report_dir / "report.md").read_text()
    for table in tables(md):
        assert len({len(line) for line in table}) == 1  # padded: the columns line up
        assert len({tuple(m.start() for m in re.finditer(r"(?<!\\)\|", line)) for line in table}) == 1
    prose = [line for line in md.splitlines() if not line.startswith(("|", "!["))]
    assert all(len(line) <= WIDTH or " " not in line for line in prose)
    assert "Pearson r [95% Fisher z]" in md and "\\[" not in md  # nothing escaped that markdown would show as it is
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert html.count("<table>") == len(tables(md))
    pngs = sorted(p.name for p in (report_dir / "plots").glob("*.png"))
    assert sorted(re.findall(r'<img src="plots/([^"]+)"', html)) == pngs


def test_the_bias_diagnostics_say_which_side_of_a_correlation_is_constant(tmp_path):
    """A judge one point above people on every id: its residual is constant, people's scores are not."""
    human = [{"id": f"s{i}", "model": "m", "overall": i % 6, "annotator": "x"} for i in range(12)]
    judge = [{"id": f"s{i}", "model": "m", "category": "c", "criteria": {}, "score": i % 6 + 1, "parse_error": None, "n_images": i % 3}
             for i in range(12)]
    for name, records in (("judge", judge), ("human", human)):
        (tmp_path / f"{name}.json").write_text(json.dumps(records))
    assert main(["--predictions", str(tmp_path / "judge.json"), "--human", str(tmp_path / "human.json"), "--output_dir", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    (table,) = tables(md[md.index("## Bias diagnostics"):])
    row = dict(zip(cells(table[0]), cells(table[2])))
    assert row["mean residual"] == "1.000" and row["vs images"] == "undefined (the residuals (judge - human) are constant)"


# Lines that markdown reads as text, which a wrapped paragraph keeps as they are, and lines it would read as a
# heading, a list, a quote or a rule, which it escapes.
AS_TEXT = ["0.751 of the pairs", "-0.12 below", "+0.5 above", "#hashtag", "1.5 levels", "2)x"]
AS_BLOCK = ["1. the first", "12) the twelfth", "# a heading", "- a list", "+ a list", "> a quote", "---", "==", "-"]


@pytest.mark.parametrize("start", AS_TEXT + AS_BLOCK)
def test_a_wrapped_line_renders_as_the_text_it_wraps(start):
    first = "x" * (WIDTH - 1)
    md = markdown([Section("S", 2, [f"{first} {start}"])])  # wrapped after the x's: the second line is `start`
    assert (md.splitlines()[3] == start) == (start in AS_TEXT)
    assert MarkdownIt("commonmark").render(md) == f"<h2>S</h2>\n<p>{first}\n{html.escape(start)}</p>\n"


def test_the_scatter_captions_say_what_is_jittered_and_why_a_line_is_missing(report_dir):
    md = " ".join((report_dir / "report.md").read_text().split())
    before = md[md.index("![before_scatter.png]"):md.index("![before_confusion.png]")]
    assert "jittered so that equal ones do not hide each other (human axis by up to ±0.09)" in before  # means of two: halves
    assert "Judge values are continuous and drawn where they are, unjittered" in before
    assert "No fitted line through a collapsed judge (score collapse:" in before
    after = md[md.index("![after_scatter.png]"):md.index("![after_confusion.png]")]
    assert "Red: the least-squares line" in after and "unjittered" in after


def require_browser():
    """Chromium's absence skips the browser tests on a developer's machine, and fails them in CI, which installs it."""
    if reason := browser.missing():
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: .ci/run installs them for this test")
        pytest.skip(reason)


def png_size(path) -> tuple[int, int]:
    return struct.unpack(">II", path.read_bytes()[16:24])


@pytest.mark.slow
@pytest.mark.parametrize("width", [1400, 800])
def test_report_html_in_chromium(report_dir, tmp_path, width):
    require_browser()
    with browser.Browser() as chromium:
        page = chromium.open(report_dir / "report.html", width)
        chromium.screenshot(tmp_path / "report.png", height=1200)
    assert page.errors == []
    assert page.scroll_width <= width  # a wide table scrolls in its box, the page never sideways
    assert len(page.images) == len(list((report_dir / "plots").glob("*.png"))) and all(i.loaded for i in page.images)
    for image in page.images:  # drawn at their own aspect ratio, never enlarged
        (nw, nh), (w, h) = image.natural, image.shown
        assert w <= nw + 0.5 and abs(w / h - nw / nh) < 0.01 * nw / nh, image
    assert min(page.top, key=page.top.get) == "Summary" and page.top["Summary"] < 200
    assert page.top["Plots"] < page.top["Inputs and method"] < page.top["Agreement with people, per criterion"]
    assert png_size(tmp_path / "report.png") == (width, 1200)


@pytest.mark.slow
def test_the_browser_check_sees_a_missing_image_and_a_console_error(tmp_path):
    require_browser()
    (tmp_path / "broken.html").write_text("<!doctype html><img alt='gone' src='missing.png'><script>console.error('broken')</script>")
    with browser.Browser() as chromium:
        page = chromium.open(tmp_path / "broken.html", 800)
    assert [i.loaded for i in page.images] == [False]
    assert any("broken" in e for e in page.errors) and any("missing.png" in e for e in page.errors)
