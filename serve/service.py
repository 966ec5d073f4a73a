"""What judge-serve's endpoints share, one floor below them (serve/app.py's, serve/rewards.py's): the Service a
handler is given, the request's body read as JSON, the name it is answered under, and the model thread's
records of samples or pairs, as a client that leaves ends them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from starlette.requests import Request

from mmjudge.infer import grammar
from mmjudge.infer.engine import pair_result, past_context, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import JudgeResult, Pair, PairResult, Sample, UsageError, field_name, value_problems
from mmjudge.judge.identity import stamp
from mmjudge.judge.model import Judge
from mmjudge.judge.prompts import Rubric
from mmjudge.judge.reward_model import is_reward_model
from mmjudge.judge.rewards import RewardSpec
from mmjudge.judge.vision import load_pixels
from mmjudge.serve.api import RequestError, read_body
from mmjudge.serve.metrics import Metrics
from mmjudge.serve.options import ServeOptions
from mmjudge.serve.worker import Worker

T = TypeVar("T")
Steps = Generator[None, None, T]  # a request's preparing, in pieces: each yield is where another request may take the thread

# How long one request keeps the preparing thread, past a piece of its preparing, while others wait for it, in the
# thread's CPU seconds (a busy machine stretches wall time, not work): short enough that a one-image request beside one
# of 64 images of 40 megapixels waits for about one of those images, long enough that a one-sample request, a few
# milliseconds of preparing, runs whole in one turn (docs/serving.md, "Fair preparing").
PREPARING_TURN_S = 0.02


class Preparer:
    """The one thread that prepares requests (Service.prepared), in turns: each request's preparing is a generator of
    pieces (an image read and checked, a prompt tokenized, an image's tiles made), and the thread runs a request's
    pieces until they have taken PREPARING_TURN_S of its CPU time, then the next waiting request's, round the queue
    in arrival order. A request's preparing holds the others for one of its pieces past its turn at most, however
    large it is."""

    def __init__(self):
        self._waiting: deque[tuple[Steps, Future]] = deque()
        self._wake = threading.Condition()
        threading.Thread(target=self._serve, name="judge-prepare", daemon=True).start()

    def submit(self, steps: Steps) -> Future:
        future = Future()
        future.set_running_or_notify_cancel()  # never cancelled (a request that stops waiting leaves it): its answer can always be set
        with self._wake:
            self._waiting.append((steps, future))
            self._wake.notify()
        return future

    def _serve(self) -> None:
        while True:
            with self._wake:
                while not self._waiting:
                    self._wake.wait()
                steps, future = self._waiting.popleft()
            if self._turn(steps, future):
                with self._wake:
                    self._waiting.append((steps, future))

    def _turn(self, steps: Steps, future: Future) -> bool:
        """Runs `steps` for one turn; True where it has pieces left, else its answer (or error) is in `future`."""
        ends = time.thread_time() + PREPARING_TURN_S
        try:
            while True:
                next(steps)
                if time.thread_time() >= ends and self._waiting:  # read without the lock: a request that just arrived waits a piece more
                    return True
        except StopIteration as done:
            future.set_result(done.value)
        except BaseException as err:  # noqa: BLE001 - a request's failure is its own, never the thread's
            future.set_exception(err)
        return False


@dataclass
class Service:
    """Everything a request handler needs: the judge, its rubrics and settings, and the model thread."""

    model_names: tuple[str, ...]  # --served_model_name's (and --harness_names'): what a request's `model` may name; the first by default
    judge: Judge
    rubrics: dict[str, Rubric]
    score_options: ScoreOptions
    limits: ServeOptions
    image_root: Path | None  # resolved once here: a request's image paths must lie within it (serve/images.py)
    api_key: str | None
    worker: Worker
    started: int
    context: int  # the model's context in tokens: a prompt and its answer together
    metrics: Metrics
    vocabulary: grammar.Vocabulary | str  # the judge's tokens for structured outputs, or why it has none
    judge_fingerprint: str  # of its weights (judge/identity.py), stamped on /v1/score's records as judge-score stamps them
    reward: RewardSpec | None = None  # --reward (judge/rewards.py); None: the reward endpoints refuse
    reward_options: ScoreOptions | None = None  # what the reward endpoints judge with (serve/rewards.py's reward_options); None: score_options
    # The thread that reads requests' images, tokenizes their prompts and makes their tiles (prepared): one, in turns
    preparer: Preparer = field(default_factory=Preparer, repr=False)

    def __post_init__(self):
        if self.image_root is not None:
            self.image_root = self.image_root.resolve()

    @property
    def reward_mode(self) -> str | None:
        """The mode the reward endpoints judge in, named in their answers; None for a verdict reward, which judges nothing."""
        if self.reward is None or self.reward.kind == "verdict":
            return None
        return (self.reward_options or self.score_options).mode

    async def prepared(self, steps: Steps[T]) -> T:
        """The answer of `steps`, a request's preparing in pieces (its images read and checked, its prompts tokenized,
        its tiles made), from the preparing thread, in turns with the other requests' (Preparer). One thread for all
        requests, beside the event loop and the model thread, because each thread more contends for the GIL: from
        Starlette's pool of 40, one-sample rewards from 64 clients ran at 150-165 samples/s, from two threads at
        138-155, from one at 180-190 (docs/rewards.md)."""
        return await asyncio.wrap_future(self.preparer.submit(steps))

    @property
    def tokenizer(self):
        return self.judge.tokenizer

    @property
    def reward_model(self) -> bool:
        """Whether the judge is a reward model (judge/reward_model.py): a reward per answer, from one prefill, and no text."""
        return is_reward_model(self.judge.model)

    @property
    def token_bytes(self) -> Callable[[int], bytes] | None:
        """A token's own bytes, where the judge has a vocabulary for structured outputs (a fast tokenizer)."""
        return None if isinstance(self.vocabulary, str) else lambda token: self.vocabulary.tokenizer.decode_bytes([token])


class ClientGone(Exception):
    """The client closed its connection before its answer was ready."""


async def read_json(request: Request, limit: int) -> object:
    """The body as JSON, refused at the limit without reading further, and refused where it holds what no
    reader here can take (a lone surrogate, NaN, nesting deeper than any request): 400 naming the field."""
    body = await read_body(request, limit)
    try:
        value = json.loads(body, parse_constant=not_a_number)
    except (ValueError, RecursionError) as err:  # RecursionError: nesting deeper than any real request
        raise RequestError(400, "body", f"not JSON ({type(err).__name__}: {str(err)[:200]})") from None
    if problems := value_problems(value):
        where, message = problems[0]
        raise RequestError(400, field_name(where) or "body", message)
    return value


def not_a_number(literal: str):
    raise ValueError(f"{literal} is not JSON")


def served_name(service: Service, name: str | None, field: str) -> str:
    """The name a request is answered under: its own, where the server serves the model under it; the first
    served name where it names none (vLLM's rule; lmms-eval's egothink sends no `model`, as to Azure)."""
    if name is None:
        return service.model_names[0]
    if name not in service.model_names:
        served = ", ".join(repr(n) for n in service.model_names)
        raise RequestError(404, field, f"the model {name!r} does not exist; this server serves {served} (--served_model_name, --harness_names)",
                           code="model_not_found")
    return name


async def judged(service: Service, local: Callable[[], Steps[list[Sample] | list[Pair]]], what: str, request: Request,
                 reward_options: ScoreOptions | None = None) -> list[JudgeResult] | list[PairResult]:
    """The records of the samples (or pairs) `local` makes, their images local files, from the model thread, stamped
    as judge-score stamps them; a prompt over the context is refused naming `what[k]`, and a client that leaves
    ends its samples at the model's next step. /v1/score and the reward endpoints (serve/rewards.py, their
    `reward_options`) alike. `local` (its images checked one piece each) runs in the preparing thread with the
    prompts' preparing, a piece a sample, and the tiles' making (with_tiles): one hop from the event loop a request."""
    options = reward_options or service.score_options

    def made() -> Steps[tuple[int, list]]:
        items = yield from local()
        prepared = []
        for k, item in enumerate(items):
            prepared += prepare(service.judge, [(k, item)], service.rubrics, Path("."), options)
            yield
        yield from with_tiles(prepared, service.limits.max_images)
        return len(items), prepared

    count, prepared = await service.prepared(made())
    if long := past_context(prepared, service.context):  # the first named, in the words OpenAI's clients read
        index, item = next(iter(long.items()))
        raise context_exceeded(service, f"{what}[{index}]", len(item.input_ids))
    gone = threading.Event()  # set when the client disconnects: its samples leave the model at the next step
    answer = service.worker.score(prepared, gone.is_set, reward=reward_options is not None)
    results = await until_answered(service, submitted(service, answer), request, gone)
    if prepared and prepared[0].pair is not None:  # each pair's views gathered into its record, as judge-score gathers them
        views: dict[int, list] = {}
        for item, result in zip(prepared, results):
            views.setdefault(item.index, []).append((item, result))
        results = [pair_result(views[k], options) for k in range(count)]
    stamp(results, service.judge_fingerprint, service.rubrics)
    return results


def with_tiles(prepared: list, most: int) -> Steps[None]:
    """Each image's tiles made here, an image a piece, where the request shows from 2 to `most` images (--max_images,
    what one chat request's tiles hold, which are made here too): so that the model thread, which waits for a sample's
    tiles, waits for one image's at most (64 of 40 megapixels in one request held it minutes while the small requests
    beside it waited). A one-image request's tile is made by the model's loaders, beside this thread, as before: made
    here, the one-sample rewards of 64 clients ran slower (docs/serving.md, "Fair preparing"). A request of more images has them made by the
    loaders a few samples ahead, so that its tiles never all wait in memory at once."""
    if not 1 < sum(len(item.images) for item in prepared) <= most:
        return
    for item in prepared:
        item.loaded = []
        for image in item.images:
            item.loaded.append(load_pixels(image.path, image.processing))
            yield


def context_exceeded(service: Service, field: str, prompt_tokens: int) -> RequestError:
    """A prompt that leaves no room for an answer, refused in the words of OpenAI and vLLM, which clients
    such as litellm read to tell it from other 400s."""
    where = " (this server's --max_model_len)" if service.limits.max_model_len else ""
    return RequestError(400, field, f"This model's maximum context length is {service.context} tokens{where}, the prompt and its "
                                    f"answer together. However, the prompt alone is {prompt_tokens} tokens. Please reduce the length "
                                    "of the input.", code="context_length_exceeded")


def submitted(service: Service, future):
    """The model thread's answer to come, counted as running until it is there (whoever waits for it)."""
    service.metrics.in_model += 1
    answer = asyncio.wrap_future(future)

    def done(answer):
        service.metrics.in_model -= 1
        if not answer.cancelled():
            answer.exception()  # retrieved: a request whose client left fails unheard, not in the log

    answer.add_done_callback(done)
    return answer


async def until_answered(service: Service, answer, request: Request, gone: threading.Event | None = None):
    """The model thread's answer, or ClientGone (and `gone` set) as soon as the client disconnects; a
    failure of the request in the model thread as its error."""
    watch = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({answer, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not answer.done():
        if gone is not None:
            gone.set()
        raise ClientGone
    try:
        return answer.result()
    except UsageError as err:  # e.g. a sample too large for the device even alone
        raise RequestError(413, None, str(err)) from None


async def disconnected(request: Request) -> None:
    """Returns when the client has closed its connection (its body has been read: the server's next
    message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
