"""judge-train --objective grpo: TRL's GRPOTrainer on a judge, both orders of each pair among the completions
rewarded together, refused before the model loads where it cannot run, and resumed to the run it resumes."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.data import load_pairs
from mmjudge.judge.testing import write_pairs
from mmjudge.train.cli import main as train_main
from mmjudge.train.data import merge_pair_annotators
from mmjudge.train.config import TrainConfig
from mmjudge.train.grpo import BothOrders, GRPOJudgeTrainer, grpo_arguments
from trl.trainer.utils import RepeatSampler

# IntJudge's reading (verdict format opening) finds a verdict, a tie, in any text holding an A or a B: the tiny
# random judge's completions differ in reward, and GRPO has advantages to learn from.
RUBRIC = ("kind: pairwise\ncategory: general\nverdict_format: opening\ninstructions: Which answer is better?\n"
          "template: \"{instructions}\\n{question}\\nA: {answer_a}\\nB: {answer_b}\\n\"\n")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    records = json.loads(write_pairs(root, 8, seed=1, annotated=True, text_only=True, rationale=False).read_text())
    (root / "train.json").write_text(json.dumps(records))
    (root / "general.yaml").write_text(RUBRIC)
    return root


def train_args(base, data, out, *extra):
    return ["--model_path", str(base), "--train_file", str(data / "train.json"), "--input_dir", str(data), "--output_dir", str(out),
            "--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", str(data / "general.yaml"), "--objective", "grpo",
            "--num_generations", "2", "--per_device_batch_size", "4", "--max_completion_length", "8", "--learning_rate", "1e-2",
            "--logging_steps", "1", *extra]


def test_the_sampler_draws_both_orders_of_each_pair_together():
    pairs = RepeatSampler(range(3), mini_repeat_count=2, batch_size=1, repeat_count=2, shuffle=True, seed=0)
    drawn = list(BothOrders(pairs, 2))
    assert len(drawn) == len(BothOrders(pairs, 2)) == 24
    for group in range(0, len(drawn), 4):  # a pair's forward row twice, then its reverse row twice
        forward = drawn[group]
        assert forward % 2 == 0 and drawn[group:group + 4] == [forward, forward, forward + 1, forward + 1]
    assert sorted(set(drawn)) == list(range(6))


def test_the_sampling_settings_reach_trls_generation(tmp_path):
    cfg = TrainConfig(objective="grpo", num_generations=2, per_device_batch_size=4, temperature=1.0, min_p=0.1, max_completion_length=8)
    args = grpo_arguments(cfg, tmp_path, None, (5, 7))
    assert (args.temperature, args.min_p, args.num_generations, args.max_completion_length) == (1.0, 0.1, 2, 8)
    assert args.generation_kwargs == {"eos_token_id": [5, 7]}
    assert grpo_arguments(TrainConfig(objective="grpo"), tmp_path, None, (5,)).min_p is None  # 0: TRL's own "no truncation"


def test_what_grpo_cannot_run_is_refused_before_the_model_loads(data, annotated, tmp_path, capsys):
    args = train_args(tmp_path / "no-model", data, tmp_path / "out")
    samples = [*args[:3], str(annotated / "train.json"), *args[4:]]
    assert train_main(samples) == 2
    assert "objective grpo learns from pairs with a preference" in capsys.readouterr().err
    assert train_main([*args, "--eval_file", str(data / "train.json")]) == 2
    assert "objective grpo keeps the last step's weights and evaluates nothing during the run" in capsys.readouterr().err
    assert train_main([*args, "--per_device_batch_size", "3"]) == 2
    assert "= 3 completions per process per step must be a multiple of 2 x num_generations = 4" in capsys.readouterr().err
    assert train_main([*args, "--rewards", "verdict", "length"]) == 2
    assert "rewards: unknown reward 'length'" in capsys.readouterr().err
    assert train_main([*args, "--min_p", "1"]) == 2
    assert "min_p" in capsys.readouterr().err
    assert train_main([*args, "--temperature", "0"]) == 2  # transformers refused it once the model had loaded
    assert "temperature must be a finite number above 0, got 0" in capsys.readouterr().err
    for generations in ("0", "1"):  # 0 divided by zero in the batch check
        assert train_main([*args, "--num_generations", generations]) == 2
        assert f"num_generations must be a whole number of at least 2, got {generations}" in capsys.readouterr().err
    sft = [*args[:args.index("--objective")], *args[args.index("--objective") + 2:]]
    assert train_main(sft) == 2
    assert "--num_generations 2: a GRPO setting, but this run trains by sft" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_two_steps_reward_the_judge_and_save_it_merged(checkpoint, data, tmp_path, capsys):
    """With the docs' KL term, in a full fine-tune (TRL loaded its reference from the model's config._name_or_path,
    which a judge loaded by load_judge lacks: "Repo id must use alphanumeric chars: ''")."""
    out = tmp_path / "out"
    assert train_main(train_args(checkpoint, data, out, "--max_steps", "2", "--save_steps", "2", "--kl_beta", "0.1", "--warmup_ratio", "0")) == 0
    said = capsys.readouterr()
    assert "(steps: 2, the last step's weights" in said.out
    assert "step 2/2 (epoch" in said.err and ", reward " in said.err  # the step's line says its mean reward
    history = json.loads((out / "reward_history.json").read_text())
    assert [h["step"] for h in history] == [1, 2]
    assert all({"rewards/verdict/mean", "rewards/format/mean", "rewards/swap_consistency/mean", "reward"} <= h.keys() for h in history)
    assert any(h["rewards/format/mean"] > 0 for h in history)  # the opening format reads the random judge now and then
    saved, base = load_file(out / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    assert (out / "judge_config.json").is_file() and json.loads((out / "config.json").read_text())["architectures"] == ["InternVLForConditionalGeneration"]
    changed = [name for name in saved if name in base and not torch.equal(saved[name], base[name])]
    assert changed, "no weight moved in 2 GRPO steps"
    # the KL to the starting judge, measured at each step (TRL logs it only where there is a reference)
    kl = [e.get("kl") for e in json.loads((out / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"] if "loss" in e]
    assert len(kl) == 2 and all(value is not None and 0 <= value < 1 for value in kl)


@pytest.mark.slow
def test_a_run_interrupted_and_resumed_ends_where_an_uninterrupted_run_ends(checkpoint, data, tmp_path, monkeypatch):
    """Ctrl-C in step 3 of 4 (step 2's checkpoint saved): --resume samples the same completions, rewards them
    alike and trains to the same weights and rewards."""
    args = ["--max_steps", "4", "--save_steps", "2"]
    assert train_main(train_args(checkpoint, data, tmp_path / "whole", *args)) == 0
    step = GRPOJudgeTrainer.training_step

    def interrupted(self, *a, **k):
        if self.state.global_step == 2:
            raise KeyboardInterrupt
        return step(self, *a, **k)

    monkeypatch.setattr(GRPOJudgeTrainer, "training_step", interrupted)
    assert train_main(train_args(checkpoint, data, tmp_path / "stopped", *args)) == 130
    monkeypatch.setattr(GRPOJudgeTrainer, "training_step", step)
    assert not (tmp_path / "stopped" / "model.safetensors").exists()
    assert train_main(train_args(checkpoint, data, tmp_path / "stopped", *args, "--resume")) == 0
    histories = [json.loads((tmp_path / d / "reward_history.json").read_text()) for d in ("whole", "stopped")]
    # the log restored with the checkpoint holds steps 1 and 2; steps 3 and 4 were rewarded after the resume
    assert [h["step"] for h in histories[1]] == [1, 2, 3, 4] and histories[1] == histories[0]
    whole, resumed = (load_file(tmp_path / d / "model.safetensors") for d in ("whole", "stopped"))
    assert whole.keys() == resumed.keys()
    assert any(not torch.equal(whole[name], load_file(tmp_path / "whole" / "checkpoints" / "checkpoint-2" / "model.safetensors")[name])
               for name in whole)  # steps 3 and 4 moved the weights: the comparison below is not of untouched ones
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=0, atol=1e-6)
    shutil.rmtree(tmp_path / "whole")


def judged(pair_id: str, verdict: str | None, forward: list[str | None], reverse: list[str | None]) -> dict:
    """judge-score's record of a pair judged len(forward) times per order (verdicts in the pair's terms)."""
    def judgements(first, verdicts):
        return [{"first": first, "feedback": "...", "verdict": v, "label": v, "n_tiles": 0, "prompt_tokens": 90, "generated_tokens": 9} for v in verdicts]

    consistent = None if None in (forward[0], reverse[0]) else forward[0] == reverse[0]
    return {"id": pair_id, "model_a": "a", "model_b": "b", "category": "general", "verdict": verdict, "rule": "agree",
            "swap_consistent": consistent, "forward": judgements("A", forward), "reverse": judgements("B", reverse), "n_images": 0}


def test_mining_keeps_the_pairs_judged_wrong_or_inconsistently(data, tmp_path, capsys):
    records = json.loads((data / "train.json").read_text())
    people = {r.pair.id: r.preference for r in merge_pair_annotators(load_pairs(data / "train.json", data, preferred=True))}
    ids = list(people)
    right = lambda i: people[ids[i]]  # noqa: E731
    wrong = lambda i: {"A": "B", "B": "A", "tie": "A"}[people[ids[i]]]  # noqa: E731
    scored = [judged(ids[0], right(0), [right(0)] * 2, [right(0)] * 2),  # easy
              judged(ids[1], wrong(1), [wrong(1)] * 2, [wrong(1)] * 2),  # wrong, consistently
              judged(ids[2], right(2), [right(2)] * 2, [wrong(2)] * 2),  # right by the rule, the orders disagree
              judged(ids[3], right(3), [right(3), wrong(3)], [right(3)] * 2),  # samples apart, the orders' verdicts agree: not hard
              judged(ids[4], None, [None] * 2, [right(4)] * 2)]  # no verdict: wrong
    scored += [judged(i, people[i], [people[i]] * 2, [people[i]] * 2) for i in ids[5:]]
    (tmp_path / "scored.json").write_text(json.dumps(scored))
    out = tmp_path / "hard.json"
    assert train_main(["mine", "--scores", str(tmp_path / "scored.json"), "--train_file", str(data / "train.json"), "--output_file", str(out)]) == 0
    kept = json.loads(out.read_text())
    assert kept == [r for r in records if r["id"] in (ids[1], ids[2], ids[4])]  # every annotator's record, in the file's order
    assert f"hard pairs: 3 of {len(ids)} (2 wrong, 1 inconsistent), {len(kept)} records" in capsys.readouterr().out
    (tmp_path / "part.json").write_text(json.dumps(scored[:-1]))
    assert train_main(["mine", "--scores", str(tmp_path / "part.json"), "--train_file", str(data / "train.json"), "--output_file", str(out)]) == 2
    assert f"{ids[-1]}" in (err := capsys.readouterr().err) and "not among --scores" in err
    assert train_main(["mine", "--scores", str(tmp_path / "scored.json"), "--train_file", str(data / "train.json"),
                       "--output_file", str(data / "train.json")]) == 2
    assert "it is --train_file, an input" in capsys.readouterr().err
    assert json.loads((data / "train.json").read_text()) == records
