"""A trained judge, exported (mmjudge's venv): a tiny original checkpoint whose long rope switches at SWITCH
tokens, shipping InternVL's own code (REMOTE_CODE, docs/internvl-reference.md step 1), LoRA-trained for 3
steps at lr 1e-2 and merged with `judge-train merge --format original` into RUN/exported.
usage: train_export.py RUN SEED SWITCH REMOTE_CODE [projector] [bf16]"""
import json, shutil, sys
from pathlib import Path

from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.testing import write_dataset, write_original_checkpoint
from mmjudge.train.cli import main as train_main

run, seed, switch, remote_code = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
options = sys.argv[5:]
projector = "projector" in options
shutil.rmtree(run, ignore_errors=True)
base = write_original_checkpoint(run / "base", seed=seed, shards=2, original_max_position_embeddings=switch,
                                 dtype="bfloat16" if "bf16" in options else "float32")
for code in remote_code.glob("*.py"):
    shutil.copyfile(code, base / code.name)
records = json.loads(write_dataset(run / "train", 12, seed=seed, annotated=True).read_text())
(run / "train" / "train.json").write_text(json.dumps(records))
common = ["--config", str(CONFIG_DIR / "train" / "tiny.yaml"), "--rubric", str(CONFIG_DIR / "rubrics" / "tiny"), "--dataloader_workers", "0"]
assert train_main(["--model_path", str(base), "--train_file", str(run / "train" / "train.json"), "--input_dir", str(run / "train"),
                   "--output_dir", str(run / "judge"), *common, "--max_steps", "3", "--save_steps", "3", "--per_device_batch_size", "2",
                   "--no-full_finetune", "--learning_rate", "1e-2", "--seed", str(seed)] + (["--train_projector"] if projector else [])) == 0
assert train_main(["merge", "--adapter", str(run / "judge"), "--output_dir", str(run / "exported"), "--format", "original"]) == 0
