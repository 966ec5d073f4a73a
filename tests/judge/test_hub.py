"""Checkpoints named by Hugging Face Hub ids, resolved through a real huggingface_hub cache that the tests
write offline in its documented layout (mmjudge.judge.testing.write_hub_cache); the Hub itself is never reached."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from huggingface_hub.utils import filter_repo_objects

import mmjudge.judge.hub
from mmjudge.infer.cli import main as score_main
from mmjudge.judge.model import CHECKPOINT_FILES, REMOTE_CODE, load_judge, original_base
from mmjudge.judge.testing import HANG_S, write_dataset, write_hub_cache, write_original_checkpoint

REPO = "org/tiny-judge"
FAST = ["--max_new_tokens", "4", "--max_tiles", "2", "--workers", "1"]
# The files of OpenGVLab/InternVL2-4B on the Hub (MMIE-Eval's are the same), and pickled weights as other
# repositories carry them beside or instead of safetensors.
INTERNVL2_4B_FILES = [
    ".gitattributes", "README.md", "added_tokens.json", "config.json", "configuration_intern_vit.py", "configuration_internvl_chat.py",
    "configuration_phi3.py", "conversation.py", "examples/image1.jpg", "examples/image2.jpg", "examples/red-panda.mp4",
    "generation_config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
    "modeling_intern_vit.py", "modeling_internvl_chat.py", "modeling_phi3.py", "special_tokens_map.json", "tokenizer.model",
    "tokenizer_config.json", "pytorch_model.bin", "pytorch_model-00001-of-00002.bin", "pytorch_model.bin.index.json",
]
FETCHED = {"added_tokens.json", "config.json", "conversation.py", "generation_config.json", "model-00001-of-00002.safetensors",
           "model-00002-of-00002.safetensors", "model.safetensors.index.json", "special_tokens_map.json", "tokenizer.model", "tokenizer_config.json"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), 3, seed=0).parent


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty cache as huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE=1 (at import, hence its constants),
    and a working directory where no directory is named like a Hub id."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "hub"


def score(model_path, data, out, *extra):
    return score_main(["--model_path", str(model_path), "--input_dir", str(data), "--input_file", "data.json", "--output_dir", str(out), *FAST, *extra])


def results(out):
    return json.loads((Path(out) / "eval_result.json").read_text())


def weights(judge):
    return judge.model.state_dict()["lm_head.weight"]


@pytest.mark.slow
def test_judge_score_takes_a_hub_id_from_the_cache_under_hf_home_offline(checkpoint, data, tmp_path):
    """As a user runs it: HF_HOME and HF_HUB_OFFLINE in the environment of a new process."""
    write_hub_cache(tmp_path / "hf" / "hub", REPO, checkpoint)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    args = ["--input_dir", str(data), "--input_file", "data.json", *FAST]
    run = subprocess.run([sys.executable, "-m", "mmjudge.infer.cli", "--model_path", REPO, "--output_dir", str(tmp_path / "hub-out"), *args],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_S)
    assert run.returncode == 0, run.stderr
    assert f"{REPO} (revision main): {tmp_path / 'hf' / 'hub' / 'models--org--tiny-judge' / 'snapshots'}" in run.stderr
    assert score(checkpoint, data, tmp_path / "local-out") == 0
    # the same records; the distributions to float32's last digits, which the CPU threads each run takes
    # (as many as cores are free when it starts: judge/cpu.py) may order differently
    hub, local = results(tmp_path / "hub-out"), results(tmp_path / "local-out")
    without = lambda r: {k: v for k, v in r.items() if k not in ("score_distribution", "expected_score")}  # noqa: E731
    assert [without(r) for r in hub] == [without(r) for r in local]
    for a, b in zip(hub, local):
        assert a["score_distribution"] == pytest.approx(b["score_distribution"], abs=1e-6)


def test_an_id_missing_from_the_offline_cache_is_one_line_and_exit_2(data, offline_cache, capsys):
    assert score("org/missing", data, "out") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: --model_path org/missing: no local directory of that name, and revision main of that Hub id is not (fully) in the "
                     f"Hugging Face cache {offline_cache} (HF_HUB_OFFLINE is set); unset HF_HUB_OFFLINE to fetch it, or "
                     "`hf download org/missing --revision main` where the Hub is reachable, into the same cache"]
    assert not Path("out").exists()


def test_a_damaged_cache_entry_is_named_as_such(checkpoint, data, offline_cache, capsys):
    """An empty refs file and a snapshot that is a file: huggingface_hub returns a path for both, which was
    then refused as 'no config.json' (the snapshots folder) or as 'not a local directory, nor a Hub id'."""
    snapshot = write_hub_cache(offline_cache, REPO, checkpoint)
    ref = offline_cache / "models--org--tiny-judge" / "refs" / "main"
    fix = f"remove it and fetch {REPO} again (`hf download {REPO} --revision main`)"
    ref.write_text("")
    assert score(REPO, data, "out") == 2
    assert capsys.readouterr().err == f"error: --model_path {REPO}: {ref}: names no commit (an empty file in the Hugging Face cache); {fix}\n"
    ref.write_text(snapshot.name)
    for file in snapshot.iterdir():
        file.unlink()
    snapshot.rmdir()
    snapshot.write_text("")
    assert score(REPO, data, "out") == 2
    assert capsys.readouterr().err == f"error: --model_path {REPO}: {snapshot}: a file where the Hugging Face cache keeps the folder of revision main; {fix}\n"
    assert not Path("out").exists()


def test_revision_picks_a_branch_tag_or_commit(tmp_path, offline_cache):
    main = write_hub_cache(offline_cache, REPO, write_original_checkpoint(tmp_path / "a", seed=0))
    tagged = write_hub_cache(offline_cache, REPO, write_original_checkpoint(tmp_path / "b", seed=1), revision="v1")
    assert main.name != tagged.name
    a, b = weights(load_judge(tmp_path / "a")), weights(load_judge(tmp_path / "b"))
    assert torch.equal(weights(load_judge(REPO)), a)
    assert torch.equal(weights(load_judge(REPO, revision="v1")), b)
    assert torch.equal(weights(load_judge(REPO, revision=main.name)), a)


def test_a_local_directory_of_the_same_name_wins(tmp_path, offline_cache, capsys):
    write_hub_cache(offline_cache, REPO, write_original_checkpoint(tmp_path / "cached", seed=0))
    local = write_original_checkpoint(Path(REPO), seed=1)  # ./org/tiny-judge
    assert torch.equal(weights(load_judge(REPO)), weights(load_judge(local)))
    load_judge(REPO, revision="v1")
    assert "note: org/tiny-judge is a local directory and is used as it is; revision v1 applies to Hub ids only" in capsys.readouterr().err


@pytest.mark.parametrize("name, message", [("a/b/c", "--model_path a/b/c: not a local directory, nor a Hugging Face Hub id (org/name)"),
                                           ("", "--model_path: an empty checkpoint name: give a local directory or a Hugging Face Hub id (org/name)")])
def test_a_name_that_is_neither_a_directory_nor_an_id_is_a_user_error(data, offline_cache, capsys, name, message):
    assert score(name, data, "out") == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {message}"]


def test_a_resumed_hub_run_is_the_same_commit(checkpoint, tmp_path, data, offline_cache, capsys):
    """The journal's fingerprint names the snapshot, hence the commit: a rerun resumes; after main moved on
    to another commit, the journal is refused as another model's."""
    write_hub_cache(offline_cache, REPO, checkpoint)
    assert score(REPO, data, "out") == 0
    assert score(REPO, data, "out") == 0
    assert "resuming: 3 sample(s) already scored" in capsys.readouterr().err
    write_hub_cache(offline_cache, REPO, write_original_checkpoint(tmp_path / "retrained", seed=1))
    assert score(REPO, data, "out") == 2
    assert "was written by a run with other settings (the judge's folder, the judge's weight files); " in capsys.readouterr().err


@pytest.fixture
def hub_of_internvl2_4b(tmp_path, monkeypatch):
    """The Hub as snapshot_download reaches it, serving a tiny checkpoint under InternVL2-4B's file names
    (the files the loader never reads are stand-ins, and its code raises if run); returns the allow
    patterns each download asked with."""
    published = write_original_checkpoint(tmp_path / "published", seed=0, shards=2)
    (published / "conversation.py").write_text(
        "raise SystemExit('this file must never run')\n"
        "register_conv_template(Conversation(name='phi3-chat', system_message='You are a careful judge.', sep='<|end|>'))\n")
    for name in INTERNVL2_4B_FILES:
        if not (published / name).exists():
            (published / name).parent.mkdir(parents=True, exist_ok=True)
            (published / name).write_text("raise SystemExit('executed')\n" if name.endswith(".py") else "not for the loader")
    asked = []

    def download(repo_id, *, revision, allow_patterns, local_files_only=False):  # hands out the files that match, as snapshot_download does
        asked.append(allow_patterns)
        snapshot = tmp_path / "hub" / revision
        for name in filter_repo_objects(INTERNVL2_4B_FILES, allow_patterns=allow_patterns):
            (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
            (snapshot / name).write_bytes((published / name).read_bytes())
        return str(snapshot)

    monkeypatch.setattr(mmjudge.judge.hub, "snapshot_download", download)
    monkeypatch.chdir(tmp_path)
    return asked


def test_the_loader_fetches_its_own_files_only_never_code_or_pickles(hub_of_internvl2_4b):
    """What is asked of the download: huggingface_hub's own matcher over InternVL2-4B's files keeps the
    weights, config, tokenizer and conversation.py, and no other .py and no .bin; and those files load."""
    judge_ = load_judge("OpenGVLab/InternVL2-4B")
    assert hub_of_internvl2_4b == [list(CHECKPOINT_FILES)]
    fetched = set(filter_repo_objects(INTERNVL2_4B_FILES, allow_patterns=hub_of_internvl2_4b[0]))
    assert fetched == FETCHED
    assert not [f for f in fetched if f.endswith(".bin") or (f.endswith(".py") and f != "conversation.py")]
    assert judge_.source_format == "original" and judge_.settings.system == "You are a careful judge."  # read as data


def test_the_original_format_export_fetches_the_base_code_as_files_and_still_no_pickles(hub_of_internvl2_4b, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "OpenGVLab/InternVL2-4B", "revision": "0" * 40}))
    base = original_base(adapter)
    assert hub_of_internvl2_4b == [list(CHECKPOINT_FILES + REMOTE_CODE)]
    code = {f for f in INTERNVL2_4B_FILES if f.endswith(".py")}
    assert set(filter_repo_objects(INTERNVL2_4B_FILES, allow_patterns=hub_of_internvl2_4b[0])) == FETCHED | code
    assert {f.name for f in base.iterdir() if f.suffix == ".py"} == code  # copied by the export, never imported
