"""One run at a time in an output directory, no output in place of an input, and atomic writes that two
writers cannot tear."""

import errno
import json
import subprocess
import sys
import threading

import pytest

from mmjudge.judge.cli import run
from mmjudge.judge.data import UsageError
from mmjudge.judge.data import write_json_atomically
from mmjudge.judge.outputs import LOCK_FILE, locked, overwritten_inputs, written_whole


def test_a_second_run_on_a_directory_in_use_is_refused_naming_the_first(tmp_path):
    with locked(tmp_path / "out", "judge-score"):
        with pytest.raises(UsageError, match=r"--output_dir .*out is in use by judge-score \(pid \d+ on .*\); wait for it to end"):
            with locked(tmp_path / "out", "judge-calibrate"):
                pass
    with locked(tmp_path / "out", "judge-calibrate"):  # released at the end of the first run
        pass


def test_a_run_killed_with_kill_9_leaves_no_lock_behind(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom mmjudge.judge.outputs import locked\n"
                               f"with locked(Path({str(tmp_path)!r}), 'judge-train'):\n    print('held', flush=True)\n    time.sleep(600)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(UsageError, match="is in use by judge-train"):
            with locked(tmp_path, "judge-score"):
                pass
    finally:
        holder.kill()
        holder.wait()
    with locked(tmp_path, "judge-score"):
        pass


def test_a_directory_that_cannot_be_written_is_a_user_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=r"--output_dir .*file/out: cannot write there \(Not a directory\)"):
        with locked(tmp_path / "file" / "out", "judge-score"):
            pass


def test_an_input_an_output_would_replace_or_delete_is_named(tmp_path):
    out = tmp_path / "out"
    (out / "plots").mkdir(parents=True)
    for name in ("summary.json", "r.json.journal.rank3.jsonl", "plots/x.png", "notes.json", LOCK_FILE):
        (out / name).write_text("{}")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    written = ["summary.json", "r.json.journal.rank*.jsonl", "plots/*"]
    inputs = [("--a", out / "summary.json"), ("--b", out / "r.json.journal.rank3.jsonl"), ("--c", out / "plots" / "x.png"),
              ("--d", out / "notes.json"), ("--e", out / LOCK_FILE), ("--f", tmp_path / "model"), ("--g", None), ("--h", tmp_path / "missing")]
    problems = overwritten_inputs(out, written, inputs)
    assert [p.split(":")[0] for p in problems] == [f"--a {out / 'summary.json'}", f"--b {out / 'r.json.journal.rank3.jsonl'}",
                                                   f"--c {out / 'plots' / 'x.png'}", f"--e {out / LOCK_FILE}"]
    assert problems[0] == (f"--a {out / 'summary.json'}: this run would overwrite {out / 'summary.json'}, one of its inputs; "
                           "give another output directory, or move the input")
    # A checkpoint directory stands for its files: writing into it (not beside it) is refused.
    assert overwritten_inputs(tmp_path / "model", ["*"], [("--model_path", tmp_path / "model")]) != []
    assert overwritten_inputs(tmp_path, ["*"], [("--model_path", tmp_path / "model")]) == []


def test_two_writers_of_one_file_never_share_a_temporary_file(tmp_path):
    target = tmp_path / "summary.json"
    other = tmp_path / ".summary.json.tmp"  # the fixed name another writer once had open
    other.write_text("another writer's half-written file")
    write_json_atomically(target, {"n": 1})
    assert other.read_text() == "another writer's half-written file" and json.loads(target.read_text()) == {"n": 1}
    errors = []

    def write_many(k):
        try:
            for i in range(200):
                write_json_atomically(target, {"writer": k, "i": i})
        except Exception as err:  # noqa: BLE001  (collected for the assertion)
            errors.append(err)

    threads = [threading.Thread(target=write_many, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and json.loads(target.read_text())["i"] == 199
    assert sorted(p.name for p in tmp_path.iterdir()) == [".summary.json.tmp", "summary.json"]


@pytest.mark.parametrize("code, strerror", [(errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system"),
                                            (errno.EACCES, "Permission denied")])
def test_a_full_disk_or_a_read_only_directory_is_one_line_and_exit_2(capsys, code, strerror):
    def main(argv):
        raise OSError(code, strerror, "out/eval_result.json")

    assert run(main, []) == 2
    assert capsys.readouterr().err == f"error: out/eval_result.json: {strerror}\n"


def test_a_directory_written_whole_appears_only_once_complete(tmp_path):
    out = tmp_path / "export"
    with pytest.raises(OSError, match="No space left"):
        with written_whole(out) as staging:
            (staging / "model.safetensors").write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")  # as a full disk stops an export
    assert list(tmp_path.iterdir()) == []  # nothing half-written, so a rerun is not refused a non-empty directory
    out.mkdir()  # new or empty: both taken
    with written_whole(out) as staging:
        (staging / "config.json").write_text("{}")
        assert not (out / "config.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["export"] and (out / "config.json").read_text() == "{}"
    with pytest.raises(UsageError, match="something was written there while this run wrote"):
        with written_whole(out) as staging:
            (staging / "config.json").write_text("{}")
    assert [p.name for p in tmp_path.iterdir()] == ["export"]


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_a_lock_or_journal_planted_as_a_link_or_fifo_is_refused_and_its_target_untouched(tmp_path, planted):
    """Whoever can write a shared --output_dir could link the run's lock or journal to a file of the user's,
    which the run emptied (the lock) or appended to (the journal); a FIFO there hung it."""
    import os

    from mmjudge.infer.journal import Journal, read_finished

    target = tmp_path / "precious.json"
    target.write_text('{"keep": true}')
    for name in (LOCK_FILE, "r.json.journal.rank0.jsonl"):
        out = tmp_path / f"out-{planted}-{name}"
        out.mkdir()
        if planted == "link":
            (out / name).symlink_to(target)
        else:
            os.mkfifo(out / name)
        with pytest.raises(UsageError, match=f"--output_dir {out}: {name} there (is a link|is not a regular file)"):
            if name == LOCK_FILE:
                with locked(out, "test"):
                    pass
            else:
                read_finished(out, "r.json", "fp")
        if name != LOCK_FILE:
            with pytest.raises(UsageError, match=f"--output_dir {out}: {name} there (is a link|is not a regular file)"):
                Journal(out, "r.json", 0, "fp")
    assert target.read_text() == '{"keep": true}'


def test_judge_score_never_writes_over_an_image_or_the_config_it_reads(tmp_path, capsys):
    """--output_dir and --output_file chosen onto an image of the input, or onto --config: both were
    overwritten with results (only the input file, rubrics, calibrator and checkpoint were checked)."""
    from mmjudge.infer.cli import main as score_main
    from mmjudge.judge.testing import write_dataset

    data = write_dataset(tmp_path / "data", 2, seed=0).parent
    image = sorted((data / "images").iterdir())[0]
    before = image.read_bytes()
    base = ["--model_path", str(tmp_path / "no-model"), "--input_dir", str(data), "--input_file", "data.json"]
    assert score_main([*base, "--output_dir", str(image.parent), "--output_file", image.name]) == 2
    assert f"--input_file's image {image}: this run would overwrite {image}" in capsys.readouterr().err
    config = tmp_path / "cfg" / "score.yaml"
    config.parent.mkdir()
    config.write_text("max_new_tokens: 8\n")
    assert score_main([*base, "--config", str(config), "--output_dir", str(config.parent), "--output_file", config.name]) == 2
    assert f"--config {config}: this run would overwrite {config}" in capsys.readouterr().err
    assert image.read_bytes() == before and config.read_text() == "max_new_tokens: 8\n"


def test_judge_score_never_writes_over_the_milebench_annotation_it_reads(tmp_path, capsys):
    """--output_file named as the dataset's annotation, in its folder: the results replaced MileBench's
    `<dataset>.json` (only --input_file and its images were checked)."""
    from mmjudge.infer.cli import main as score_main
    from tests.judge.test_formats import MILEBENCH, milebench_annotation, milebench_record

    milebench_annotation(tmp_path, "ALFRED", {1: 2})
    annotation = tmp_path / MILEBENCH / "ALFRED" / "ALFRED.json"
    before = annotation.read_bytes()
    pred = tmp_path / "outputs" / "my-model" / "ALFRED" / "pred.json"
    pred.parent.mkdir(parents=True)
    pred.write_text(json.dumps([milebench_record(1, 2)]))
    code = score_main(["--model_path", str(tmp_path / "no-model"), "--input_dir", str(tmp_path), "--input_file", str(pred),
                       "--output_dir", str(annotation.parent), "--output_file", annotation.name])
    assert code == 2
    assert f"--input_file's MileBench annotation {annotation}: this run would overwrite {annotation}" in capsys.readouterr().err
    assert annotation.read_bytes() == before
