"""The judge as the reward of RL runs: each framework's reward door, over a judge-serve started with --reward
(its /get_reward) or over an in-process `mmjudge.Judge`. What a reward is, the server's --reward (or
`LocalRewards`' `reward`) says: judge/rewards.py. docs/rewards.md shows each framework's setup.

    from mmjudge.rewards import ServerRewards, TRLReward
    reward = TRLReward(ServerRewards("http://127.0.0.1:8000"))            # TRL's GRPOTrainer(reward_funcs=[reward]), ms-swift's AsyncORM
    GRPOTrainer(..., reward_funcs=[reward])

    verl:     reward.custom_reward_function.path=<this file's path>, name=compute_score (async; MMJUDGE_URL, or
              reward_kwargs.base_url; the question in extra_info["question"], images in extra_info["images"])
    EasyR1:   worker.reward.reward_function=<this file's path>:compute_score_batch (REWARD_TYPE batch)
    OpenRLHF: --reward.remote_url <server>/get_reward (its own client), or this file's `reward_func`

Images go as they come: paths (read under the server's --image_root, or locally by `LocalRewards`), data
URLs, or PIL images (sent as PNG data URLs). A request is retried a bounded number of times on a transport
failure or a 5xx, each within a timeout; a refusal (4xx) is not retried. A judgement that fails is never a
reward: TRL gets None (its skip value); verl, EasyR1 and OpenRLHF, which have none, get 0.0 beside a
`judge_failed` metric of 1; every failure is counted on the rewarder (`failed`) and logged.
"""

# No `from __future__ import annotations`: OpenRLHF, verl and EasyR1 load this file by path as a module they do
# not register, where dataclasses cannot resolve annotations given as strings.
import asyncio
import base64
import io
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("mmjudge.rewards")

MAX_RETRIES = 5  # OpenRLHF's own client tries 5 times
MAX_TIMEOUT_S = 3600.0


class RewardError(Exception):
    """A judgement that gave no reward: the server refused the request, or could not be reached in the tries given."""


@dataclass(frozen=True)
class Asked:
    """One response to reward: the prompt it answers (text), its images, and the reference answer (a
    preference reward) or verdict label (a verdict reward) where the reward needs one."""

    prompt: str
    response: str
    images: Sequence[Any] = ()  # paths, data URLs or PIL images
    reference: str | None = None  # any other value as its text

    def __post_init__(self):
        # A framework's ground truth is its dataset's answer column, a number as often as a text (EasyR1's and verl's
        # math sets): the judge reads it as text, and judge-serve refuses a label that is not one.
        if self.reference is not None and not isinstance(self.reference, str):
            object.__setattr__(self, "reference", str(self.reference))


@dataclass
class ServerRewards:
    """Rewards from a judge-serve's /get_reward: one request per batch, the server batching it with every
    other client's. `api_key`: sent as a bearer token (default: the MMJUDGE_API_KEY variable)."""

    base_url: str
    api_key: str | None = None
    timeout_s: float = 180.0  # OpenRLHF's
    retries: int = 2
    backoff_s: float = 1.0  # the wait before the first retry, doubled before each next, at most 10 s
    failed: int = 0  # judgements that gave no reward, over this rewarder's life
    n_images: list[int] = field(default_factory=list)  # the images the judge was shown, per response of the last call

    def __post_init__(self):
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout_s must be above 0 and at most {MAX_TIMEOUT_S:g}, got {self.timeout_s}")
        if not 0 <= self.retries <= MAX_RETRIES:
            raise ValueError(f"retries must be 0-{MAX_RETRIES}, got {self.retries}")
        if not 0 <= self.backoff_s <= 10:
            raise ValueError(f"backoff_s must be 0-10, got {self.backoff_s}")
        self.base_url = self.base_url.rstrip("/")
        self.api_key = self.api_key or os.environ.get("MMJUDGE_API_KEY")

    async def rewards(self, asked: list[Asked]) -> list[float | None]:
        """Each response's reward; None for each where the judgement failed (counted and logged)."""
        try:
            answer = await self._post({"query": [a.prompt + a.response for a in asked], "prompts": [a.prompt for a in asked],
                                       "images": [[image_reference(i) for i in a.images] for a in asked],
                                       **({"labels": [a.reference for a in asked]} if any(a.reference is not None for a in asked) else {})})
        except RewardError as err:
            return self._failed(len(asked), err)
        self.n_images = answer["extra_logs"].get("n_images", [])
        rewards = answer["rewards"]
        if missing := sum(r is None for r in rewards):
            self.failed += missing
            logger.warning("mmjudge: the judge's output gave no reward for %d of %d responses", missing, len(rewards))
        return rewards

    def _failed(self, n: int, err: Exception) -> list[None]:
        self.failed += n
        logger.warning("mmjudge: no reward for %d responses: %s", n, err)
        return [None] * n

    async def _post(self, body: dict) -> dict:
        import httpx2

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        problem = "no try made"
        async with httpx2.AsyncClient(timeout=self.timeout_s) as client:
            for attempt in range(self.retries + 1):
                if attempt:
                    await asyncio.sleep(min(self.backoff_s * 2.0 ** (attempt - 1), 10.0))  # a restarting server gets a moment
                try:
                    answer = await client.post(f"{self.base_url}/get_reward", json=body, headers=headers)
                except httpx2.TransportError as err:  # timeouts included
                    problem = f"{type(err).__name__}: {err}"
                    continue
                if answer.status_code < 400:
                    return answer.json()
                problem = f"HTTP {answer.status_code}: {answer.text[:500]}"
                if answer.status_code < 500:  # the request itself is at fault: the same again would be refused again
                    break
        raise RewardError(f"{self.base_url}/get_reward: {problem}")


@dataclass
class LocalRewards:
    """Rewards from an in-process judge (`mmjudge.Judge.load(...)`), under `reward` as judge-serve's --reward
    spells it; images are local paths (or PIL images)."""

    judge: Any  # mmjudge.Judge
    reward: str = "score:SA"
    rubrics: Sequence[str] | None = None  # rubric files or folders (default: judge-serve's)
    failed: int = 0
    n_images: list[int] = field(default_factory=list)

    def __post_init__(self):
        from mmjudge.infer.options import ScoreOptions
        from mmjudge.judge.formats import FORMATS
        from mmjudge.judge.prompts import load_rubrics
        from mmjudge.judge.rewards import parse_reward

        self._rubrics = load_rubrics(self.rubrics or FORMATS["pairs"].default_rubrics)
        self._spec = parse_reward(self.reward, self._rubrics)
        self._options = ScoreOptions(**{"mode": "logits", **self.judge.options})

    async def rewards(self, asked: list[Asked]) -> list[float | None]:
        try:
            return await asyncio.to_thread(self._rewards, asked)
        except Exception as err:  # noqa: BLE001 - a judgement that fails is no reward, and says why
            self.failed += len(asked)
            logger.warning("mmjudge: no reward for %d responses: %s: %s", len(asked), type(err).__name__, err)
            return [None] * len(asked)

    def _rewards(self, asked: list[Asked]) -> list[float | None]:
        import tempfile

        from mmjudge.judge.data import Pair, Sample
        from mmjudge.judge.rewards import preference_reward, score_reward, verdict_reward

        spec, rubric = self._spec, self._rubrics[self._spec.category]
        if spec.kind == "verdict":
            return [verdict_reward(a.response, a.reference or "", rubric) for a in asked]
        with tempfile.TemporaryDirectory(prefix="mmjudge-rewards-") as folder:
            items = []
            for k, a in enumerate(asked):
                question = [{"image": local_image(image, folder, f"{k}_{n}")} for n, image in enumerate(a.images)] + [{"text": a.prompt}]
                if spec.kind == "preference":
                    items.append((k, Pair(id=str(k), question=question, answer_a=a.response, answer_b=a.reference or "", category=spec.category)))
                else:
                    items.append((k, Sample(id=str(k), question=question, answer=a.response, category=spec.category)))
            results = {int(r.id): r for batch in self.judge.score_batches(items, self._rubrics, self._options, ".") for r in batch}
        ordered = [results[k] for k in range(len(asked))]
        self.n_images = [r.n_images for r in ordered]
        if spec.kind == "preference":
            return [preference_reward(r) for r in ordered]
        return [score_reward(r, rubric, spec.calibrator) for r in ordered]


def image_reference(image: Any) -> str:
    """An image as a request names it: a path or data URL as it is, a PIL image as a PNG data URL."""
    if isinstance(image, (str, os.PathLike)):
        return os.fspath(image)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def local_image(image: Any, folder: str, name: str) -> str:
    """A local path of the image: a path as it is, a PIL image written (losslessly) into `folder`."""
    if isinstance(image, (str, os.PathLike)):
        if os.fspath(image).startswith("data:"):
            raise ValueError("an in-process judge reads images from paths or PIL images, not data URLs")
        return os.fspath(image)
    path = os.path.join(folder, f"{name}.png")
    image.save(path, format="PNG")
    return path


def text_of(message: Any) -> str:
    """The text of a prompt or completion as TRL passes it: a text, or a conversation (each message's text
    parts, joined by lines); its image parts are the `images` column's."""
    if isinstance(message, str):
        return message
    texts = []
    for turn in message:
        content = turn["content"]
        texts += [content] if isinstance(content, str) else [part["text"] for part in content if part.get("type") == "text"]
    return "\n".join(texts)


class TRLReward:
    """TRL's GRPOTrainer reward function (async; `reward_funcs=[TRLReward(...)]`), and ms-swift's AsyncORM's
    body: the batch's prompts, completions and images (the `images` column, or `image`) to the judge at
    once; the reference answers from the column `reference_column` where the reward needs them. A failed
    judgement is None, TRL's skip."""

    def __init__(self, rewarder: ServerRewards | LocalRewards, reference_column: str = "solution"):
        self.rewarder, self.reference_column = rewarder, reference_column
        self.__name__ = "mmjudge"  # TRL names each reward function's metrics by it

    async def __call__(self, prompts: list, completions: list, images: list | None = None, image: list | None = None, **columns) -> list[float | None]:
        given = images if images is not None else [[i] if i is not None else [] for i in image] if image is not None else [[]] * len(prompts)
        references = columns.get(self.reference_column) or [None] * len(prompts)
        asked = [Asked(text_of(p), text_of(c), list(i or []), r) for p, c, i, r in zip(prompts, completions, given, references)]
        rewards = await self.rewarder.rewards(asked)
        if log_metric := columns.get("log_metric"):  # TRL's: the share of failed judgements, and the images the judge saw
            log_metric("mmjudge/failed", sum(r is None for r in rewards) / len(rewards))
            log_metric("mmjudge/images_judged", float(sum(self.rewarder.n_images)))
        return rewards


# -- verl, EasyR1, OpenRLHF: files these frameworks load by path, configured by the environment -----------------

def _server(base_url: str | None = None) -> ServerRewards:
    url = base_url or os.environ.get("MMJUDGE_URL")
    if not url:
        raise RewardError("set MMJUDGE_URL to the judge-serve's address (http://HOST:PORT), or pass base_url")
    if url not in _SERVERS:
        _SERVERS[url] = ServerRewards(url, timeout_s=float(os.environ.get("MMJUDGE_TIMEOUT_S", 180)),
                                      retries=int(os.environ.get("MMJUDGE_RETRIES", 2)))
    return _SERVERS[url]


_SERVERS: dict[str, ServerRewards] = {}


def _or_failed(reward: float | None) -> dict:
    """A framework without a skip value: 0.0, with the failure as a metric of its own."""
    return {"score": 0.0 if reward is None else reward, "judge_failed": float(reward is None)}


async def compute_score(data_source: str, solution_str: str, ground_truth: str | None = None, extra_info: dict | None = None,
                        base_url: str | None = None, **_: Any) -> dict:
    """verl's custom reward function: the response `solution_str`, the question `extra_info["question"]`
    and its images `extra_info["images"]` (paths under the server's --image_root, or data URLs), the
    reference `ground_truth` (a preference or verdict reward's). `{"score", "judge_failed"}`: verl logs the
    second as a metric."""
    extra = extra_info or {}
    asked = Asked(str(extra.get("question", "")), solution_str, list(extra.get("images") or []), ground_truth)
    reward, = await _server(base_url).rewards([asked])
    return _or_failed(reward)


REWARD_TYPE = "batch"  # EasyR1's: compute_score_batch takes the whole batch
REWARD_NAME = "mmjudge"  # what EasyR1 names the reward function it loaded


def compute_score_batch(reward_inputs: list[dict], base_url: str | None = None) -> list[dict]:
    """EasyR1's batch reward function: each input's `response` (and `ground_truth`, where the reward needs
    a reference) judged; EasyR1 passes no question or images, so the response is judged alone. `overall` is
    the reward, `judge_failed` 1 where it failed."""
    asked = [Asked("", item["response"], (), item.get("ground_truth")) for item in reward_inputs]
    rewards = asyncio.run(_server(base_url).rewards(asked))
    return [{"overall": r["score"], "judge_failed": r["judge_failed"]} for r in map(_or_failed, rewards)]


def reward_func(queries: list[str], prompts: list[str], labels: list[str | None], images: list | None = None, base_url: str | None = None,
                **_: Any) -> dict:
    """OpenRLHF's reward function file (`--reward.remote_url this.py`): its {"rewards", "scores", "extra_logs"},
    as tensors."""
    import torch

    from mmjudge.judge.rewards import response_of

    asked = [Asked(p, response_of(q, p) or q, list(images[k]) if images else (), label) for k, (q, p, label) in enumerate(zip(queries, prompts, labels))]
    rewards = [_or_failed(r) for r in asyncio.run(_server(base_url).rewards(asked))]
    scores = torch.tensor([r["score"] for r in rewards])
    return {"rewards": scores, "scores": scores, "extra_logs": {"judge_failed": torch.tensor([r["judge_failed"] for r in rewards])}}
