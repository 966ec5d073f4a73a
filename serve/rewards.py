"""judge-serve's reward endpoints: the judge as the reward of RL runs, each in the shape its client sends,
over the same model thread, batching and cancellation as /v1/score. What a reward is, `--reward` says
(judge/rewards.py); every answer names it.

    POST /classify             vLLM's (verl's reward model):  {"model", "input": str | [str]} or {"model", "messages"}
                               -> {"data": [{"index", "label", "probs": [1 - r, r], "num_classes": 2}], "usage"}
                               (verl reads data[-1].probs[-1]); a string input is judged whole as the response
    POST /get_reward           OpenRLHF's: {"query": [prompt + response], "prompts", "labels", "images": [[ref]]}
                               -> {"rewards", "scores", "extra_logs"}
    POST /v1/score/evaluation  LLaMA-Factory's: {"model", "messages": [str]} -> {"scores"}
    POST /v1/decisions         OpenAI's Decisions API (client.decisions.create), images included: {"model", "input": str |
                               [user messages of input_text / input_image parts], "questions": [predicate | choice |
                               score]} -> {"model", "answers": [one per question, in order], "usage"}, each answer read
                               from the judge's score distribution

Images: image parts of chat messages (/classify, /v1/decisions), OpenRLHF's `images` beside the query (one
list per query, shown before its prompt's text); each a path under --image_root or a data URL. Refusals are
4xx naming the field: in OpenAI's shape on /classify and /v1/decisions (vLLM's), in FastAPI's
`{"detail": ...}` on /get_reward and /v1/score/evaluation (OpenRLHF's and LLaMA-Factory's servers are
FastAPI). A reward that the judge's output gives no number for is null, never a made-up value.

A reward model (judge-train --objective bradley_terry) scores each response by one prefill under --reward
score:CATEGORY's pointwise rubric, and its reward is its head's output, unbounded: as is on /get_reward and
/v1/score/evaluation (OpenRLHF's and LLaMA-Factory's reward-model servers answer the head's output), and on
/classify as vLLM's pooling runner answers a one-label classifier, `probs: [sigmoid(r)]`, `num_classes` 1
(`[r]` with use_activation false). /v1/decisions, which reads score distributions, refuses it.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, replace
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictStr, ValidationError, model_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mmjudge.infer.cache import prefix_cache_refusal, prefix_cache_room
from mmjudge.infer.engine import read_tokens
from mmjudge.infer.options import MAX_PREFIX_CACHE, REWARD_PREFIX_CACHE_BYTES, ScoreOptions
from mmjudge.judge.data import JudgeResult, Pair, Sample, Segment, UsageError
from mmjudge.judge.model import Judge
from mmjudge.judge.prompts import Rubric
from mmjudge.judge.rewards import RewardSpec, label_problem, preference_reward, score_reward, verdict_reward
from mmjudge.rewards import response_of
from mmjudge.serve.api import Message, RequestError, validated
from mmjudge.serve.images import RequestImages
from mmjudge.serve.service import Service, Steps, judged, read_json, served_name

# A decisions request's bounds: vLLM's on questions and levels; OpenAI's on choices, each one response judged (vLLM reads a
# letter for each, A-Z), all within --max_samples
MAX_QUESTIONS, MAX_CHOICES, LEVELS = 64, 255, (2, 10)


@dataclass(frozen=True)
class Piece:
    """A text, or an image reference, of a question or an answer, with the client's field that holds it."""

    field: str
    text: str | None = None
    image: str | None = None


@dataclass
class Asked:
    """One response to reward: the question it answers, the response, and the reference answer (a
    preference reward) or verdict label (a verdict reward) where the client sends one."""

    field: str  # the client's field of this response, for errors: "query[2]"
    question: list[Piece]
    answer: list[Piece]
    reference: str | None = None
    reference_field: str = ""  # the client's field of the reference; none where its shape has no place for one

    @property
    def response(self) -> str:
        return "\n".join(p.text for p in self.answer if p.text is not None)


@dataclass
class Reward:
    value: float | None  # in [0, 1] (a reward model's: its head's own reward, unbounded); None where the judgement gives no number
    result: JudgeResult | None = None  # the judgement it was read from (a pair's: the PairResult); None for a verdict reward
    n_images: int = 0  # the images the judge was shown


def reward_options(spec: RewardSpec, rubrics: dict[str, Rubric], tokenizer, options: ScoreOptions, mode: str) -> ScoreOptions:
    """The scoring options the reward endpoints judge with (--reward_mode): the server's, in logits mode where
    asked or, auto, where the reward's rubric allows it (read_tokens: its scores, or verdicts, one token each),
    generate mode elsewhere. A logits mode asked of a rubric that does not allow it is refused, before the
    model loads. The prefix cache, on unless --prefix_cache was given, is sized once the weights are in memory
    (with_prefix_cache)."""
    logits = replace(options, mode="logits", structured=False)  # structured constrains what is written; logits writes nothing
    if spec.kind == "verdict" or mode == "generate":  # a verdict reward reads the response and judges nothing
        return replace(options, mode="generate")
    try:
        read_tokens(tokenizer, {spec.category: rubrics[spec.category]}, "logits")
    except UsageError as err:
        if mode == "logits":
            raise UsageError(f"--reward_mode logits: {err}") from None
        return replace(options, mode="generate")
    return logits


def reward_routes(endpoint) -> list[Route]:
    return [Route("/classify", endpoint(classify), methods=["POST"]),
            Route("/get_reward", endpoint(fastapi_errors(get_reward)), methods=["POST"]),
            Route("/v1/score/evaluation", endpoint(fastapi_errors(evaluation)), methods=["POST"]),
            Route("/v1/decisions", endpoint(decisions), methods=["POST"])]


def fastapi_errors(handler):
    """A refusal in FastAPI's shape, `{"detail": "field: why"}`, which OpenRLHF's and LLaMA-Factory's clients read."""
    async def answered(request: Request, service: Service) -> Response:
        try:
            return await handler(request, service)
        except RequestError as err:
            return JSONResponse({"detail": str(err)}, status_code=err.status)
    return answered


def spec_of(service: Service, kinds: tuple[str, ...] = ("score", "preference", "verdict"), why: str = "") -> RewardSpec:
    if service.reward is None:
        raise RequestError(400, None, "this server answers no rewards: start judge-serve with --reward KIND:CATEGORY (docs/rewards.md)")
    if service.reward.kind not in kinds:
        raise RequestError(400, None, f"this server's reward is {service.reward.name}; {why}")
    return service.reward


async def rewarded(request: Request, service: Service, asked: list[Asked], what: str) -> list[Reward]:
    """Each response's reward under the server's --reward, from one pass of the model thread for all."""
    spec = spec_of(service)
    if len(asked) > service.limits.max_samples:
        raise RequestError(413, what, f"{len(asked)} responses, over this server's limit of {service.limits.max_samples} (--max_samples)")
    rubric = service.rubrics[spec.category]
    for item in asked:
        if spec.needs_reference and item.reference is None:
            needed = "the reference answer" if spec.kind == "preference" else "the verdict label (A, B or tie)"
            raise RequestError(400, item.reference_field or item.field, f"this server's reward is {spec.name}, which needs {needed} of "
                                                                        "each response" + ("" if item.reference_field else
                                                                                           "; this request's shape has no place for one: use /get_reward's labels"))
        if spec.kind == "verdict" and (problem := label_problem(item.reference)):
            raise RequestError(400, item.reference_field, problem)
        if (n := sum(p.image is not None for p in item.question + item.answer)) > service.limits.max_images:
            raise RequestError(413, item.field, f"{n} images, over this server's limit of {service.limits.max_images} (--max_images)")
    if spec.kind == "verdict":  # the response is a judgement being trained: read, not judged
        return [Reward(verdict_reward(item.response, item.reference, rubric)) for item in asked]
    images = RequestImages(service.image_root, service.limits.max_image_pixels)
    try:
        results = await judged(service, lambda: judged_items(asked, spec, images), what, request, service.reward_options)
    finally:
        images.close()
    if spec.kind == "preference":
        return [Reward(preference_reward(result), result, result.n_images) for result in results]
    if service.reward_model:
        return [Reward(result.reward, result, result.n_images) for result in results]
    return [Reward(score_reward(result, rubric, spec.calibrator), result, result.n_images) for result in results]


def with_prefix_cache(options: ScoreOptions, judge: Judge, device: str) -> ScoreOptions:
    """The reward endpoints' options with the prefix cache on where --prefix_cache was not given: an RL group's answers
    share their rubric, question and images. It holds what REWARD_PREFIX_CACHE_BYTES of the judge's keys and values
    hold (on a GPU, half the room its free memory leaves beside the weights), at most MAX_PREFIX_CACHE tokens: a fixed
    number of tokens was 6 GiB for InternVL2-4B and a few megabytes for a small judge, whose questions then missed."""
    if options.prefix_cache is not None:
        return options
    model = judge.model
    if prefix_cache_refusal(model.config.get_text_config()):  # a hybrid's linear-attention state (infer/cache.py): off
        return replace(options, prefix_cache=0)
    room = prefix_cache_room(model.config.get_text_config(), model.dtype, torch.device(device), REWARD_PREFIX_CACHE_BYTES)
    return replace(options, prefix_cache=min(MAX_PREFIX_CACHE, room))


def judged_items(asked: list[Asked], spec: RewardSpec, images: RequestImages) -> Steps[list[Sample | Pair]]:
    """Each response as the sample (or, against its reference, the pair) the judge is shown, each image a checked
    local file, an image a piece."""
    def segments(pieces: list[Piece]) -> Steps[list[Segment]]:
        made = []
        for piece in pieces:
            if piece.image is not None:
                made.append(Segment(image=str(images.file(piece.image, piece.field))))
                yield
                continue
            try:
                made.append(Segment(text=piece.text))
            except ValidationError as err:  # a text longer than any judge's context
                raise RequestError(400, piece.field, err.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return made

    items = []
    for k, item in enumerate(asked):
        question, answer = (yield from segments(item.question)), (yield from segments(item.answer))
        if spec.kind == "preference":
            reference = yield from segments([Piece(item.reference_field, text=item.reference)])
            items.append(Pair(id=str(k), question=question, answer_a=answer, answer_b=reference, category=spec.category))
        else:
            items.append(Sample(id=str(k), question=question, answer=answer, category=spec.category))
    return items


def message_pieces(message: Message, where: str) -> list[Piece]:
    return [Piece(f"{where}.content[{n}].image_url.url", image=part.image_url.url) if part.type == "image_url"
            else Piece(f"{where}.content[{n}].text", text=part.text) for n, part in enumerate(message.content)]


# -- vLLM's /classify (verl's reward model) --------------------------------------------------------------

class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None  # the first served name where none is sent, as vLLM
    input: str | list[str] | None = None
    messages: list[Message] | None = Field(default=None, min_length=2)
    use_activation: bool | None = None  # a judge's reward is a probability either way; a reward model's is its sigmoid unless false, as vLLM's
    user: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> ClassifyRequest:
        if (self.input is None) == (self.messages is None):
            raise ValueError("give 'input' (a text, or a list of texts) or 'messages' (a chat ending in the assistant's response), one of them")
        if isinstance(self.input, list) and not self.input:
            raise ValueError("an empty list of inputs")
        return self


def chat_asked(messages: list[Message], field: str = "messages") -> Asked:
    """A chat of one user turn and the assistant's response (a system message first is dropped: the rubric
    has its own) as a response to reward."""
    roles = [m.role for m in messages]
    if roles not in (["user", "assistant"], ["system", "user", "assistant"], ["developer", "user", "assistant"]):
        raise RequestError(400, field, f"one user message then the assistant's response (after at most one system message) is what a "
                                       f"reward judges; got roles {roles}")
    user, response = len(messages) - 2, len(messages) - 1
    if messages[response].images():
        raise RequestError(400, f"{field}[{response}].content", "the response is judged as text: an assistant message holds no image")
    return Asked(field, message_pieces(messages[user], f"{field}[{user}]"), message_pieces(messages[response], f"{field}[{response}]"))


def sigmoid(reward: float) -> float:
    """The logistic function without overflow: exp of a reward below about -709 is past a float (a 500
    OverflowError), so a negative reward goes through exp(r) / (1 + exp(r)), which only underflows to 0."""
    if reward >= 0:
        return 1 / (1 + math.exp(-reward))
    return math.exp(reward) / (1 + math.exp(reward))


async def classify(request: Request, service: Service) -> Response:
    arrived = time.monotonic()
    body = validated(ClassifyRequest, await read_json(request, service.limits.max_request_bytes))
    model = served_name(service, body.model, "model")
    if body.messages is not None:
        asked, what = [chat_asked(body.messages)], "messages"
    else:
        texts = [body.input] if isinstance(body.input, str) else body.input
        where = (lambda k: "input") if isinstance(body.input, str) else (lambda k: f"input[{k}]")  # noqa: E731
        asked, what = [Asked(where(k), [], [Piece(where(k), text=text)]) for k, text in enumerate(texts)], "input"
    rewards = await rewarded(request, service, asked, what)
    service.metrics.e2e.observe(time.monotonic() - arrived)
    if service.reward_model:  # as vLLM's pooling runner answers a num_labels 1 classifier: its sigmoid, or with use_activation false its logit
        data = [{"index": k, "label": service.reward.name, "probs": [r.value if body.use_activation is False else sigmoid(r.value)],
                 "num_classes": 1} for k, r in enumerate(rewards)]
    else:
        data = [{"index": k, "label": service.reward.name, "probs": [None if r.value is None else 1 - r.value, r.value], "num_classes": 2}
                for k, r in enumerate(rewards)]
    tokens = sum(r.result.prompt_tokens if isinstance(r.result, JudgeResult) else 0 for r in rewards)
    return JSONResponse({"id": f"classify-{request.state.request_id}", "object": "list", "created": int(time.time()), "model": model,
                         "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "reward_mode": service.reward_mode})


# -- OpenRLHF's /get_reward --------------------------------------------------------------------------------

class GetRewardRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    query: list[str] = Field(min_length=1)  # each the prompt and the response, as the policy saw and wrote them
    prompts: list[str] | None = None
    labels: list[str | None] | None = None
    images: list[list[str]] | None = None  # each query's images, shown before its prompt's text

    @model_validator(mode="after")
    def _one_per_query(self) -> GetRewardRequest:
        for name in ("prompts", "labels", "images"):
            given = getattr(self, name)
            if given is not None and len(given) != len(self.query):
                raise ValueError(f"{name}: {len(given)} of them for {len(self.query)} queries; give one per query")
        return self


async def get_reward(request: Request, service: Service) -> Response:
    arrived = time.monotonic()
    body = validated(GetRewardRequest, await read_json(request, service.limits.max_request_bytes))
    asked = []
    for k, query in enumerate(body.query):
        prompt = body.prompts[k] if body.prompts is not None else ""
        response = response_of(query, prompt)
        if response is None:
            raise RequestError(400, f"query[{k}]", "does not start with its prompt (prompts[k]), nor hold the prompt's assistant marker "
                                                  "(its end from its last special token): a query is the prompt followed by the response")
        images = [Piece(f"images[{k}][{n}]", image=ref) for n, ref in enumerate(body.images[k])] if body.images is not None else []
        question = images + ([Piece(f"prompts[{k}]", text=prompt)] if prompt else [])
        label = body.labels[k] if body.labels is not None else None
        asked.append(Asked(f"query[{k}]", question, [Piece(f"query[{k}]", text=response)], label, f"labels[{k}]"))
    rewards = await rewarded(request, service, asked, "query")
    service.metrics.e2e.observe(time.monotonic() - arrived)
    values = [r.value for r in rewards]
    logs = {"n_images": [r.n_images for r in rewards]}  # numbers only: OpenRLHF averages each list into its logs
    if service.reward.kind == "score" and not service.reward_model:
        logs["expected_score"] = [r.result.expected_score if r.result.expected_score is not None else r.result.score for r in rewards]
    return JSONResponse({"rewards": values, "scores": values, "extra_logs": logs, "reward": service.reward.name, "reward_mode": service.reward_mode})


# -- LLaMA-Factory's /v1/score/evaluation ------------------------------------------------------------------

class EvaluationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str  # not checked: LLaMA-Factory's client sends "model" whatever the server serves
    messages: list[str] = Field(min_length=1)  # each the whole text, prompt and response, as its PPO trainer decodes it
    max_length: int | None = Field(default=None, ge=1)  # the judge reads its own context's worth; longer prompts are refused


async def evaluation(request: Request, service: Service) -> Response:
    arrived = time.monotonic()
    body = validated(EvaluationRequest, await read_json(request, service.limits.max_request_bytes))
    asked = [Asked(f"messages[{k}]", [], [Piece(f"messages[{k}]", text=text)]) for k, text in enumerate(body.messages)]
    rewards = await rewarded(request, service, asked, "messages")
    service.metrics.e2e.observe(time.monotonic() - arrived)
    return JSONResponse({"id": f"scoreeval-{request.state.request_id}", "object": "score.evaluation", "model": service.model_names[0],
                         "scores": [r.value for r in rewards], "reward": service.reward.name, "reward_mode": service.reward_mode})


# -- /v1/decisions -----------------------------------------------------------------------------------------

class InputPart(BaseModel):
    """A piece of a decision's input or instructions: `{"type": "input_text", "text"}` or `{"type": "input_image", "image_url"}`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["input_text", "input_image"]
    text: str | None = None
    image_url: str | None = None  # a base64 data URL, or a path under --image_root; no URL is fetched (serve/images.py)
    detail: Literal["auto", "high", "original", "low"] | None = None  # the server's tiling (--max_tiles); "low" is refused by name

    @model_validator(mode="after")
    def _filled(self) -> InputPart:
        field = "text" if self.type == "input_text" else "image_url"
        if getattr(self, field) is None:
            raise ValueError(f"an {self.type!r} part needs its '{field}' field")
        return self


def as_parts(value: object) -> object:
    """A text given where parts may be, as its one part (OpenAI's shorthand)."""
    return [{"type": "input_text", "text": value}] if isinstance(value, str) else value


class DecisionMessage(BaseModel):
    """A user message of a decision's input: text and image parts in order."""

    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["user"]  # OpenAI's other items (system, assistant, tool calls and outputs) are refused by name
    content: Annotated[list[InputPart], BeforeValidator(as_parts)]
    type: Literal["message"] = "message"


class Choice(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    value: StrictStr | StrictBool  # typed, as OpenAI's: the string "true" and true are two choices
    description: str = ""


class Level(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    label: str
    description: str = ""


class Question(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["predicate", "choice", "score"]
    name: str | None = None  # echoed in its answer; null where none is given
    instructions: Annotated[list[InputPart], BeforeValidator(as_parts)]
    choices: list[Choice] | None = Field(default=None, min_length=2, max_length=MAX_CHOICES)
    levels: list[Level] | None = Field(default=None, min_length=LEVELS[0], max_length=LEVELS[1])

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> Question:
        if (self.type == "choice") != (self.choices is not None):
            raise ValueError(f"a choice question needs its choices ({{value, description}}, 2-{MAX_CHOICES}), and only it takes them")
        if (self.type == "score") != (self.levels is not None):
            raise ValueError(f"a score question needs its levels ({{label, description}}, {LEVELS[0]}-{LEVELS[1]}, lowest first), and only it "
                             "takes them")
        return self


class DecisionsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None  # the first served name where none is sent, as vLLM
    input: Annotated[list[DecisionMessage], BeforeValidator(lambda value: [{"role": "user", "content": value}] if isinstance(value, str) else value)]
    questions: list[Question] = Field(min_length=1, max_length=MAX_QUESTIONS)
    safety_identifier: str | None = None  # these two label the request for its sender (serve/api.py's LABELS); no answer changes
    prompt_cache_key: str | None = None


@dataclass
class Asking:
    """The responses a decision question is answered from: one (predicate, score) or one per choice."""

    question: Question
    first: int  # index of its first response in the request's list
    count: int = 1


def part_pieces(content: list[InputPart], where: str) -> list[Piece]:
    """Text and image parts in order, as pieces; an image's low detail refused by name."""
    pieces = []
    for n, part in enumerate(content):
        if part.type == "input_text":
            pieces.append(Piece(f"{where}[{n}].text", text=part.text))
            continue
        if part.detail == "low":
            raise RequestError(400, f"{where}[{n}].detail", "'low' is not implemented on /v1/decisions: every image is judged at the "
                                                            "server's tiling (--max_tiles); leave detail out")
        pieces.append(Piece(f"{where}[{n}].image_url", image=part.image_url))
    return pieces


def repeated(values: list, what: str, where: str) -> None:
    """400 naming the first value that repeats an earlier one: a choice's probabilities, or a level's, are one each."""
    seen = {}
    for k, value in enumerate(values):
        if value in seen:
            raise RequestError(400, f"{where}[{k}].{what}", f"repeats {where}[{seen[value]}].{what} ({value[1]!r}): each must be unique")
        seen[value] = k


def asked_about(question: Question, q: int, about: list[Piece]) -> list[Asked]:
    """A question as the responses the judge scores: its instructions (a score question's levels after them) as the
    question, the input (a choice question: the input then the choice, with its description) as the answer."""
    where = f"questions[{q}]"
    instructions = part_pieces(question.instructions, f"{where}.instructions")
    if question.levels is not None:
        repeated([(str, level.label) for level in question.levels], "label", f"{where}.levels")
        scale = "; ".join(f"{k}: {level.label}" + (f" ({level.description})" if level.description else "") for k, level in enumerate(question.levels))
        instructions.append(Piece(f"{where}.levels", text=f"Levels, lowest first: {scale}."))
    if question.choices is None:
        return [Asked(where, instructions, about)]
    repeated([(type(choice.value), choice.value) for choice in question.choices], "value", f"{where}.choices")
    return [Asked(where, instructions, about + [Piece(f"{where}.choices[{c}]", text=choice_text(choice))])
            for c, choice in enumerate(question.choices)]


def choice_text(choice: Choice) -> str:
    value = json.dumps(choice.value) if isinstance(choice.value, bool) else choice.value
    return f"{value}: {choice.description}" if choice.description else value


async def decisions(request: Request, service: Service) -> Response:
    """OpenAI's Decisions API (the openai SDK's client.decisions.create), as vLLM serves it, images included: each
    question asked of the input under the server's score rubric. A predicate's probability is the reward; a score's
    probabilities are the judge's, its scale cut into the question's levels (the score the probability-weighted level
    index, as vLLM's); a choice's probabilities are the choices' rewards, normalised. A question the judge's output
    gives no number for is a refusal; the others are answered."""
    arrived = time.monotonic()
    body = validated(DecisionsRequest, await read_json(request, service.limits.max_request_bytes))
    model = served_name(service, body.model, "model")
    spec = spec_of(service, ("score",), "decisions are read from a pointwise rubric's score distribution: start it with --reward score:CATEGORY")
    if service.reward_model:
        raise RequestError(400, None, "decisions are read from a judge's score distribution, and this server's model is a reward model, "
                                      "which gives one unbounded reward: ask /classify or /get_reward")
    about = [piece for k, message in enumerate(body.input) for piece in part_pieces(message.content, f"input[{k}].content")]
    asked, asking = [], []
    for q, question in enumerate(body.questions):
        made = asked_about(question, q, about)
        asking.append(Asking(question, len(asked), len(made)))
        asked += made
    rewards = await rewarded(request, service, asked, "questions")
    service.metrics.e2e.observe(time.monotonic() - arrived)
    scale = service.rubrics[spec.category].score_scale
    answers = [decision(a.question, rewards[a.first: a.first + a.count], scale) for a in asking]
    prompt = sum(r.result.prompt_tokens for r in rewards)
    written = sum(r.result.generated_tokens for r in rewards)
    usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": written,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + written}
    return JSONResponse({"id": f"decision-{request.state.request_id}", "model": model, "answers": answers, "usage": usage,
                         "reward_mode": service.reward_mode})


def decision(question: Question, rewards: list[Reward], scale) -> dict:
    """A question's answer in OpenAI's shape, from its responses' rewards."""
    answer = {"type": question.type, "name": question.name}
    if any(r.value is None for r in rewards):
        return {"type": "refusal", "name": question.name}
    if question.type == "predicate":
        return {**answer, "probability": rewards[0].value}
    if question.type == "choice":
        total = sum(r.value for r in rewards)
        probabilities = [r.value / total if total > 0 else 1 / len(rewards) for r in rewards]
        best = max(range(len(rewards)), key=lambda k: probabilities[k])
        return {**answer, "choice": question.choices[best].value, "confidence": probabilities[best],
                "probabilities": [{"value": c.value, "probability": p} for c, p in zip(question.choices, probabilities)]}
    levels = len(question.levels)
    distribution = [0.0] * levels
    judged = rewards[0].result.score_distribution or {str(rewards[0].value * (scale.high - scale.low) + scale.low): 1.0}
    for value, p in judged.items():  # each of the judge's levels to the question's level at the same place on the scale
        distribution[round((float(value) - scale.low) / (scale.high - scale.low) * (levels - 1))] += p
    total = sum(distribution)
    distribution = [p / total for p in distribution]
    return {**answer, "score": sum(k * p for k, p in enumerate(distribution)), "confidence": max(distribution),
            "probabilities": [{"value": k, "label": level.label, "probability": p} for k, (level, p) in enumerate(zip(question.levels, distribution))]}
