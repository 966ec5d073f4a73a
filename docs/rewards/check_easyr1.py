"""EasyR1's own reward path against judge-serve: its RewardConfig naming mmjudge/rewards.py:compute_score_batch
(with reward_function_kwargs.base_url), its AutoRewardManager loading that file by path, run as the Ray actor its
trainer makes of it (verl/trainer/main.py: ray.remote(AutoRewardManager)), and its compute_reward on a DataProto of
two responses, decoded by the policy's tokenizer as its rollouts leave them (ground truths a text and a number). EasyR1 is not on the package index:
its source is a snapshot of github.com/hiyouga/EasyR1 on PYTHONPATH, in a venv of its own (docs/rewards.md):

    PYTHONPATH=EASYR1_SOURCE python docs/rewards/check_easyr1.py POLICY_DIR JUDGE_URL

POLICY_DIR: a tokenizer (the tiny Qwen2.5-VL policy). Prints the reward tensor's rewards (each at its response's
last token, where EasyR1 puts it) and the metrics EasyR1 collects; exits non-zero unless both were judged."""

import json
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import ray
import torch
import verl
from transformers import AutoTokenizer
from verl.protocol import DataProto
from verl.workers.reward import AutoRewardManager, RewardConfig

MMJUDGE_REWARDS = Path(__file__).resolve().parents[2] / "mmjudge" / "rewards.py"  # loaded by path, as EasyR1 loads any reward file


def main(policy: str, judge_url: str) -> int:
    tokenizer = AutoTokenizer.from_pretrained(policy)
    responses = ["The square in the picture is red.", "I cannot tell what colour anything is."]
    ids = [tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for text in responses]
    width = max(map(len, ids))
    padded = torch.tensor([row + [tokenizer.pad_token_id or 0] * (width - len(row)) for row in ids])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids])
    data = DataProto.from_dict(tensors={"responses": padded, "response_mask": mask},
                               non_tensors={"ground_truth": np.array(["red", 3], dtype=object)})  # a text and a number, as answer columns hold

    config = RewardConfig(reward_function=f"{MMJUDGE_REWARDS}:compute_score_batch", reward_function_kwargs={"base_url": judge_url})
    config.post_init()  # what EasyR1's PPOConfig does to its worker.reward: the file and the function's name apart
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=True)
    try:
        manager = ray.remote(AutoRewardManager).options(num_cpus=config.num_cpus).remote(config, tokenizer)
        reward_tensor, metrics = ray.get(manager.compute_reward.remote(data))
    finally:
        ray.shutdown()
    lengths = mask.sum(-1)
    rewards = [float(reward_tensor[k, lengths[k] - 1]) for k in range(len(responses))]
    print(json.dumps({"easyr1": verl.__version__, "ray": metadata.version("ray"), "transformers": metadata.version("transformers"),
                      "rewards": rewards, "metrics": {name: list(map(float, values)) for name, values in metrics.items()},
                      "reward_tensor_nonzero": int((reward_tensor != 0).sum())}))
    judged = all(0 < r < 1 for r in rewards) and metrics["judge_failed"] == [0.0, 0.0]
    return 0 if judged else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
