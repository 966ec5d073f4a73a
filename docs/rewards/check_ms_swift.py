"""ms-swift's own data loading and reward call against judge-serve, on image datasets: its load_dataset reads a JSONL
file naming image paths and a Parquet file holding the images' bytes (each image then a {"bytes", "path"} dict), its
import_external_file (what --external_plugins runs) registers docs/rewards/ms_swift_plugin.py's reward as
orms["mmjudge"], and its GRPO compute_rewards_per_func calls it on the loaded rows. Each reward must equal a direct
/get_reward with the same image to 1e-6, and differ from the same request without it. Run in a venv of ms-swift's
own (docs/rewards.md), with the server's --image_root at DATA_DIR:

    MMJUDGE_URL=http://127.0.0.1:PORT python docs/rewards/check_ms_swift.py DATA_DIR"""

import base64
import json
import os
import sys
from importlib import metadata
from pathlib import Path

import httpx2
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image
from swift.dataset import load_dataset
from swift.rewards import orms
from swift.rl_core.data import GRPOSample
from swift.rl_core.grpo_algorithm import compute_rewards_per_func
from swift.utils.utils import import_external_file

QUESTION = "<image>What colour is the square?"
ANSWERS = {"red": "Red.", "blue": "It looks blue to me."}


def write_datasets(folder: Path) -> tuple[Path, Path]:
    """The same two rows as JSONL (image paths) and as Parquet (image bytes, as a Hub dataset's Image feature stores them)."""
    rows = []
    for colour, answer in ANSWERS.items():
        path = folder / f"{colour}.png"
        Image.new("RGB", (28, 28), colour).save(path)
        rows.append({"messages": [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": answer}], "images": [str(path)]})
    jsonl = folder / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    parquet = folder / "rows.parquet"
    pq.write_table(pa.table({"messages": [json.dumps(r["messages"]) for r in rows],
                             "images": [[{"bytes": Path(r["images"][0]).read_bytes(), "path": None}] for r in rows]}), parquet)
    return jsonl, parquet


def direct(url: str, answer: str, image: Path | None) -> float:
    """/get_reward asked directly: the same question and answer, with the image as a data URL or without it."""
    images = [["data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()]] if image else [[]]
    body = {"query": [QUESTION + answer], "prompts": [QUESTION], "images": images}
    return httpx2.post(f"{url}/get_reward", json=body, timeout=120).json()["rewards"][0]


def main(data_dir: str) -> int:
    folder = Path(data_dir)
    url = os.environ["MMJUDGE_URL"]
    import_external_file(str(Path(__file__).with_name("ms_swift_plugin.py")))
    reward = orms["mmjudge"]()
    ok = True
    for name, file in zip(("jsonl", "parquet"), write_datasets(folder)):
        dataset, _ = load_dataset([str(file)], num_proc=1)
        samples = [GRPOSample.from_row(dataset[k]) for k in range(len(dataset))]
        rewards = compute_rewards_per_func(samples, [reward], None, torch.device("cpu"))[:, 0].tolist()
        with_images = [direct(url, answer, folder / f"{colour}.png") for colour, answer in ANSWERS.items()]
        without = [direct(url, answer, None) for answer in ANSWERS.values()]
        same = all(abs(a - b) <= 1e-6 for a, b in zip(rewards, with_images)) and all(abs(a - b) > 1e-6 for a, b in zip(rewards, without))
        ok &= same
        first = dataset[0]["images"][0]
        print(json.dumps({"ms-swift": metadata.version("ms-swift"), "dataset": name, "image as load_dataset gives it":
                          {k: (f"{len(v)} bytes" if isinstance(v, bytes) else v) for k, v in first.items()}, "rewards": rewards,
                          "direct with the image": with_images, "direct without it": without, "equal to 1e-6 with, differ without": same}))
    failed = reward.reward.rewarder.failed
    print(json.dumps({"failed": failed}))
    return 0 if ok and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
