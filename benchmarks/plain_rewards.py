"""mmjudge's reward exports read by plain transformers: no mmjudge import, only torch, transformers and Pillow.

    python benchmarks/plain_rewards.py CASES.json

CASES.json (benchmarks/plain_transformers.py writes it) lists answers: an export, the answer's user turn as chat
messages, and mmjudge's prompt ids and reward. Each export is loaded as docs/reward-models.md says (the loaders
below are the docs' lines), each answer's prompt built by the export's own chat template and image processing,
and its ids and reward compared with mmjudge's. Exit code 1 if any id differs or any reward is off by more than
1e-5.
"""

import json
import sys

import PIL
import torch
import transformers
from PIL import Image
from transformers.modeling_layers import GenericForSequenceClassification

TOLERANCE = 1e-5


# -- docs/reward-models.md ---------------------------------------------------------------------------------------------
class Qwen2_5_VLForSequenceClassification(GenericForSequenceClassification, transformers.Qwen2_5_VLPreTrainedModel):
    pass


class Qwen3VLForSequenceClassification(GenericForSequenceClassification, transformers.Qwen3VLPreTrainedModel):
    pass


class InternVLForSequenceClassification(GenericForSequenceClassification, transformers.InternVLPreTrainedModel):
    pass


def qwen_images(path):
    """Qwen-VL's image processor, and each image's tokens as its processor writes them."""
    processor = transformers.AutoImageProcessor.from_pretrained(path)
    return processor, "<|image_pad|>", lambda pixels: ["<|image_pad|>" * (int(grid.prod()) // processor.merge_size**2) for grid in pixels["image_grid_thw"]]


def internvl_images(path):
    """InternVL's tiles (judge_config.json says how many), and each image's tokens as InternVLProcessor writes them."""
    settings, per_tile = json.load(open(f"{path}/judge_config.json")), transformers.AutoConfig.from_pretrained(path).image_seq_length
    processor = transformers.GotOcr2ImageProcessor(crop_to_patches=True, min_patches=settings["min_tiles"], max_patches=settings["max_tiles"],
                                                   size={"height": settings["image_size"], "width": settings["image_size"]},
                                                   image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])  # ImageNet's
    return processor, "<IMG_CONTEXT>", lambda pixels: ["<img>" + "<IMG_CONTEXT>" * (int(n) * per_tile) + "</img>" for n in pixels["num_patches"]]


def prompt_inputs(path, images_of, messages, **template_flags):
    """The model's inputs for a chat: the export's own chat template, each image part's tokens put in its place."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    processor, image_token, tokens_of = images_of(path)
    images = [Image.open(part["path"]) for message in messages if isinstance(message["content"], list)
              for part in message["content"] if part["type"] == "image"]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_flags)
    pixels = processor(images=images, return_tensors="pt") if images else {}
    pieces = text.split(image_token)  # the template writes one image token per image part
    text = pieces[0] + "".join(tokens + piece for tokens, piece in zip(tokens_of(pixels) if images else [], pieces[1:]))
    inputs = tokenizer(text, add_special_tokens=False, return_tensors="pt")  # the template wrote BOS where there is one
    if "image_grid_thw" in pixels:  # Qwen-VL's 3-D positions: which tokens are an image's (its processor's mm_token_type_ids)
        inputs["mm_token_type_ids"] = (inputs["input_ids"] == tokenizer.convert_tokens_to_ids(image_token)).int()
    return {**inputs, **{k: v for k, v in pixels.items() if k != "num_patches"}}
# --------------------------------------------------------------------------------------------------------------------

# Each family's class, its images, and its chat template's flags. transformers has Qwen3.5's classifier itself
# (AutoModelForSequenceClassification reads the export); its template opens a thinking block unless told not to.
LOADERS = {"qwen2.5-vl-3b": (Qwen2_5_VLForSequenceClassification, qwen_images, {}), "qwen3-vl-4b": (Qwen3VLForSequenceClassification, qwen_images, {}),
           "qwen3.5-4b": (transformers.AutoModelForSequenceClassification, qwen_images, {"enable_thinking": False}),
           "internvl2-4b": (InternVLForSequenceClassification, internvl_images, {})}


def main(cases_file: str) -> int:
    cases = json.load(open(cases_file))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, Pillow {PIL.__version__}; mmjudge importable: {_importable('mmjudge')}")
    print("| family | answers | with images | prompt ids equal | largest reward difference |")
    print("|---|---:|---:|---:|---:|")
    failed = False
    for family in dict.fromkeys(case["family"] for case in cases):
        model_class, images_of, template_flags = LOADERS[family]
        mine = [case for case in cases if case["family"] == family]
        model = model_class.from_pretrained(mine[0]["export"], dtype=torch.float32).eval()
        same, worst, with_images = 0, 0.0, 0
        for case in mine:
            inputs = prompt_inputs(case["export"], images_of, case["messages"], **template_flags)
            same += inputs["input_ids"][0].tolist() == case["input_ids"]
            with_images += "pixel_values" in inputs
            with torch.no_grad():
                reward = model(**inputs).logits[0, 0].item()
            worst = max(worst, abs(reward - case["reward"]))
        failed |= same != len(mine) or worst > TOLERANCE
        print(f"| {family} | {len(mine)} | {with_images} | {same} of {len(mine)} | {worst:.1e} |")
    return 1 if failed else 0


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
