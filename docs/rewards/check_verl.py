"""verl's own data loading and reward loop against judge-serve, on an image dataset: its RLHFDataset reads a Parquet
file whose extra_info holds the question and the image as Parquet gives it back (a {"bytes", "path"} dict), its
collate_fn batches the row, its NaiveRewardManager calls mmjudge's compute_score, loaded from mmjudge/rewards.py by
verl's get_custom_reward_fn; the reward must equal a direct /get_reward with the same image to 1e-6, and differ from
the same request without it. Then its reward-model request (RewardLoopWorker.compute_score_disrm: the chat templated
by the reward model's tokenizer, POST /classify, data[-1].probs[-1]), text only. Run in a venv of verl's own
(docs/rewards.md):

    python docs/rewards/check_verl.py POLICY_DIR JUDGE_URL SERVED_MODEL_NAME WORK_DIR

POLICY_DIR: a tokenizer with a chat template (the tiny Qwen2.5-VL policy), which stands for the policy's and the
reward model's; WORK_DIR: where the Parquet file and the image are written."""

import base64
import io
import json
import sys
from importlib import metadata
from pathlib import Path

import httpx2
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from omegaconf import OmegaConf
from PIL import Image
from transformers import AutoTokenizer
from verl import DataProto
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

import mmjudge.rewards

QUESTION, RESPONSE = "What colour is the square?", "It is red."


def direct(url: str, image: bytes | None) -> float:
    images = [["data:image/png;base64," + base64.b64encode(image).decode()]] if image else [[]]
    body = {"query": [QUESTION + RESPONSE], "prompts": [QUESTION], "images": images}
    return httpx2.post(f"{url}/get_reward", json=body, timeout=120).json()["rewards"][0]


def main(policy: str, judge_url: str, served: str, work_dir: str) -> int:
    tokenizer = AutoTokenizer.from_pretrained(policy)
    buffer = io.BytesIO()
    Image.new("RGB", (28, 28), "red").save(buffer, format="PNG")
    image = buffer.getvalue()
    parquet = Path(work_dir) / "colours.parquet"
    pq.write_table(pa.table({"data_source": ["colours"], "prompt": [[{"role": "user", "content": QUESTION}]],
                             "reward_model": [{"ground_truth": "red"}],
                             "extra_info": [{"question": QUESTION, "images": [{"bytes": image, "path": None}]}]}), parquet)
    dataset = RLHFDataset(str(parquet), tokenizer, OmegaConf.create({"filter_overlong_prompts": False, "cache_dir": work_dir}))
    batch = collate_fn([dataset[0]])
    given = batch["extra_info"][0]["images"][0]
    prompt_ids = tokenizer(QUESTION, return_tensors="pt").input_ids
    response_ids = tokenizer(RESPONSE, return_tensors="pt").input_ids
    data = DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": torch.ones(1, prompt_ids.shape[1] + response_ids.shape[1], dtype=torch.long)},
        non_tensors={key: batch[key] for key in ("data_source", "reward_model", "extra_info", "raw_prompt")})

    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": mmjudge.rewards.__file__, "name": "compute_score",
                                                                     "reward_kwargs": {"base_url": judge_url}},
                                          "reward_model": {"enable": True, "model_path": served, "rollout": {"name": "vllm"}}}})
    manager = NaiveRewardManager(config, tokenizer, get_custom_reward_fn(config))
    custom = manager.loop.run_until_complete(manager.run_single(data))  # the loop verl made it with

    worker = RewardLoopWorker.__new__(RewardLoopWorker)  # its requests alone: no tokenizer download, no router started by verl
    worker.config, worker.reward_router_address = config, judge_url.removeprefix("http://")
    worker.input_tokenizer = worker.reward_model_tokenizer = tokenizer
    disrm = manager.loop.run_until_complete(worker.compute_score_disrm(data))
    with_image, without = direct(judge_url, image), direct(judge_url, None)
    score = custom["reward_score"]
    same = abs(score - with_image) <= 1e-6 and abs(score - without) > 1e-6
    print(json.dumps({"verl": metadata.version("verl"), "image as RLHFDataset gives it": {k: (f"{len(v)} bytes" if isinstance(v, bytes) else v)
                                                                                          for k, v in given.items()},
                      "naive_reward_manager": custom, "direct with the image": with_image, "direct without it": without,
                      "equal to 1e-6 with, differ without": same, "compute_score_disrm": disrm}, default=str))
    return 0 if same and custom["reward_extra_info"]["judge_failed"] == 0 and 0 <= disrm["reward_score"] <= 1 else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
