"""transformers' own side of an exactness check for a natively released checkpoint (Qwen2.5-VL, Qwen3-VL, InternVL's
-hf): the model loaded by transformers from the checkpoint, its official processor (processor class, image
processor, tokenizer, chat template; the image processor's PIL backend, since its default fast backend needs
torchvision, which this machine lacks), and `generate` at batch size 1, as their model cards run them.
For each sample of ours.py's dump: the official processor's input ids, pixels and image grids from the same user
turn (Qwen-VL: a content list of texts and images, as the official template takes it; InternVL -hf: the turn as one
string with the processor's image token `<IMG_CONTEXT>` where each image goes, which its processor expands, as
InternVL's chat() takes a question with `<image>` placeholders), then
greedy `generate` with the checkpoint's generation config, each step's logits, and the answer decoded as the
processor decodes it (special tokens skipped; for InternVL, stripped as InternVL's chat() strips its answers,
which is how judge-score finishes an InternVL judge's answer).
InternVL's tile limit is mmjudge's (MAX_TILES, the processor's `max_patches`); Qwen-VL has none.
usage: hf_reference.py CHECKPOINT OURS.pt NEW_TOKENS MAX_TILES OUT.pt"""
import json
import sys
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer, InternVLProcessor, Qwen2_5_VLProcessor, Qwen3VLProcessor

checkpoint, ours, new_tokens, max_tiles, out = Path(sys.argv[1]), torch.load(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.set_num_threads(1)
model = AutoModelForImageTextToText.from_pretrained(checkpoint, dtype=torch.float32).eval()
model_type = model.config.model_type
official = {"qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor, "internvl": InternVLProcessor}[model_type]


class Processor(official):
    """The official processor for images and text; its video processor, which needs torchvision, left out."""

    @classmethod
    def get_attributes(cls):
        return ["image_processor", "tokenizer"]


chat_template = json.loads((checkpoint / "chat_template.json").read_text())["chat_template"] if (checkpoint / "chat_template.json").is_file() \
    else (checkpoint / "chat_template.jinja").read_text()
extra = json.loads((checkpoint / "processor_config.json").read_text()) if (checkpoint / "processor_config.json").is_file() else {}
extra = {k: v for k, v in extra.items() if k != "processor_class"}
processor = Processor(AutoImageProcessor.from_pretrained(checkpoint), AutoTokenizer.from_pretrained(checkpoint), None,
                      chat_template=chat_template, **extra)


def user_turn(query: str) -> list[dict] | str:
    if model_type == "internvl":  # the processor expands its image token where the text has it
        return query.replace("<image>", processor.image_token)
    pieces = query.split("<image>")
    content = []
    for k, piece in enumerate(pieces):
        content += [{"type": "text", "text": piece}] if piece else []
        content += [{"type": "image"}] if k < len(pieces) - 1 else []
    return content


results = []
for record in ours["records"]:
    images = [Image.open(path) for path in record["images"]]
    messages = [{"role": "user", "content": user_turn(record["query"])}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    tiles = {"max_patches": max_tiles} if model_type == "internvl" else {}
    inputs = processor(text=[text], images=images or None, return_tensors="pt", **tiles)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, output_logits=True, return_dict_in_generate=True)
    generated = output.sequences[0, inputs["input_ids"].shape[1]:]
    answer = processor.decode(generated, skip_special_tokens=True)
    results.append({"id": record["id"], "input_ids": inputs["input_ids"][0], "pixels": inputs.get("pixel_values"),
                    "grids": inputs.get("image_grid_thw"), "tokens": generated.tolist(), "logits": torch.stack(output.logits)[:, 0],
                    "text": answer.strip() if model_type == "internvl" else answer})
torch.save(results, out)
print(f"{len(results)} samples: {out}")
