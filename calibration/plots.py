"""The report's pictures (matplotlib, Agg backend: no display needed). Each function returns a `Plot`: the PNG
and its caption, which says what is drawn and how (what is jittered, why a line is missing).

Every per-judge picture puts the judge's score on x and the human score on y, so the scatter, the
confusion matrix and the reliability curve read the same way.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from mmjudge.calibration.analysis import Calibration, CriterionResult
from mmjudge.calibration.benchmark import BenchmarkScores
from mmjudge.calibration.preferences import PreferenceReport
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.probes import ProbeEffect

plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.grid": True, "grid.alpha": 0.3, "legend.fontsize": 8})
JUDGE_COLOUR, HUMAN_COLOUR, CALIBRATED_COLOUR = "tab:blue", "tab:orange", "tab:green"
DPI = 110
JITTER = 0.18  # of a discrete axis's spacing: points of one value spread out, and stay clear of the next value's


@dataclass(frozen=True)
class Plot:
    png: bytes
    caption: str  # what the picture shows and how it is drawn, for the report's text beside it


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    return buffer.getvalue()


def interval(ax, at: float, low: float, high: float, colour: str, capsize: float, vertical: bool = False) -> None:
    """A 95% interval drawn from its ends, not as lengths either side of the estimate: a percentile bootstrap's
    interval need not hold the estimate (a model absent from many of a few pairs' resamples), and matplotlib
    refuses an error bar of negative length."""
    middle, half = (low + high) / 2, (high - low) / 2
    if vertical:
        ax.errorbar(at, middle, yerr=half, fmt="none", ecolor=colour, capsize=capsize)
    else:
        ax.errorbar(middle, at, xerr=half, fmt="none", ecolor=colour, capsize=capsize)


def grid_spacing(values: np.ndarray, scale: ScoreScale) -> float | None:
    """The spacing of the grid every value lies on when they are discrete: the scale's levels, or means of a
    few annotators' levels (halves, thirds, ... twelfths); None for continuous values (expected scores)."""
    values = np.asarray(values, dtype=float)
    for parts in range(1, 13):
        steps = (values - scale.low) / (scale.step / parts)
        if len(values) and np.allclose(steps, np.rint(steps), rtol=0, atol=1e-6):
            return scale.step / parts
    return None


def _level_ticks(ax, scale: ScoreScale, axes: str = "xy") -> None:
    """A tick at every level, labelled as a person writes it (0.7, not 0.7000000000000001)."""
    labels = [f"{v:g}" for v in scale.levels]
    if "x" in axes:
        ax.set_xticks(scale.levels, labels)
    if "y" in axes:
        ax.set_yticks(scale.levels, labels)


def _square_axes(ax, scale: ScoreScale, xlabel: str, ylabel: str, title: str) -> None:
    lo, hi, margin = scale.low, scale.high, scale.step / 2
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="judge = human")
    ax.set(xlim=(lo - margin, hi + margin), ylim=(lo - margin, hi + margin), xlabel=xlabel, ylabel=ylabel, title=title, aspect="equal")
    _level_ticks(ax, scale)


def scatter(judge: np.ndarray, human: np.ndarray, name: str, scale: ScoreScale, seed: int = 0, collapse: str | None = None,
            value: str = "score") -> Plot:
    """Judge vs human, with the least-squares line unless the judge's scores collapse (`collapse`, the report's
    verdict: a line through one level is no trend). `value`: what the judge's values are ("score",
    "expected score"). A discrete axis is jittered (scores on a few levels would pile up on a few points),
    a continuous one never: its spread is the data's."""
    rng = np.random.default_rng(seed)
    fig, ax = plt.subplots(figsize=(5.2, 6))
    drawn, jittered, exact = [], [], []
    for label, values in (("judge", judge), ("human", human)):
        spacing = grid_spacing(values, scale)
        if spacing is None:
            drawn.append(values)
            exact.append(label)
        else:
            drawn.append(values + rng.uniform(-JITTER, JITTER, len(values)) * spacing)
            jittered.append(f"{label} axis by up to ±{JITTER * spacing:.2g}")
    ax.scatter(*drawn, s=12, alpha=0.45, color=JUDGE_COLOUR, edgecolors="none",
               label=f"samples (n={len(judge)}), " + (f"jittered: {', '.join(jittered)}" if jittered else "not jittered"))
    lo, hi = scale.bounds
    if collapse:
        line = f"No fitted line through a collapsed judge ({collapse})."
    elif np.ptp(judge) > 0:
        slope, intercept = np.polyfit(judge, human, 1)
        ax.plot([lo, hi], [intercept + slope * lo, intercept + slope * hi], color="tab:red", linewidth=1.5,
                label=f"least squares: human = {slope:.2f} x judge {intercept:+.2f}")
        line = "Red: the least-squares line."
    else:
        line = "No fitted line: the judge gave one value."
    _square_axes(ax, scale, f"judge {value}", "human score (mean of annotators)", f"{name}: judge vs human, overall")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1, frameon=False)  # below: points fill every corner
    caption = f"{name}: each point is an id, the judge's {value} against the mean of its annotators' scores."
    if jittered:
        caption += f" Discrete values are jittered so that equal ones do not hide each other ({', '.join(jittered)})."
    if exact:
        caption += f" {' and '.join(exact).capitalize()} values are continuous and drawn where they are, unjittered."
    return Plot(_png(fig), f"{caption} {line} Dashed: judge = human.")


def confusion(judge: np.ndarray, human: np.ndarray, name: str, scale: ScoreScale) -> Plot:
    k, levels = scale.n_levels, scale.levels
    counts = np.zeros((k, k), dtype=int)  # [human level, judge level]
    np.add.at(counts, (scale.index(human), scale.index(judge)), 1)
    fig, ax = plt.subplots(figsize=(5.4, 4.8))
    edges = (scale.low - scale.step / 2, scale.high + scale.step / 2)
    image = ax.imshow(counts, origin="lower", cmap="Blues", extent=(*edges, *edges))
    for i in range(k):
        for j in range(k):
            if counts[i, j]:
                colour = "white" if counts[i, j] > counts.max() / 2 else "black"
                ax.text(levels[j], levels[i], counts[i, j], ha="center", va="center", fontsize=9 if k <= 8 else 7, color=colour)
    ax.set(xlabel="judge score (nearest level)", ylabel="human score (mean, nearest level)", title=f"{name}: counts per level, scale {scale}")
    _level_ticks(ax, scale)
    ax.grid(False)
    ax.plot(edges, edges, color="grey", linestyle="--", linewidth=0.8)
    fig.colorbar(image, ax=ax, shrink=0.85, label="samples")
    return Plot(_png(fig), f"{name}: how many ids fall on each pair of levels, the judge's (x) against people's (y), each score at its "
                           "nearest level. The dashed diagonal is exact agreement.")


def reliability_curve(calibration: Calibration, name: str, scale: ScoreScale) -> Plot:
    """Mean human score at each judge score level, before and after calibration, with the map itself."""
    fig, ax = plt.subplots(figsize=(5.2, 6))
    source = "expected score" if calibration.source == "expected_score" else "score"
    if calibration.calibrator is not None:
        c = calibration.calibrator
        xs = [scale.low, *c.x, scale.high]
        ax.plot(xs, [c.apply(x) for x in xs], color="tab:purple", linewidth=1, alpha=0.7, label=f"{c.method} map (fitted on all pairs)")
    curves = ((calibration.reliability_before, f"judge {source}", JUDGE_COLOUR, "o"),
              (calibration.reliability_after, "calibrated, held-out folds", CALIBRATED_COLOUR, "s"))
    for levels, label, colour, marker in curves:
        if levels:
            ax.plot([v.judge_level for v in levels], [v.mean_human for v in levels], marker=marker, color=colour, label=label)
            for v in levels:
                offset = (5, -11) if colour == CALIBRATED_COLOUR else (-14, 5)
                ax.annotate(f"{v.n}", (v.judge_level, v.mean_human), textcoords="offset points", xytext=offset, fontsize=7, color=colour)
    _square_axes(ax, scale, "score level, nearest (small numbers: samples)", "mean human score at that level", f"{name}: reliability")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)  # below: a harsh judge's curve fills the upper left
    return Plot(_png(fig), f"{name}: the mean human score of the ids at each level of the judge's {source} (small numbers: ids), before "
                           "calibration and after it on held-out folds, beside the map fitted on all pairs. On the dashed line a "
                           "level means to the judge what it means to people.")


def histograms(result: CriterionResult, name: str, scale: ScoreScale) -> Plot:
    h = result.histogram
    levels, offset = np.array(h.levels), 0.2 * scale.step
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    ax.bar(levels - offset, h.judge, width=2 * offset, label="judge", color=JUDGE_COLOUR)
    ax.bar(levels + offset, h.human, width=2 * offset, label="human (mean of annotators, nearest level)", color=HUMAN_COLOUR)
    title = f"{name}: score distributions, overall"
    if result.collapse:
        title += "\n" + result.collapse
    ax.set(xlabel="score (nearest level)", ylabel="samples", title=title)
    _level_ticks(ax, scale, "x")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)  # below: inside, it covers a tall bar
    collapse = f" Warning: {result.collapse}." if result.collapse else ""
    return Plot(_png(fig), f"{name}: how often each level was given, by the judge and by people (the mean of annotators at its "
                           f"nearest level).{collapse}")


LABEL_PAD = 0.15  # room on the r axis beyond the intervals for the n labels


def group_bars(results: dict[str, CriterionResult], group_by: str) -> Plot:
    """Overall Pearson r per group and judge with its 95% Fisher-z interval; undefined r is marked, not drawn.
    The r axis spans the intervals drawn (and 0), not always -1 to 1: agreement is usually positive, and a
    fixed axis left its negative half empty."""
    groups = sorted({g for r in results.values() for g in r.groups})
    judges = list(results)
    width = 0.8 / len(judges)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 + 1.3 * len(groups) * max(1, len(judges) / 2)), 4.4))
    lows, highs = [0.0], [0.0]
    for k, judge in enumerate(judges):
        x = np.arange(len(groups)) - 0.4 + width * (k + 0.5)
        for xi, g in zip(x, groups):
            table = results[judge].groups.get(g)
            n = int(table["n"].value) if table else 0
            stat = table["pearson"] if table else None
            if stat is None or stat.value is None:
                ax.text(xi, 0.02, f"undefined (n={n})", transform=ax.get_xaxis_transform(), rotation=90, ha="center", va="bottom",
                        fontsize=7, color="dimgrey")
                continue
            ci = stat.fisher_95
            low, high = (ci.low, ci.high) if ci is not None and ci.low is not None else (stat.value, stat.value)
            ax.bar(xi, stat.value, width=width * 0.9, color=f"C{k}")
            interval(ax, xi, low, high, "black", capsize=3, vertical=True)
            end, offset, va = (high, 3, "bottom") if stat.value >= 0 else (low, -3, "top")  # beyond the interval's outer end
            ax.annotate(f"n={n}", (xi, end), xytext=(0, offset), textcoords="offset points", ha="center", va=va, fontsize=7, color="dimgrey")
            lows.append(low)
            highs.append(high)
    bottom = min(lows) - LABEL_PAD if min(lows) < 0 else 0
    ax.set_ylim(bottom, max(highs) + LABEL_PAD)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.legend(swatches(len(judges)), judges, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(len(judges), 4), frameon=False)
    ax.set(xlim=(-0.5, len(groups) - 0.5), xticks=range(len(groups)), xticklabels=groups, ylabel="Pearson r, 95% interval (Fisher z)", xlabel=group_by,
           title=f"Overall agreement by {group_by}")
    return Plot(_png(fig), f"Overall Pearson r per {group_by} and judge, with its 95% Fisher-z interval; n: the ids of the group. "
                           "Where r is undefined (too few ids, or one side constant) the group is marked, not drawn.")


BENCHMARK_WAYS = (("ppi", "PPI++ (human + judge)", "tab:green"), ("human_only", "human only", HUMAN_COLOUR), ("judge_only", "judge only", JUDGE_COLOUR))


def benchmark(scores: BenchmarkScores, name: str, scale: ScoreScale) -> Plot:
    """Each evaluated model's mean score, three ways side by side, with their 95% intervals; models best first
    (by PPI++) from the top. An undefined estimate is left out of its row."""
    models = list(scores.ranking.order) + [m for m in scores.models if m not in scores.ranking.order]
    fig, ax = plt.subplots(figsize=(6.4, 1.6 + 0.7 * len(models)))
    for k, (way, label, colour) in enumerate(BENCHMARK_WAYS):
        y = np.arange(len(models))[::-1] + 0.22 * (1 - k)
        for yi, model in zip(y, models):
            e = getattr(scores.models[model], way)
            if e.value is not None:
                interval(ax, yi, e.low, e.high, colour, capsize=3)
                ax.plot(e.value, yi, "o", color=colour, markersize=4)
        ax.plot([], [], "o-", color=colour, label=label)
    labels = [f"{m}\n{scores.models[m].human_scored} human + {scores.models[m].judge_only_ids} judge-only ids" for m in models]
    ax.set_yticks(np.arange(len(models))[::-1], labels, fontsize=8)
    ax.set(xlim=(scale.low - scale.step / 2, scale.high + scale.step / 2), ylim=(-0.6, len(models) - 0.4),
           xlabel="mean overall score, 95% interval", title=f"{name}: benchmark score per model")
    _level_ticks(ax, scale, "x")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(models) < 4 else -0.12), ncol=3, frameon=False)
    return Plot(_png(fig), f"{name}: each evaluated model's mean overall score, estimated three ways with 95% intervals: PPI++ "
                           "(the human-scored ids with every id only the judge scored), people's scores only, the judge's only. "
                           "Best first, by PPI++.")


def ranking(report: PreferenceReport) -> Plot:
    """Each evaluated model's Bradley-Terry log-strength with its 95% interval: people's and each judge's side by
    side, models in people's order from the top."""
    models = list(report.people_ranking.models) or sorted({m for j in report.judges.values() for m in j.ranking.models})
    # the judges in matplotlib's colours less the people's orange (C1)
    sides = [("people", report.people_ranking, HUMAN_COLOUR)] + [(name, j.ranking, f"C{k + (k > 0)}") for k, (name, j) in enumerate(report.judges.items())]
    fig, ax = plt.subplots(figsize=(6.4, 1.4 + 0.45 * max(len(models), 1)))
    for k, (name, ranked, colour) in enumerate(sides):
        y = np.arange(len(models))[::-1] + 0.3 * (k - (len(sides) - 1) / 2) / max(len(sides) - 1, 1)
        for yi, model in zip(y, models):
            s = ranked.models.get(model)
            if s is None:
                continue
            if s.low is not None:
                interval(ax, yi, s.low, s.high, colour, capsize=2)
            ax.plot(s.log_strength, yi, "o", color=colour, markersize=4)
        ax.plot([], [], "o-", color=colour, label=name)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(np.arange(len(models))[::-1], models, fontsize=8)
    ax.set(xlabel="Bradley-Terry log-strength, 95% interval (0: the average model)", title="Ranking of the evaluated models")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12 if len(models) > 4 else -0.25), ncol=min(len(sides), 4), frameon=False)
    return Plot(_png(fig), "Each evaluated model's Bradley-Terry log-strength from the final verdicts, with its 95% percentile bootstrap interval (of a few pairs it need not hold the estimate): "
                           "people's and each judge's side by side, the models in people's order from the top.")


def swatches(count: int) -> list:
    """Legend handles in matplotlib's first `count` colours, C0, C1, ...: bars drawn one at a time in a loop
    give the legend no handle of their own (an empty bar() shows C0's blue whatever colour it is given)."""
    return [plt.Rectangle((0, 0), 1, 1, color=f"C{k}") for k in range(count)]


def position_bias(report: PreferenceReport) -> Plot:
    """How often each judge's first-shown answer wins, per order; 0.5 is no bias."""
    judges = list(report.judges)
    orders = ("forward", "reverse", "both")
    fig, ax = plt.subplots(figsize=(max(4.8, 1.6 + 1.6 * len(judges)), 4.0))
    width = 0.8 / len(orders)
    for k, order in enumerate(orders):
        x = np.arange(len(judges)) - 0.4 + width * (k + 0.5)
        for xi, name in zip(x, judges):
            b = report.judges[name].position_bias[order]
            if b.share is not None:
                ax.bar(xi, b.share, width=width * 0.9, color=f"C{k}")
                ax.annotate(f"n={b.n}", (xi, b.share), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7, color="dimgrey")
    ax.axhline(0.5, color="black", linewidth=0.8, linestyle="--")
    ax.set(xticks=range(len(judges)), xticklabels=judges, ylim=(0, 1.08), ylabel="share of verdicts for the answer shown first",
           title="Position bias (0.5: none)")
    ax.legend(swatches(len(orders)), orders, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    return Plot(_png(fig), "How often each judge's verdict goes to the answer shown first, among the verdicts that prefer one answer, "
                           "per order (forward: A first; reverse: B first) and over both; the dashed line, 0.5, is no bias.")


def selective(report: PreferenceReport) -> Plot:
    """Coverage against error among kept verdicts: each judge's curve as its threshold falls, and where thresholds
    fitted for each risk level alpha land on held-out folds."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    alphas = sorted({p.alpha for j in report.judges.values() if j.selective for p in j.selective.points})
    for alpha in alphas:
        ax.axhline(alpha, color="grey", linewidth=0.6, linestyle=":")
        ax.annotate(f"α={alpha:g}", (1.0, alpha), xytext=(2, 0), textcoords="offset points", fontsize=7, color="dimgrey", va="center")
    for k, (name, j) in enumerate(report.judges.items()):
        if j.selective is None or not j.selective.curve:
            continue
        coverage, error = zip(*j.selective.curve)
        ax.plot(coverage, error, color=f"C{k}", linewidth=1, label=f"{name}: most confident pairs kept")
        held = [(p.held_out_coverage, p.held_out_error, p.alpha) for p in j.selective.points if p.held_out_error is not None]
        if held:
            ax.plot([h[0] for h in held], [h[1] for h in held], "o", color=f"C{k}", markersize=5, label=f"{name}: fitted for each α, held out")
            for coverage, error, alpha in held:
                ax.annotate(f"{alpha:g}", (coverage, error), xytext=(3, -8), textcoords="offset points", fontsize=6, color=f"C{k}")
    ax.set(xlim=(0, 1.08), ylim=(0, None), xlabel="coverage (share of pairs kept)", ylabel="error among kept verdicts",
           title="Selective judging: coverage against error")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    return Plot(_png(fig), "Each line: the error among the kept verdicts as more pairs are kept, most confident first. Each dot: the coverage "
                           "and error, on held-out folds, of the threshold fitted for one risk level α (written beside it; dotted lines); a dot "
                           "under its α line kept its promise there.")


def probe(effect: ProbeEffect) -> Plot:
    """One probe's effect: the share of samples whose score changed and the mean shift, each with its 95% interval,
    beside the gate's line."""
    fig, (shares, shifts) = plt.subplots(1, 2, figsize=(7.2, 2.8))
    colour = "tab:grey" if effect.passed is None else "tab:green" if effect.passed else "tab:red"
    for ax, value, label in ((shares, effect.share_changed, "share of samples changed"), (shifts, effect.mean_shift, "mean shift (levels)")):
        ax.bar([0], [value.value], 0.5, color=colour)
        interval(ax, 0, value.low, value.high, "black", capsize=6, vertical=True)
        ax.set(xticks=[], ylabel=label, xlim=(-1, 1))
        ax.grid(axis="y", alpha=0.3)
    shares.set_ylim(0, 1)
    shifts.axhline(0, color="black", linewidth=0.8)
    if effect.expects == "moves":
        shares.axhline(effect.threshold, color="grey", linestyle="--", label=f"gate: at least {effect.threshold:.0%}")
        shares.legend(fontsize=7)
    elif effect.expects == "holds":
        for bound in ([effect.max_shift] if effect.kind == "verbosity" else [-effect.max_shift, effect.max_shift]):
            shifts.axhline(bound, color="grey", linestyle="--")
        shifts.set_ylim(min(shifts.get_ylim()[0], -1.2 * effect.max_shift), max(shifts.get_ylim()[1], 1.2 * effect.max_shift))
    result = "no samples" if effect.passed is None else "PASS" if effect.passed else "FAIL"
    fig.suptitle(f"Probe {effect.kind}: {effect.changes} ({effect.n} samples): {result}", fontsize=9)
    fig.tight_layout()
    return Plot(_png(fig), f"Probe {effect.kind}: {effect.changes}. Bars: the share of samples whose score changed level and the mean "
                           f"shift of the score (copy − original), with 95% bootstrap intervals; green passes the gate, red fails it. "
                           f"The gate {effect.gate}.")
