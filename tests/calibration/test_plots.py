"""The plots' geometry: legends beside the data, not on it, and axes that span what is drawn."""

import json

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from mmjudge.calibration import plots
from mmjudge.calibration.analysis import Options, analyse
from mmjudge.calibration.cli import main
from mmjudge.calibration.inputs import Coverage, HumanRecord, JudgeRecord, Ratings
from mmjudge.judge.parsing import ScoreScale
from tests.calibration.test_preferences import files, pair_result, write  # noqa: F401 - fixture

TENTHS = ScoreScale(0, 1, 0.1)


@pytest.fixture
def drawn(monkeypatch):
    """Every figure a plot function makes, kept after it is saved (and laid out) so its geometry can be read."""
    figures, save = [], plots._png

    def keep(fig):
        png = save(fig)
        fig.set_dpi(plots.DPI)  # as saved: a legend placed "best" may sit elsewhere at another resolution
        FigureCanvasAgg(fig).draw()  # pyplot's close took the figure's canvas away
        figures.append(fig)
        return png

    monkeypatch.setattr(plots, "_png", keep)
    return figures


def report(judge: dict[str, list[float]], human: list[float], categories: list[str], scale: ScoreScale):
    """The report of judges (name -> scores) against one annotator per id."""
    ids = [str(i) for i in range(len(human))]
    humans = {i: HumanRecord({"overall": [h]}, None, c) for i, h, c in zip(ids, human, categories)}
    judges = {name: {i: JudgeRecord({"overall": s}, None, None, c, None) for i, s, c in zip(ids, scores, categories)} for name, scores in judge.items()}
    coverage = Coverage(predictions="p.json", records=len(ids), shared_ids=len(ids), only_in_predictions=0, only_in_predictions_first=[],
                        only_in_human=0, only_in_human_first=[], parse_failures=0)
    ratings = Ratings(judges, humans, {name: coverage for name in judge})
    return analyse(ratings, Options(["overall"], "category", 0, 0, "isotonic", 5, scale), "h.json", [])[0]


def counted(levels: list[float], counts: list[int]) -> list[float]:
    return [level for level, count in zip(levels, counts) for _ in range(count)]


def boxes(fig, artists):
    renderer = fig.canvas.get_renderer()
    return [a.get_window_extent(renderer) for a in artists]


@pytest.mark.parametrize("scale", [ScoreScale(0, 6), TENTHS])
def test_the_histogram_legend_covers_no_bar(drawn, scale):
    # People's scores fill the right, the judge's tallest bar is at the left end: no corner is free.
    levels, k = list(np.array(scale.levels, dtype=float)), scale.n_levels
    human = counted(levels, [5] * 4 + [23] * (k - 6) + [25, 25])
    judge = counted(levels, [26] + [(len(human) - 26) // (k - 1)] * (k - 1))
    judge += levels[-1:] * (len(human) - len(judge))
    result = report({"j": judge}, human, ["SA"] * len(human), scale).judges["j"].criteria["overall"]
    plots.histograms(result, "j", scale)
    fig = drawn[-1]
    ax = fig.axes[0]
    legend = boxes(fig, [ax.get_legend()])[0]
    assert not any(legend.overlaps(bar) for bar in boxes(fig, ax.patches))


def test_the_reliability_legend_covers_no_point_of_a_harsh_judge(drawn):
    rng = np.random.default_rng(1)
    human = rng.uniform(3, 6, 300)  # people score high; the judge gives 0-2: its curve fills the upper left
    judge = np.clip(np.rint(human - 3 + rng.normal(0, 0.3, 300)), 0, 6)
    calibration = report({"j": list(judge)}, list(human), ["SA"] * 300, ScoreScale(0, 6)).judges["j"].calibration
    plots.reliability_curve(calibration, "j", ScoreScale(0, 6))
    fig = drawn[-1]
    ax = fig.axes[0]
    legend = boxes(fig, [ax.get_legend()])[0]
    points = ax.transData.transform([(v.judge_level, v.mean_human) for v in calibration.reliability_before])
    assert not any(legend.contains(x, y) for x, y in points)


def pearson_axis(fig):
    ax = fig.axes[0]
    inside = ax.get_window_extent(fig.canvas.get_renderer())
    texts = boxes(fig, ax.texts)
    return ax.get_ylim(), texts, inside


@pytest.mark.parametrize("scale", [ScoreScale(0, 6), TENTHS])
def test_group_bars_of_positive_agreement_start_at_zero(drawn, scale):
    rng = np.random.default_rng(2)
    human = rng.choice(np.array(scale.levels, dtype=float), 150)
    judge = np.clip(human + rng.choice([-1, 0, 0, 1], 150) * scale.step, scale.low, scale.high)
    result = report({"a": list(judge), "b": list(human)}, list(human), ["SA", "PBL", "MSR"] * 50, scale)
    plots.group_bars({j: r.criteria["overall"] for j, r in result.judges.items()}, "category")
    (low, high), texts, inside = pearson_axis(drawn[-1])
    assert low == 0 and 1 < high <= 1 + plots.LABEL_PAD  # no empty negative half; room for the n labels above r = 1
    assert len(texts) == 6 and all(inside.contains(t.x0, t.y0) and inside.contains(t.x1, t.y1) for t in texts)


def test_group_bars_reach_below_a_negative_interval_and_show_undefined_groups(drawn):
    rng = np.random.default_rng(3)
    human = rng.integers(0, 7, 120).astype(float)
    categories = ["SA", "PBL"] * 59 + ["XX", "XX"]
    judge = np.where(np.array(categories) == "SA", 6 - human, human)  # SA: r = -1; XX: two pairs, r undefined
    result = report({"j": list(judge)}, list(human), categories, ScoreScale(0, 6)).judges["j"].criteria["overall"]
    plots.group_bars({"j": result}, "category")
    (low, _), texts, inside = pearson_axis(drawn[-1])
    assert low <= -1 - plots.LABEL_PAD + 1e-9
    assert any(t.get_text() == "undefined (n=2)" for t in drawn[-1].axes[0].texts)
    assert all(inside.contains(t.x0, t.y0) and inside.contains(t.x1, t.y1) for t in texts)


def test_benchmark_plot_draws_three_intervals_per_model_best_first_and_leaves_undefined_ones_out(drawn):
    from mmjudge.calibration.benchmark import benchmark_scores

    rng = np.random.default_rng(0)
    data = {m: (rng.normal(mu, 1, 40), rng.normal(mu + 0.5, 1, 40), rng.normal(mu + 0.5, 1, 400)) for m, mu in (("low", 2.0), ("high", 4.0))}
    data["few"] = (np.array([3.0]), np.array([3.0]), rng.normal(3, 1, 50))  # one human score: no PPI++, no human-only mean
    plots.benchmark(benchmark_scores(data, "overall", 0, 0), "j", ScoreScale())
    [fig] = drawn
    ax = fig.axes[0]
    assert [t.get_text().split("\n")[0] for t in ax.get_yticklabels()] == ["high", "low", "few"]
    assert len(ax.containers) == 3 + 3 + 1  # an error bar per defined estimate: "few" has the judge-only mean only
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["PPI++ (human + judge)", "human only", "judge only"]
    assert legend.get_window_extent().y1 <= ax.get_window_extent().y0  # below the axes, off the data


def test_the_scatter_jitters_a_discrete_axis_only_and_draws_no_line_through_a_collapsed_judge(drawn):
    rng = np.random.default_rng(4)
    human = rng.integers(0, 13, 80) / 2  # means of two annotators: halves
    expected = rng.uniform(3.265, 3.353, 80)  # an untrained judge's expected scores: continuous, and collapsed
    result = report({"j": list(expected)}, list(human), ["SA"] * 80, ScoreScale()).judges["j"].criteria["overall"]
    assert result.collapse is not None
    plot = plots.scatter(expected, human, "j", ScoreScale(), 0, result.collapse, "expected score")
    ax = drawn[-1].axes[0]
    x, y = ax.collections[0].get_offsets().T
    assert np.array_equal(x, expected)  # drawn where they are: 3.265-3.353 stays 3.265-3.353
    assert 0 < np.abs(y - human).max() <= plots.JITTER * 0.5
    assert [line.get_label() for line in ax.lines] == ["judge = human"]  # no least-squares line
    assert "human axis by up to ±0.09" in plot.caption and "No fitted line through a collapsed judge" in plot.caption


def test_the_scatter_of_a_judge_that_ranks_jitters_both_axes_and_draws_its_line(drawn):
    rng = np.random.default_rng(5)
    human = rng.integers(0, 7, 80).astype(float)
    judge = np.clip(human + rng.choice([-1, 0, 1], 80), 0, 6)
    plot = plots.scatter(judge, human, "j", ScoreScale())
    ax = drawn[-1].axes[0]
    x, y = ax.collections[0].get_offsets().T
    assert 0 < np.abs(x - judge).max() <= plots.JITTER and 0 < np.abs(y - human).max() <= plots.JITTER
    assert len(ax.lines) == 2 and ax.lines[0].get_label().startswith("least squares")
    assert "judge axis by up to ±0.18, human axis by up to ±0.18" in plot.caption and "Red: the least-squares line" in plot.caption


def test_the_position_bias_legend_shows_each_orders_bar_colour(drawn, files):
    from matplotlib.colors import to_rgba

    from mmjudge.calibration.preferences import analyse as analyse_verdicts

    predictions, human, _ = files
    plots.position_bias(analyse_verdicts([predictions, predictions], ["one", "two"], human, "category", 0, 0))
    (fig,) = drawn
    legend = fig.axes[0].get_legend()
    shown = {text.get_text(): to_rgba(handle.get_facecolor()) for text, handle in zip(legend.get_texts(), legend.legend_handles)}
    assert list(shown) == ["forward", "reverse", "both"] and len(set(shown.values())) == 3
    bars = [patch for patch in fig.axes[0].patches if patch.get_height() > 0]
    assert len(bars) == 6  # three orders for each of the two judges, in order
    for k, order in enumerate(shown):
        assert {to_rgba(bar.get_facecolor()) for bar in bars[2 * k:2 * k + 2]} == {shown[order]}


def test_a_bootstrap_interval_that_misses_its_estimate_is_drawn_from_its_ends(drawn, tmp_path):
    # Three pairs among four models: m2 is missing from many resamples, and its percentile interval from them
    # lies above its estimate, which matplotlib refused as an error bar of negative length (an internal failure).
    pairs = [(("m1", "m2"), "B"), (("m3", "m1"), "B"), (("m1", "m0"), "tie")]
    predictions = write(tmp_path / "eval_result.json", [pair_result(f"p{k}", v, v, models) for k, (models, v) in enumerate(pairs)])
    human = write(tmp_path / "people.json", [{"id": f"p{k}", "preference": v, "annotator": "x", "model_a": a, "model_b": b}
                                             for k, ((a, b), v) in enumerate(pairs)])
    assert main(["--predictions", predictions, "--human", human, "--output_dir", str(tmp_path / "r"), "--bootstrap", "10"]) == 0
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    sides = [report["people_ranking"]["models"], report["judges"]["eval_result"]["ranking"]["models"]]
    assert any(not s["low"] <= s["log_strength"] <= s["high"] for side in sides for s in side.values())
    [ax] = [fig.axes[0] for fig in drawn if fig.axes[0].get_title() == "Ranking of the evaluated models"]
    ends = sorted(tuple(segment[:, 0].round(9)) for lines in ax.collections for segment in lines.get_segments())
    assert ends == sorted((round(s["low"], 9), round(s["high"], 9)) for side in sides for s in side.values())
