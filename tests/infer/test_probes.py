"""The bias suite (judge-score --probe, judge-calibrate --probes): each perturbation does what judge/probes.py says
and nothing else, each gate passes and fails on either side of its threshold, and the two commands end to end on
the tiny judge."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmjudge.calibration.cli import main as calibrate
from mmjudge.calibration.probes import probe_kind
from mmjudge.infer.cli import main
from mmjudge.infer.probe import answer_images, probed_samples
from mmjudge.judge.data import Segment, UsageError, load_samples, resolve_image
from mmjudge.judge.probes import CONTRADICTION, PADDING, PROBES, probe_effect
from mmjudge.judge.testing import write_dataset

FAST = ["--max_tiles", "1", "--workers", "2", "--mode", "logits"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    # 12 samples, 6 with answer images: SA_0007 alone in its category, PBL_0002/0008/0011, MSR_0003/0006
    return write_dataset(tmp_path_factory.mktemp("data"), 12, seed=2).parent


def pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"), dtype=float)


def roughness(image: np.ndarray) -> float:
    return float((np.diff(image, axis=0) ** 2).mean() + (np.diff(image, axis=1) ** 2).mean())  # a blurred edge keeps its total variation, not its energy


@pytest.mark.parametrize("kind", ["blur", "noise", "quarter"])
def test_degraded_images_keep_their_size_lose_detail_and_stay_outside_the_input(dataset, tmp_path, kind):
    samples = load_samples(dataset / "data.json", dataset)
    probed, notes = probed_samples(samples, kind, 0, dataset, tmp_path)
    with_images = [s for s in samples if answer_images(s)]
    assert [s.id for s in probed] == [s.id for s in with_images] and notes == ["6 sample(s) have no image in their answer: nothing to replace, not probed"]
    for before, after in zip(with_images, probed):
        assert after.question == before.question and [seg.text for seg in after.answer] == [seg.text for seg in before.answer]
        for original, copy in zip(answer_images(before), answer_images(after)):
            assert Path(copy).parent == tmp_path
            a, b = pixels(resolve_image(original, dataset)), pixels(copy)
            assert a.shape == b.shape and not np.array_equal(a, b)  # same size, other pixels
            if kind == "noise":
                assert 20 < (b - a).std() < 45
            else:  # detail lost: less difference between neighbouring pixels
                assert roughness(b) < roughness(a)
    (tmp_path / "again").mkdir()
    again, _ = probed_samples(samples, kind, 0, dataset, tmp_path / "again")
    assert all(np.array_equal(pixels(answer_images(x)[0]), pixels(answer_images(y)[0])) for x, y in zip(probed, again))  # seeded


def test_reverse_contradict_verbosity_and_paraphrase_change_what_they_say(dataset, tmp_path):
    samples = load_samples(dataset / "data.json", dataset)
    reversed_, notes = probed_samples(samples, "reverse", 0, dataset, tmp_path)
    several = [s for s in samples if len(answer_images(s)) > 1]
    one = [s for s in samples if len(answer_images(s)) == 1]
    assert [s.id for s in reversed_] == [s.id for s in several] and any("no order to reverse" in n for n in notes) == bool(one)
    assert all(answer_images(r) == answer_images(s)[::-1] for r, s in zip(reversed_, several))
    contradicted, _ = probed_samples(samples, "contradict", 0, dataset, tmp_path)
    assert all(c.answer[:-1] == s.answer and c.answer[-1].text == CONTRADICTION for c, s in zip(contradicted, [s for s in samples if answer_images(s)]))
    padded, notes = probed_samples(samples, "verbosity", 0, dataset, tmp_path)
    assert len(padded) == len(samples) and not notes and all(p.answer[-1].text == PADDING for p in padded)
    paraphrased, notes = probed_samples(samples, "paraphrase", 0, dataset, tmp_path, {"SA_0001": [Segment(text="Put another way.")]})
    assert [p.id for p in paraphrased] == ["SA_0001"] and paraphrased[0].answer == [Segment(text="Put another way.")]
    assert notes == [f"{len(samples) - 1} sample(s) have no rewording in --paraphrases: not probed"]


def levels(values):
    return np.round(values).astype(int)


@pytest.mark.parametrize("changed, passes", [(2, True), (1, False)])
def test_an_image_probe_passes_where_enough_scores_move(changed, passes):
    before = np.full(10, 3.0)
    after = before.copy()
    after[:changed] = 5.0
    effect = probe_effect("blank", before, after, levels(before), levels(after), threshold=0.2, max_shift=0.5, resamples=200)
    assert effect.share_changed.value == changed / 10 and effect.passed is passes
    assert effect.share_changed.low <= effect.share_changed.value <= effect.share_changed.high


@pytest.mark.parametrize("kind, shift, passes", [("verbosity", 0.4, True), ("verbosity", 0.6, False), ("verbosity", -2.0, True),
                                                 ("paraphrase", -0.4, True), ("paraphrase", -0.6, False),
                                                 ("contradict", -1.0, True), ("contradict", 0.0, False)])
def test_text_probes_gate_on_the_mean_shift(kind, shift, passes):
    rng = np.random.default_rng(0)
    before = rng.integers(1, 6, 40).astype(float)
    after = before + shift + (rng.normal(0, 0.05, 40) if kind == "contradict" else 0)
    effect = probe_effect(kind, before, after, levels(before), levels(after), threshold=0.1, max_shift=0.5, resamples=200)
    assert effect.mean_shift.value == pytest.approx(shift, abs=0.03) and effect.passed is passes
    assert effect.expects == PROBES[kind].expects and effect.source == PROBES[kind].source


def test_no_sample_no_verdict():
    empty = np.array([])
    assert probe_effect("blank", empty, empty, empty, empty, 0.1, 0.5).passed is None


def test_probe_files_are_named_by_their_kind():
    assert probe_kind("out/probe_blur.json") == "blur"
    with pytest.raises(UsageError, match="probe_<kind>.json"):
        probe_kind("out/eval_result.json")


def test_paraphrase_flags_and_files_are_checked_before_the_model_loads(dataset, tmp_path, capsys):
    base = ["--model_path", str(tmp_path / "no-checkpoint"), "--input_dir", str(dataset), "--input_file", "data.json", "--output_dir", str(tmp_path / "o")]
    assert main([*base, "--probe", "paraphrase"]) == 2
    assert "--probe paraphrase reads its rewordings from --paraphrases FILE" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": "nope", "answer": "x"}, {"id": "SA_0001", "answer": 3}, {"id": "PBL_0002", "answer": "a"},
                               {"id": "PBL_0002", "answer": "b"}, {"answer": "c"}]))
    assert main([*base, "--probe", "paraphrase", "--paraphrases", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "no sample of id 'nope' in the input" in err and "SA_0001" in err and "id 'PBL_0002' is reworded twice" in err
    assert "a record needs an id" in err
    assert main([*base, "--probe", "blur", "--probe_seed", "2"]) == 2
    assert "--probe_seed applies to the shuffle and noise probes only" in capsys.readouterr().err
    assert main([*base, "--probe", "blur", "--output_file", "probe_blur.json"]) == 2
    assert "--probe blur writes its own results there" in capsys.readouterr().err


@pytest.mark.slow
def test_the_suite_through_judge_score_and_judge_calibrate(checkpoint, dataset, tmp_path, capsys):
    (tmp_path / "paraphrases.json").write_text(json.dumps([{"id": "SA_0001", "answer": "Put another way, the same."}]))
    out = tmp_path / "out"
    kinds = ["blur", "reverse", "contradict", "verbosity", "paraphrase"]
    assert main(["--model_path", str(checkpoint), "--input_dir", str(dataset), "--input_file", "data.json", "--output_dir", str(out), *FAST,
                 "--probe", *kinds, "--paraphrases", str(tmp_path / "paraphrases.json")]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["probes"]) == kinds and "image_reliance" not in summary
    assert summary["probes"]["verbosity"]["probed"] == 12 and summary["probes"]["paraphrase"]["probed"] == 1
    assert summary["probes"]["verbosity"]["barely_moves"] == []  # the image warning is the image probes' only
    original = {r["id"]: r for r in json.loads((out / "eval_result.json").read_text())}
    padded = json.loads((out / "probe_verbosity.json").read_text())
    assert all(r["prompt_tokens"] > original[r["id"]]["prompt_tokens"] for r in padded)  # the padding reached the judge
    human = tmp_path / "human.json"
    human.write_text(json.dumps([{"id": rid, "overall": 3} for rid in original]))
    capsys.readouterr()
    assert calibrate(["--predictions", str(out / "eval_result.json"), "--human", str(human), "--output_dir", str(tmp_path / "report"),
                      "--overall", "expected_score", "--bootstrap", "100", "--probes", *[str(out / f"probe_{k}.json") for k in kinds]]) == 0
    printed = capsys.readouterr().out
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert list(report["probes"]) == kinds and report["probes_of"] == "eval_result"
    for kind in kinds:
        effect = report["probes"][kind]
        before = [original[r["id"]]["expected_score"] for r in json.loads((out / f"probe_{kind}.json").read_text())]
        after = [r["expected_score"] for r in json.loads((out / f"probe_{kind}.json").read_text())]
        assert effect["n"] == len(before) and effect["mean_shift"]["value"] == pytest.approx(np.mean(np.subtract(after, before)))
        assert f"probe {kind}: mean shift" in printed and (tmp_path / "report" / "plots" / f"probe_{kind}.png").exists()
    assert "Bias probes (eval_result)" in (tmp_path / "report" / "report.md").read_text()
    assert calibrate(["--predictions", str(out / "eval_result.json"), "--human", str(human), "--output_dir", str(tmp_path / "r2"),
                      "--probes", str(out / "eval_result.json")]) == 2


@pytest.mark.parametrize("lift, passes", [(0.3, True), (1.0, False)])
def test_family_preference_passes_where_the_judge_over_scores_its_family_by_at_most_the_shift(lift, passes):
    """Answers by qwen-7b and by others, scored by people alike; the judge adds `lift` to its family's."""
    from mmjudge.calibration.inputs import HumanRecord, JudgeRecord
    from mmjudge.calibration.probes import family_preference

    rng = np.random.default_rng(1)
    judged, human = {}, {}
    for k in range(60):
        model = "Qwen-7B" if k % 3 == 0 else "other-model"
        truth = float(rng.integers(1, 6))
        human[str(k)] = HumanRecord(ratings={"overall": [truth]}, model=model, category="SA")
        judged[str(k)] = JudgeRecord(scores={"overall": truth + (lift if model == "Qwen-7B" else 0.0)}, expected_score=None, model=model,
                                     category="SA", n_images=0)
    found = family_preference(judged, human, "qwen", "score", 0.5, 200, 0)
    assert found.models == ["Qwen-7B"] and (found.n_family, found.n_other) == (20, 40)
    assert found.difference.value == pytest.approx(lift) and found.passed is passes
    nobody = family_preference(judged, human, "llava", "score", 0.5, 200, 0)
    assert nobody.passed is None and "0 scored answer(s) by a model named like 'llava'" in nobody.reason


@pytest.mark.parametrize("flipped, passes", [(2, True), (8, False)])
def test_family_preference_on_pairs_passes_where_the_judge_picks_its_family_at_most_the_gap_more_often_than_people(tmp_path, capsys, flipped, passes):
    """40 pairs of qwen-7b against another model (qwen's answer shown first in half), people preferring qwen's in exactly half, and
    20 pairs without qwen; the judge agrees with people but for `flipped` pairs where people preferred the other answer and it
    picks qwen's: a gap of flipped/40."""
    people, judged, flips = [], [], 0
    for k in range(60):
        family = k < 40
        models = ("qwen-7b", "other-1") if family and k % 2 else ("other-1", "qwen-7b") if family else ("other-1", "other-2")
        preference = "AB"[(k // 2) % 2]
        verdict = preference
        if family and preference != ("A" if models[0] == "qwen-7b" else "B") and flips < flipped:
            verdict, flips = ("A" if models[0] == "qwen-7b" else "B"), flips + 1
        pair = {"id": f"pair_{k:03d}", "model_a": models[0], "model_b": models[1]}
        people.append({**pair, "preference": preference, "annotator": "ann-1"})
        judged.append({**pair, "verdict": verdict, "verdict_distribution": {"A": 0.9 if verdict == "A" else 0.1, "B": 0.1 if verdict == "A" else 0.9, "tie": 0.0}})
    (tmp_path / "people.json").write_text(json.dumps(people))
    (tmp_path / "judge.json").write_text(json.dumps(judged))
    assert calibrate(["--predictions", str(tmp_path / "judge.json"), "--human", str(tmp_path / "people.json"), "--output_dir", str(tmp_path / "report"),
                      "--bootstrap", "200", "--judge_family", "qwen"]) == 0
    family = json.loads((tmp_path / "report" / "report.json").read_text())["family_preference"]
    assert family["n"] == 40 and family["models"] == ["qwen-7b"] and family["people_share"] == 0.5
    assert family["difference"]["value"] == pytest.approx(flipped / 40) and family["passed"] is passes
    assert f"picks its family's answer {0.5 + flipped / 40:.3f}, people 0.500 (n 40): {'PASS' if passes else 'FAIL'}" in capsys.readouterr().out
    assert "## Self- and family-preference (qwen)" in (tmp_path / "report" / "report.md").read_text()
    assert calibrate(["--predictions", str(tmp_path / "judge.json"), "--human", str(tmp_path / "people.json"), "--output_dir", str(tmp_path / "r2"),
                      "--judge_family", "qwen", "--family_max_gap", "0.3"]) == 0
    assert json.loads((tmp_path / "r2" / "report.json").read_text())["family_preference"]["passed"] is True
    import mmjudge

    api = mmjudge.calibrate(str(tmp_path / "judge.json"), str(tmp_path / "people.json"), judge_family="qwen", bootstrap=0).family_preference
    assert api.difference.value == pytest.approx(flipped / 40) and api.passed is passes  # the API reaches pairs' family preference too
