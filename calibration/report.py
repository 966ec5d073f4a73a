"""report.json (everything), report.md (tables for a paper or README), report.html (self-contained,
plots embedded), and the PNGs themselves under plots/."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from calibration import plots

# The rows of the side-by-side table, as MMIE compares judges (Pearson, cosine, MSE, MAE) and more.
TABLE_ROWS = [("n", "n"), ("pearson", "Pearson r"), ("spearman", "Spearman ρ"), ("kendall_tau_b", "Kendall τ-b"),
              ("mse", "MSE"), ("rmse", "RMSE"), ("mae", "MAE"), ("cosine", "cosine*"), ("exact_agreement", "exact agreement"),
              ("within_1_agreement", "within-1 agreement"), ("quadratic_kappa", "quadratic κ"),
              ("krippendorff_interval", "Krippendorff α (interval)"), ("krippendorff_ordinal", "Krippendorff α (ordinal)")]
COSINE_NOTE = ("*Cosine similarity is reported because MMIE reports it; it is not a correlation: two positive score "
               "vectors of similar size score high whatever their agreement, and a constant offset barely moves it.")


def cell(stat: dict | None) -> str:
    if stat is None:
        return "–"
    if stat.get("value") is None:
        return "undefined"
    text = f"{stat['value']:.3f}" if not float(stat["value"]).is_integer() else f"{stat['value']:.0f}"
    if "low" in stat:
        text += f" [{stat['low']:.2f}, {stat['high']:.2f}]"
    return text


def markdown(report: dict) -> str:
    judges = list(report["judges"])
    lines = ["# Judge agreement with human scores", ""]
    lines += [f"- {note}" for note in report["notes"]] + ([""] if report["notes"] else [])
    for criterion in report["criteria"]:
        lines += [f"## {criterion}", "", "| statistic | " + " | ".join(judges) + " | human ceiling |", "|---" * (len(judges) + 2) + "|"]
        ceiling = report["human_ceiling"].get(criterion, {})
        for key, label in TABLE_ROWS:
            row = [cell(report["judges"][j]["criteria"].get(criterion, {}).get("all", {}).get(key)) for j in judges]
            lines.append(f"| {label} | " + " | ".join(row) + f" | {cell(ceiling.get(key)) if 'undefined' not in ceiling else '–'} |")
        lines.append("")
        for j in judges:
            if warning := report["judges"][j]["collapse"].get(criterion):
                lines.append(f"**{j}: {warning}**\n")
    lines += [COSINE_NOTE, "", "Intervals are 95% (Fisher z). Human ceiling: one annotator against the mean of the others."]
    for j in judges:
        info = report["judges"][j]
        lines += ["", f"## {j}: calibration, ranking and bias", ""]
        if cal := info.get("calibration"):
            if "undefined" in cal:
                lines.append(f"Calibration: undefined ({cal['undefined']}).")
            else:
                lines.append(f"Calibration ({cal['method']}, {cal['folds']}-fold cross-fitted, from `{cal['source']}`): held-out MSE "
                             f"{cal['mse_before']:.3f} → {cal['mse_after']:.3f}, MAE {cal['mae_before']:.3f} → {cal['mae_after']:.3f}.")
        if system := info.get("system_level"):
            lines.append(f"System level over {len(system['models'])} models: Pearson {cell(system['pearson'])}, Kendall τ-b {cell(system['kendall_tau_b'])}.")
        if bias := info.get("bias"):
            lines.append(f"Residual (judge − human) vs answer length: r = {cell(bias['residual_vs_answer_chars'])}; "
                         f"vs number of images: r = {cell(bias['residual_vs_n_images'])}; mean residual by category: "
                         + ", ".join(f"{c} {v:+.2f}" for c, v in bias["mean_residual_by_category"].items()) + ".")
    return "\n".join(lines) + "\n"


def make_plots(report: dict, arrays: dict, out_dir: Path) -> dict[str, list[tuple[str, bytes]]]:
    scale = report["scale"]
    figures: dict[str, list[tuple[str, bytes]]] = {}
    for name, judge_arrays in arrays.items():
        figures[name] = []
        if (p := judge_arrays.get("overall")) is not None:
            figures[name] += [("scatter", plots.scatter(p.judge, p.human, name, scale)), ("confusion", plots.confusion(p.judge, p.human, name, scale)),
                              ("histograms", plots.histograms(p.judge, p.human, name, scale))]
            groups = report["judges"][name]["criteria"]["overall"]["groups"]
            if report["group_by"] != "none":
                figures[name].append(("groups", plots.group_bars(groups, name, report["group_by"])))
        if (cal := report["judges"][name].get("calibration")) and "reliability_before" in cal:
            figures[name].append(("reliability", plots.reliability_curve(cal["reliability_before"], cal.get("reliability_after"), name, scale)))
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    for name, items in figures.items():
        for kind, png in items:
            (out_dir / "plots" / f"{slug(name)}_{kind}.png").write_bytes(png)
    return figures


def slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _markdown_table_to_html(md: str) -> str:
    """The few markdown constructs report.md uses (headings, tables, bullets, bold), as HTML."""
    out, in_table = [], False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("-"):
                continue
            tag = "th" if not in_table else "td"
            out.append(("<table>" if not in_table else "") + "<tr>" + "".join(f"<{tag}>{html.escape(c)}</{tag}>" for c in cells) + "</tr>")
            in_table = True
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{html.escape(line.lstrip('# '))}</h{level}>")
        elif line.startswith("- "):
            out.append(f"<p>• {html.escape(line[2:])}</p>")
        elif line.strip():
            text = html.escape(line)
            out.append(f"<p><b>{text.strip('*')}</b></p>" if line.startswith("**") else f"<p>{text}</p>")
    return "\n".join(out + (["</table>"] if in_table else []))


def write_reports(report: dict, arrays: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    md = markdown(report)
    (out_dir / "report.md").write_text(md)
    figures = make_plots(report, arrays, out_dir)
    images = "".join(
        f"<h2>{html.escape(name)}</h2><div class='plots'>"
        + "".join(f"<img alt='{kind}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>" for kind, png in items)
        + "</div>"
        for name, items in figures.items()
    )
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}td:first-child{text-align:left}"
             ".plots img{max-width:48%;margin:4px;border:1px solid #eee}")
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>Judge agreement</title><style>{style}</style></head><body>{_markdown_table_to_html(md)}{images}</body></html>"
    (out_dir / "report.html").write_text(page)
