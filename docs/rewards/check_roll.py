"""ROLL's own data loading and reward worker shape against judge-serve, on an image dataset: its VLM pipeline's data
path (roll.datasets.vlm_dataset_utils.get_vlm_data_kwargs: a JSONL file whose prompt holds `<image>` and whose
`images` column names the image, encoded by its encode_function into its Image features) and its
DataCollatorWithPaddingForMM, which puts each request's images for vLLM into `multi_modal_data`; a DataProto of the
prompt and a response (ROLL's own) whose non-tensor batch carries them to docs/rewards/roll_reward_worker.py's
MMJudgeRewardWorker (a subclass of ROLL's Worker), whose compute_rewards ROLL's pipeline calls. The reward must
equal a direct /get_reward with the same image to 1e-6 and differ from the same request without it; then a judge
that cannot be reached: 0.0, and judge_failed 1 in its metrics. Run in a venv of ROLL's own (docs/rewards.md):

    PYTHONPATH=ROLL_SOURCE:docs/rewards:. python docs/rewards/check_roll.py POLICY_DIR JUDGE_URL DATA_DIR

POLICY_DIR: a policy with a processor and a chat template (the tiny Qwen2.5-VL policy), whose tokenizer stands for
the actor's; DATA_DIR: where the image and the JSONL file are written."""

import base64
import functools
import io
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx2
import numpy as np
import torch
from PIL import Image
from roll.configs.data_args import DataArguments
from roll.datasets.collator import DataCollatorWithPaddingForMM
from roll.datasets.vlm_dataset_utils import get_vlm_data_kwargs, process_image
from roll.distributed.scheduler.protocol import DataProto
from transformers import AutoImageProcessor, AutoTokenizer, BatchFeature
from roll_reward_worker import MMJudgeRewardWorker, user_turn

QUESTION, RESPONSE = "What colour is the square?", "It is red."


class StandInProcessor(SimpleNamespace):
    def __call__(self, images=None, videos=None, audio=None, text=None, **kwargs):
        return BatchFeature({**self.tokenizer([text]), **(self.image_processor(images=images) if images else {})})


def data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def direct(url: str, question: str, image: str | None) -> float:
    body = {"query": [question + RESPONSE], "prompts": [question], "images": [[image] if image else []], "labels": ["red"]}
    return httpx2.post(f"{url}/get_reward", json=body, timeout=120).json()["rewards"][0]


def main(policy: str, judge_url: str, data_dir: str) -> int:
    Image.new("RGB", (28, 28), "red").save(Path(data_dir) / "red.png")
    (Path(data_dir) / "colours.jsonl").write_text(json.dumps({"data_source": "colours", "prompt": "<image>" + QUESTION,
                                                              "images": [str(Path(data_dir) / "red.png")],
                                                              "reward_model": {"ground_truth": "red"}}) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(policy)
    # Qwen2.5-VL's processor needs torchvision for its video processor, which has no build for this CPU torch: its image
    # processor, tokenizer and chat template (what ROLL's encode_function and collator read of it) stand for it; called,
    # it gives the text's tokens (its image token not expanded per patch: the reward reads the text) and the image's features
    template = json.loads((Path(policy) / "chat_template.json").read_text())["chat_template"]
    image_processor = AutoImageProcessor.from_pretrained(policy, use_fast=False)

    processor = StandInProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                 apply_chat_template=functools.partial(tokenizer.apply_chat_template, chat_template=template))
    data_args = DataArguments(file_name=str(Path(data_dir) / "colours.jsonl"))
    kwargs = get_vlm_data_kwargs(data_args, tokenizer, processor)
    # its default image loader is qwen_vl_utils' fetch_image, whose module needs torchvision too: ROLL's own process_image
    # (the same resize to the processor's pixel bounds) loads them here
    collator = DataCollatorWithPaddingForMM(tokenizer=tokenizer, processor=processor,
                                            image_load_sample_fn=lambda images, metas, **_: ([process_image(i, processor) for i in images], []),
                                            **kwargs["collect_fn_kwargs"])
    collator._default_image_processor_mm_kwargs = {"do_resize": False}  # what its __post_init__ sets beside its own loader alone
    batch = collator([kwargs["dataset"][0]])
    entry = batch["multi_modal_data"][0]

    responses = tokenizer([RESPONSE], return_tensors="pt").input_ids
    non_tensors = {"ground_truth": np.array(batch["ground_truth"], dtype=object), "multi_modal_data": np.array([entry], dtype=object)}
    data = DataProto.from_dict(tensors={"prompts": batch["input_ids"], "responses": responses}, non_tensors=non_tensors)

    worker = MMJudgeRewardWorker.__new__(MMJudgeRewardWorker)  # its reward alone: no Ray actor, no cluster
    worker.tokenizer, worker.worker_config = tokenizer, SimpleNamespace(judge_api_url=judge_url)
    output = worker.compute_rewards(data)
    reward = output.batch["response_level_rewards"][0].item()
    question = user_turn(tokenizer.decode(batch["input_ids"][0], skip_special_tokens=True))
    image = entry["multi_modal_data"]["image"][0]
    with_image, without = direct(judge_url, question, data_url(image)), direct(judge_url, question, None)
    same = abs(reward - with_image) <= 1e-6 and abs(reward - without) > 1e-6

    worker.worker_config = SimpleNamespace(judge_api_url="http://127.0.0.1:9")  # nothing listens: the judgement fails
    failed = worker.compute_rewards(data)
    print(json.dumps({"question (the prompt's user turn, as ROLL decodes it)": question,
                      "image as its collator gives it": f"{type(image).__name__} {image.mode} {image.size}",
                      "response_level_rewards": reward, "metrics": output.meta_info["metrics"], "direct with the image": with_image,
                      "direct without it": without, "equal to 1e-6 with, differ without": same,
                      "judge unreachable": {"response_level_rewards": failed.batch["response_level_rewards"].tolist(),
                                            "metrics": failed.meta_info["metrics"]}}))
    return 0 if same and failed.batch["response_level_rewards"].tolist() == [0.0] and failed.meta_info["metrics"]["mmjudge/judge_failed"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
