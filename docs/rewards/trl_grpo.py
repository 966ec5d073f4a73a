"""TRL's own GRPOTrainer, 2 steps on a CPU, a tiny random Qwen2.5-VL policy, rewarded by a judge-serve through
mmjudge.rewards.TRLReward; run by docs/rewards/check_trl.sh, in a venv of TRL's own (docs/rewards.md).

    bash docs/rewards/check_trl.sh                              # from the repository root: makes that venv, runs this
    python docs/rewards/trl_grpo.py POLICY_DIR JUDGE_URL OUT_DIR   # in that venv

Not in the project's venv: TRL loads the policy's processor with transformers' AutoProcessor, and Qwen2.5-VL's
needs torchvision, which requirements/lock.txt does not have (torch's CPU build 2.13.0 has no torchvision of its
own); check_trl.sh's venv installs trl, torchvision (which brings the torch it was built for), datasets, pillow
and httpx2, and mmjudge without its dependencies.

Prints what the trainer logged at each step (the mmjudge reward's mean, its failed share, the images the judge
was shown)."""

import importlib.util
import json
import sys

if importlib.util.find_spec("torchvision") is None:
    sys.exit("trl_grpo.py needs torchvision (Qwen2.5-VL's processor), which the project's venv lacks: "
             "run it through `bash docs/rewards/check_trl.sh`, which makes a venv of TRL's own with it")

import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from PIL import Image  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from mmjudge.rewards import ServerRewards, TRLReward  # noqa: E402


def main(policy: str, judge_url: str, out_dir: str) -> int:
    colours = ["red", "green", "blue", "yellow"]
    dataset = Dataset.from_dict({
        "prompt": [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is this square?"}]}]] * len(colours),
        "images": [[Image.new("RGB", (56, 56), colour)] for colour in colours],
    })
    rewarder = ServerRewards(judge_url, timeout_s=120, retries=1)
    reward = TRLReward(rewarder)
    config = GRPOConfig(output_dir=out_dir, max_steps=2, per_device_train_batch_size=2, num_generations=2, max_completion_length=8,
                        learning_rate=1e-5, logging_steps=1, report_to="none", use_cpu=True, bf16=False, save_strategy="no",
                        dataloader_num_workers=0, seed=0)
    trainer = GRPOTrainer(model=policy, reward_funcs=[reward], args=config, train_dataset=dataset)
    trainer.train()
    images_judged = [entry["mmjudge/images_judged"] for entry in trainer.state.log_history if "mmjudge/images_judged" in entry]
    print(json.dumps({"trl": trl.__version__, "steps": trainer.state.global_step, "judge_failed": rewarder.failed,
                      "images_judged_per_step": images_judged}))
    for entry in trainer.state.log_history:
        print(json.dumps({k: v for k, v in entry.items() if k.startswith(("rewards/", "reward", "mmjudge/")) or k == "step"}))
    return 0 if trainer.state.global_step == 2 and rewarder.failed == 0 and all(n > 0 for n in images_judged) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
