"""OpenRLHF's own reward fetch (openrlhf.utils.agent.SingleTurnAgentExecutor, as its rollouts call it) against a
judge-serve started with --reward: its HTTP path to /get_reward (its client posts query, prompts and labels alone),
and its Python-file path loading mmjudge's `reward_func` (mmjudge/rewards.py) by file; in both, each label a
{"reference", "images"} object (what its --label_key column would hold) carrying the prompt's image. Run in a venv of
OpenRLHF's own (docs/rewards.md), with the server's --image_root at DATA_DIR:

    MMJUDGE_URL=http://127.0.0.1:PORT python docs/rewards/check_openrlhf.py DATA_DIR

Prints what each path returns for two queries, the prompt followed by the response, as OpenRLHF sends them; each path's
rewards must equal a direct /get_reward with the same images to 1e-6, and differ from the same request without them."""

import asyncio
import json
import os
import sys
from importlib import metadata
from pathlib import Path

import httpx2
from PIL import Image

import mmjudge.rewards
from openrlhf.utils.agent import SingleTurnAgentExecutor


def direct(url: str, queries: list[str], prompt: str, images: list[list[str]]) -> list[float]:
    body = {"query": queries, "prompts": [prompt] * len(queries), "images": images}
    return httpx2.post(f"{url}/get_reward", json=body, timeout=120).json()["rewards"]


def main(data_dir: str) -> int:
    url = os.environ["MMJUDGE_URL"]
    image = str(Path(data_dir) / "light.png")
    Image.new("RGB", (28, 28), "red").save(image)
    prompt = "<|im_start|>user\nWhat does this traffic light mean?<|im_end|>\n<|im_start|>assistant\n"
    queries = [prompt + "Stop and wait until it turns green.<|im_end|>", prompt + "Go faster.<|im_end|>"]
    labels = [json.dumps({"images": [image]})] * 2
    over_http = SingleTurnAgentExecutor(remote_rm_url=f"{url}/get_reward")
    http = asyncio.run(over_http._fetch_rewards_via_http(queries, [prompt] * 2, labels))
    by_file = SingleTurnAgentExecutor(remote_rm_url=mmjudge.rewards.__file__)
    func = asyncio.run(by_file._fetch_rewards_via_func(queries, [prompt] * 2, labels))
    rewards_func = [r["rewards"].item() for r in func]
    with_images = direct(url, [q.removesuffix("<|im_end|>") for q in queries], prompt, [[image]] * 2)
    without = direct(url, [q.removesuffix("<|im_end|>") for q in queries], prompt, [[]] * 2)
    same = all(abs(a - b) <= 1e-6 for got in (rewards_func, http[0]["rewards"]) for a, b in zip(got, with_images)) and \
        all(abs(a - b) > 1e-6 for got in (rewards_func, http[0]["rewards"]) for a, b in zip(got, without))
    print(json.dumps({"openrlhf": metadata.version("openrlhf"), "http with the label's image": http[0]["rewards"], "reward_func with the label's image":
                      rewards_func, "judge_failed": [r["extra_logs"]["judge_failed"].item() for r in func], "direct with the image": with_images,
                      "direct without it": without, "equal to 1e-6 with, differ without": same}))
    return 0 if same and all(r["extra_logs"]["judge_failed"].item() == 0 for r in func) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
