"""The judge as the reward of RL runs: each framework's reward door, over a judge-serve started with --reward
(its /get_reward) or over an in-process `mmjudge.Judge`. What a reward is, the server's --reward (or
`LocalRewards`' `reward`) says: judge/rewards.py. docs/rewards.md shows each framework's setup.

    from mmjudge.rewards import ServerRewards, TRLReward
    reward = TRLReward(ServerRewards("http://127.0.0.1:8000"))            # TRL's GRPOTrainer(reward_funcs=[reward]), ms-swift's AsyncORM
    GRPOTrainer(..., reward_funcs=[reward])

    verl:     reward.custom_reward_function.path=<this file's path>, name=compute_score (async; MMJUDGE_URL, or
              reward_kwargs.base_url; the question in extra_info["question"], images in extra_info["images"])
    EasyR1:   worker.reward.reward_function=<this file's path>:compute_score_batch (REWARD_TYPE batch)
    OpenRLHF: --reward.remote_url <server>/get_reward (its own client), or this file's `reward_func`; in both the images
              in each label (--label_key naming a column of {"reference", "images"} objects)
    slime:    --custom-rm-path mmjudge.rewards.slime_reward --rm-url <server> (its Sample's PIL images)
    ROLL:     a rewards domain of worker_cls roll_reward_worker.MMJudgeRewardWorker (docs/rewards/), over `roll_rewards`
    prime-rl: its verifiers task config's rewards = {mmjudge = {fn = "mmjudge.rewards.prime_rl_reward"}}
    AReaL:    workflow="mmjudge.rewards.AReaLJudgeVisionWorkflow" (or AReaLJudgeWorkflow, text), its workflow_kwargs
              less reward_fn (MMJUDGE_URL, or base_url): the sample's `images`, `messages`, `answer`
    SkyRL:    skyrl_gym.envs.register(id="mmjudge", entry_point="mmjudge.rewards:SkyRLJudgeEnv"), env_class mmjudge:
              the prompt's text and image parts, reward_spec's ground_truth

Images go in every shape the frameworks' loaders give (IMAGE_SHAPES): paths (read under the server's
--image_root, or locally by `LocalRewards`), data URLs, encoded bytes, `{"bytes", "path"}` dicts (datasets'
Image feature, Parquet), PIL images and numpy arrays (sent as PNG). An image of any other shape fails its
response's judgement. A request is retried a bounded number of times on a transport failure or a 5xx, each
within a timeout; a refusal (4xx), a redirect (never followed) or an answer of the wrong shape is not retried.
A reward is a finite number within the reward's range, one per response, from a 2xx JSON answer: anything else
is a failed judgement, never a reward. TRL and ms-swift get None (their skip value), prime-rl an error (verifiers
errors the rollout, which prime-rl does not train on), AReaL its rejection of the trajectory, slime 0.0 with the
sample out of the loss; verl, EasyR1, OpenRLHF, ROLL and SkyRL, which have none, get 0.0 beside a `judge_failed`
metric of 1; every failure is counted on the rewarder (`failed`) and logged.

This file needs httpx2 alone (pillow too for PIL images and numpy arrays, which come from pillow's and numpy's
owners; torch for OpenRLHF's `reward_func`, whose answer is tensors): it imports nothing else of mmjudge
where it runs by itself (OpenRLHF, verl and EasyR1 load it by path), no tokenizer and no torch.
"""

# No `from __future__ import annotations`: OpenRLHF, verl and EasyR1 load this file by path as a module they do
# not register, where dataclasses cannot resolve annotations given as strings.
import asyncio
import base64
import functools
import importlib
import io
import json
import logging
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("mmjudge.rewards")

MAX_RETRIES = 5  # OpenRLHF's own client tries 5 times
MAX_TIMEOUT_S = 3600.0
# Every reward of a judge (judge/rewards.py: a score mapped to [0, 1], a probability, a verdict's 0 or 1) lies in
# [0, 1]; a reward model's head (judge-train --objective bradley_terry) is unbounded, and its users give the range
# its rewards can take. A number outside the range is a peer's fault, never a reward.
JUDGE_REWARD_RANGE = (0.0, 1.0)
IMAGE_SHAPES = "a path, a data URL, encoded bytes, a {'bytes', 'path'} dict, a PIL image or a numpy array"


class RewardError(Exception):
    """A judgement that gave no reward: the server refused the request, could not be reached in the tries given,
    or answered what is not one reward per response."""


class ImageError(ValueError):
    """An image in no shape this module reads (IMAGE_SHAPES)."""


@dataclass(frozen=True)
class Asked:
    """One response to reward: the prompt it answers (text), its images, and the reference answer (a
    preference reward) or verdict label (a verdict reward) where the reward needs one."""

    prompt: str
    response: str
    images: Sequence[Any] = ()  # each in one of IMAGE_SHAPES
    reference: str | None = None  # any other value as its text

    def __post_init__(self):
        # A framework's ground truth is its dataset's answer column, a number as often as a text (EasyR1's and verl's
        # math sets): the judge reads it as text, and judge-serve refuses a label that is not one.
        if self.reference is not None and not isinstance(self.reference, str):
            object.__setattr__(self, "reference", str(self.reference))


@dataclass(frozen=True)
class Judged:
    """One call's answer, about that call alone: each response's reward (None where its judgement failed) and the
    images the judge was shown with it."""

    rewards: list[float | None]
    n_images: list[int]

    @property
    def failed(self) -> int:
        return sum(r is None for r in self.rewards)


def _failed_judgements(rewarder: Any, judged: Judged, problems: dict[int, str]) -> Judged:
    """Counts the call's failed judgements on the rewarder, and logs why (the first few reasons)."""
    if judged.failed:
        rewarder.failed += judged.failed
        reasons = "; ".join(f"response {k}: {why}" for k, why in list(problems.items())[:3])
        logger.warning("mmjudge: no reward for %d of %d responses: %s", judged.failed, len(judged.rewards), reasons or "the judge gave no number")
    return judged


@dataclass
class ServerRewards:
    """Rewards from a judge-serve's /get_reward: one request per batch, the server batching it with every
    other client's. `api_key`: sent as a bearer token (default: the MMJUDGE_API_KEY variable). `reward_range`:
    the rewards the server can answer (a judge's: [0, 1]; give a served reward model's own)."""

    base_url: str
    api_key: str | None = None
    timeout_s: float = 180.0  # OpenRLHF's
    retries: int = 2
    backoff_s: float = 1.0  # the wait before the first retry, doubled before each next, at most 10 s
    reward_range: tuple[float, float] = JUDGE_REWARD_RANGE
    failed: int = 0  # judgements that gave no reward, over this rewarder's life

    def __post_init__(self):
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise ValueError(f"timeout_s must be above 0 and at most {MAX_TIMEOUT_S:g}, got {self.timeout_s}")
        if not 0 <= self.retries <= MAX_RETRIES:
            raise ValueError(f"retries must be 0-{MAX_RETRIES}, got {self.retries}")
        if not 0 <= self.backoff_s <= 10:
            raise ValueError(f"backoff_s must be 0-10, got {self.backoff_s}")
        low, high = self.reward_range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"reward_range must be two finite numbers, the lower first, got {self.reward_range}")
        self.base_url = self.base_url.rstrip("/")
        self.api_key = self.api_key or os.environ.get("MMJUDGE_API_KEY")

    async def ask(self, asked: list[Asked]) -> Judged:
        """Each response's reward; None for each where the judgement failed (counted and logged)."""
        rewards: list[float | None] = [None] * len(asked)
        n_images = [0] * len(asked)
        problems, images = {}, {}
        for k, a in enumerate(asked):
            try:
                images[k] = [image_reference(i) for i in a.images]
            except ImageError as err:
                problems[k] = str(err)
        sent = list(images)
        if sent:
            body = {"query": [asked[k].prompt + asked[k].response for k in sent], "prompts": [asked[k].prompt for k in sent],
                    "images": [images[k] for k in sent]}
            if any(asked[k].reference is not None for k in sent):
                body["labels"] = [asked[k].reference for k in sent]
            try:
                answered, shown, wrong = checked_answer(await self._post(body), len(sent), self.reward_range)
            except RewardError as err:
                problems.update({k: str(err) for k in sent})
            else:
                for j, k in enumerate(sent):
                    rewards[k], n_images[k] = answered[j], shown[j] if answered[j] is not None else 0
                problems.update({sent[j]: why for j, why in wrong.items()})
        return _failed_judgements(self, Judged(rewards, n_images), problems)

    async def _post(self, body: dict) -> Any:
        """The answer's JSON, from a 2xx; a RewardError for anything else."""
        import httpx2

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        problem = "no try made"
        url = f"{self.base_url}/get_reward"
        async with httpx2.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as client:
            for attempt in range(self.retries + 1):
                if attempt:
                    await asyncio.sleep(min(self.backoff_s * 2.0 ** (attempt - 1), 10.0))  # a restarting server gets a moment
                try:
                    answer = await client.post(url, json=body, headers=headers)
                except httpx2.TransportError as err:  # timeouts included
                    problem = f"{type(err).__name__}: {err}"
                    continue
                if 200 <= answer.status_code < 300:
                    try:
                        return answer.json()
                    except ValueError:  # an HTML page, an empty body (a 204's)
                        raise RewardError(f"{url}: HTTP {answer.status_code} with no JSON answer: {answer.text[:200]!r}") from None
                problem = f"HTTP {answer.status_code}: {answer.text[:500]}"
                if answer.status_code < 500:  # a refusal, or a redirect (never followed): the same again gets the same
                    break
        raise RewardError(f"{url}: {problem}")


def checked_answer(answer: Any, n: int, reward_range: tuple[float, float]) -> tuple[list[float | None], list[int], dict[int, str]]:
    """The rewards and image counts of a /get_reward answer for `n` responses, and why each missing reward is: a
    RewardError where the answer's shape is not one reward (a number or null) per response; None for a reward that
    is null (the judge's output gave no number) or not a finite number within `reward_range`."""
    rewards = answer.get("rewards") if isinstance(answer, dict) else None
    if not isinstance(rewards, list) or len(rewards) != n or not all(r is None or _is_number(r) for r in rewards):
        raise RewardError(f"the answer is not one reward (a number or null) per response for {n} responses: {str(answer)[:200]}")
    logs = answer.get("extra_logs", {})
    shown = logs.get("n_images", [0] * n) if isinstance(logs, dict) else None
    if not isinstance(shown, list) or len(shown) != n or not all(_is_number(m) and isinstance(m, int) and m >= 0 for m in shown):
        raise RewardError(f"the answer's extra_logs.n_images is not one image count per response: {str(answer)[:200]}")
    low, high = reward_range
    checked, problems = [], {}
    for k, reward in enumerate(rewards):
        if reward is not None and not (math.isfinite(reward) and low <= reward <= high):
            problems[k] = f"the answer's reward {reward!r} is not a finite number in [{low:g}, {high:g}]"
            reward = None
        checked.append(None if reward is None else float(reward))
    return checked, shown, problems


def _is_number(value: Any) -> bool:
    """A JSON number Python reads exactly enough to compare: a float, or an int a float holds."""
    return isinstance(value, float) or isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2 ** 53


@dataclass
class LocalRewards:
    """Rewards from an in-process judge (`mmjudge.Judge.load(...)`), under `reward` as judge-serve's --reward
    spells it; images in any of IMAGE_SHAPES, written to files for the judge where they are not paths."""

    judge: Any  # mmjudge.Judge
    reward: str = "score:SA"
    rubrics: Sequence[str] | None = None  # rubric files or folders (default: judge-serve's)
    failed: int = 0

    def __post_init__(self):
        from mmjudge.infer.options import ScoreOptions
        from mmjudge.judge.formats import FORMATS
        from mmjudge.judge.prompts import load_rubrics
        from mmjudge.judge.rewards import parse_reward

        self._rubrics = load_rubrics(self.rubrics or FORMATS["pairs"].default_rubrics)
        self._spec = parse_reward(self.reward, self._rubrics)
        self._options = ScoreOptions(**{"mode": "logits", **self.judge.options})

    async def ask(self, asked: list[Asked]) -> Judged:
        """Each response's reward; None for each where the judgement failed (counted and logged)."""
        try:
            judged, problems = await asyncio.to_thread(self._judged, asked)
        except Exception as err:  # noqa: BLE001 - a judgement that fails is no reward, and says why
            judged, problems = Judged([None] * len(asked), [0] * len(asked)), dict.fromkeys(range(len(asked)), f"{type(err).__name__}: {err}")
        return _failed_judgements(self, judged, problems)

    def _judged(self, asked: list[Asked]) -> tuple[Judged, dict[int, str]]:
        import tempfile

        from mmjudge.judge.data import Pair, Sample
        from mmjudge.judge.rewards import preference_reward, score_reward, verdict_reward

        spec, rubric = self._spec, self._rubrics[self._spec.category]
        if spec.kind == "verdict":
            return Judged([verdict_reward(a.response, a.reference or "", rubric) for a in asked], [0] * len(asked)), {}
        rewards, n_images, problems = [None] * len(asked), [0] * len(asked), {}
        with tempfile.TemporaryDirectory(prefix="mmjudge-rewards-") as folder:
            items = []
            for k, a in enumerate(asked):
                try:
                    question = [{"image": local_image(image, folder, f"{k}_{n}")} for n, image in enumerate(a.images)] + [{"text": a.prompt}]
                except ImageError as err:
                    problems[k] = str(err)
                    continue
                if spec.kind == "preference":
                    items.append((k, Pair(id=str(k), question=question, answer_a=a.response, answer_b=a.reference or "", category=spec.category)))
                else:
                    items.append((k, Sample(id=str(k), question=question, answer=a.response, category=spec.category)))
            results = [r for batch in self.judge.score_batches(items, self._rubrics, self._options, ".") for r in batch] if items else []
        for result in results:
            k = int(result.id)
            rewards[k] = preference_reward(result) if spec.kind == "preference" else score_reward(result, rubric, spec.calibrator)
            n_images[k] = result.n_images
        return Judged(rewards, n_images), problems


# -- images, in each shape the frameworks' loaders give ----------------------------------------------------------

def image_content(image: Any) -> str | bytes:
    """An image as a path or data URL (a text, as given) or as an encoded file's bytes: a `{"bytes", "path"}` dict
    (datasets' Image feature; Parquet rows, as ms-swift's load_dataset and verl read them) by its bytes where it
    has them, else its path; a PIL image or a numpy array (height x width, with 1, 3 or 4 channels of uint8)
    encoded as PNG. An ImageError for anything else."""
    if isinstance(image, dict) and set(image) <= {"bytes", "path"}:
        image = image.get("bytes") or image.get("path")
    if isinstance(image, os.PathLike):
        image = os.fspath(image)
    if isinstance(image, str) and image:
        return image
    if isinstance(image, (bytes, bytearray, memoryview)) and len(image):
        return bytes(image)
    pil = sys.modules.get("PIL.Image")  # loaded wherever a PIL image exists; never imported here for a test
    numpy = sys.modules.get("numpy")
    try:
        if numpy is not None and isinstance(image, numpy.ndarray):
            from PIL import Image

            image = Image.fromarray(image)
            pil = Image
        if pil is not None and isinstance(image, pil.Image):
            buffer = io.BytesIO()
            image.save(buffer, format="PNG")
            return buffer.getvalue()
    except Exception as err:  # noqa: BLE001 - an array or image PIL cannot write as PNG: the image's fault, said
        raise ImageError(f"an image PIL cannot encode as PNG: {type(err).__name__}: {err}") from None
    raise ImageError(f"an image must be {IMAGE_SHAPES}; got {_described(image)}")


def _described(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'...' if len(text) > 80 else ''}"


IMAGE_FORMATS = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpeg"), (b"GIF8", "gif"), (b"BM", "bmp"), (b"II*\x00", "tiff"), (b"MM\x00*", "tiff"))


def image_list(images: Any) -> list:
    """A response's images as a column gives them: none, one image, or a list (or array) of them."""
    if images is None:
        return []
    if isinstance(images, (str, bytes, bytearray, memoryview, dict, os.PathLike)) or hasattr(images, "save") or getattr(images, "ndim", 1) != 1:
        return [images]  # one image: a text, bytes, a {"bytes", "path"} dict, a PIL image, an image's array
    return list(images)


def image_format(content: bytes) -> str:
    """An encoded image's format from its first bytes (png, jpeg, gif, webp, bmp, tiff), or "octet-stream"."""
    if content[:4] == b"RIFF" and content[8:12] == b"WEBP":
        return "webp"
    return next((name for magic, name in IMAGE_FORMATS if content.startswith(magic)), "octet-stream")


def image_reference(image: Any) -> str:
    """An image as a request names it: a path or data URL as it is, anything else as a data URL."""
    content = image_content(image)
    if isinstance(content, str):
        return content
    kind = image_format(content)
    return f"data:{'application' if kind == 'octet-stream' else 'image'}/{kind};base64," + base64.b64encode(content).decode()


def local_image(image: Any, folder: str, name: str) -> str:
    """A local path of the image: a path as it is; a data URL's content, or any other shape's, written into `folder`."""
    content = image_content(image)
    if isinstance(content, str) and content.startswith("data:"):
        header, _, data = content.partition(",")
        if not header.endswith(";base64"):
            raise ImageError("a data URL must be base64: data:image/png;base64,...")
        try:
            content = base64.b64decode(data, validate=True)
        except ValueError:
            raise ImageError("the data URL's base64 does not decode") from None
    if isinstance(content, str):
        return content
    path = os.path.join(folder, f"{name}.{image_format(content)}")
    with open(path, "wb") as out:
        out.write(content)
    return path


# -- the response as the framework means it ---------------------------------------------------------------------

# A chat template's special token: <|im_start|>, <|start_header_id|>, <|assistant|> (Qwen's, Llama 3's, Phi's), or
# InternVL's and Gemma's <img>, <start_of_turn>; [/INST] (Mistral's).
SPECIAL_TOKEN = r"<\|[^<>|\s]{1,40}\|>|<[/A-Za-z_][\w/]{0,39}>|\[/?[A-Z_]{2,20}\]"
ASSISTANT_MARKER = re.compile(rf"(?:{SPECIAL_TOKEN})[^<>\[\]]*$")  # the prompt's end from its last special token
END_OF_TURN = re.compile(r"(?:\s*(?:<\|[^<>|\s]{1,40}\|>|</s>|<eos>|<end_of_turn>))+\s*$")  # where a response ends


def response_of(query: str, prompt: str) -> str | None:
    """The response in a query that is a prompt's tokens and the response's decoded together (OpenRLHF's): what
    follows the prompt, its end-of-turn tokens left out. Where the query does not start with the prompt's text (a
    vision-language prompt's image token stands expanded in it, one per patch), the response follows the prompt's
    assistant marker (its end from its last special token: `<|im_start|>assistant\n`), at the occurrence that
    ends the prompt: as many as the prompt holds, so that a few-shot prompt's answers stay in the prompt. None
    where the query holds no such marker: the split cannot be told."""
    if query.startswith(prompt):
        response = query[len(prompt):]
    else:
        marker = ASSISTANT_MARKER.search(prompt)
        if marker is None:
            return None
        turns = query.split(marker.group())
        count = prompt.count(marker.group())
        if len(turns) <= count:
            return None
        response = marker.group().join(turns[count:])
    return END_OF_TURN.sub("", response)


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


async def mmjudge(rewarder: "ServerRewards | LocalRewards", reference_column: str, prompts: list, completions: list,
                  images: list | None = None, image: list | None = None, **columns) -> list[float | None]:
    """TRLReward's body, named as TRL names the reward's metrics (TRL 1.x reads a partial's function's name)."""
    given = images if images is not None else image if image is not None else [None] * len(prompts)
    references = columns.get(reference_column) or [None] * len(prompts)
    asked = [Asked(text_of(p), text_of(c), image_list(i), r) for p, c, i, r in zip(prompts, completions, given, references)]
    judged = await rewarder.ask(asked)
    if log_metric := columns.get("log_metric"):  # TRL's: this call's share of failed judgements, and the images the judge saw
        log_metric("mmjudge/failed", judged.failed / len(asked))
        log_metric("mmjudge/images_judged", float(sum(judged.n_images)))
    return judged.rewards


class TRLReward(functools.partial):
    """TRL's GRPOTrainer reward function (`reward_funcs=[TRLReward(...)]`), and ms-swift's AsyncORM's body: the
    batch's prompts, completions and images (the `images` column, or `image`) to the judge at once; the reference
    answers from the column `reference_column` where the reward needs them. A failed judgement is None, TRL's skip.

    An async function to every check TRL has made of one (asyncio's and inspect's iscoroutinefunction, 0.29's and
    1.0's; is_async_callable later): a partial of one, which both unwrap. An object whose __call__ is async is one
    to the last alone, and the others call it without awaiting."""

    def __new__(cls, rewarder: "ServerRewards | LocalRewards", reference_column: str = "solution"):
        reward = super().__new__(cls, mmjudge, rewarder, reference_column)
        reward.__name__ = mmjudge.__name__  # TRL 0.29 names each reward function's metrics by its own __name__
        return reward

    def __reduce__(self):  # partial's would rebuild it from the function, as if it were the rewarder
        return type(self), self.args

    @property
    def rewarder(self) -> "ServerRewards | LocalRewards":
        return self.args[0]


# -- verl, EasyR1, OpenRLHF: files these frameworks load by path, configured by the environment -----------------

def _server(base_url: str | None = None) -> ServerRewards:
    url = base_url or os.environ.get("MMJUDGE_URL")
    if not url:
        raise RewardError("set MMJUDGE_URL to the judge-serve's address (http://HOST:PORT), or pass base_url")
    if url not in _SERVERS:
        given = os.environ.get("MMJUDGE_REWARD_RANGE")  # LOW,HIGH: a served reward model's
        _SERVERS[url] = ServerRewards(url, timeout_s=float(os.environ.get("MMJUDGE_TIMEOUT_S", 180)),
                                      retries=int(os.environ.get("MMJUDGE_RETRIES", 2)),
                                      reward_range=tuple(map(float, given.split(","))) if given else JUDGE_REWARD_RANGE)
    return _SERVERS[url]


_SERVERS: dict[str, ServerRewards] = {}


def _or_failed(reward: float | None) -> dict:
    """A framework without a skip value: 0.0, with the failure as a metric of its own."""
    return {"score": 0.0 if reward is None else reward, "judge_failed": float(reward is None)}


async def compute_score(data_source: str, solution_str: str, ground_truth: str | None = None, extra_info: dict | None = None,
                        base_url: str | None = None, **_: Any) -> dict:
    """verl's custom reward function: the response `solution_str`, the question `extra_info["question"]`
    and its images `extra_info["images"]` (IMAGE_SHAPES: Parquet's {"bytes", "path"} dicts too), the reference
    `ground_truth` (a preference or verdict reward's). `{"score", "judge_failed"}`: verl logs the second as a
    metric."""
    extra = extra_info or {}
    asked = Asked(str(extra.get("question", "")), solution_str, image_list(extra.get("images")), ground_truth)
    judged = await _server(base_url).ask([asked])
    return _or_failed(judged.rewards[0])


REWARD_TYPE = "batch"  # EasyR1's: compute_score_batch takes the whole batch
REWARD_NAME = "mmjudge"  # what EasyR1 names the reward function it loaded


def compute_score_batch(reward_inputs: list[dict], base_url: str | None = None) -> list[dict]:
    """EasyR1's batch reward function: each input's `response` (and `ground_truth`, where the reward needs
    a reference) judged; EasyR1 passes no question or images, so the response is judged alone. `overall` is
    the reward, `judge_failed` 1 where it failed."""
    asked = [Asked("", item["response"], (), item.get("ground_truth")) for item in reward_inputs]
    judged = asyncio.run(_server(base_url).ask(asked))
    return [{"overall": r["score"], "judge_failed": r["judge_failed"]} for r in map(_or_failed, judged.rewards)]


def label_parts(label: Any) -> tuple[Any, list]:
    """An OpenRLHF label as the reference and the images it carries. OpenRLHF passes a reward function the query, the
    prompt and the label alone, so a prompt's images reach the judge through the label: a `{"reference", "images"}`
    object (its `--label_key` column holding one, or its JSON text). Any other label is the reference, without images."""
    held = label
    if isinstance(label, str) and label.startswith("{"):
        try:
            held = json.loads(label)
        except ValueError:
            return label, []
    if isinstance(held, dict) and "images" in held and set(held) <= {"images", "reference"}:
        return held.get("reference"), image_list(held["images"])
    return label, []  # a reference text that happens to be JSON stays the text


def reward_func(queries: list[str], prompts: list[str], labels: list, base_url: str | None = None, **_: Any) -> dict:
    """OpenRLHF's reward function file (`--reward.remote_url this.py`): its {"rewards", "scores", "extra_logs"},
    as tensors. Each query is its prompt and response decoded together: the response is split off as
    `response_of` says, an empty one judged empty; a query whose split cannot be told is a failed judgement. Each
    label is the reference, or a `{"reference", "images"}` object carrying the prompt's images (`label_parts`)."""
    import torch

    responses = [response_of(q, p) for q, p in zip(queries, prompts)]
    asked = {}
    for k, (prompt, response, label) in enumerate(zip(prompts, responses, labels)):
        if response is not None:
            reference, images = label_parts(label)
            asked[k] = Asked(prompt, response, images, reference)
    server = _server(base_url)
    judged = asyncio.run(server.ask(list(asked.values()))) if asked else Judged([], [])
    rewards = dict(zip(asked, judged.rewards))
    if unsplit := len(queries) - len(asked):
        server.failed += unsplit
        logger.warning("mmjudge: no reward for %d queries that do not start with their prompt nor hold its assistant marker", unsplit)
    results = [_or_failed(rewards.get(k)) for k in range(len(queries))]
    scores = torch.tensor([r["score"] for r in results])
    return {"rewards": scores, "scores": scores, "extra_logs": {"judge_failed": torch.tensor([r["judge_failed"] for r in results])}}


# -- slime, ROLL, prime-rl: functions each framework's own loader finds by name ----------------------------------

def _part(item: Any, name: str) -> Any:
    """A field of a message or content part, a dict or a pydantic model (verifiers' Messages are either)."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _slime_asked(sample: Any) -> Asked:
    images = (sample.multimodal_inputs or {}).get("images")  # slime's Dataset: the prompt's PIL images, as its processor takes them
    return Asked(text_of(sample.prompt), sample.response, image_list(images), sample.label)


async def slime_reward(args: Any, sample: Any) -> "float | list[float]":
    """slime's custom reward function (`--custom-rm-path mmjudge.rewards.slime_reward`, with `--rm-url` the
    judge-serve's address, or MMJUDGE_URL): one Sample, or the list slime passes with `--group-rm` (one request).
    Each sample's prompt (a text, or messages whose text parts are the question), `response`, `label` (the reference)
    and the images slime's Dataset holds in `multimodal_inputs["images"]`. slime takes a number alone (it enters
    the group's normalisation): a failed judgement is 0.0, and the sample leaves the loss (`remove_sample`, slime's
    own flag), `metadata["judge_failed"]` 1."""
    samples = sample if isinstance(sample, list) else [sample]
    judged = await _server(getattr(args, "rm_url", None)).ask([_slime_asked(s) for s in samples])
    results = [_or_failed(r) for r in judged.rewards]
    for s, result in zip(samples, results):
        if result["judge_failed"]:
            s.remove_sample = True
        if isinstance(s.metadata, dict):
            s.metadata["judge_failed"] = result["judge_failed"]
    rewards = [result["score"] for result in results]
    return rewards if isinstance(sample, list) else rewards[0]


def roll_rewards(prompts: list[str], responses: list[str], references: Sequence[Any], multi_modal_data: Sequence[Any] | None = None,
                 base_url: str | None = None) -> dict[str, list[float]]:
    """A ROLL reward worker's body (docs/rewards/roll_reward_worker.py): each response to its prompt (the user turn,
    as ROLL's own reward workers take it), its reference (ROLL's `ground_truth`) and the images of its
    `multi_modal_data` entry (`{"multi_modal_data": {"image": [PIL images]}}`, as ROLL's collator builds it for
    vLLM). ROLL's rewards are tensors of numbers: `{"scores", "judge_failed"}`, a failed judgement 0.0 beside 1."""
    entries = multi_modal_data if multi_modal_data is not None else [None] * len(prompts)
    asked = [Asked(p, r, image_list(((entry or {}).get("multi_modal_data") or {}).get("image")), g)
             for p, r, g, entry in zip(prompts, responses, references, entries)]
    results = [_or_failed(r) for r in asyncio.run(_server(base_url).ask(asked)).rewards]
    return {"scores": [r["score"] for r in results], "judge_failed": [r["judge_failed"] for r in results]}


async def prime_rl_reward(task: Any, trace: Any) -> float:
    """prime-rl's reward through verifiers (a task's plugged reward: `rewards.mmjudge.fn =
    "mmjudge.rewards.prime_rl_reward"` in the taskset's task config; MMJUDGE_URL): the task's prompt (its text parts
    the question, its `image_url` parts the images), the trace's last reply, the task's `answer` field (the
    reference) where it has one. A failed judgement raises: verifiers errors the rollout, and prime-rl trains none
    of an errored rollout (its skip), never a 0."""
    prompt = task.prompt if task.prompt is not None else ""
    texts = []
    for content in [prompt] if isinstance(prompt, str) else [_part(m, "content") or "" for m in prompt]:
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content:
            if _part(part, "type") == "text":
                texts.append(_part(part, "text"))
    text = "\n\n".join(t for t in texts if t)
    images = [] if isinstance(prompt, str) else message_images(prompt)  # verifiers' image: a data URL (or a path) in an image_url part
    judged = await _server().ask([Asked(text, trace.last_reply, images, getattr(task, "answer", None))])
    if judged.rewards[0] is None:
        raise RewardError("the judge gave no reward (counted and logged): the rollout errors, and is not trained on")
    return judged.rewards[0]


# -- AReaL and SkyRL: classes of theirs, made where first asked for (this file imports neither) -----------------

async def areal_reward(prompt: str, completions: str, prompt_ids: Any = None, completion_ids: Any = None, *, judge: ServerRewards,
                       images: Any = None, answer: Any = None, messages: Any = None, messages_chat: Any = None, **_: Any) -> float:
    """The reward of one AReaL episode, as its RLVR workflows call a reward function: the decoded prompt and
    completion, then the sample's own fields (`**data`): its images (AReaL's vision datasets hold them in
    `images`), its question in `messages_chat` or `messages` (a conversation, or the chat-templated text its vision
    datasets write), the reference in `answer`. A failed judgement raises RewardError (counted and logged first):
    AReaLJudgeWorkflow turns it into AReaL's rejection of the trajectory, never a reward."""
    question = text_of(messages_chat or messages or prompt)
    asked = Asked(question, END_OF_TURN.sub("", completions), image_list(images), answer)
    reward = (await judge.ask([asked])).rewards[0]
    if reward is None:
        raise RewardError("the judge gave no reward (logged above)")
    return reward


def _areal_workflow(base: type) -> type:
    """AReaL's workflow `base` (RLVRWorkflow or VisionRLVRWorkflow) rewarding through judge-serve. AReaL's own
    reward door runs a reward function in a process pool under a 15 s timeout, then retries it and reads a timeout
    as 0 and an exception as the whole group's failure; here the judge is awaited in AReaL's own event loop, under
    ServerRewards' timeout and retries, and a failed judgement rejects that trajectory alone (arun_episode's
    None, AReaL's skip: not trained on, counted as rejected)."""

    class Workflow(base):
        def __init__(self, *args: Any, base_url: str | None = None, **kwargs: Any):
            super().__init__(areal_reward, *args, **kwargs)
            self.judge = _server(base_url)
            self.async_reward_fn = functools.partial(areal_reward, judge=self.judge)  # what AReaL's _compute_rewards awaits

        async def arun_episode(self, engine: Any, data: dict) -> dict | None:
            try:
                return await super().arun_episode(engine, data)
            except RewardError:
                return None

    Workflow.__name__ = Workflow.__qualname__ = f"AReaLJudge{base.__name__.removesuffix('RLVRWorkflow')}Workflow"
    Workflow.__module__ = __name__  # AReaL names a workflow by its import path to its rollout workers
    return Workflow


def _skyrl_env() -> type:
    """SkyRL's environment (skyrl-gym's BaseTextEnv) rewarding a single-turn episode through judge-serve."""
    from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

    class SkyRLJudgeEnv(BaseTextEnv):
        """Register it (`skyrl_gym.envs.register(id="mmjudge", entry_point="mmjudge.rewards:SkyRLJudgeEnv")`, with
        `kwargs={"base_url": URL}` or MMJUDGE_URL set) and name it in each row's `env_class`. The question and its
        images are the prompt's (its messages' text parts, and their `image_url` or `image` parts, as SkyRL's VLM
        generator passes them), the reference `extras["reward_spec"]["ground_truth"]`. SkyRL has no skip value (a
        step's reward is a float): a failed judgement is 0.0, with `judge_failed` 1 in the step's metadata and
        the episode's metrics (SkyRL's `environment/judge_failed`)."""

        def __init__(self, env_config: Any = None, extras: dict | None = None, base_url: str | None = None):
            super().__init__()
            self.judge = _server(base_url)
            self.reference = ((extras or {}).get("reward_spec") or {}).get("ground_truth")
            self.question, self.images, self.metrics = "", [], {}

        def init(self, prompt: list) -> tuple[list, dict]:
            self.question, self.images = text_of(prompt), message_images(prompt)
            return prompt, {}

        def step(self, action: str) -> BaseTextEnvStepOutput:
            judged = _run(self.judge.ask([Asked(self.question, END_OF_TURN.sub("", action), self.images, self.reference)]))
            result = _or_failed(judged.rewards[0])
            self.metrics = {"judge_failed": result["judge_failed"], "images_judged": float(judged.n_images[0])}
            return BaseTextEnvStepOutput(observations=[], reward=result["score"], done=True, metadata=dict(self.metrics))

        def get_metrics(self) -> dict:
            return self.metrics

    SkyRLJudgeEnv.__module__ = __name__
    return SkyRLJudgeEnv


def message_images(conversation: list) -> list:
    """The images of a conversation's messages (dicts, or pydantic models as verifiers' are): each `image_url`
    part's URL (a data URL or path) and each `image` part's image, in order (a Parquet row's parts carry each
    other's keys as nulls)."""
    images = []
    for turn in conversation:
        content = _part(turn, "content")
        for part in content if isinstance(content, list) else []:
            if _part(part, "type") == "image_url":
                url = _part(part, "image_url")
                images.append(url if isinstance(url, str) else _part(url, "url"))
            elif _part(part, "type") == "image":
                images.append(_part(part, "image"))
    return images


def _run(coroutine: Any) -> Any:
    """A coroutine run to its end from synchronous code: SkyRL steps its environments in a pool of threads (its
    max_env_workers), or, set to 0, in its event loop's own thread, where a loop of our own must run in a thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


_FRAMEWORK_CLASSES = {  # the name asked for: how it is made
    "AReaLJudgeWorkflow": lambda: _areal_workflow(importlib.import_module("areal.workflow.rlvr").RLVRWorkflow),
    "AReaLJudgeVisionWorkflow": lambda: _areal_workflow(importlib.import_module("areal.workflow.vision_rlvr").VisionRLVRWorkflow),
    "SkyRLJudgeEnv": _skyrl_env,
}


def __getattr__(name: str) -> type:
    """AReaL's workflows and SkyRL's environment subclass those frameworks' own classes: each is made where it is
    first asked for (`mmjudge.rewards.AReaLJudgeVisionWorkflow`), in that framework's process."""
    if name not in _FRAMEWORK_CLASSES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = globals()[name] = _FRAMEWORK_CLASSES[name]()
    return made
