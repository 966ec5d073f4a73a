"""LLaMA-Factory's own PPO reward request (llamafactory.train.ppo.ppo_utils.get_rewards_from_server, which its
trainer calls under `reward_model_type: api`) against judge-serve's /v1/score/evaluation. Run in a venv of
LLaMA-Factory's own (docs/rewards.md), with DISABLE_VERSION_CHECK=1 (it pins transformers <= 5.6):

    MMJUDGE_URL=http://127.0.0.1:PORT python docs/rewards/check_llamafactory.py

torchaudio, which its multimodal data plugin imports at load, has no build for torch 2.13 on the package index:
it stands in as an empty module here; the function called uses requests and torch only."""

import importlib.machinery
import json
import os
import sys
import types
from importlib import metadata

sys.modules["torchaudio"] = types.ModuleType("torchaudio")
sys.modules["torchaudio"].__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)

from llamafactory.train.ppo.ppo_utils import get_rewards_from_server  # noqa: E402


def main() -> int:
    texts = ["Question: what does a red light mean?\nAnswer: stop.", "Question: what does a red light mean?\nAnswer: go faster."]
    rewards = get_rewards_from_server(f"{os.environ['MMJUDGE_URL']}/v1/score/evaluation", texts)
    print(json.dumps({"llamafactory": metadata.version("llamafactory"), "rewards": rewards.tolist()}))
    return 0 if len(rewards) == 2 and all(0 <= r <= 1 for r in rewards.tolist()) else 1


if __name__ == "__main__":
    sys.exit(main())
