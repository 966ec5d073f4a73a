"""The requests judge-serve takes, as pydantic models, their bodies read at the size limit, and the error every refusal
becomes.

    POST /v1/score             {"samples": [MMIE sample, ...]}  ->  {"results": [judge-score record, ...]}
                               {"pairs": [pair, ...]}           ->  {"results": [judge-score pair record, ...]}
    POST /v1/chat/completions  OpenAI's chat completions, as judges use them (below)

A chat request holds at most one system (or `developer`) message, then one user message whose content is a
text or a list of `text` and `image_url` parts. Decoding is greedy unless `temperature` says otherwise;
`top_p`, `top_k` (vLLM's), `seed`, `n`, `stop`, `stream`, `logprobs`, `presence_penalty` and
`frequency_penalty` (OpenAI's rule, infer/sampler.py) are honoured, and so are structured
outputs: OpenAI's `response_format` (`json_object`, `json_schema`) and vLLM's `structured_outputs`
(`json`, `regex`, `choice`, `grammar`) or its older `guided_*` fields, at most one of them. An optional
field given as null is taken as absent, as OpenAI's API reference allows. A field this server cannot honour
(tools, `logit_bias`, vLLM's `repetition_penalty` other than 1, `store: true`, ...) is refused by name, and so is a
field it does not know: none is silently ignored. Fields that only label a request for its sender (`user`,
`metadata`, ...) change no answer and are taken (docs/serve.md lists each field and what is done with it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.requests import Request

from mmjudge.judge.data import MAX_TEXT_CHARS, Pair, Sample, field_name

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_CHOICES = 128  # OpenAI's limit on n
MAX_STOP_SEQUENCES = 16

# Fields that label a request for its sender, or only route it within OpenAI's service; no answer changes
# (docs/serve.md says why for each).
LABELS = {"user", "safety_identifier", "metadata", "prompt_cache_key", "parallel_tool_calls"}
# Fields taken at their neutral values only (what an SDK or harness sends to say "nothing special"), each with
# why another value is refused.
NEUTRAL = {
    "repetition_penalty": ([1], "repetition_penalty is not implemented; presence_penalty and frequency_penalty are (OpenAI's)"),
    "min_p": ([0], "min_p sampling is not implemented; use top_p or top_k"),
    "logit_bias": ([{}], "logit_bias is not implemented"),
    "store": ([False], "this server stores no completion"),
    "service_tier": (["auto", "default"], "this server has one tier of service"),
    "guided_decoding_backend": (["auto", "guidance"], "this server's grammars are llguidance's (vLLM's 'guidance' backend)"),
    "tools": ([[]], "tool calls are not implemented"),
    "tool_choice": (["none"], "tool calls are not implemented"),
    "functions": ([[]], "function calls are not implemented"),
    "function_call": (["none"], "function calls are not implemented"),
    "modalities": ([["text"]], "this judge answers in text only"),
    "best_of": ([1], "best_of is not implemented; use n"),
    "use_beam_search": ([False], "beam search is not implemented"),
    "min_tokens": ([0], "min_tokens is not implemented"),
    "echo": ([False], "echoing the prompt is not implemented"),
    "ignore_eos": ([False], "ignore_eos is not implemented"),
    # OpenAI's, for its reasoning models' hidden reasoning before the answer: a judge has none to spend effort on
    # (its reasoning is the text of its answer, as long as max_tokens lets it be), so only none is honoured
    "reasoning_effort": (["none"], "this judge does no hidden reasoning whose effort could be set: it writes its reasoning, if any, "
                                   "in its answer, within max_tokens"),
}


class RequestError(Exception):
    """A request the server refuses: the HTTP status, the field at fault (as `a.b[2].c`), why, and OpenAI's
    error type and code."""

    def __init__(self, status: int, field: str | None, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.field, self.kind = status, field, kind
        self.code = code or DEFAULT_CODES.get(status, "invalid_request")

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.field, "code": self.code}}


DEFAULT_CODES = {400: "invalid_value", 401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large",
                 500: "internal_error"}


def validated(model: type[BaseModel], value: object) -> BaseModel:
    """`value` as `model`, or a 400 naming every field at fault (the first is the error's `param`)."""
    try:
        return model.model_validate(value)
    except ValidationError as err:
        errors = [(field_name(e["loc"]) or "body", e["msg"].removeprefix("Value error, ")) for e in err.errors()]
        raise RequestError(400, errors[0][0], "; ".join(f"{name}: {msg}" for name, msg in errors).removeprefix(f"{errors[0][0]}: ")) from None


class ScoreRequest(BaseModel):
    """Samples to score, or pairs to judge (in both orders, as judge-score judges them): one or the other."""

    model_config = ConfigDict(extra="forbid")
    samples: list[Sample] | None = Field(default=None, min_length=1)
    pairs: list[Pair] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_kind(self) -> ScoreRequest:
        if (self.samples is None) == (self.pairs is None):
            raise ValueError("give 'samples' (to score) or 'pairs' (to judge in both orders), one of them")
        return self

    @property
    def items(self) -> list[Sample] | list[Pair]:
        return self.samples if self.samples is not None else self.pairs

    @property
    def field(self) -> str:
        return "samples" if self.samples is not None else "pairs"


class ImageURL(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str
    # OpenAI's resolution: "low" is one tile of the whole image (InternVL's max_dynamic_patch 1); "high" and
    # "auto" the server's tiling (its --max_tiles, or the request's mm_processor_kwargs)
    detail: Literal["auto", "low", "high"] | None = None


class Part(BaseModel):
    """A piece of a message's content: `{"type": "text", "text": ...}` or `{"type": "image_url", "image_url": {"url": ...}}`."""

    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None

    @model_validator(mode="after")
    def _filled(self) -> Part:
        if getattr(self, self.type) is None:
            raise ValueError(f"a {self.type!r} part needs its '{self.type}' field")
        return self


class Message(BaseModel):
    # OpenAI's `developer` role is its newer name for the system message
    role: Literal["system", "developer", "user", "assistant"]
    content: list[Part]
    name: str | None = None  # a label of the speaker, which the judge's template has no place for

    @model_validator(mode="before")
    @classmethod
    def _text_alone(cls, value: object) -> object:
        if isinstance(value, dict) and isinstance(value.get("content"), str):
            return {**value, "content": [{"type": "text", "text": value["content"]}]}
        return value

    def images(self) -> list[tuple[int, Part]]:
        return [(n, part) for n, part in enumerate(self.content) if part.type == "image_url"]

    def text(self) -> str:
        """The text parts, each on its own line, as vLLM joins them."""
        return "\n".join(part.text for part in self.content if part.type == "text")


class ProcessorKwargs(BaseModel):
    """vLLM's per-request image-processor settings: InternVL's tile limit, Qwen-VL's least and most pixels."""

    model_config = ConfigDict(extra="forbid")
    max_dynamic_patch: int | None = Field(default=None, ge=1, le=40)
    min_pixels: int | None = Field(default=None, ge=1)
    max_pixels: int | None = Field(default=None, ge=1)


class JSONSchema(BaseModel):
    """OpenAI's `response_format.json_schema`. The schema is enforced whatever `strict` says (vLLM does the
    same): a judge asked for JSON writes JSON."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict | bool = Field(default=True, alias="schema")  # absent: any JSON value
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchema | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("a json_schema response_format needs its json_schema, and only it takes one")
        return self


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: one of json, regex, choice, grammar, json_object, with the whitespace
    JSON may have between its tokens."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    json_: dict | bool | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None
    whitespace_pattern: str | None = None
    # vLLM's name; absent, it is true here (vLLM's default is false): compact JSON, whitespace only where asked
    disable_any_whitespace: bool | None = None

    def whitespace(self) -> str | None:
        if self.whitespace_pattern is not None:
            return self.whitespace_pattern
        return None if self.disable_any_whitespace is False else ""


@dataclass(frozen=True)
class Constraint:
    """What a request's answer must follow, as the request says it: the field that says it (for errors),
    one of json, regex, choice, grammar, and for JSON the whitespace between tokens ("": none, the default,
    infer/grammar.py's COMPACT; None: a space, or a line break and indentation, as `disable_any_whitespace:
    false` asks; else the request's pattern)."""

    field: str
    kind: Literal["json", "regex", "choice", "grammar"]
    value: object
    whitespace: str | None = ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool | None = None


class ChatRequest(BaseModel):
    # strict: `"max_tokens": true` or `"temperature": "0"` are refused, not read as 1 and 0
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None  # none: the served model, as vLLM takes it
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)  # the newer name of max_tokens
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM's: 0 or -1 is no cut
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)  # OpenAI's range
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    mm_processor_kwargs: ProcessorKwargs | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    # vLLM's older names of structured_outputs' fields
    guided_json: dict | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(default=None, min_length=1)
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None

    def constraint(self) -> Constraint | None:
        """The one structured output the request asks for, or None; a 400 where it asks for two."""
        found = []
        if self.response_format is not None and self.response_format.type != "text":
            schema = self.response_format.json_schema.schema_ if self.response_format.json_schema else {"type": "object"}
            found.append(Constraint("response_format", "json", schema))
        if (given := self.structured_outputs) is not None:
            whitespace = given.whitespace()
            kinds = {"json": given.json_, "regex": given.regex, "choice": given.choice, "grammar": given.grammar,
                     "json_object": {"type": "object"} if given.json_object else None}
            found += [Constraint(f"structured_outputs.{name}", "json" if name == "json_object" else name, value, whitespace)
                      for name, value in kinds.items() if value is not None]
            if not found:
                raise RequestError(400, "structured_outputs", "give one of json, regex, choice, grammar, json_object")
        found += [Constraint(f"guided_{kind}", kind, value, self.guided_whitespace_pattern or "") for kind, value in
                  (("json", self.guided_json), ("regex", self.guided_regex), ("choice", self.guided_choice), ("grammar", self.guided_grammar))
                  if value is not None]
        if len(found) > 1:
            raise RequestError(400, found[1].field, f"one structured output per request; {found[0].field} already asks for one")
        if found and found[0].kind == "json" and isinstance(found[0].value, str):  # a schema sent as JSON text
            try:
                return Constraint(found[0].field, "json", json.loads(found[0].value), found[0].whitespace)
            except ValueError:
                raise RequestError(400, found[0].field, "a JSON schema given as text must be JSON") from None
        return found[0] if found else None

    def stop_sequences(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP_SEQUENCES:
            raise RequestError(400, "stop", f"{len(stops)} stop sequences, more than the {MAX_STOP_SEQUENCES} this server takes")
        for k, stop in enumerate(stops):
            if not stop:
                raise RequestError(400, "stop" if isinstance(self.stop, str) else f"stop[{k}]", "an empty stop sequence would end every answer before it starts")
        return stops

    def new_tokens(self, default: int, room: int) -> int:
        """The answer's length limit: the request's (or the server's --max_new_tokens when it gives none), cut
        to what the model's context holds after the prompt; the answer then ends with finish_reason "length"."""
        return min(self.max_completion_tokens or self.max_tokens or default, room)

    def turns(self) -> tuple[str | None, Message]:
        """The system text, if any, and the user message: the one conversation shape a judge has."""
        roles = [m.role for m in self.messages]
        if roles not in (["user"], ["system", "user"], ["developer", "user"]):
            raise RequestError(400, "messages", f"one user message, after at most one system (or developer) message, is what a judge reads; got roles {roles}")
        system = None
        if roles[0] != "user":
            if self.messages[0].images():
                raise RequestError(400, "messages[0].content", f"a {roles[0]} message holds text only")
            system = self.messages[0].text()
        if self.top_logprobs and not self.logprobs:
            raise RequestError(400, "top_logprobs", "needs logprobs: true")
        if self.stream_options is not None and not self.stream:
            raise RequestError(400, "stream_options", "only with stream: true")
        total = 0
        for k, message in enumerate(self.messages):
            total += sum(len(part.text) for part in message.content if part.type == "text")
            if total > MAX_TEXT_CHARS:  # checked before anything is tokenized
                # in the words of OpenAI's and vLLM's refusal, which clients such as litellm read (serve/app.py)
                raise RequestError(400, f"messages[{k}].content", f"This model's maximum context length is exceeded: the messages' texts "
                                                                  f"reach {total:,} characters, more than the {MAX_TEXT_CHARS:,} a judge's "
                                                                  "context can hold", code="context_length_exceeded")
        return system, self.messages[-1]


def chat_request(body: object) -> ChatRequest:
    """The request, or a 400 naming the first field that asks for what this server does not do, or that it
    does not know (null values are absent), or that is malformed."""
    if isinstance(body, dict):
        refuse_unhonoured(body)
    return validated(ChatRequest, body)


def refuse_unhonoured(body: dict) -> None:
    known = set(ChatRequest.model_fields) | LABELS
    for key, value in body.items():
        if value is None or key in known:
            continue
        if key not in NEUTRAL:  # an empty name is named as JSON writes it: an empty param names no field
            raise RequestError(400, key or '""', "a field this server does not take (docs/serve.md lists what it does with each field of "
                                         "OpenAI's and vLLM's); it honours every field it takes, so it refuses the others",
                               code="unsupported_parameter")
        neutral, why = NEUTRAL[key]
        if not any(value == allowed and isinstance(value, bool) == isinstance(allowed, bool) for allowed in neutral):
            raise RequestError(400, key, f"{why}; leave it out (or send {json.dumps(neutral[0])})", code="unsupported_parameter")


async def read_body(request: Request, limit: int) -> bytes:
    """The body's bytes, refused (413) at the limit without reading further."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, "body", f"{declared} bytes, over this server's limit of {limit} (--max_request_bytes)")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise RequestError(413, "body", f"over this server's limit of {limit} bytes (--max_request_bytes)")
    return bytes(body)
