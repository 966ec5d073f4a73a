"""The pickles of a checkpoint judge-train resumes from: never unpickled with arbitrary globals, and a
planted one named before any model loads. (A real DeepSpeed resume, planted and clean: test_deepspeed.py.)"""

import pickle

import torch
from deepspeed.runtime.fp16.loss_scaler import LossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address

from mmjudge.judge.cli import run
from mmjudge.judge.testing import Planted
from mmjudge.train.checkpoints import unsafe_pickles


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
