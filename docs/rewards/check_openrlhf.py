"""OpenRLHF's own reward fetch (openrlhf.utils.agent.SingleTurnAgentExecutor, as its rollouts call it) against a
judge-serve started with --reward: its HTTP path to /get_reward, and its Python-file path loading mmjudge's
`reward_func` (mmjudge/rewards.py) by file. Run in a venv of OpenRLHF's own (docs/rewards.md):

    MMJUDGE_URL=http://127.0.0.1:PORT python docs/rewards/check_openrlhf.py

Prints what each path returns for one query, the prompt followed by the response, as OpenRLHF sends it."""

import asyncio
import json
import os
import sys
from importlib import metadata

import mmjudge.rewards
from openrlhf.utils.agent import SingleTurnAgentExecutor


def main() -> int:
    url = os.environ["MMJUDGE_URL"]
    prompt = "<|im_start|>user\nWhat does a red traffic light mean?<|im_end|>\n<|im_start|>assistant\n"
    queries = [prompt + "Stop and wait until it turns green.", prompt + "Go faster."]
    over_http = SingleTurnAgentExecutor(remote_rm_url=f"{url}/get_reward")
    http = asyncio.run(over_http._fetch_rewards_via_http(queries, [prompt] * 2, [None, None]))
    by_file = SingleTurnAgentExecutor(remote_rm_url=mmjudge.rewards.__file__)
    func = asyncio.run(by_file._fetch_rewards_via_func(queries, [prompt] * 2, [None, None]))
    print(json.dumps({"openrlhf": metadata.version("openrlhf"), "http": http,
                      "reward_func": [{k: v.tolist() if hasattr(v, "tolist") else {n: t.tolist() for n, t in v.items()} for k, v in r.items()}
                                      for r in func]}))
    rewards_http = http[0]["rewards"]
    rewards_func = [r["rewards"].item() for r in func]
    same = all(abs(a - b) < 1e-6 for a, b in zip(rewards_http, rewards_func))  # the file's are float32 tensors
    return 0 if same and all(0 <= r <= 1 for r in rewards_http) else 1


if __name__ == "__main__":
    sys.exit(main())
