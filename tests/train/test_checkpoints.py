"""The pickles of a checkpoint judge-train resumes from: never unpickled with arbitrary globals, and a
planted one named before any model loads. (A real DeepSpeed resume, planted and clean: test_deepspeed.py.)"""

import json
import pickle

import torch
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

from mmjudge.judge.cli import run
from mmjudge.judge.testing import Planted
from mmjudge.train.checkpoints import data_order_problems, read_data_order, unsafe_pickles, write_data_order


def test_no_command_unpickles_a_planted_object_even_where_a_library_asks_for_any_global(tmp_path, capsys):
    # DeepSpeed loads its checkpoints with torch.load(weights_only=False): that object ran on --resume.
    torch.save({"module": {"w": torch.ones(2)}, "planted": Planted(tmp_path / "ran")}, tmp_path / "mp_rank_00_model_states.pt")
    assert run(lambda argv: torch.load(tmp_path / "mp_rank_00_model_states.pt", weights_only=False), []) == 1
    assert not (tmp_path / "ran").exists()
    assert "Weights only load failed" in capsys.readouterr().err


def test_a_planted_pickle_is_named_and_deepspeeds_own_types_are_not(tmp_path):
    step = tmp_path / "checkpoint-2" / "global_step2"
    step.mkdir(parents=True)
    # What a ZeRO-2 checkpoint's optimizer shard holds besides tensors (a real one: test_deepspeed.py).
    torch.save({"loss_scaler": LossScaler(scale=1.0), "zero_stage": ZeroStageEnum.gradients,
                "param_slice_mappings": [{"w": fragment_address(numel=4, start=0)}], "state": {"step": torch.tensor(2)}},
               step / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    torch.save({"python": (3, (1, 2), None)}, tmp_path / "checkpoint-2" / "rng_state_0.pth")
    assert unsafe_pickles(tmp_path / "checkpoint-2") == []
    torch.save({"module": {}, "planted": Planted(tmp_path / "ran")}, step / "mp_rank_00_model_states.pt")
    (tmp_path / "checkpoint-2" / "scheduler.pt").write_bytes(pickle.dumps(Planted(tmp_path / "ran")))  # not torch.save's archive
    problems = unsafe_pickles(tmp_path / "checkpoint-2")
    assert problems[0].startswith(f"{step / 'mp_rank_00_model_states.pt'}: holds pickled io.open, which no checkpoint of judge-train holds; "
                                  "refused, since unpickling it could run any code")
    assert problems[1].startswith(f"{tmp_path / 'checkpoint-2' / 'scheduler.pt'}: not a checkpoint as torch.save writes it")
    assert len(problems) == 2 and not (tmp_path / "ran").exists()


def test_a_deepspeed_latest_file_naming_a_folder_outside_the_checkpoint_is_refused(tmp_path):
    """DeepSpeed reads its shards from the folder `latest` names: outside the checkpoint, pickles no scan saw."""
    checkpoint = tmp_path / "checkpoint-2"
    (checkpoint / "global_step2").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (checkpoint / "latest").write_text("global_step2")
    assert unsafe_pickles(checkpoint) == []
    for tag in ("../elsewhere", str(tmp_path / "elsewhere"), "..", "", "global_step9"):
        (checkpoint / "latest").write_text(tag)
        assert unsafe_pickles(checkpoint) == [f"{checkpoint / 'latest'}: names {tag!r}, not a folder of this checkpoint; "
                                              "DeepSpeed would load its shards from there (was it planted?)"]


def test_a_deepspeed_tag_folder_linked_to_elsewhere_is_refused_and_scanned_behind_the_link(tmp_path):
    """`latest` naming global_step2, a link in the checkpoint to a folder outside it: it passed the outside
    check (the name was a folder here), and the scan, which did not follow links, never saw the planted pickle."""
    checkpoint, elsewhere = tmp_path / "checkpoint-2", tmp_path / "elsewhere"
    checkpoint.mkdir()
    elsewhere.mkdir()
    torch.save({"module": {}, "planted": Planted(tmp_path / "ran")}, elsewhere / "mp_rank_00_model_states.pt")
    (checkpoint / "global_step2").symlink_to(elsewhere, target_is_directory=True)
    (checkpoint / "latest").write_text("global_step2")
    (checkpoint / "loop").symlink_to(checkpoint, target_is_directory=True)  # a link cycle is walked once
    problems = unsafe_pickles(checkpoint)
    assert problems == [
        f"{checkpoint / 'latest'}: names 'global_step2', not a folder of this checkpoint; DeepSpeed would load its shards from there (was it planted?)",
        f"{checkpoint / 'global_step2' / 'mp_rank_00_model_states.pt'}: holds pickled io.open, which no checkpoint of judge-train holds; "
        "refused, since unpickling it could run any code (was it planted?)",
    ]
    assert not (tmp_path / "ran").exists()


def test_the_data_order_a_checkpoint_holds_is_read_back_and_anything_else_named(tmp_path):
    drawn = (3, torch.get_rng_state())
    write_data_order(tmp_path, drawn)
    epoch, state = read_data_order(tmp_path)
    assert epoch == 3 and torch.equal(state, drawn[1]) and data_order_problems(tmp_path) == []
    file = tmp_path / "data_order.json"
    for content, says in [("[1, 2]", "not the data order judge-train writes"), ('{"epoch": 1, "rng_state": "AAAA"}', "rng_state 5,056 bytes, got 1 and 3 bytes"),
                          ('{"epoch": -1, "rng_state": "%s"}' % json.loads(file.read_text())["rng_state"], "got -1 and 5,056 bytes"),
                          (" " * 20_000, "20,000 bytes, not the data order judge-train writes")]:
        file.write_text(content)
        [problem] = data_order_problems(tmp_path)
        assert problem.startswith(f"{file}: ") and says in problem
    file.unlink()
    assert read_data_order(tmp_path) is None  # a checkpoint saved before there was one
