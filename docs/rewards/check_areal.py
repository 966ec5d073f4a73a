"""AReaL's own vision data loading and rollout workflow against judge-serve, on an image dataset: its
clevr_count_70k RL dataset loader reads a local copy (a Parquet file of a question, an answer and an image, the
Hub set's columns) and prepares each sample with the policy's processor as its trainer does; AReaL's own
import_from_string resolves mmjudge.rewards.AReaLJudgeVisionWorkflow (its VisionRLVRWorkflow, rewarding through
the judge), whose arun_episode runs each sample, AReaL's processor call and ModelRequest included. The policy's
generation alone stands in (an engine answering fixed text): it is the GPU's part, not the reward's. Each reward
must equal a direct /get_reward with the same image to 1e-6 and differ from the same request without it; a judge
that cannot be reached must give AReaL's rejection (arun_episode's None), not a reward; AReaL's own reward door
(AsyncRewardWrapper) is shown reading a reward function past its timeout as 0. Run in a venv of AReaL's own
(docs/rewards.md), with mmjudge on PYTHONPATH:

    MMJUDGE_URL=http://127.0.0.1:PORT python docs/rewards/check_areal.py POLICY_DIR WORK_DIR

POLICY_DIR: a vision-language policy's processor (the tiny Qwen2.5-VL one); WORK_DIR: where the dataset is written."""

import asyncio
import base64
import io
import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path

import datasets
import httpx2
from PIL import Image
from transformers import AutoProcessor

from areal.api.cli_args import GenerationHyperparameters, TrainDatasetConfig
from areal.api.io_struct import ModelResponse
from areal.api.reward_api import AsyncRewardWrapper
from areal.dataset import get_custom_dataset
from areal.utils.dynamic_import import import_from_string

ROWS = [("red", 3, "There are [3] items."), ("blue", 5, "I count [4].")]


def write_dataset(folder: Path) -> Path:
    """A local clevr_count_70k: AReaL's loader picks its preparing by the path's name."""
    path = folder / "clevr_count_70k"
    path.mkdir(parents=True, exist_ok=True)
    features = datasets.Features({"images": datasets.Sequence(datasets.Image()), "problem": datasets.Value("string"),
                                  "answer": datasets.Value("string")})
    rows = {"images": [[Image.new("RGB", (56, 56), colour)] for colour, _, _ in ROWS],
            "problem": ["<image>How many items are there in the image?"] * len(ROWS), "answer": [str(n) for _, n, _ in ROWS]}
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path / "train.parquet"))
    return path


class Policy:
    """The policy's generation, which is not the reward's code: each request answered with a fixed text's tokens."""

    def __init__(self, tokenizer, answers: list[str]):
        self.tokenizer, self.answers = tokenizer, list(answers)

    async def agenerate(self, request) -> ModelResponse:
        tokens = self.tokenizer.encode(self.answers.pop(0), add_special_tokens=False) + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        return ModelResponse(input_tokens=request.input_ids, output_tokens=tokens, output_logprobs=[0.0] * len(tokens),
                             output_versions=[0] * len(tokens), tokenizer=self.tokenizer)


def data_url(image) -> str:
    """The sample's image as a data URL, in the form AReaL's dataset holds it (encoded bytes, or a PIL image as PNG)."""
    if isinstance(image, Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        image, kind = buffer.getvalue(), "png"
    else:
        kind = "jpeg" if image[:3] == b"\xff\xd8\xff" else "png"
    return f"data:image/{kind};base64," + base64.b64encode(image).decode()


def direct(url: str, question: str, answer: str, reference: str, images: list[str]) -> float:
    body = {"query": [question + answer], "prompts": [question], "images": [images], "labels": [reference]}
    return httpx2.post(f"{url}/get_reward", json=body, timeout=120).json()["rewards"][0]


def main(policy_dir: str, work_dir: str) -> int:
    url = os.environ["MMJUDGE_URL"]
    processor = AutoProcessor.from_pretrained(policy_dir)
    os.environ["AREAL_SPMD_MODE"] = "1"  # each process loads its dataset itself (AReaL's SPMD launch), not from its data service
    config = TrainDatasetConfig(path=str(write_dataset(Path(work_dir))), type="rl", batch_size=len(ROWS))  # as a trainer's yaml gives it
    dataset = get_custom_dataset(split="train", dataset_config=config, processor=processor)
    workflow_class = import_from_string("mmjudge.rewards.AReaLJudgeVisionWorkflow")
    gconfig = GenerationHyperparameters(max_new_tokens=16)
    workflow = workflow_class(gconfig=gconfig, tokenizer=processor.tokenizer, processor=processor, enable_thinking=False)
    policy = Policy(processor.tokenizer, [answer for _, _, answer in ROWS])
    samples = [dataset[k] for k in range(len(dataset))]
    trajectories = [asyncio.run(workflow.arun_episode(policy, sample)) for sample in samples]
    rewards = [t["rewards"].item() for t in trajectories]
    images = [[data_url(i) for i in sample["images"]] for sample in samples]
    with_images = [direct(url, s["messages"], a, s["answer"], i) for s, (_, _, a), i in zip(samples, ROWS, images)]
    without = [direct(url, s["messages"], a, s["answer"], []) for s, (_, _, a) in zip(samples, ROWS)]
    same = all(abs(a - b) <= 1e-6 for a, b in zip(rewards, with_images)) and all(abs(a - b) > 1e-6 for a, b in zip(rewards, without))
    first = samples[0]["images"][0]
    print(json.dumps({"areal": metadata.version("areal"), "transformers": metadata.version("transformers"),
                      "workflow": f"{workflow_class.__module__}.{workflow_class.__name__}, a {type(workflow).__mro__[1].__name__}",
                      "image as AReaL's dataset gives it": type(first).__name__ + (f", {len(first)} bytes" if isinstance(first, bytes) else ""),
                      "question (the sample's messages)": samples[0]["messages"], "rewards": rewards, "direct with the image": with_images,
                      "direct without it": without, "equal to 1e-6 with, differ without": same, "failed": workflow.judge.failed}))

    unreachable = workflow_class(gconfig=gconfig, tokenizer=processor.tokenizer, processor=processor, enable_thinking=False,
                                 base_url="http://127.0.0.1:9")  # nothing listens on the discard port
    rejected = asyncio.run(unreachable.arun_episode(Policy(processor.tokenizer, ["[3]"]), samples[0]))
    print(json.dumps({"judge unreachable: arun_episode gives": repr(rejected), "failed": unreachable.judge.failed}))
    # AReaL's own reward door, for comparison: a reward function past the wrapper's timeout is read as a reward of 0
    past_timeout = asyncio.run(AsyncRewardWrapper(time.sleep, timeout_seconds=0.5, max_retries=0)(2.0))
    print(json.dumps({"AReaL's AsyncRewardWrapper, a reward function past its timeout, gives": past_timeout}))
    return 0 if same and workflow.judge.failed == 0 and rejected is None and unreachable.judge.failed == 1 else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
