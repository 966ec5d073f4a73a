"""slime's own data loading and reward code against judge-serve, on an image dataset: its Dataset reads a JSONL file
whose prompt holds an `<image>` placeholder and whose `images` column names the image (`--input-key messages
--multimodal-keys '{"image": "images"}' --label-key label`), turning the prompt into messages with an image part
and the image into a PIL image in `sample.multimodal_inputs["images"]`; its rm_hub's `async_rm` (one sample) and
`batched_async_rm` (a group, as `--group-rm` calls it) load mmjudge's reward by `--custom-rm-path
mmjudge.rewards.slime_reward` and call it with `--rm-url` the judge's address. Each reward must equal a direct
/get_reward with the same image to 1e-6, and differ from the same request without it; then a judge that cannot be
reached: 0.0 and the sample out of the loss (`remove_sample`). Run in a venv of slime's own (docs/rewards.md):

    PYTHONPATH=SLIME_SOURCE:. python docs/rewards/check_slime.py POLICY_DIR JUDGE_URL DATA_DIR

POLICY_DIR: a policy with a processor (the tiny Qwen2.5-VL policy); DATA_DIR: the judge-serve's --image_root,
where the image and the JSONL file are written."""

import asyncio
import copy
import json
import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import httpx2
from PIL import Image
from transformers import AutoImageProcessor
from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.utils.data import Dataset
from slime.utils.processing_utils import load_processor, load_tokenizer

QUESTION, RESPONSES = "What colour is the square?", ["It is red.", "Blue."]


def direct(url: str, response: str, image: str | None) -> float:
    body = {"query": [QUESTION + response], "prompts": [QUESTION], "images": [[image] if image else []], "labels": ["red"]}
    return httpx2.post(f"{url}/get_reward", json=body, timeout=120).json()["rewards"][0]


def main(policy: str, judge_url: str, data_dir: str) -> int:
    Image.new("RGB", (28, 28), "red").save(Path(data_dir) / "red.png")
    rows = Path(data_dir) / "colours.jsonl"
    rows.write_text(json.dumps({"messages": [{"role": "user", "content": "<image>" + QUESTION}],
                                "images": [str(Path(data_dir) / "red.png")], "label": "red"}) + "\n")
    # Qwen2.5-VL's AutoProcessor needs torchvision for its video processor, which has no build for this CPU torch: slime's
    # process_vision_info reads the processor's image_processor alone, so that part stands for it
    try:
        processor = load_processor(policy)
    except ImportError:
        processor = SimpleNamespace(image_processor=AutoImageProcessor.from_pretrained(policy))
    dataset = Dataset(str(rows), load_tokenizer(policy), processor, None, prompt_key="messages",
                      multimodal_keys={"image": "images"}, label_key="label")
    args = Namespace(custom_rm_path="mmjudge.rewards.slime_reward", rm_url=judge_url)
    samples = [copy.deepcopy(dataset[0]) for _ in range(1 + len(RESPONSES) + 1)]  # slime's data source copies a prompt's sample
    for sample, response in zip(samples, RESPONSES[:1] + RESPONSES + RESPONSES[:1]):
        sample.response = response  # as its rollout sets it
    one = asyncio.run(async_rm(args, samples[0]))
    group, failing = samples[1:-1], samples[-1]
    grouped = asyncio.run(batched_async_rm(args, group))
    with_image = [direct(judge_url, r, "red.png") for r in RESPONSES]
    without = [direct(judge_url, r, None) for r in RESPONSES]
    got = [one] + grouped
    expected, unlike = [with_image[0]] + with_image, [without[0]] + without
    same = all(abs(g - w) <= 1e-6 and abs(g - o) > 1e-6 for g, w, o in zip(got, expected, unlike))

    failed = asyncio.run(async_rm(Namespace(custom_rm_path=args.custom_rm_path, rm_url="http://127.0.0.1:9"), failing))
    image = samples[0].multimodal_inputs["images"][0]
    print(json.dumps({"prompt as slime's Dataset gives it": samples[0].prompt, "image as it holds it": f"{type(image).__name__} {image.mode} {image.size}",
                      "async_rm": one, "batched_async_rm": grouped, "direct with the image": with_image, "direct without it": without,
                      "equal to 1e-6 with, differ without": same, "judge unreachable": {"reward": failed, "remove_sample": failing.remove_sample,
                                                                                         "metadata": failing.metadata}}))
    return 0 if same and failed == 0.0 and failing.remove_sample and not any(s.remove_sample for s in samples[:-1]) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
