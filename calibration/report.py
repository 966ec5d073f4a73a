"""report.json (everything, machine-readable), report.md (tables a paper or README can take, readable as
plain text), report.html (the same tables and every plot, self-contained), and the PNGs under plots/.

Both read top down: a summary (per judge: n, Pearson with its interval, MSE, κ, collapse, and the PPI++
estimates per evaluated model), the plots with captions that say how they are drawn, then every table.
The markdown and the HTML are two renderings of one list of sections, so they cannot drift apart.
"""

from __future__ import annotations

import base64
import html
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from mmjudge.calibration import plots
from mmjudge.calibration.analysis import Ceiling, Paired, Report
from mmjudge.calibration.benchmark import Estimate
from mmjudge.calibration.preferences import PreferenceReport
from mmjudge.calibration.stats import Agreement, Stat
from mmjudge.judge.data import VERDICTS, write_json_atomically, write_text_atomically

# Rows of the side-by-side table: MMIE's four (Pearson, cosine, MSE, MAE) and the rest.
ROWS = [("n", "n"), ("pearson", "Pearson r [95% Fisher z]"), ("pearson_bootstrap", "Pearson r 95% bootstrap"),
        ("spearman", "Spearman ρ"), ("kendall_tau_b", "Kendall τ-b"), ("mse", "MSE"), ("rmse", "RMSE"), ("mae", "MAE"),
        ("cosine", "cosine similarity*"), ("exact_agreement", "exact agreement"), ("within_1_agreement", "within-1 agreement"),
        ("quadratic_kappa", "quadratic weighted κ"), ("krippendorff_interval", "Krippendorff α, interval"),
        ("krippendorff_ordinal", "Krippendorff α, ordinal")]
COSINE_NOTE = ("* Cosine similarity is reported because MMIE reports it. It is not a correlation: positive scores point "
               "roughly the same way whatever their agreement (random scores on 0-6 give about 0.7), and a judge off by a "
               "constant point everywhere still scores about 0.99. Read Pearson, Kendall and the errors first.")


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass
class Image:
    file: str  # under plots/
    plot: plots.Plot
    judge: str | None = None  # the judge it shows; None: all of them


@dataclass
class Section:
    title: str
    level: int
    blocks: list[str | Table | Image]  # paragraphs, tables and plots, in order


def fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def cell(stat: Stat | None) -> str:
    if stat is None:
        return "–"
    if stat.value is None:
        return f"undefined ({stat.reason})"
    text = fmt(stat.value)
    if stat.fisher_95 is not None and stat.fisher_95.low is not None:
        text += f" [{stat.fisher_95.low:.2f}, {stat.fisher_95.high:.2f}]"
    return text


def _row(table: Agreement | None, key: str) -> str:
    if table is None:
        return "–"
    if key == "pearson_bootstrap":
        ci = table["pearson"].bootstrap_95
        if ci is None:
            return "not computed" if table["pearson"].value is not None else "–"
        return f"[{ci.low:.2f}, {ci.high:.2f}]" if ci.low is not None else f"undefined ({ci.reason})"
    if key == "n":
        return f"{table['n'].value:.0f}"
    return cell(table[key])


def _ceiling_columns(report: Report, criterion: str) -> dict[str, Ceiling]:
    """Column header -> ceiling: one column when every judge was compared on the same ids, else one per judge."""
    ceilings = {j: r.criteria[criterion].ceiling for j, r in report.judges.items()}
    first = next(iter(ceilings.values()))
    if all(c == first for c in ceilings.values()):
        return {"human ceiling": first}
    return {f"human ceiling, ids of {j}": c for j, c in ceilings.items()}


def _ceiling_note(header: str, c: Ceiling) -> str:
    if c.ids == 0:
        return f"{header}: no id compared with the judge has two annotators on this criterion, so there is none."
    return (f"{header}: {c.ids} ids with two or more annotators (up to {c.most_annotators}), one drawn annotator each against the mean "
            f"of the others. Krippendorff's α among all their annotators: interval {cell(c.alpha_interval_all_annotators)}, "
            f"ordinal {cell(c.alpha_ordinal_all_annotators)}.")


def agreement_sections(report: Report) -> list[Section]:
    judges = list(report.judges)
    sections = [Section("Agreement with people, per criterion", 2, [
        f"Judges side by side, then the human-human ceiling: {report.ceiling_method}."])]
    for criterion in report.criteria:
        ceilings = _ceiling_columns(report, criterion)
        rows = [[label] + [_row(report.judges[j].criteria[criterion].all, key) for j in judges] + [_row(c.agreement, key) for c in ceilings.values()]
                for key, label in ROWS]
        blocks: list[str | Table] = [Table(["statistic", *judges, *ceilings], rows)]
        blocks += [_ceiling_note(header, c) for header, c in ceilings.items()]
        blocks += [f"Warning, {j}: {report.judges[j].criteria[criterion].collapse}" for j in judges if report.judges[j].criteria[criterion].collapse]
        sections.append(Section(criterion, 3, blocks))
        if report.group_by != "none":
            groups = sorted({g for j in judges for g in report.judges[j].criteria[criterion].groups})
            header = [report.group_by] + [f"{j}: {what}" for j in judges for what in ("n", "Pearson r [95%]", "MAE")]
            rows = []
            for g in groups:
                row = [g]
                for j in judges:
                    table = report.judges[j].criteria[criterion].groups.get(g)
                    row += [_row(table, "n"), _row(table, "pearson"), _row(table, "mae")]
                rows.append(row)
            sections.append(Section(f"{criterion} by {report.group_by}", 4, [Table(header, rows)]))
    return sections


def system_section(report: Report) -> Section:
    judges = list(report.judges)
    header = ["criterion"] + [f"{j}: {what}" for j in judges for what in ("models", "Pearson r", "Kendall τ-b")]
    rows = []
    for criterion in report.criteria:
        row = [criterion]
        for j in judges:
            s = report.judges[j].criteria[criterion].system_level
            row += [str(len(s.models)), cell(s.pearson), cell(s.kendall_tau_b)]
        rows.append(row)
    blocks: list[str | Table] = [
        ("Each evaluated model's mean judge score against its mean human score, as a leaderboard ranks models "
         "(needs at least 3 models)."), Table(header, rows)]
    if "overall" in report.criteria:
        models = sorted({m for j in judges for m in report.judges[j].criteria["overall"].system_level.models})
        means = []
        for m in models:
            row = [m]
            for j in judges:
                mean = report.judges[j].criteria["overall"].system_level.models.get(m)
                row += [fmt(mean.judge_mean, 2), fmt(mean.human_mean, 2)] if mean else ["–", "–"]
            means.append(row)
        if models:
            blocks += ["Overall means per evaluated model:", Table(["model"] + [f"{j}: {w}" for j in judges for w in ("judge", "human")], means)]
    return Section("System level", 2, blocks)


def calibrator_note(report: Report) -> str:
    """Which file judge-score --calibrator would apply, so that a reader never takes an earlier run's for this one's."""
    removed = f" An earlier run's {', '.join(report.removed_calibrators)} in this directory was removed." if report.removed_calibrators else ""
    if report.calibrator_of is None:
        why = "--fit none" if report.fit == "none" else "its judge has fewer than two human-scored ids with an overall score"
        return f"No calibrator.json was written ({why}).{removed}"
    each = [f"calibrator_{slug(j)}.json" for j, r in report.judges.items() if r.calibration and r.calibration.calibrator]
    several = f" ({', '.join(each)}: each judge's)" if len(report.judges) > 1 and each else ""
    return (f"calibrator.json ({report.calibrator_of}'s map, fitted on all pairs, with its score sets and escalation threshold where "
            f"fitted) is what judge-score --calibrator applies{several}.{removed}")


def summary_criterion(report: Report) -> str:
    return "overall" if "overall" in report.criteria else report.criteria[0]


def summary_section(report: Report) -> Section:
    """What a maintainer reads first: each judge's agreement on one line, and the benchmark scores it gives."""
    criterion = summary_criterion(report)
    rows = []
    for name, j in report.judges.items():
        result = j.criteria[criterion]
        rows.append([name, _row(result.all, "n"), _row(result.all, "pearson"), _row(result.all, "mse"), _row(result.all, "quadratic_kappa"),
                     result.collapse or "no", str(j.coverage.parse_failures)])
    value = "expected score" if report.overall == "expected_score" and criterion == "overall" else "score"
    blocks: list[str | Table | Image] = [
        f"Each judge's {criterion} {value} against the human score ({report.reference}); the tables below give the rest.",
        Table(["judge", "n", "Pearson r [95% Fisher z]", "MSE", "quadratic weighted κ", "collapse", "parse failures"], rows)]
    models = list(dict.fromkeys(m for j in report.judges.values() if j.benchmark for m in j.benchmark.models))
    if models:
        judges = [name for name, j in report.judges.items() if j.benchmark and j.benchmark.models]
        rows = [[m] + [_estimate(report.judges[j].benchmark.models[m].ppi) if m in report.judges[j].benchmark.models else "–" for j in judges]
                for m in models]
        blocks += ["Benchmark score per evaluated model by PPI++ (mean overall human score, 95% interval; see below for the judge-only "
                   "and human-only means):", Table(["model", *(f"{j}: PPI++ [95%]" for j in judges)], rows)]
    blocks.append(calibrator_note(report))
    return Section("Summary", 2, blocks)


def calibration_section(report: Report) -> Section:
    rows = []
    for name, j in report.judges.items():
        c = j.calibration
        if c is None:
            rows.append([name, "not fitted", "–", "–", "–", "–", "–"])
            continue
        rows.append([name, c.method, c.source, f"{c.folds}", f"{c.n}", f"{cell(c.mse_before)} → {cell(c.mse_after)}", f"{cell(c.mae_before)} → {cell(c.mae_after)}"])
    return Section("Calibration of the overall score", 2, [
        ("A monotone map from the judge's score to the human scale, cross-fitted: the errors after calibration are "
         "measured on folds the map was not fitted on."), calibrator_note(report),
        Table(["judge", "map", "from", "folds", "n", "MSE before → after", "MAE before → after"], rows)])


def _estimate(e: Estimate) -> str:
    return f"undefined ({e.reason})" if e.value is None else f"{e.value:.2f} [{e.low:.2f}, {e.high:.2f}]"


def benchmark_section(report: Report) -> Section:
    blocks: list[str | Table] = [
        ("Each evaluated model's mean human overall score, estimated three ways with 95% intervals. PPI++ combines the ids people "
         "scored with every id only the judge scored (prediction-powered inference, power-tuned): valid whatever the judge's errors, "
         "if the human-scored ids are a random draw of each model's ids, and narrower than the human-only mean when the judge "
         "tracks people. The judge-only mean is narrow and off by the judge's bias; the human-only mean is valid and wide. "
         "λ: how far PPI++ leans on the judge (0: the human-only mean). Effective human labels: how many human scores alone "
         "would give an interval as narrow as PPI++'s.")]
    for name, j in report.judges.items():
        b = j.benchmark
        if b is None or not b.models:  # no overall score from this judge
            continue
        rows = [[m, str(s.human_scored), str(s.judge_only_ids), _estimate(s.ppi), fmt(s.lam, 2), _estimate(s.judge_only), _estimate(s.human_only),
                 fmt(s.effective_labels, 0)] for m, s in b.models.items()]
        blocks += [Table([f"{name}: model", "human-scored", "judge only", "PPI++ [95%]", "λ", "judge only [95%]", "human only [95%]",
                          "effective human labels"], rows)]
        r = b.ranking
        if r.holds is None:
            blocks.append(f"{name}: ranking by PPI++: {' > '.join(r.order) or 'none'} ({r.reason}).")
        else:
            pairs = ", ".join(f"{a} > {c} {share:.0%}" for a, c, share in zip(r.order, r.order[1:], r.above_next))
            blocks.append(f"{name}: ranking by PPI++: {' > '.join(r.order)}. The whole order holds in {r.holds:.0%} of {r.resamples} "
                          f"bootstrap resamples (seed {report.seed}); each model above the next: {pairs}.")
    return Section("Benchmark scores per evaluated model", 2, blocks)


def guarantees_section(report: Report) -> Section:
    sets, escalation = [], []
    for name, j in report.judges.items():
        c = j.calibration
        if c is None or c.score_sets is None:
            continue
        ss, e = c.score_sets, c.escalation
        held = ss.held_out
        sets.append([name, str(ss.n), f"{ss.coverage:.0%}", fmt(ss.threshold), f"{held.coverage:.1%}" if held else f"– ({ss.reason})",
                     f"{held.mean_size:.2f}" if held else "–"])
        if e.fit is None:
            escalation.append([name, e.agreement, f"{e.target_agreement:.0%}", f"– ({e.reason})", "–", "–", "–", "–"])
            continue
        f = e.fit
        escalation.append([name, e.agreement, f"{e.target_agreement:.0%}", fmt(f.threshold) if f.threshold is not None else "none met the target",
                           f"{f.trusted} of {f.n}", fmt(f.trusted_agreement), fmt(f.agreement_lower_bound),
                           f"{e.escalated} of {e.judged}" if e.judged else "–"])
    if not sets:
        return Section("Score sets and escalation", 2, ["Not fitted: no calibration map (--fit none, or too few pairs)."])
    error_rate = next(j.calibration.escalation.error_rate for j in report.judges.values() if j.calibration and j.calibration.escalation)
    return Section("Score sets and escalation", 2, [
        ("Conformal score sets, from the judge's score distribution: judge-score --calibrator writes each record's score_set, "
         "an interval of levels that holds the human score (the mean of annotators, at its nearest level) with at least the "
         "coverage asked, for records like these. Held-out: fitted on the other folds, measured on each."),
        Table(["judge", "records with a distribution", "coverage asked", "threshold", "held-out coverage", "held-out mean set size (levels)"], sets),
        (f"Escalation (trust or escalate): records whose judge is at least this sure of its written score (its probability of "
         f"the agreeing levels) are left to the judge; with probability {1 - error_rate:.0%} over these human labels, the judge "
         f"agrees with people on them at least at the target rate. judge-score --calibrator marks the rest escalate: true. "
         f"Lower bound: the one-sided Clopper-Pearson bound of the agreement on the trusted labelled records. "
         f"Escalated: of this predictions file's records with a distribution."),
        Table(["judge", "agreement", "target", "confidence threshold", "trusted labelled records", "their agreement",
               f"lower bound ({1 - error_rate:.0%})", "escalated"], escalation)])


def bias_section(report: Report) -> Section:
    rows = []
    for name, j in report.judges.items():
        for criterion, result in j.criteria.items():
            b = result.bias
            by_category = ", ".join(f"{c} {g.mean_residual:+.2f} (n={g.n})" for c, g in b.residual_by_category.items())
            rows.append([name, criterion, cell(b.mean_residual), cell(b.residual_vs_answer_chars.spearman), cell(b.residual_vs_n_images.spearman),
                         cell(b.residual_vs_category), by_category])
    return Section("Bias diagnostics", 2, [
        ("Residual = judge − human. A correlation away from 0 means the judge's error follows that property of the "
         "answer (Spearman ρ for answer length in characters and number of images; η, the correlation ratio, for category)."),
        Table(["judge", "criterion", "mean residual", "vs answer length", "vs images", "vs category (η)", "mean residual by category"], rows)])


def _share(value) -> str:
    return f"{value.value:+.3f} [{value.low:+.3f}, {value.high:+.3f}]"


def family_paragraph(report: Report) -> list[str]:
    family = report.family_preference
    if family is None:
        return []
    if family.difference is None:
        return [f"Self- and family-preference ({family.family}): {family.reason}."]
    d = family.difference
    return [f"Self- and family-preference ({family.family}; models {', '.join(family.models)}): the judge's residual (judge − people) is "
            f"{family.residual_family:+.3f} on its family's answers (n {family.n_family}) and {family.residual_other:+.3f} on the others' "
            f"(n {family.n_other}): a difference of {_share(d)}; it {family.gate}: {'PASS' if family.passed else 'FAIL'}."]


def probe_section(report: Report, figures: list[Image]) -> list[Section]:
    if not report.probes:
        return [Section(f"Bias probes ({report.probes_of or next(iter(report.judges))})", 2, family_paragraph(report))] if report.family_preference else []
    rows = [[kind, e.changes, str(e.n), _share(e.mean_shift), f"{e.share_changed.value:.3f} [{e.share_changed.low:.3f}, {e.share_changed.high:.3f}]",
             e.gate, "–" if e.passed is None else "PASS" if e.passed else "FAIL"] for kind, e in report.probes.items()]
    sources = [f"{kind}: {e.source}." for kind, e in report.probes.items()]
    return [Section(f"Bias probes ({report.probes_of})", 2, [
        "Each probe scored perturbed copies of the samples (judge-score --probe); the effect compares each copy's overall value with the "
        "sample's own: mean shift (copy − original, score levels) and the share of samples whose score changed level, each with a 95% "
        "percentile bootstrap interval over samples. The gate says what a judge that reads the images and judges content, not form, does.",
        Table(["probe", "what changes", "samples", "mean shift [95%]", "share changed [95%]", "gate", "result"], rows),
        "Sources, and how ours differ: " + " ".join(sources), *family_paragraph(report), *[f for f in figures if f.file.startswith("probe_")]])]


def sections(report: Report, figures: list[Image] | None = None) -> list[Section]:
    scale = report.score_scale
    intervals = (f"Intervals are 95%: Fisher z, and a percentile bootstrap of {report.bootstrap} resamples (seed {report.seed}) where shown."
                 if report.bootstrap else "Intervals are 95%, Fisher z (no bootstrap: --bootstrap 0).")
    intro = [(f"Human scores: {report.human_file}, {report.human_ids} ids, scale {scale}; the human value of an id is {report.reference}. "
             f"Exact and within-1 agreement (within one step of {scale.step:g}), κ, histograms and confusion counts take each score "
             f"at its nearest of the scale's {scale.n_levels} levels. {intervals}")]
    if report.overall == "expected_score":
        intro.append("The judge's overall value is its expected score (the probability-weighted mean of its score distribution), "
                     "not the score it wrote.")
    intro += [f"Note: {n}" for n in report.notes]
    figures = figures or []
    return [Section("Judge agreement with human scores", 1, []), summary_section(report), *plot_sections(report, figures),
            Section("Inputs and method", 2, intro), *agreement_sections(report), system_section(report), calibration_section(report), guarantees_section(report),
            benchmark_section(report), bias_section(report), *probe_section(report, figures), Section("Notes", 2, [COSINE_NOTE])]


def plot_sections(report: Report, figures: list[Image]) -> list[Section]:
    """The plots, right after the summary: the per-group comparison, then each judge's."""
    figures = [f for f in figures if not f.file.startswith("probe_")]  # in the probes' own section
    if not figures:
        return []
    per_judge = [Section(name, 3, blocks) for name in report.judges if (blocks := [f for f in figures if f.judge == name])]
    return [Section("Plots", 2, [f for f in figures if f.judge is None]), *per_judge]


# What could format a judge's name, an id or a path (the user's text) in markdown, each made literal.
# Plain text stays plain: "[95% Fisher z]", "a < b", "PBL_999" and "A & B" mean nothing to markdown and are left as they are.
MARKDOWN_LITERAL = [
    (re.compile(r"([\\`*|~])"), r"\\\1"),  # emphasis, code, a table cell's end, strikethrough
    (re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])"), r"\\_"),  # emphasis; "PBL_999" (inside a word) is none
    (re.compile(r"\](?=[(\[:])"), r"\\]"),  # a link, an image, a reference
    (re.compile(r"&(?=#?[0-9A-Za-z]+;)"), "&amp;"),  # an entity (first: the next line writes one)
    (re.compile(r"<(?=[A-Za-z/!?])"), "&lt;"),  # a tag, an autolink
]
# What would start a heading, a quote, a list or a rule at a wrapped line's start, as CommonMark reads it: "#",
# "-", "+" and "1." only before a space ("-0.12" and "0.751" are text). A backslash escapes punctuation only,
# so a numbered list's "." or ")" is escaped, not its digits (a "\0.751" would show its backslash).
BLOCK_START = re.compile(r"#{1,6}(?=\s|$)|[-+](?=\s|$)|>|[=-]+\s*$")
LIST_NUMBER = re.compile(r"(\d{1,9})([.)])(?=\s|$)")
WIDTH = 100  # of the markdown's paragraphs, so that it reads as plain text


def _md_text(text: str) -> str:
    for pattern, literal in MARKDOWN_LITERAL:
        text = pattern.sub(literal, text)
    return text


def _md_paragraph(text: str) -> list[str]:
    lines = textwrap.wrap(_md_text(text), WIDTH, break_long_words=False, break_on_hyphens=False)
    return [_md_line_start(line) if k else line for k, line in enumerate(lines)]


def _md_line_start(line: str) -> str:
    if number := LIST_NUMBER.match(line):
        return f"{number[1]}\\{number[2]}{line[number.end():]}"
    return "\\" + line if BLOCK_START.match(line) else line


def _md_table(table: Table) -> list[str]:
    """Columns padded to one width, so that the table lines up as plain text too; the first column left,
    the numbers right."""
    cells = [[_md_text(c) for c in row] for row in [table.header, *table.rows]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(table.header))]
    line = lambda row: "| " + " | ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in enumerate(zip(row, widths))) + " |"  # noqa: E731
    rule = "|" + "|".join(":" + "-" * (w + 1) if k == 0 else "-" * (w + 1) + ":" for k, w in enumerate(widths)) + "|"
    return [line(cells[0]), rule, *map(line, cells[1:])]


def markdown(secs: list[Section]) -> str:
    lines = []
    for s in secs:
        lines += ["#" * s.level + " " + _md_text(s.title), ""]
        for block in s.blocks:
            if isinstance(block, Table):
                lines += _md_table(block)
            elif isinstance(block, Image):
                lines += [f"![{_md_text(block.file)}](plots/{block.file})", *_md_paragraph(block.plot.caption)]
            else:
                lines += _md_paragraph(block)
            lines.append("")
    return "\n".join(lines)


def _html_blocks(secs: list[Section]) -> str:
    out = []
    for s in secs:
        out.append(f"<h{s.level}>{html.escape(s.title)}</h{s.level}>")
        figures = []
        for block in [*s.blocks, None]:
            if isinstance(block, Image):  # consecutive plots share a row where they fit
                png = base64.b64encode(block.plot.png).decode()
                width = int.from_bytes(block.plot.png[16:20], "big")  # from the PNG's header: the caption wraps within the picture's width
                figures.append(f"<figure style='width:{width}px'><img alt='{html.escape(block.file)}' src='data:image/png;base64,{png}'>"
                               f"<figcaption>{html.escape(block.plot.caption)}</figcaption></figure>")
                continue
            if figures:
                out.append(f"<div class='plots'>{''.join(figures)}</div>")
                figures = []
            if isinstance(block, Table):
                head = "".join(f"<th>{html.escape(h)}</th>" for h in block.header)
                body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in block.rows)
                out.append(f"<div class='table'><table><tr>{head}</tr>{body}</table></div>")
            elif block is not None:
                out.append(f"<p>{html.escape(block)}</p>")
    return "\n".join(out)


# Plots keep their own aspect ratio: they shrink to the column (height follows), never stretch to a row's
# tallest. A wide table scrolls in its own box rather than widening the page.
STYLE = ("body{font-family:system-ui,sans-serif;max-width:1250px;margin:2em auto;padding:0 1em;color:#222}"
         ".table{overflow-x:auto}table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:14px}"
         "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}"
         ".plots{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}"
         "figure{margin:0 0 1em;max-width:100%;flex:0 1 auto}figure img{display:block;max-width:100%;height:auto;border:1px solid #eee}"
         "figcaption{font-size:13px;color:#444;margin-top:4px}")


def make_plots(report: Report, paired: dict[str, Paired]) -> list[Image]:
    """Every plot: the per-group comparison, then up to five per judge."""
    figures = []
    if report.group_by != "none" and "overall" in report.criteria:
        figures.append(Image("groups.png", plots.group_bars({j: r.criteria["overall"] for j, r in report.judges.items()}, report.group_by)))
    scale = report.score_scale
    value = "expected score" if report.overall == "expected_score" else "score"
    for name, p in paired.items():
        judge, file = report.judges[name], slug(name)
        overall = judge.criteria["overall"]
        drawn = {"scatter": plots.scatter(p.judge, p.human, name, scale, report.seed, overall.collapse, value),
                 "confusion": plots.confusion(p.judge, p.human, name, scale), "histograms": plots.histograms(overall, name, scale)}
        if judge.calibration is not None and judge.calibration.reliability_before:
            drawn["reliability"] = plots.reliability_curve(judge.calibration, name, scale)
        if judge.benchmark is not None and judge.benchmark.models:
            drawn["benchmark"] = plots.benchmark(judge.benchmark, name, scale)
        figures += [Image(f"{file}_{kind}.png", plot, name) for kind, plot in drawn.items()]
    figures += [Image(f"probe_{kind}.png", plots.probe(effect)) for kind, effect in report.probes.items()]
    return figures


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def write_reports(report: Report, paired: dict[str, Paired], out_dir: Path) -> None:
    figures = make_plots(report, paired)
    write_pages(out_dir, report, sections(report, figures), figures, "Judge agreement with human scores")


def write_pages(out_dir: Path, report, secs: list[Section], figures: list[Image], title: str) -> None:
    """report.json, report.md, the plots and report.html (the plots embedded where `secs` place them) of one report."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomically(out_dir / "report.json", report.model_dump(mode="json"))
    write_text_atomically(out_dir / "report.md", markdown(secs))
    (out_dir / "plots").mkdir(exist_ok=True)
    for figure in figures:
        (out_dir / "plots" / figure.file).write_bytes(figure.plot.png)
    page = (f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>{_html_blocks(secs)}</body></html>\n")
    write_text_atomically(out_dir / "report.html", page)


# -- preferences --------------------------------------------------------------------------------------

def _interval(stat: Stat) -> str:
    if stat.value is None:
        return f"undefined ({stat.reason})"
    ci = stat.bootstrap_95
    return fmt(stat.value) + (f" [{ci.low:.3f}, {ci.high:.3f}]" if ci is not None and ci.low is not None else "")


def _bias(b) -> str:
    return "–" if b.share is None else f"{b.share:.3f} ({b.first_wins} of {b.n}; p = {b.p_value:.2g})"


def _strength(s) -> str:
    return f"{s.log_strength:+.2f}" + (f" [{s.low:+.2f}, {s.high:+.2f}]" if s.low is not None else "")


def preference_sections(report: PreferenceReport) -> list[Section]:
    judges = list(report.judges)
    intervals = (f"Intervals are 95% percentile bootstraps over pairs, {report.bootstrap} resamples (seed {report.seed})."
                 if report.bootstrap else "No intervals (--bootstrap 0).")
    intro = [f"People's preferences: {report.human_file}, {report.human_pairs} pairs, up to {report.most_annotators} annotator(s) a pair; "
             f"a pair's people are their majority (a tie where they split). {intervals}", *[f"Note: {n}" for n in report.notes]]
    rows = [[name, str(j.n_with_ties), _interval(j.accuracy_with_ties), str(j.n_without_ties), _interval(j.accuracy_without_ties), cell(j.kappa)]
            for name, j in report.judges.items()]
    secs = [Section("Judge agreement with people's preferences", 1, intro),
            Section("Agreement", 2, ["Accuracy with ties counts A, B and tie as three verdicts; without ties leaves out every pair either side "
                                     "calls a tie. Cohen's κ is over the three verdicts.",
                                     Table(["judge", "pairs", "accuracy with ties", "pairs without ties", "accuracy without ties", "Cohen's κ"], rows)])]
    for name, j in report.judges.items():
        confusion = [[f"people {h}", *[str(j.confusion[h][v]) for v in VERDICTS]] for h in VERDICTS]
        blocks: list[str | Table] = [Table(["", *[f"judge {v}" for v in VERDICTS]], confusion)]
        if j.groups:
            blocks.append(Table([report.group_by, "pairs", "accuracy with ties", "accuracy without ties"],
                                [[g, str(a.n), _interval(a.accuracy_with_ties), _interval(a.accuracy_without_ties)] for g, a in j.groups.items()]))
        secs.append(Section(f"{name}: verdicts against people's", 3, blocks))
    bias = [[name, _bias(j.position_bias["forward"]), _bias(j.position_bias["reverse"]), _bias(j.position_bias["both"]),
             _interval(j.swap_consistency)] for name, j in report.judges.items()]
    secs.append(Section("Position bias and swap consistency", 2, [
        "How often the answer shown first wins, among the verdicts that prefer one answer: 0.5 is no bias (p: a two-sided binomial "
        "test against 0.5). Forward shows answer A first, reverse answer B. Swap consistency: how often the two orders give the same verdict.",
        Table(["judge", "first shown wins, forward", "reverse", "both orders", "swap consistency"], bias)]))
    models = list(report.people_ranking.models) or sorted({m for j in report.judges.values() for m in j.ranking.models})
    strength = lambda ranking, m: _strength(ranking.models[m]) if m in ranking.models else "–"  # noqa: E731
    table = Table(["model", "people", *judges], [[m, strength(report.people_ranking, m), *[strength(report.judges[j].ranking, m) for j in judges]]
                                                  for m in models])
    taus = [f"{name}: Kendall's τ between its order and people's {cell(j.kendall_tau_with_people)}." for name, j in report.judges.items()]
    secs.append(Section("Ranking of the evaluated models", 2, [
        f"Bradley-Terry log-strengths from the final verdicts (a tie half a win each; {report.tie_prior:g} of a tie between every two models "
        "that met, so that a model that never wins keeps a finite strength); 0 is the average model.",
        *([report.people_ranking.reason] if report.people_ranking.reason else []), table, *taus]))
    for rule, what in report.tie_rules.items():
        rates = [[m, fmt(report.people_win_rates[rule].get(m)), *[fmt(report.judges[j].win_rates[rule].get(m)) for j in judges]] for m in models]
        secs.append(Section(f"Win rates, {what}", 3, [Table(["model", "people", *judges], rates)]))
    return secs


def _point(p) -> list[str]:
    return [f"{p.alpha:g}", "none (all abstained)" if p.threshold is None else f"{p.threshold:.4f}", str(p.kept), fmt(p.error_kept),
            fmt(p.error_upper_bound), fmt(p.held_out_coverage), fmt(p.held_out_error)]


def selective_sections(report: PreferenceReport, calibrator_of: str) -> list[Section]:
    judges = {name: j.selective for name, j in report.judges.items() if j.selective is not None}
    if not judges:
        return []
    first = next(iter(judges.values()))
    blocks: list[str | Table] = [
        f"A pair's confidence is {'the probability of its verdict' if first.uncertainty == 'verdict_probability' else '1 - the normalised entropy'} "
        "in its verdict distribution averaged over both orders. For each risk level α, the threshold is the lowest confidence at which, "
        f"tested from the top down, the one-sided Clopper-Pearson bound of the error among the pairs at or above it stays at or under α "
        f"(a threshold is tested with at least {first.min_kept} pairs above it). With probability {1 - first.delta:g} over the labelled pairs, "
        "the verdicts kept on new pairs drawn like them are wrong at most at α. Held-out coverage and error: thresholds fitted on "
        f"{first.folds - 1} of {first.folds} folds, applied to the fold left out. calibrator.json holds {calibrator_of}'s threshold at "
        f"α = {first.max_error:g}, which judge-score --calibrator applies (each record then says abstained and its uncertainty)."]
    for name, sel in judges.items():
        blocks.append(f"{name}: {sel.n} labelled pairs with a verdict distribution; error keeping every one {sel.error_all:.3f}."
                      + (f" {sel.reason}." if sel.reason else ""))
        blocks.append(Table(["α", "threshold", "pairs kept", "their error", "its bound", "held-out coverage", "held-out error"],
                            [_point(p) for p in sel.points]))
    secs = [Section("Selective judging: abstaining with a guarantee", 2, blocks)]
    if (panel := report.panel) is not None:
        rows = [[m, fmt(a), fmt(panel.weights.get(m))] for m, a in panel.member_agreement.items()]
        rows.append(["panel (cross-fitted)", fmt(panel.held_out_agreement), f"intercept {panel.intercept:+.3f}" if panel.weights else "–"])
        secs.append(Section("Judge panel", 2, [
            f"A stacked logistic model on the judges' log-odds for answer A, on the {panel.n} pairs where people prefer one answer and every judge "
            f"leans; its accuracy is cross-fitted over {panel.folds} folds, each judge's read on the same pairs. panel.json holds the weights "
            "fitted on every pair and a selective threshold fitted on the panel's held-out distributions; panel_verdicts.json its verdicts on "
            "every pair all judges gave a lean, labelled or not." + (f" {panel.reason}." if panel.reason else ""),
            Table(["judge", "accuracy without ties", "weight"], rows)]))
    if (family := report.family_preference) is not None:
        said = family.reason + "." if family.difference is None else (
            f"On the {family.n} pairs where one answer is by {', '.join(family.models)} and the other is not, {report.family_of} picks the "
            f"family's answer {family.judge_share:.3f} of the time (a tie counts half) and people {family.people_share:.3f}: a difference of "
            f"{_share(family.difference)}; it {family.gate}: {'PASS' if family.passed else 'FAIL'}.")
        secs.append(Section(f"Self- and family-preference ({family.family})", 2, [said]))
    return secs


def write_preference_report(report: PreferenceReport, out_dir: Path, calibrator_of: str | None = None) -> None:
    """The report's pages, and beside them calibrator.json (calibrator_of's selective threshold; with several judges
    calibrator_<name>.json each), panel.json and panel_verdicts.json; files an earlier run left that this one does
    not write are removed, as judge-score --calibrator would otherwise apply them."""
    calibrator_of = calibrator_of or next(iter(report.judges), "")
    figures = [Image("ranking.png", plots.ranking(report)), Image("position_bias.png", plots.position_bias(report))]
    if any(j.selective is not None and j.selective.curve for j in report.judges.values()):
        figures.append(Image("selective.png", plots.selective(report)))
    secs = preference_sections(report)
    secs.insert(2, Section("Plots", 2, figures))  # after the summary of agreement, as the score report places its plots
    secs[3:3] = selective_sections(report, calibrator_of)
    files = {}
    if calibrator_of in report.calibrators:
        files["calibrator.json"] = report.calibrators[calibrator_of]
    if len(report.calibrators) > 1:
        files |= {f"calibrator_{slug(name)}.json": c for name, c in report.calibrators.items()}
    if report.panel_calibrator is not None:
        files["panel.json"] = report.panel_calibrator
    for stale in sorted({f.name for pattern in ("calibrator*.json", "panel*.json") for f in out_dir.glob(pattern)} - set(files) - {"panel_verdicts.json"}):
        (out_dir / stale).unlink()
    write_pages(out_dir, report, secs, figures, "Judge agreement with people's preferences")
    for name, calibrator in files.items():
        calibrator.save(out_dir / name)
    if report.panel_calibrator is not None:
        write_json_atomically(out_dir / "panel_verdicts.json", report.panel_verdicts)
    elif (out_dir / "panel_verdicts.json").exists():
        (out_dir / "panel_verdicts.json").unlink()
