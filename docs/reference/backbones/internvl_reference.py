"""InternVL's own code's side of an exactness check (a venv with transformers 4.37.2, as InternVL pins it; the
checkpoint ships InternVL's remote code): for each sample of ours.py's dump, the prompt InternVL's `chat()`
builds from the same question (its conversation template and system message, `<image>` expanded to the
image's tiles) tokenized by the checkpoint's slow tokenizer (use_fast=False, as InternVL's examples and MMIE
load it); `generate` on exactly mmjudge's tiles as `chat()` calls it, each step's logits recorded; and
`chat()` itself end to end, whose answer is the text MMIE's main.py writes.
The images are InternVL's own: each opened and converted to RGB, tiled by `dynamic_preprocess` and normalised by
`build_transform` (its internvl_chat/internvl/train/dataset.py, the functions read from the checkout unchanged;
torchvision's transforms), at mmjudge's tile limit (MAX_TILES) and the checkpoint's size, thumbnail and least tiles.
InternLM2's dynamic-NTK rope keeps a grown base for every later, shorter sequence (modeling_internlm2.py):
its caches are reset before each sample, so that each is computed as it would be alone.
usage: internvl_reference.py CHECKPOINT OURS.pt NEW_TOKENS MAX_TILES INTERNVL_CHECKOUT OUT.pt"""
import ast
import sys
from pathlib import Path

import torch
import torchvision.transforms as T
from PIL import Image
from torchvision.transforms.functional import InterpolationMode
from transformers import AutoModel, AutoTokenizer

checkpoint, ours, new_tokens, max_tiles, internvl, out = (sys.argv[1], torch.load(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
                                                          Path(sys.argv[5]), sys.argv[6])
torch.set_num_threads(1)
code = internvl / "internvl_chat" / "internvl" / "train"
reference = {"T": T, "InterpolationMode": InterpolationMode}
exec(compile((code / "constants.py").read_text(), "constants.py", "exec"), reference)
wanted = {"build_transform", "find_closest_aspect_ratio", "dynamic_preprocess"}
functions = [node for node in ast.parse((code / "dataset.py").read_text()).body if isinstance(node, ast.FunctionDef) and node.name in wanted]
exec(compile(ast.Module(body=functions, type_ignores=[]), "dataset.py", "exec"), reference)
model = AutoModel.from_pretrained(checkpoint, torch_dtype=torch.float32, trust_remote_code=True, use_flash_attn=False).eval()
tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=True, use_fast=False)
get_conv_template = sys.modules[type(model).__module__].get_conv_template
model.img_context_token_id = tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>")


def fresh_rotary() -> None:
    """InternLM2's rotary caches as a freshly loaded model has them."""
    for module in model.modules():
        if type(module).__name__.startswith("InternLM2") and type(module).__name__.endswith("RotaryEmbedding"):
            module.inv_freq = 1.0 / (module.base ** (torch.arange(0, module.dim, 2).float() / module.dim))
            module._set_cos_sin_cache(module.max_position_embeddings, module.inv_freq.device, torch.get_default_dtype())


def prompt_ids(question: str, tiles: list[int]) -> torch.Tensor:
    """The ids `chat()` gives the model, built as it builds them."""
    template = get_conv_template(model.template)
    template.system_message = model.system_message
    template.append_message(template.roles[0], question)
    template.append_message(template.roles[1], None)
    query = template.get_prompt()
    for n in tiles:
        query = query.replace("<image>", "<img>" + "<IMG_CONTEXT>" * model.num_image_token * n + "</img>", 1)
    return tokenizer(query, return_tensors="pt").input_ids


def load_image(path: str) -> torch.Tensor:
    config = model.config
    size = config.force_image_size or config.vision_config.image_size
    transform = reference["build_transform"](is_train=False, input_size=size)
    tiles = reference["dynamic_preprocess"](Image.open(path).convert("RGB"), min_num=config.min_dynamic_patch, max_num=max_tiles,
                                            image_size=size, use_thumbnail=config.use_thumbnail)
    return torch.stack([transform(tile) for tile in tiles])


results = []
for record in ours["records"]:
    images = [load_image(path) for path in record["images"]]
    question, tiles = record["query"], [len(image) for image in images]
    pixels = torch.cat(images) if images else None
    ids = prompt_ids(question, tiles)
    stop = tokenizer.convert_tokens_to_ids(get_conv_template(model.template).sep.strip())
    fresh_rotary()
    with torch.no_grad():
        output = model.generate(pixel_values=pixels, input_ids=ids, attention_mask=torch.ones_like(ids),
                                max_new_tokens=new_tokens, do_sample=False, eos_token_id=stop, output_scores=True, return_dict_in_generate=True)
        fresh_rotary()
        try:
            answer = model.chat(tokenizer, pixels, question, dict(max_new_tokens=new_tokens, do_sample=False), num_patches_list=tiles)
        except (IndexError, TypeError):  # the answer holds a row of the output layer past the tokenizer, which its decode cannot name
            answer = None
    scores = torch.stack(output.scores)[:, 0]
    results.append({"id": record["id"], "input_ids": ids[0], "pixels": pixels, "tokens": output.sequences[0, -len(output.scores):].tolist(), "logits": scores,
                    "text": answer, "system": model.system_message, "template": model.template})
torch.save(results, out)
print(f"{len(results)} samples: {out}")
