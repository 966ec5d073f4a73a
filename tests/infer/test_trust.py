"""How far to trust the judge, in judge-score: --calibrator's conformal score sets and escalation (each
record's score_set and escalate, checked against a computation of our own from the record's score
distribution, and counted in the summary), and the image-reliance probe (--probe_images)."""

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mmjudge.infer.cli import main
from mmjudge.infer.probe import BARELY_MOVES, answer_images, barely_moving, format_reliance, image_reliance, probed_samples, reliance
from mmjudge.judge.calibrator import Calibrator, Escalation, ScoreSets
from mmjudge.judge.data import CALIBRATOR_FIELDS, JudgeResult, load_samples
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.testing import HANG_S, judge_result, write_dataset
from mmjudge.serve.process import free_port, start_server

FAST = ["--max_new_tokens", "6", "--max_tiles", "2", "--workers", "2", "--mode", "logits"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    # 12 samples, 6 with answer images: SA_0007 alone in its category, PBL_0002/0008/0011, MSR_0003/0006
    return write_dataset(tmp_path_factory.mktemp("data"), 12, seed=2).parent


def score(checkpoint, data_dir, out, *extra):
    return main(["--model_path", str(checkpoint), "--input_dir", str(data_dir), "--input_file", "data.json", "--output_dir", str(out), *FAST, *extra])


def read(out, name="eval_result.json"):
    return json.loads((Path(out) / name).read_text())


def own_score_set(distribution: dict[str, float], threshold: float) -> list[int]:
    """The set as calibrator.json documents it: from the most probable level, the more probable neighbour
    joins (the lower on a tie) while the probability already in the set is at most the threshold."""
    p = [distribution[str(k)] for k in range(7)]
    low = high = max(range(7), key=lambda k: (p[k], -k))
    mass = p[low]
    while mass <= threshold and (low, high) != (0, 6):
        left = p[low - 1] if low > 0 else -1
        right = p[high + 1] if high < 6 else -1
        if left >= right:
            low -= 1
            mass += left
        else:
            high += 1
            mass += right
    return [low, high]


def confidence_within_one(r: dict) -> float:
    return sum(p for k, p in r["score_distribution"].items() if abs(int(k) - r["score"]) <= 1)


def test_score_sets_and_escalation_per_record_and_in_the_summary(checkpoint, dataset, tmp_path, capsys):
    assert score(checkpoint, dataset, tmp_path / "plain") == 0
    plain = read(tmp_path / "plain")
    assert all("score_set" not in r and "escalate" not in r for r in plain)  # no calibrator: MMIE's keys only
    assert "calibrator" not in read(tmp_path / "plain", "summary.json")
    # A threshold between the records' confidences, so that both verdicts occur.
    confidences = sorted(confidence_within_one(r) for r in plain)
    threshold = (confidences[5] + confidences[6]) / 2
    calibrator = Calibrator(method="linear", source="score", x=[0, 6], y=[0, 6], scale=(0, 6),
                            score_sets=ScoreSets(coverage=0.9, threshold=0.5, n=100, held_out_coverage=0.91),
                            escalation=Escalation(agreement="within_1", target_agreement=0.8, error_rate=0.1, threshold=threshold, n=100))
    calibrator.save(tmp_path / "cal.json")
    capsys.readouterr()
    assert score(checkpoint, dataset, tmp_path / "out", "--calibrator", str(tmp_path / "cal.json")) == 0
    results = read(tmp_path / "out")
    for r in results:
        assert r["score_set"] == own_score_set(r["score_distribution"], 0.5)
        assert r["score_set"][0] <= r["score"] <= r["score_set"][1]
        assert r["escalate"] is (confidence_within_one(r) < threshold)
    escalated = sum(r["escalate"] for r in results)
    assert escalated == 6
    summary = read(tmp_path / "out", "summary.json")["calibrator"]
    sizes = [r["score_set"][1] - r["score_set"][0] + 1 for r in results]
    assert summary["score_sets"] == {"coverage": 0.9, "held_out_coverage": 0.91, "with_set": 12, "without_set": 0,
                                     "mean_levels": pytest.approx(sum(sizes) / 12)}
    assert summary["escalation"] == {"agreement": "within_1", "target_agreement": 0.8, "escalate": 6, "judge_alone": 6, "undecided": 0}
    out = capsys.readouterr().out
    assert "Escalate to people: 6  judge alone: 6  undecided (no score distribution): 0" in out
    assert f"Score sets (cover the human score at 90%): 12 record(s), {sum(sizes) / 12:.2f} levels on average" in out


def test_a_calibrator_without_sets_writes_null_and_parse_failures_are_escalated(checkpoint, dataset, tmp_path):
    Calibrator(method="linear", source="expected_score", x=[0, 6], y=[0, 6], scale=(0, 6),
               escalation=Escalation(agreement="exact", target_agreement=0.9, error_rate=0.1, threshold=0.0, n=50)).save(tmp_path / "cal.json")
    # generate mode: the random judge's output never parses, so no record has a score the judge may keep
    assert main(["--model_path", str(checkpoint), "--input_dir", str(dataset), "--input_file", "data.json", "--output_dir", str(tmp_path / "out"),
                 "--max_new_tokens", "4", "--max_tiles", "1", "--calibrator", str(tmp_path / "cal.json")]) == 0
    results = read(tmp_path / "out")
    assert all(r["score"] is None and r["score_set"] is None and r["escalate"] is True for r in results)
    summary = read(tmp_path / "out", "summary.json")["calibrator"]
    assert "score_sets" not in summary and summary["escalation"]["escalate"] == 12


# --- the image-reliance probe -------------------------------------------------------------------------------

def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_blank_images_are_mid_grey_of_the_same_size_outside_the_input(dataset, tmp_path):
    samples = load_samples(dataset / "data.json", dataset)
    before = files_under(dataset)
    probed, notes = probed_samples(samples, "blank", 0, dataset, tmp_path)
    assert [s.id for s in probed] == ["PBL_0002", "MSR_0003", "MSR_0006", "SA_0007", "PBL_0008", "PBL_0011"]
    assert notes == ["6 sample(s) have no image in their answer: nothing to replace, not probed"]
    originals = {s.id: s for s in samples}
    for s in probed:
        original = originals[s.id]
        assert s.question == original.question  # the question's images and all text unchanged
        assert [seg.text for seg in s.answer] == [seg.text for seg in original.answer]
        for new, old in zip(answer_images(s), answer_images(original)):
            assert Path(new).parent == tmp_path
            with Image.open(new) as grey, Image.open(dataset / old) as image:
                assert grey.size == image.size
                assert grey.mode == "RGB" and np.all(np.asarray(grey) == 128)
    assert files_under(dataset) == before  # nothing written among the inputs


def test_shuffle_is_seeded_and_stays_in_the_category(dataset, tmp_path):
    samples = load_samples(dataset / "data.json", dataset)
    owners = {image: s for s in samples for image in answer_images(s)}
    probed, notes = probed_samples(samples, "shuffle", 0, dataset, tmp_path)
    assert [s.id for s in probed] == ["PBL_0002", "MSR_0003", "MSR_0006", "PBL_0008", "PBL_0011"]
    assert notes[1] == ("category 'SA': sample 'SA_0007' is its only sample with answer images, so --probe_images shuffle "
                        "has no other sample's image to give it; not probed")
    for s in probed:
        for image in answer_images(s):
            assert owners[image].category == s.category and owners[image].id != s.id
    assert probed == probed_samples(samples, "shuffle", 0, dataset, tmp_path)[0]  # same seed, same draw
    # ... on any order of the samples (each rank draws the same for a sample)
    assert sorted(probed_samples(samples[::-1], "shuffle", 0, dataset, tmp_path)[0], key=lambda s: s.id) == sorted(probed, key=lambda s: s.id)
    draws = {seed: [answer_images(s) for s in probed_samples(samples, "shuffle", seed, dataset, tmp_path)[0]] for seed in range(5)}
    assert len({json.dumps(d) for d in draws.values()}) > 1  # another seed, another draw
    assert list(tmp_path.iterdir()) == []  # shuffle writes nothing


def own_figures(before: list[dict], after: list[dict]) -> dict:
    """The probe's figures computed from the two passes' records, without infer/probe.py."""
    probed = {r["id"]: r for r in after}
    figures = {}
    for name in ("overall", "text_quality", "image_quality", "text_image_coherence", "style_consistency", "expected_score"):
        get = {"overall": lambda r: r["score"], "expected_score": lambda r: r["expected_score"]}.get(name, lambda r: r["criteria"].get(name))
        pairs = [(get(r), get(probed[r["id"]])) for r in before if r["id"] in probed]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        if not pairs:
            continue
        a, b = np.array(pairs, dtype=float).T
        level_a, level_b = np.round(a), np.round(b)  # an expected score at its nearest level; the others are levels
        tv = 0.5 * sum(abs(np.mean(level_a == level) - np.mean(level_b == level)) for level in range(7))
        figures[name] = {"n": len(pairs), "mean_abs_change": pytest.approx(np.abs(a - b).mean()),
                         "share_changed": pytest.approx(np.mean(level_a != level_b)), "tv_distance": pytest.approx(tv)}
    return figures


def test_reliance_figures_per_criterion_on_known_records():
    def record(id, score, **criteria):
        return judge_result(id, score, criteria=criteria)

    before = [record("a", 3, image_quality=2, text_quality=4), record("b", 5, image_quality=5), record("c", None, image_quality=1),
              record("d", 2, image_quality=2), record("e", 6)]
    after = {r.id: r for r in [record("a", 3, image_quality=0, text_quality=4), record("b", 2, image_quality=5),
                               record("c", 4, image_quality=1), record("d", 2, image_quality=6)]}  # e: not probed
    for r, expected in zip([*before[:4], *after.values()], [2.6, 4.4, 3.6, 2.0, 3.3, 2.2, 3.4, 2.1]):
        r.expected_score = expected  # at their nearest levels: a 3 -> 3, b 4 -> 2, c 4 -> 3, d 2 -> 2
    figures = reliance(before, after, ScoreScale())
    expected = own_figures([r.model_dump() for r in before], [r.model_dump() for r in after.values()])
    assert figures == expected
    assert figures["image_quality"] == {"n": 4, "mean_abs_change": 1.5, "share_changed": 0.5, "tv_distance": 0.5}
    assert figures["overall"]["n"] == 3 and figures["text_quality"]["share_changed"] == 0
    assert figures["expected_score"] == {"n": 4, "mean_abs_change": pytest.approx((0.7 + 2.2 + 0.2 + 0.1) / 4), "share_changed": 0.5,
                                         "tv_distance": 0.5}
    assert barely_moving(figures) == []  # image_quality moved on half of them


@pytest.mark.parametrize("changed, named", [(1, True), (2, False)])
def test_a_judge_whose_image_scores_barely_move_is_named(changed, named):
    # 15 samples: 1 changed is 6.7%, under BARELY_MOVES (10%); 2 changed is 13.3%, over it
    before = [judge_result(f"s{i}", 3, criteria={"image_quality": 3, "text_image_coherence": 4}) for i in range(15)]
    after = {r.id: judge_result(r.id, 3, criteria={"image_quality": 2 if i < changed else 3, "text_image_coherence": 4})
             for i, r in enumerate(before)}
    entry = image_reliance("blank", 0, before, after, [], ScoreScale())
    assert BARELY_MOVES == 0.10
    assert entry["barely_moves"] == (["image_quality", "text_image_coherence"] if named else ["text_image_coherence"])
    assert ("warning: the judge's image_quality scores barely move" in format_reliance(entry)) is named
    # without image criteria (--mode logits), the overall score is judged; where no output parsed, the expected score
    overall_only = {r.id: judge_result(r.id, 3, expected_score=3.0) for r in before}
    assert barely_moving(reliance([judge_result(r.id, 3, expected_score=3.1) for r in before], overall_only, ScoreScale())) == ["overall"]
    unparsed = {r.id: judge_result(r.id, None, expected_score=3.0) for r in before}
    assert barely_moving(reliance([judge_result(r.id, None, expected_score=3.1) for r in before], unparsed, ScoreScale())) == ["expected_score"]


def test_the_probe_writes_figures_that_match_the_two_passes_records(checkpoint, dataset, tmp_path, capsys, monkeypatch):
    before = files_under(dataset)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    assert score(checkpoint, dataset, tmp_path, "--probe_images", "blank") == 0
    main_pass, probe_pass = read(tmp_path), read(tmp_path, "probe_blank.json")
    assert [r["id"] for r in probe_pass] == ["PBL_0002", "MSR_0003", "MSR_0006", "SA_0007", "PBL_0008", "PBL_0011"]
    originals = {r["id"]: r for r in main_pass}
    # same size, so the same tiles and prompt: only the pixels differ
    assert all(r["n_tiles"] == originals[r["id"]]["n_tiles"] and r["prompt_tokens"] == originals[r["id"]]["prompt_tokens"] for r in probe_pass)
    assert any(r["score_distribution"] != originals[r["id"]]["score_distribution"] for r in probe_pass)
    entry = read(tmp_path, "summary.json")["image_reliance"]
    assert entry["criteria"] == own_figures(main_pass, probe_pass) and set(entry["criteria"]) == {"overall", "expected_score"}  # logits: no criteria
    assert entry["probed"] == 6 and entry["probe"] == "blank" and entry["seed"] is None
    assert entry["barely_moves"] == (["overall"] if entry["criteria"]["overall"]["share_changed"] < 0.1 else [])
    with Image.open(tmp_path / "probe_blank.png") as plot:
        assert plot.format == "PNG"
    out = capsys.readouterr().out
    assert "Image reliance, answer images blanked (mid-grey): 6 sample(s) scored again" in out
    assert f"overall: mean |change| {entry['criteria']['overall']['mean_abs_change']:.3f}" in out
    assert files_under(dataset) == before  # the grey images went elsewhere
    # and are gone with the run
    assert list((tmp_path / "tmp").iterdir()) == []


def test_shuffle_through_judge_score_names_the_lone_category(checkpoint, dataset, tmp_path, capsys):
    assert score(checkpoint, dataset, tmp_path, "--probe_images", "shuffle", "--probe_seed", "3") == 0
    probe_pass = read(tmp_path, "probe_shuffle.json")
    assert [r["id"] for r in probe_pass] == ["PBL_0002", "MSR_0003", "MSR_0006", "PBL_0008", "PBL_0011"]
    entry = read(tmp_path, "summary.json")["image_reliance"]
    assert entry["seed"] == 3 and entry["criteria"] == own_figures(read(tmp_path), probe_pass)
    assert "category 'SA': sample 'SA_0007' is its only sample with answer images" in capsys.readouterr().out


def test_probe_flags_that_cannot_work_are_refused_before_the_model_loads(dataset, tmp_path, capsys):
    assert score(tmp_path / "no-checkpoint", dataset, tmp_path / "out", "--probe_images", "blank", "--probe_seed", "1") == 2
    assert "--probe_seed applies to the shuffle and noise probes only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        score(tmp_path / "no-checkpoint", dataset, tmp_path / "out", "--probe_images", "grey")
    assert refused.value.code == 2
    # the probe's files are outputs: an input there would be overwritten
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "probe_blank.json").write_text(json.dumps(json.loads((dataset / "data.json").read_text())))
    capsys.readouterr()
    assert main(["--model_path", str(tmp_path / "no-checkpoint"), "--input_dir", str(dataset), "--input_file", str(tmp_path / "out" / "probe_blank.json"),
                 "--output_dir", str(tmp_path / "out"), "--probe_images", "blank"]) == 2
    assert "would overwrite" in capsys.readouterr().err
    assert score(tmp_path / "no-checkpoint", dataset, tmp_path / "out2", "--probe_images", "shuffle", "--output_file", "probe_shuffle.json") == 2
    assert "--output_file probe_shuffle.json: --probe_images shuffle writes its own results there" in capsys.readouterr().err


@pytest.mark.slow
def test_the_probe_resumes_after_a_kill_without_rescoring(checkpoint, dataset, tmp_path, wait_for_lines):
    out = tmp_path / "out"
    args = [sys.executable, "-m", "mmjudge.infer.cli", "--model_path", str(checkpoint), "--input_dir", str(dataset), "--input_file", "data.json",
            "--output_dir", str(out), "--max_new_tokens", "24", "--max_tiles", "2", "--token_budget", "1", "--probe_images", "blank"]  # batch size 1
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # a killed run leaves its grey images behind: here, not in /tmp
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    probe_journal = out / "probe_blank.json.journal.rank0.jsonl"
    assert wait_for_lines(probe_journal, 2, proc)  # the main pass is done, the probe's under way
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    journal_lines = lambda path: [json.loads(line) for line in path.read_text().splitlines()[1:] if line.endswith("}")]  # noqa: E731
    main_done, probe_done = journal_lines(out / "eval_result.json.journal.rank0.jsonl"), journal_lines(probe_journal)
    assert len(main_done) == 12 and 1 <= len(probe_done) < 6
    rerun = subprocess.run(args, capture_output=True, text=True, env=env)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "resuming: 12 sample(s) already scored for eval_result.json" in rerun.stderr
    assert f"resuming: {len(probe_done)} sample(s) already scored for probe_blank.json" in rerun.stderr
    # each sample journaled once in each pass: nothing was scored again
    assert len(journal_lines(out / "eval_result.json.journal.rank0.jsonl")) == 12
    rescored = journal_lines(probe_journal)
    assert len(rescored) == len({r["id"] for r in rescored}) == 6
    probed = {r["id"]: r for r in json.loads((out / "probe_blank.json").read_text())}
    assert all(probed[r["id"]] == JudgeResult.model_validate(r).model_dump(exclude=CALIBRATOR_FIELDS) for r in probe_done)
    entry = json.loads((out / "summary.json").read_text())["image_reliance"]
    assert entry["criteria"] == own_figures(json.loads((out / "eval_result.json").read_text()), list(probed.values()))


@pytest.mark.slow
def test_the_probe_through_a_server_gives_the_local_probes_records(checkpoint, dataset, tmp_path):
    """--backend openai sends the grey images as it sends any image, read from the run's temporary directory."""
    port = free_port()
    server = start_server(["--model_path", str(checkpoint), "--max_new_tokens", "6", "--max_tiles", "2"], port, tmp_path / "serve.log",
                          {**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        args = ["--model_path", str(checkpoint), "--input_dir", str(dataset), "--input_file", "data.json", "--max_new_tokens", "6",
                "--max_tiles", "2", "--probe_images", "blank"]
        assert main([*args, "--output_dir", str(tmp_path / "local")]) == 0
        assert main([*args, "--output_dir", str(tmp_path / "remote"), "--backend", "openai", "--base_url", f"http://127.0.0.1:{port}/v1"]) == 0
    finally:
        server.terminate()
        server.wait(timeout=HANG_S)
    local, remote = read(tmp_path / "local", "probe_blank.json"), read(tmp_path / "remote", "probe_blank.json")
    # a chat API gives no distribution after a parse failure, nor the tiles (docs/openai-scoring.md), nor the judge's weights to fingerprint;
    # all else is the local record
    same = lambda r: {k: v for k, v in r.items() if k not in ("score_distribution", "expected_score", "n_tiles", "judge_fingerprint")}  # noqa: E731
    assert len(remote) == 6 and [same(r) for r in remote] == [same(r) for r in local]


@pytest.mark.slow
def test_under_torchrun_the_probe_draws_and_scores_as_one_process(checkpoint, dataset, tmp_path):
    """Each rank draws the shuffle for its own samples: the draw depends on the seed and the sample only."""
    probe = ["--mode", "logits", "--max_tiles", "2", "--probe_images", "shuffle", "--probe_seed", "7"]
    assert score(checkpoint, dataset, tmp_path / "single", *probe) == 0
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "mmjudge.infer.cli", "--model_path", str(checkpoint),
           "--input_dir", str(dataset), "--input_file", "data.json", "--output_dir", str(tmp_path / "multi"), *FAST, *probe]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=HANG_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "multi").glob("probe_shuffle.json.journal.*")) == [
        "probe_shuffle.json.journal.rank0.jsonl", "probe_shuffle.json.journal.rank1.jsonl"]
    single, multi = read(tmp_path / "single", "probe_shuffle.json"), read(tmp_path / "multi", "probe_shuffle.json")
    assert [(r["id"], r["score"], r["n_tiles"], r["prompt_tokens"]) for r in multi] == [(r["id"], r["score"], r["n_tiles"], r["prompt_tokens"]) for r in single]
    for m, s in zip(multi, single):
        assert m["score_distribution"] == pytest.approx(s["score_distribution"], abs=1e-5)
    assert read(tmp_path / "multi", "summary.json")["image_reliance"]["criteria"] == own_figures(read(tmp_path / "multi"), multi)
