"""ms-swift's own plugin registration and reward call against judge-serve: its import_external_file (what
--external_plugins runs) registers docs/rewards/ms_swift_plugin.py's reward as orms["mmjudge"], and its GRPO
compute_rewards_per_func calls it on two samples, each with an image path under the server's --image_root. Run in
a venv of ms-swift's own (docs/rewards.md):

    MMJUDGE_URL=http://127.0.0.1:PORT python docs/rewards/check_ms_swift.py IMAGE"""

import json
import sys
from importlib import metadata
from pathlib import Path

import torch
from swift.rewards import orms
from swift.rl_core.data import GRPOSample
from swift.rl_core.grpo_algorithm import compute_rewards_per_func
from swift.utils.utils import import_external_file


def main(image: str) -> int:
    import_external_file(str(Path(__file__).with_name("ms_swift_plugin.py")))
    reward = orms["mmjudge"]()
    samples = [GRPOSample.from_row({"messages": [{"role": "user", "content": "<image>What colour is the square?"},
                                                 {"role": "assistant", "content": answer}], "images": [image]})
               for answer in ("Red.", "It looks blue to me.")]
    rewards = compute_rewards_per_func(samples, [reward], None, torch.device("cpu"))
    judged = reward.reward.rewarder
    print(json.dumps({"ms-swift": metadata.version("ms-swift"), "rewards": rewards[:, 0].tolist(), "images_judged": judged.n_images,
                      "failed": judged.failed}))
    return 0 if judged.failed == 0 and judged.n_images == [1, 1] and bool(((rewards >= 0) & (rewards <= 1)).all()) else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
