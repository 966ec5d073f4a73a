"""verl's own reward loop against judge-serve: its NaiveRewardManager calling mmjudge's compute_score, loaded from
mmjudge/rewards.py by verl's get_custom_reward_fn (the question and image from extra_info), and its reward-model
request (RewardLoopWorker.compute_score_disrm: the chat templated by the reward model's tokenizer, POST /classify,
data[-1].probs[-1]). Run in a venv of verl's own (docs/rewards.md):

    python docs/rewards/check_verl.py POLICY_DIR JUDGE_URL SERVED_MODEL_NAME IMAGE

POLICY_DIR: a tokenizer with a chat template (the tiny Qwen2.5-VL policy), which stands for the policy's and the
reward model's; IMAGE: a path under the server's --image_root."""

import json
import sys
from importlib import metadata

import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl import DataProto
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.trainer.ppo.reward import get_custom_reward_fn

import mmjudge.rewards


def main(policy: str, judge_url: str, served: str, image: str) -> int:
    tokenizer = AutoTokenizer.from_pretrained(policy)
    question, response = "What colour is the square?", "It is red."
    prompt_ids = tokenizer(question, return_tensors="pt").input_ids
    response_ids = tokenizer(response, return_tensors="pt").input_ids
    data = DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": torch.ones(1, prompt_ids.shape[1] + response_ids.shape[1], dtype=torch.long)},
        non_tensors={"data_source": np.array(["colours"], dtype=object), "reward_model": np.array([{"ground_truth": None}], dtype=object),
                     "extra_info": np.array([{"question": question, "images": [image]}], dtype=object),
                     "raw_prompt": np.array([[{"role": "user", "content": question}]], dtype=object)})

    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": mmjudge.rewards.__file__, "name": "compute_score",
                                                                     "reward_kwargs": {"base_url": judge_url}},
                                          "reward_model": {"enable": True, "model_path": served, "rollout": {"name": "vllm"}}}})
    manager = NaiveRewardManager(config, tokenizer, get_custom_reward_fn(config))
    custom = manager.loop.run_until_complete(manager.run_single(data))  # the loop verl made it with

    worker = RewardLoopWorker.__new__(RewardLoopWorker)  # its requests alone: no tokenizer download, no router started by verl
    worker.config, worker.reward_router_address = config, judge_url.removeprefix("http://")
    worker.input_tokenizer = worker.reward_model_tokenizer = tokenizer
    disrm = manager.loop.run_until_complete(worker.compute_score_disrm(data))
    print(json.dumps({"verl": metadata.version("verl"), "naive_reward_manager": custom, "compute_score_disrm": disrm}, default=str))
    score = custom["reward_score"]
    return 0 if 0 <= score <= 1 and custom["reward_extra_info"]["judge_failed"] == 0 and 0 <= disrm["reward_score"] <= 1 else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
