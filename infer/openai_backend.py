"""judge-score --backend openai: the same samples, prompts, parsing, journal and outputs as a local run,
with the judge behind an OpenAI-compatible chat-completions API (judge-serve, `vllm serve`, GPT-4o).

    sample --build_prompt--> the user turn: rubric, question, answer, an `<image>` where each image goes
           --request------> one text part holding that turn, then the images as base64 data URLs in prompt
                            order (vLLM's InternVL2 keeps `<image>` placeholders where the text puts them);
                            max_tokens, logprobs with the top 20 alternatives, and every decoding field at
                            the value that leaves greedy decoding alone (NEUTRAL)
           --answer-------> parsed by judge/parsing.py as a local run parses it; the score's distribution
                            from the top_logprobs of the token that wrote the score

What is not the local backend's (README, "Scoring through an OpenAI-compatible server"):
- the server renders the chat template and tiles the images; a tile limit (--max_tiles, or one lowered
  by image_token_budget) is sent as vLLM's `mm_processor_kwargs.max_dynamic_patch`, which judge-serve
  reads too; a server that refuses the field by name (`transformers serve`: 422) is sent the request again
  without it, and the run warns that the server's own tiling applies;
- the answer is stripped as InternVL's chat() strips it, whatever the judge (a local Qwen-VL judge's is not),
  but not cut where it spells the template's separator: the client knows neither the judge nor its template;
- a parse failure has no distribution: the local backend reads one after a `### Score` heading appended
  to the judge's own tokens, which a chat API cannot do (and so --mode logits is refused);
- image_token_budget uses InternVL2's tiles (448 px, 256 tokens each) and the prompt_token_budget, which
  counts the judge's tokens, is refused; prompt_tokens, generated_tokens and n_tiles are the server's
  (`usage`, and the `n_tiles` judge-serve adds to its answers; null from a server that does not say).

What a server does that a local run never would is found and said, on stderr as it is found and in the
summary's warnings: no logprobs (no score distribution), a written score that is not its distribution's
top (the server does not decode greedily), images it drops (found before scoring from the first sample
with images, one new token: by the tiles the server says it cut, or else by sending it once more without
its images: a server that sees them counts more prompt tokens with them).
An answer that is not a chat completion, or larger than answer_limit, ends the run with a message naming its
sample, and so does a request still unanswered after its tries (each cut at ANSWER_TIMEOUT_S) or after
--request_timeout in all; the samples finished stay in the journal.
"""

from __future__ import annotations

import base64
import json
import math
import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import httpx2
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tqdm import tqdm

from mmjudge.infer.engine import expected_score
from mmjudge.infer.options import ScoreOptions
from mmjudge.infer.progress import Bar
from mmjudge.judge.data import JudgeResult, Sample, UsageError
from mmjudge.judge.parsing import SCORE_HEADING, ScoreScale, parse_judgement
from mmjudge.judge.prompts import JudgePrompt, Rubric, build_prompt
from mmjudge.judge.templates import ChatTemplate
from mmjudge.judge.tiling import TilingConfig

# The server renders its own chat template: what is sent is the prompt's user turn (JudgePrompt.query), and
# this template, with no system message and no roles, keeps build_prompt from rendering any other.
USER_TURN = ChatTemplate(name="user turn", system_template="{system_message}", user_role="", assistant_role="", separator="",
                         default_system_message="")
INTERNVL2_TILE_TOKENS = 256  # 448-px tiles, pixel-shuffled to 16 x 16 tokens
INTERNVL2_MAX_TILES = 12  # InternVL2's max_dynamic_patch
TOP_LOGPROBS = 20  # the most OpenAI's API returns
CONNECT_TIMEOUT_S, ANSWER_TIMEOUT_S = 10.0, 600.0  # an answer of 1024 tokens from a busy server takes minutes
# What makes an OpenAI-compatible server decode greedily, as a local run does: temperature 0 and top_p 1, and
# each penalty at its neutral value. A server may apply a penalty by default (llama.cpp's repeat_penalty is
# 1.1, which made written scores differ from their own distribution's top).
NEUTRAL = {"temperature": 0, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0}
# Penalties only some servers have, under their own names: vLLM's, TGI's and judge-serve's repetition_penalty,
# llama.cpp's repeat_penalty. A server without one may refuse it by name (judge-serve, OpenAI): it has no
# such penalty to turn off, and the field is not sent to it again.
NEUTRAL_IF_KNOWN = {"repetition_penalty": 1, "repeat_penalty": 1}
# What a request can go without when a server refuses it by name: the penalties above, and vLLM's tile limit
# (the server then tiles as it does by default, which the run says: TILING_REFUSED).
DROPPABLE = (*NEUTRAL_IF_KNOWN, "mm_processor_kwargs")
TILING_REFUSED = ("{url} refuses mm_processor_kwargs (vLLM's per-request tile limit, sent for --max_tiles or image_token_budget): "
                  "requests go without it, and the server's own tiling applies")
BACKOFF_S, MAX_BACKOFF_S = 1.0, 60.0


class ServerError(UsageError):
    """The server refused a request, or gave no usable answer after every retry; the message names the sample."""


class Refused(ServerError):
    """The server answered that the request itself is wrong (a 4xx other than 429)."""


class OpenAIBackend:
    """The judge behind --base_url; this process sends its samples, --concurrency at a time."""

    judge_fingerprint = None  # the server's weights are not the client's to read
    deterministic = False  # how the server batches is its own

    def __init__(self, args, options: ScoreOptions, rubrics: dict[str, Rubric], samples: list[Sample]):
        if options.structured:
            raise UsageError("--structured constrains this machine's decoder: it applies to --backend local (and to judge-serve's own "
                             "--structured), not to a server's answers")
        self.server = Server(args.base_url, args.model_path, args.api_key_env, args.max_retries, args.concurrency, args.request_timeout)
        self.options, self.rubrics, self.samples, self.image_root = options, rubrics, samples, Path(args.input_dir)
        self.concurrency = args.concurrency
        self.found: list[str] = []  # what the server does that a local run would not, in the order found

    def load(self) -> dict:
        """What a journal's results depend on: the server and the model's name there (its weights are not
        for the client to see). The server is asked first whether it returns logprobs and sees images."""
        if self.samples:
            self.found += probe(self.server, self.samples, self.rubrics, self.image_root, self.options)
        for warning in self.found:
            print(f"warning: {warning}", file=sys.stderr)
        return {"backend": "openai", "base_url": self.server.base_url, "model": self.server.model, "max_tiles": self.options.max_tiles}

    def said(self) -> list[str]:
        """What the server does that a local run would not, as found so far."""
        return [*self.found, *([TILING_REFUSED.format(url=self.server.url)] if "mm_processor_kwargs" in self.server.unknown else [])]

    def score(self, samples: list[tuple[int, Sample]], bar: Callable[[str], Bar]) -> Iterator[list[JudgeResult]]:
        warned = False
        with bar("scoring") as scoring:
            for result in score_concurrently(self.server, [sample for _, sample in samples], self.rubrics, self.image_root, self.options, self.concurrency):
                if not warned and not score_is_top(result):
                    warned = True
                    tqdm.write(f"warning: {NOT_GREEDY.format(what=f'sample {result.id!r}')} (all such samples are counted in the summary)", file=sys.stderr)
                yield [result]
                scoring.update(1)

    def warnings(self, results: list[JudgeResult]) -> list[str]:
        """What the summary says of the server: what the probe found, and the records whose written score is
        not their distribution's top (those of an earlier run resumed included)."""
        not_top = [r.id for r in results if not score_is_top(r)]
        if not not_top:
            return self.said()
        first = ", ".join(repr(i) for i in not_top[:3]) + (" ..." if len(not_top) > 3 else "")
        return [*self.said(), NOT_GREEDY.format(what=f"{len(not_top)} of {len(results)} samples ({first})")]

    def close(self) -> None:
        self.server.close()


NOT_GREEDY = ("{what}: the written score is not the top of its own score_distribution; the server does not decode greedily "
              "(a penalty or sampling it applies by default?), so score and distribution disagree")


def score_is_top(result: JudgeResult) -> bool:
    """Whether the written score is the likeliest of its distribution (or there is no distribution to ask)."""
    distribution = result.score_distribution
    return not distribution or distribution.get(str(result.score), 0.0) >= max(distribution.values())


def probe(server: Server, samples: list[Sample], rubrics: dict[str, Rubric], image_root: Path, options: ScoreOptions) -> list[str]:
    """What the server does with the first sample that has images (or the first), one new token each: whether
    it returns logprobs, and whether it sees the images: by the tiles it says it cut (judge-serve's n_tiles),
    or else by the prompt tokens it counts with the images and without them (each image is at least one
    token to a server that sees it)."""
    sample = next((s for s in samples if s.images()), samples[0])
    prompt = sample_prompt(sample, rubrics[sample.category], image_root, options)
    request = {**chat_request(prompt, server.model, options), "max_tokens": 1}
    answer = server.complete(request, sample.id)
    found = []
    choice = answer.choices[0]
    if choice.logprobs is None or not choice.logprobs.content or not choice.logprobs.content[0].top_logprobs:
        found.append(f"{server.url} returns no logprobs (top_logprobs): every score_distribution and expected_score is null")
    if prompt.images and answer.n_tiles is not None:  # judge-serve says how it tiled them
        if answer.n_tiles < len(prompt.images):
            found.append(f"{server.url} drops images: it cut {answer.n_tiles} tile(s) from the {len(prompt.images)} image(s) of sample {sample.id!r}")
    elif prompt.images:
        text_only = {**request, "messages": [{"role": "user", "content": request["messages"][0]["content"][:1]}]}
        try:
            without = server.complete(text_only, sample.id).usage.prompt_tokens
        except Refused:  # a server that refuses the text without its images (judge-serve: placeholders without images) reads them
            return found
        if answer.usage.prompt_tokens - without < len(prompt.images):
            found.append(f"{server.url} drops images: sample {sample.id!r} counts {answer.usage.prompt_tokens} prompt tokens with its "
                         f"{len(prompt.images)} image(s) and {without} without them; a judge that does not see the images scores the text alone")
    return found


def score_concurrently(server: Server, samples: list[Sample], rubrics: dict[str, Rubric], image_root: Path, options: ScoreOptions,
                       concurrency: int) -> Iterator[JudgeResult]:
    """Each sample's result as it arrives, `concurrency` requests in flight. After a failure no new request
    starts; those in flight finish and are yielded (the journal keeps them), then the failure is raised."""
    queued = iter(samples)
    pending: set[Future] = set()
    failure: BaseException | None = None
    with ThreadPoolExecutor(concurrency) as pool:
        while True:
            while failure is None and len(pending) < concurrency and (sample := next(queued, None)) is not None:
                pending.add(pool.submit(score_sample, server, sample, rubrics[sample.category], image_root, options))
            if not pending:
                break
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                if future.exception() is None:
                    yield future.result()
                else:
                    failure = failure or future.exception()
    if failure is not None:
        raise failure


def score_sample(server: Server, sample: Sample, rubric: Rubric, image_root: Path, options: ScoreOptions) -> JudgeResult:
    prompt = sample_prompt(sample, rubric, image_root, options)
    answer = server.complete(chat_request(prompt, server.model, options), sample.id)
    choice = answer.choices[0]
    # Stripped as InternVL's chat() strips its answer (judge.detokenize.chat_answer); the cut at a separator
    # spelled in the text is the local backend's only, which knows the judge's template.
    text = (choice.message.content or "").strip()
    judgement = parse_judgement(text, rubric.criteria, rubric.score_scale)
    distribution = None if judgement.error else score_distribution(choice.logprobs, judgement.score, rubric.score_scale)
    return JudgeResult(
        id=sample.id, model=sample.model, category=sample.category, feedback=text, score=judgement.score, criteria=judgement.criteria,
        score_distribution=distribution, expected_score=expected_score(distribution), parse_error=judgement.error,
        truncated=prompt.truncated, n_images=len(sample.images()), n_tiles=answer.n_tiles,
        prompt_tokens=answer.usage.prompt_tokens, generated_tokens=answer.usage.completion_tokens,
    )


def sample_prompt(sample: Sample, rubric: Rubric, image_root: Path, options: ScoreOptions) -> JudgePrompt:
    tiling = TilingConfig(max_tiles=options.max_tiles or INTERNVL2_MAX_TILES, tokens_per_tile=INTERNVL2_TILE_TOKENS)
    return build_prompt(sample, rubric, USER_TURN, None, image_root, tiling, options.image_token_budget)


def chat_request(prompt: JudgePrompt, model: str, options: ScoreOptions) -> dict:
    images = [{"type": "image_url", "image_url": {"url": data_url(image.path)}} for image in prompt.images]
    request = {"model": model, "messages": [{"role": "user", "content": [{"type": "text", "text": prompt.query}, *images]}],
               "max_tokens": options.max_new_tokens, **NEUTRAL, "logprobs": True, "top_logprobs": TOP_LOGPROBS}
    # Only when asked for or lowered by the image budget: GPT-4o's API refuses parameters it does not know.
    max_tiles = prompt.images[0].processing.max_tiles if prompt.images else None
    if options.max_tiles is not None or (max_tiles is not None and max_tiles < INTERNVL2_MAX_TILES):
        request["mm_processor_kwargs"] = {"max_dynamic_patch": max_tiles or options.max_tiles}
    return request


def data_url(path: Path) -> str:
    """The file's own bytes, base64: the server decodes the image exactly as it is stored."""
    with Image.open(path) as image:
        mime = Image.MIME.get(image.format, "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def score_distribution(logprobs: Logprobs | None, score: int | float | None, scale: ScoreScale) -> dict[str, float] | None:
    """The probability of each score value at the token where the judge wrote its score (the first token
    after the score heading that spells the parsed score), from that step's top_logprobs, renormalised over
    the score values among them (a value not among them gets 0). None without logprobs, or on a scale
    whose scores are not one token each."""
    if not scale.integral or score is None or logprobs is None or not logprobs.content:
        return None
    tail, heading_seen = "", False  # the end of what was written so far, enough to hold the heading's start
    for step in logprobs.content:
        if heading_seen and step.token.strip() == str(score):
            probabilities = {str(value): 0.0 for value in scale.levels}
            for alternative in step.top_logprobs or []:
                if (value := alternative.token.strip()) in probabilities:
                    probabilities[value] += math.exp(alternative.logprob)
            total = sum(probabilities.values())
            return {value: p / total for value, p in probabilities.items()} if total > 0 else None
        tail += step.token
        heading_seen = heading_seen or SCORE_HEADING in tail
        tail = tail[-len(SCORE_HEADING):]
    return None


class Server:
    """POSTs to one chat-completions endpoint, retrying what a server may answer later, and reads its answers
    within a deadline and a size."""

    def __init__(self, base_url: str, model: str, api_key_env: str | None, max_retries: int, concurrency: int,
                 request_timeout_s: float, transport: httpx2.BaseTransport | None = None):
        self.base_url, self.model, self.max_retries, self.request_timeout_s = base_url, model, max_retries, request_timeout_s
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.unknown: set[str] = set()  # the fields of DROPPABLE this server refused by name
        self.lock = threading.Lock()
        key = os.environ[api_key_env] if api_key_env else None
        self.client = httpx2.Client(
            headers={"Authorization": f"Bearer {key}"} if key else {}, transport=transport,
            timeout=httpx2.Timeout(ANSWER_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), limits=httpx2.Limits(max_connections=concurrency),
        )

    def complete(self, request: dict, sample_id: str) -> ChatAnswer:
        attempt, deadline = 0, time.monotonic() + self.request_timeout_s
        while True:
            wait_s = None
            with self.lock:
                sent = {k: v for k, v in {**request, **NEUTRAL_IF_KNOWN}.items() if k not in self.unknown}
            try:
                # What is left of the deadline, never less than a moment: a wait that overslept it on a busy machine
                # would give httpx a negative timeout, which it refuses with a ValueError.
                status, headers, body = self.post(sent, request["max_tokens"], min(ANSWER_TIMEOUT_S, max(deadline - time.monotonic(), 1e-3)))
            except (httpx2.TransportError, TimeoutError) as err:
                problem = f"no answer ({type(err).__name__}: {err})"
            except (httpx2.DecodingError, AnswerTooLarge) as err:
                raise ServerError(f"{self.url}: the answer for sample {sample_id!r} cannot be read ({type(err).__name__}: {err})") from None
            else:
                if status == 200:
                    return chat_answer(body, f"{self.url}: the answer for sample {sample_id!r}")
                problem = f"HTTP {status}: {error_message(body)}"
                if refused := self.refused_fields(status, body, sent):
                    with self.lock:
                        new, self.unknown = refused - self.unknown, self.unknown | refused
                    if "mm_processor_kwargs" in new:
                        print(f"warning: {TILING_REFUSED.format(url=self.url)}", file=sys.stderr)
                    continue  # the same request without them, at once: not a retry
                if status != 429 and status < 500:  # the request itself is wrong: retrying repeats it
                    raise Refused(f"{self.url} refused sample {sample_id!r}: {problem}")
                wait_s = retry_after(headers)
            wait_s = wait_s if wait_s is not None else backoff(attempt)
            if attempt == self.max_retries:
                tried = f"failed {attempt + 1} time(s)"
                break
            if time.monotonic() + wait_s >= deadline:  # no time left for another try
                tried = f"failed {attempt + 1} time(s) in --request_timeout {self.request_timeout_s:g} s"
                break
            time.sleep(wait_s)
            attempt += 1
        raise ServerError(f"{self.url}: sample {sample_id!r} {tried}, last with {problem}; "
                          "the samples finished are kept: rerun the same command to resume")

    def post(self, request: dict, max_tokens: int, timeout_s: float) -> tuple[int, httpx2.Headers, bytes]:
        """The answer's status, headers and body, decompressed; AnswerTooLarge past its size, and a TimeoutError
        at the first piece that arrives `timeout_s` after sending, however the server trickles it (httpx's
        timeouts are per read: a server silent that long is cut by the read timeout instead)."""
        deadline = time.monotonic() + timeout_s
        limit = answer_limit(max_tokens)
        body = bytearray()
        timeout = httpx2.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))
        with self.client.stream("POST", self.url, json=request, timeout=timeout) as response:
            for chunk in response.iter_bytes():
                body += chunk
                if len(body) > limit:
                    raise AnswerTooLarge(f"more than {limit:,} bytes for {max_tokens} new tokens")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"unfinished after {timeout_s:.3g} s")
            return response.status_code, response.headers, bytes(body)

    @staticmethod
    def refused_fields(status: int, body: bytes, sent: dict) -> set[str]:
        """The fields of DROPPABLE sent that a 400 or 422 (FastAPI's validation error) names."""
        if status not in (400, 422):
            return set()
        text = body[:4096].decode("utf-8", errors="replace")
        return {name for name in DROPPABLE if name in sent and re.search(rf"\b{name}\b", text)}

    def close(self) -> None:
        self.client.close()


class AnswerTooLarge(Exception):
    pass


def answer_limit(max_tokens: int) -> int:
    """Bytes an honest answer of `max_tokens` new tokens stays within, decompressed (2 MB of gzip can expand
    to gigabytes): about 2 kB of JSON a token with 20 alternatives, given 4 times that."""
    return 2**20 + 8 * 2**10 * max_tokens


# An answer as the OpenAI API documents it, as far as judge-score reads it; anything else in it is ignored.
class _Answer(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class TopLogprob(_Answer):
    token: str
    logprob: float = Field(le=0)  # a log-probability: -inf allowed, NaN and positive values not


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] | None = None


class Logprobs(_Answer):
    content: list[TokenLogprob] | None = None


class Message(_Answer):
    content: str | None = None


class Choice(_Answer):
    message: Message
    logprobs: Logprobs | None = None


class Usage(_Answer):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)


class ChatAnswer(_Answer):
    choices: list[Choice] = Field(min_length=1)
    usage: Usage
    n_tiles: int | None = Field(None, ge=0)  # judge-serve's: the tiles it cut the request's images into


def chat_answer(body: bytes, what: str) -> ChatAnswer:
    """The answer read and checked; a ServerError that says `what` and where it is wrong otherwise."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):  # not UTF-8 or not JSON, or nested too deep to read
        raise ServerError(f"{what} is not JSON: {body[:100]!r}") from None
    try:
        return ChatAnswer.model_validate(value)
    except ValidationError as err:
        error = err.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "the answer"
        raise ServerError(f"{what} is not a chat completion as the OpenAI API documents it: {where}: {error['msg']}") from None
    except RecursionError:
        raise ServerError(f"{what} is nested too deep to read") from None


def backoff(attempt: int) -> float:
    """Exponential, with jitter so that the requests in flight do not all come back at once."""
    return min(MAX_BACKOFF_S, BACKOFF_S * 2**attempt) * random.uniform(0.5, 1.0)


def retry_after(headers: httpx2.Headers) -> float | None:
    """A 429's or 503's Retry-After in seconds, within reason; None if absent or not a number."""
    try:
        return min(MAX_BACKOFF_S, max(0.0, float(headers["retry-after"])))
    except (KeyError, ValueError):
        return None


def error_message(body: bytes) -> str:
    """The message of an OpenAI-style error body, or the start of whatever the server said."""
    try:
        return str(json.loads(body)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError, RecursionError):
        return body[:300].decode("utf-8", errors="replace") or "(no body)"
