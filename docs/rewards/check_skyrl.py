"""SkyRL's own data loading and vision-language rollout against judge-serve, on an image dataset: its PromptDataset
reads a Parquet file of prompts whose user turn holds an image part (OpenAI's image_url, a data URL, as SkyRL's VLM
prompts carry images) and a text part, each row naming mmjudge's environment in env_class and its reference in
reward_spec; its prepare_generator_input makes the generator's input of them, and its SkyRLVLMGymGenerator runs each
trajectory's agent loop: skyrl_gym.make of mmjudge.rewards:SkyRLJudgeEnv (registered as SkyRL's users register an
environment), init with the prompt, step with the policy's text in SkyRL's pool of environment threads, the reward
placed on the response's last token, the environment's metrics aggregated into its rollout metrics. The policy's
side alone stands in (vLLM's render and generate, answering fixed text). Each reward must equal a direct
/get_reward with the same image to 1e-6 and differ from the same request without it; a judge that cannot be reached
must give 0.0 with judge_failed 1 (SkyRL has no skip value). Run in a venv of SkyRL's own (docs/rewards.md), with
mmjudge on PYTHONPATH:

    MMJUDGE_URL=http://127.0.0.1:PORT python docs/rewards/check_skyrl.py POLICY_DIR WORK_DIR

POLICY_DIR: the policy's tokenizer (the tiny Qwen2.5-VL one); WORK_DIR: where the Parquet file is written."""

import asyncio
import base64
import io
import json
import os
import sys
from importlib import metadata
from pathlib import Path

import typing

import typing_extensions

if sys.version_info < (3, 12):  # skyrl 0.3.0 (the last for Python 3.11) puts typing's TypedDict in pydantic models, which pydantic
    typing.TypedDict = typing_extensions.TypedDict  # refuses below 3.12; 0.4.0 requires 3.12. Its reward path is untouched.

import httpx2
import pyarrow as pa
import pyarrow.parquet as pq
import skyrl_gym
from PIL import Image
from transformers import AutoTokenizer

from skyrl.train.config import GeneratorConfig, SkyRLGymConfig
from skyrl.train.dataset import PromptDataset
from skyrl.train.generators.skyrl_vlm_generator import SkyRLVLMGymGenerator
from skyrl.train.generators.utils import prepare_generator_input

QUESTION = "What colour is the square?"
ROWS = [("red", "It is red."), ("blue", "Green, I think.")]


def png(colour: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (28, 28), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(colour: str) -> str:
    return "data:image/png;base64," + base64.b64encode(png(colour)).decode()


def write_dataset(folder: Path) -> Path:
    prompts = [[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(colour)}}, {"type": "text", "text": QUESTION}]}]
               for colour, _ in ROWS]
    path = folder / "prompts.parquet"
    pq.write_table(pa.table({"prompt": prompts, "env_class": ["mmjudge"] * len(ROWS),
                             "reward_spec": [{"ground_truth": colour} for colour, _ in ROWS]}), path)
    return path


class Policy:
    """vLLM's side of SkyRL's VLM generator (render the conversation, generate), answering each prompt's fixed text."""

    model_name = "policy"

    def __init__(self, tokenizer, answers: dict[str, str]):
        self.tokenizer, self.answers = tokenizer, answers

    async def render_chat_completion(self, request: dict) -> dict:
        text = " ".join(p["text"] for m in request["json"]["messages"] for p in m["content"] if isinstance(p, dict) and p.get("text"))
        return {"token_ids": self.tokenizer.encode(text), "features": None}

    async def generate(self, engine_input: dict, model: str | None = None) -> dict:
        text = self.answers[engine_input["session_ids"][0].rsplit("_", 1)[0]]  # the session is the trajectory's id: uid_repetition
        return {"responses": [text], "response_ids": [self.tokenizer.encode(text) + [self.tokenizer.eos_token_id]],
                "stop_reasons": ["stop"], "response_logprobs": None}

    async def finish_session(self, session_id: str) -> None:
        return None


def direct(url: str, answer: str, reference: str, images: list[str]) -> float:
    body = {"query": [QUESTION + answer], "prompts": [QUESTION], "images": [images], "labels": [reference]}
    return httpx2.post(f"{url}/get_reward", json=body, timeout=120).json()["rewards"][0]


def rollout(url: str, tokenizer, dataset: PromptDataset) -> dict:
    """SkyRL's generator over the dataset's rows, mmjudge's environment registered against the judge at `url`."""
    if "mmjudge" in skyrl_gym.registry:
        skyrl_gym.envs.deregister("mmjudge")
    skyrl_gym.register(id="mmjudge", entry_point="mmjudge.rewards:SkyRLJudgeEnv", kwargs={"base_url": url})
    config = GeneratorConfig(max_input_length=4096, use_cache_salt=False, vision_language_generator=True)
    generator = SkyRLVLMGymGenerator(config, SkyRLGymConfig(), Policy(tokenizer, dict(ROWS)), tokenizer)
    rows = dataset.collate_fn([dataset[k] for k in range(len(dataset))])
    for row, (colour, _) in zip(rows, ROWS):
        row["uid"] = colour  # the stand-in policy answers by the trajectory's id
    batch, _ = prepare_generator_input(rows, 1, None, "mmjudge", "train", 0)
    return asyncio.run(generator.generate(batch, disable_tqdm=True))


def main(policy_dir: str, work_dir: str) -> int:
    url = os.environ["MMJUDGE_URL"]
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    dataset = PromptDataset([str(write_dataset(Path(work_dir)))], tokenizer, max_prompt_length=4096, num_workers=1)
    out = rollout(url, tokenizer, dataset)
    rewards = [r[-1] for r in out["rewards"]]  # the reward sits on the response's last token
    with_images = [direct(url, answer, colour, [data_url(colour)]) for colour, answer in ROWS]
    without = [direct(url, answer, colour, []) for colour, answer in ROWS]
    same = all(abs(a - b) <= 1e-6 for a, b in zip(rewards, with_images)) and all(abs(a - b) > 1e-6 for a, b in zip(rewards, without))
    metrics = {k: v for k, v in out["rollout_metrics"].items() if k.startswith("environment/")}
    part = dataset[0][0][0]["content"][1]
    print(json.dumps({"skyrl": metadata.version("skyrl"), "skyrl-gym": metadata.version("skyrl-gym"), "transformers": metadata.version("transformers"),
                      "a text part as PromptDataset gives it": part, "rewards (last token)": rewards, "direct with the image": with_images,
                      "direct without it": without, "equal to 1e-6 with, differ without": same, "environment metrics": metrics}))
    failed = rollout("http://127.0.0.1:9", tokenizer, dataset)  # nothing listens on the discard port
    failed_metrics = {k: v for k, v in failed["rollout_metrics"].items() if k.startswith("environment/")}
    print(json.dumps({"judge unreachable: rewards (last token)": [r[-1] for r in failed["rewards"]], "environment metrics": failed_metrics}))
    ok = same and metrics.get("environment/judge_failed") == 0.0 and failed_metrics.get("environment/judge_failed") == 1.0
    return 0 if ok and all(r[-1] == 0.0 for r in failed["rewards"]) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
