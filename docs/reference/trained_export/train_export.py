"""A trained judge, exported (mmjudge's venv): a tiny original checkpoint whose long rope switches at SWITCH
tokens, shipping InternVL's own code (REMOTE_CODE, docs/internvl-reference.md step 1), LoRA-trained for 3
steps at lr 1e-2 and merged with `judge-train merge --format original` into RUN/exported.
With `image-rows`, the base's output rows of `</img>` and `<IMG_CONTEXT>` are those of `<0x0A>` and `T`
(two tokens trained judges write often) plus noise of a tenth of a row's spread: the judge then ranks an image
token first at some steps where it would write one of those (LoRA leaves the output layer as it is).
usage: train_export.py RUN SEED SWITCH REMOTE_CODE [projector] [bf16] [image-rows]"""
import json, shutil, sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.testing import write_dataset, write_original_checkpoint
from mmjudge.train.cli import main as train_main

run, seed, switch, remote_code = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
options = sys.argv[5:]
projector = "projector" in options
shutil.rmtree(run, ignore_errors=True)
base = write_original_checkpoint(run / "base", seed=seed, shards=2, original_max_position_embeddings=switch,
                                 dtype="bfloat16" if "bf16" in options else "float32")
if "image-rows" in options:
    shard = next(f for f in sorted(base.glob("model-*.safetensors")) if "language_model.lm_head.weight" in safe_open(f, "pt").keys())
    with safe_open(shard, "pt") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    head = tensors["language_model.lm_head.weight"]
    noise = torch.randn(2, head.shape[1], generator=torch.Generator().manual_seed(seed)) * head.float().std() * 0.1
    for row, (image_token, like) in enumerate(((1212, 13), (1213, 1165))):  # </img> like <0x0A>, <IMG_CONTEXT> like T
        head[image_token] = (head[like].float() + noise[row]).to(head.dtype)
    save_file(tensors, shard, metadata=metadata)
for code in remote_code.glob("*.py"):
    shutil.copyfile(code, base / code.name)
records = json.loads(write_dataset(run / "train", 12, seed=seed, annotated=True).read_text())
(run / "train" / "train.json").write_text(json.dumps(records))
common = ["--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", str(CONFIG_DIR / "rubrics" / "tiny"), "--dataloader_workers", "0"]
assert train_main(["--model_path", str(base), "--train_file", str(run / "train" / "train.json"), "--input_dir", str(run / "train"),
                   "--output_dir", str(run / "judge"), *common, "--max_steps", "3", "--save_steps", "3", "--per_device_batch_size", "2",
                   "--no-full_finetune", "--learning_rate", "1e-2", "--seed", str(seed)] + (["--train_projector"] if projector else [])) == 0
assert train_main(["merge", "--adapter", str(run / "judge"), "--output_dir", str(run / "exported"), "--format", "original"]) == 0
