"""prime-rl's reward path against judge-serve, on image data: prime-rl scores each rollout through verifiers (v1, the
commit prime-rl pins as its deps/verifiers submodule), whose Task.score runs a task's rewards, here mmjudge's plugged
by its config (`rewards={"mmjudge": RewardFunctionConfig(fn="mmjudge.rewards.prime_rl_reward")}`) as a taskset's TOML
plugs it. A Taskset reads a JSONL file of tasks whose prompt holds the image as an `image_url` part (a data URL),
verifiers validates each row into its own TaskData (pydantic content parts), and a Trace holds the policy's reply.
The reward must equal a direct /get_reward with the same image to 1e-6, and differ from the same request without it;
then a judge that cannot be reached: verifiers' scoring raises TaskError, which errors the rollout (prime-rl trains
none of an errored rollout), and the reward stays unscored, never a 0. Run in a venv holding verifiers and httpx2:

    MMJUDGE_URL=http://127.0.0.1:PORT python docs/rewards/check_prime_rl.py WORK_DIR"""

import asyncio
import base64
import io
import json
import os
import sys
from importlib import metadata
from pathlib import Path

import httpx2
import verifiers.v1 as vf
from PIL import Image
from verifiers.v1.graph import MessageNode
from verifiers.v1.types import AssistantMessage

QUESTION, RESPONSE = "What colour is the square?", "It is red."


class ColourData(vf.TaskData):
    answer: str


class ColourTask(vf.Task[ColourData]):
    pass


class ColourTaskset(vf.Taskset[ColourTask, vf.TasksetConfig]):
    """Tasks from a JSONL file, each row a prompt (chat messages, the image an image_url part) and its answer."""

    def __init__(self, config: vf.TasksetConfig, path: Path, task_config: vf.TaskConfig):
        super().__init__(config)
        self.path, self.task_config = path, task_config

    def load(self):
        for idx, line in enumerate(self.path.read_text().splitlines()):
            yield ColourTask(ColourData(idx=idx, **json.loads(line)), self.task_config)


def direct(url: str, image: str | None) -> float:
    body = {"query": [QUESTION + RESPONSE], "prompts": [QUESTION], "images": [[image] if image else []], "labels": ["red"]}
    return httpx2.post(f"{url}/get_reward", json=body, timeout=120).json()["rewards"][0]


def rollout(task: ColourTask) -> vf.Trace:
    """The trace of a rollout that answered RESPONSE."""
    return vf.Trace(agent=vf.AgentInfo(config=vf.AgentConfig()), task=vf.TraceTask(type="ColourTask", data=task.data),
                    nodes=[MessageNode(parent=None, message=task.data.prompt[0], sampled=False),
                           MessageNode(parent=0, message=AssistantMessage(content=RESPONSE), sampled=True)])


def main(work_dir: str) -> int:
    url = os.environ["MMJUDGE_URL"]
    buffer = io.BytesIO()
    Image.new("RGB", (28, 28), "red").save(buffer, format="PNG")
    image = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    rows = Path(work_dir) / "colours.jsonl"
    rows.write_text(json.dumps({"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                                        {"type": "text", "text": QUESTION}]}], "answer": "red"}) + "\n")
    config = vf.TaskConfig(rewards={"mmjudge": vf.RewardFunctionConfig(fn="mmjudge.rewards.prime_rl_reward")})
    (task,) = list(ColourTaskset(vf.TasksetConfig(), rows, config))
    part = task.data.prompt[0].content[0]
    trace = rollout(task)
    asyncio.run(task.score(trace))
    reward = trace.rewards["mmjudge"].score
    with_image, without = direct(url, image), direct(url, None)
    same = abs(reward - with_image) <= 1e-6 and abs(reward - without) > 1e-6

    os.environ["MMJUDGE_URL"] = "http://127.0.0.1:9"  # nothing listens: the judgement fails
    failed = rollout(task)
    try:
        asyncio.run(task.score(failed))
        failure = "no error: the failure read as a reward"
    except vf.TaskError as err:
        failure = f"{type(err).__name__}: {str(err)[:120]}"
    unreachable = failure.startswith("TaskError") and failed.rewards["mmjudge"] is None
    print(json.dumps({"verifiers": metadata.version("verifiers"), "image as verifiers holds it": f"{type(part).__name__}, {part.image_url.url[:30]}...",
                      "trace.rewards['mmjudge'].score": reward, "trace.reward": trace.reward, "direct with the image": with_image,
                      "direct without it": without, "equal to 1e-6 with, differ without": same, "judge unreachable": failure,
                      "its reward then": failed.rewards["mmjudge"]}))
    return 0 if same and unreachable else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
