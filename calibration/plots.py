"""The report's pictures (matplotlib, Agg backend: no display needed). Each function returns PNG bytes."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

plt.rcParams.update({"font.size": 10, "axes.titlesize": 11, "axes.grid": True, "grid.alpha": 0.3})


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def scatter(judge: np.ndarray, human: np.ndarray, name: str, scale, seed: int = 0) -> bytes:
    """Judge vs human with jitter (integer scores pile up otherwise) and the least-squares line."""
    rng = np.random.default_rng(seed)
    fig, ax = plt.subplots(figsize=(5, 4.5))
    jitter = lambda v: v + rng.uniform(-0.15, 0.15, len(v))  # noqa: E731
    ax.scatter(jitter(human), jitter(judge), s=14, alpha=0.5, color="tab:blue", label="samples (jittered)")
    lo, hi = scale
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="perfect agreement")
    if np.ptp(human) > 0:
        slope, intercept = np.polyfit(human, judge, 1)
        ax.plot([lo, hi], [intercept + slope * lo, intercept + slope * hi], color="tab:red", label=f"fit: judge = {slope:.2f} x human {intercept:+.2f}")
    ax.set(xlim=(lo - 0.5, hi + 0.5), ylim=(lo - 0.5, hi + 0.5), xlabel="human score (mean of annotators)", ylabel="judge score",
           title=f"{name}: judge vs human (overall, n={len(judge)})")
    ax.legend(loc="upper left", fontsize=8)
    return _png(fig)


def confusion(judge: np.ndarray, human: np.ndarray, name: str, scale) -> bytes:
    lo, hi = int(scale[0]), int(scale[1])
    k = hi - lo + 1
    counts = np.zeros((k, k), dtype=int)
    np.add.at(counts, (np.clip(np.rint(judge), lo, hi).astype(int) - lo, np.clip(np.rint(human), lo, hi).astype(int) - lo), 1)
    fig, ax = plt.subplots(figsize=(5, 4.5))
    image = ax.imshow(counts, origin="lower", cmap="Blues")
    for i in range(k):
        for j in range(k):
            if counts[i, j]:
                ax.text(j, i, counts[i, j], ha="center", va="center", fontsize=8, color="white" if counts[i, j] > counts.max() / 2 else "black")
    ax.set(xticks=range(k), yticks=range(k), xticklabels=range(lo, hi + 1), yticklabels=range(lo, hi + 1),
           xlabel="human score (rounded)", ylabel="judge score (rounded)", title=f"{name}: confusion on the integer scale")
    ax.grid(False)
    fig.colorbar(image, ax=ax, shrink=0.8, label="samples")
    return _png(fig)


def reliability_curve(before: list[dict], after: list[dict] | None, name: str, scale) -> bytes:
    fig, ax = plt.subplots(figsize=(5, 4.5))
    lo, hi = scale
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="perfectly calibrated")
    for points, label, colour in ((before, "judge score", "tab:blue"), (after, "calibrated (held-out folds)", "tab:green")):
        if points:
            x = [p["judge_level"] for p in points]
            ax.plot(x, [p["mean_human"] for p in points], marker="o", color=colour, label=label)
            for p in points:
                ax.annotate(f"n={p['n']}", (p["judge_level"], p["mean_human"]), textcoords="offset points", xytext=(4, -10), fontsize=7, color=colour)
    ax.set(xlim=(lo - 0.5, hi + 0.5), ylim=(lo - 0.5, hi + 0.5), xlabel="judge score level", ylabel="mean human score at that level",
           title=f"{name}: reliability")
    ax.legend(loc="upper left", fontsize=8)
    return _png(fig)


def histograms(judge: np.ndarray, human: np.ndarray, name: str, scale) -> bytes:
    lo, hi = int(scale[0]), int(scale[1])
    levels = np.arange(lo, hi + 1)
    count = lambda v: np.array([(np.rint(v) == x).sum() for x in levels])  # noqa: E731
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.bar(levels - 0.2, count(judge), width=0.4, label="judge", color="tab:blue")
    ax.bar(levels + 0.2, count(human), width=0.4, label="human (mean, rounded)", color="tab:orange")
    ax.set(xticks=levels, xlabel="score", ylabel="samples", title=f"{name}: score distributions")
    ax.legend(fontsize=8)
    return _png(fig)


def group_bars(groups: dict[str, dict], name: str, group_by: str) -> bytes:
    """Pearson r per group with its 95% interval (Fisher z); groups with undefined r are shown empty."""
    labels = sorted(groups)
    r = [groups[g]["pearson"].get("value") for g in labels]
    fig, ax = plt.subplots(figsize=(max(4, 1 + 0.9 * len(labels)), 3.8))
    x = np.arange(len(labels))
    heights = [v if v is not None else 0 for v in r]
    errors = [[max(v - groups[g]["pearson"].get("low", v), 0) if v is not None else 0 for g, v in zip(labels, r)],
              [max(groups[g]["pearson"].get("high", v) - v, 0) if v is not None else 0 for g, v in zip(labels, r)]]
    ax.bar(x, heights, yerr=errors, capsize=4, color=["tab:blue" if v is not None else "lightgrey" for v in r])
    for xi, g, v in zip(x, labels, r):
        top = groups[g]["pearson"].get("high", v) if v is not None else 0
        ax.text(xi, max(top, 0) + 0.03, "undefined" if v is None else f"r={v:.2f}", ha="center", fontsize=8)
        ax.text(xi, -0.95, f"n={groups[g]['n']['value']:.0f}", ha="center", fontsize=8, color="dimgrey")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set(xticks=x, xticklabels=labels, ylim=(-1, 1.2), ylabel="Pearson r (95% interval)", title=f"{name}: overall agreement by {group_by}")
    return _png(fig)
