"""judge-serve's HTTP API (Starlette): what each endpoint reads, checks and answers.

    GET  /health               {"status": "ok"} while the model thread runs; no key needed
    GET  /metrics              Prometheus text in vLLM's shape (serve/metrics.py)
    GET  /v1/models            the model under each name it is served as; /v1/models/{id} its card (ids may hold slashes)
    POST /v1/score             MMIE samples (or pairs) -> the records judge-score writes (serve/api.py)
    POST /v1/chat/completions  OpenAI's chat completions, whole or streamed (serve/api.py, serve/completions.py)

Every refusal is a JSON error in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with
`param` naming the field at fault: 400 for a malformed request, 401 for a missing or wrong key, 404 for
an unknown path or model, 413 for a body, text or image over a limit. Checks run in the request's own
thread, before the request reaches the model; an unexpected failure is a 500 for that request alone.
Every answer carries an `x-request-id` header: the client's own, or one made here.

A client that goes away while its request waits or is being written (a timeout, a closed stream) ends it:
the model thread computes nothing more for it from its next step on.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import threading
import time
import uuid

import torch
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from mmjudge.infer import grammar
from mmjudge.infer.decoding import Completion
from mmjudge.infer.sampler import Sampling
from mmjudge.judge.data import CALIBRATOR_FIELDS, IMAGE_PLACEHOLDER, Pair, Sample, UsageError
from mmjudge.judge.prompts import Query, encode_prompt, render_query
from mmjudge.judge.vision import Pixels, load_pixels, placeholder
from mmjudge.serve.api import ChatRequest, Constraint, RequestError, ScoreRequest, chat_request, validated
from mmjudge.serve.completions import ChoiceText, chunk, logprob_entries, now, sse, usage
from mmjudge.serve.images import RequestImages
from mmjudge.serve.metrics import Metrics
from mmjudge.serve.rewards import reward_routes
from mmjudge.serve.service import ClientGone, Service, Steps, context_exceeded, disconnected, judged, read_json, served_name, submitted, until_answered
from mmjudge.serve.worker import ChatPrompt

CLIENT_GONE = 499  # nginx's status for a request whose client closed the connection: answered to no one


def build_app(service: Service) -> RequestIds:
    def endpoint(handler, authorized: bool = True):
        async def route(request: Request) -> Response:
            try:
                if authorized:
                    check_key(request, service.api_key)
                return await handler(request, service)
            except RequestError as err:
                return JSONResponse(err.body(), status_code=err.status)
            except ClientGone:
                return Response(status_code=CLIENT_GONE)
            except Exception as err:  # noqa: BLE001 - the last line of defence: this request fails, the server stays
                return JSONResponse(RequestError(500, None, f"internal failure: {type(err).__name__}: {err}", "server_error").body(), status_code=500)
        return route

    async def not_found(request: Request, err: HTTPException) -> Response:
        return JSONResponse(RequestError(err.status_code, None, f"{request.method} {request.url.path}: {err.detail}").body(), status_code=err.status_code)

    routes = [
        Route("/health", endpoint(health, authorized=False)),
        Route("/metrics", endpoint(metrics)),
        Route("/v1/models", endpoint(models)),
        Route("/v1/models/{model_id:path}", endpoint(model_card)),
        Route("/v1/score", endpoint(score), methods=["POST"]),
        Route("/v1/chat/completions", endpoint(chat_completions), methods=["POST"]),
        *reward_routes(endpoint),
    ]
    return RequestIds(Starlette(routes=routes, exception_handlers={HTTPException: not_found}), service.metrics)


HANDLERS = {"/health", "/metrics", "/v1/models", "/v1/score", "/v1/chat/completions", "/classify", "/get_reward", "/v1/score/evaluation",
            "/v1/decisions"}
METHODS = {"GET", "POST", "HEAD", "OPTIONS", "PUT", "DELETE", "PATCH"}
REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestIds:
    """ASGI middleware: an `x-request-id` on every answer (the client's, when it sent a plain one, as
    vLLM does) and every answer counted by handler, method and status class."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        path = scope["path"]
        handler = path if path in HANDLERS else "/v1/models/{model_id}" if path.startswith("/v1/models/") else "none"
        # labels from a bounded set: a client that makes up paths or methods cannot grow the metrics without end
        method = scope["method"] if scope["method"] in METHODS else "other"

        async def answer(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
                self.metrics.http[handler, method, f"{message['status'] // 100}xx"] += 1
            await send(message)

        await self.app(scope, receive, answer)


def check_key(request: Request, api_key: str | None) -> None:
    if api_key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # compare_digest takes constant time: the key cannot be guessed a byte at a time
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), api_key.encode()):
        raise RequestError(401, None, "missing or wrong API key: send it as 'Authorization: Bearer KEY'", "authentication_error")






async def health(request: Request, service: Service) -> Response:
    if not service.worker.alive():
        return JSONResponse({"status": "model thread stopped"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def metrics(request: Request, service: Service) -> Response:
    text = service.metrics.text(service.worker.counts, service.worker.forward_passes(), service.worker.waiting())
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


def card(service: Service, name: str) -> dict:
    """The model under one of its names as /v1/models lists it, with what a client needs to know of its input:
    its context (vLLM's `max_model_len`) and how large an image it takes: the tiles an InternVL judge cuts an
    image into at most (`max_tiles`), the pixels a Qwen-VL judge resizes one to at most (`max_pixels`)."""
    limits = {k: v for k, v in service.judge.settings.images.stored().items() if k in ("max_tiles", "max_pixels")}
    return {"id": name, "object": "model", "created": service.started, "owned_by": "mmjudge",
            "max_model_len": service.context, **limits}


def processing_of(settings, body: ChatRequest):
    """The judge's image processing with the request's mm_processor_kwargs (vLLM's): a tile limit for an
    InternVL judge, least and most pixels for a Qwen-VL one; the other backbone's are refused."""
    processing = settings.images
    kwargs = body.mm_processor_kwargs
    if kwargs is None:
        return processing
    try:
        if kwargs.max_dynamic_patch:
            processing = processing.with_max_tiles(kwargs.max_dynamic_patch)
        pixels = {k: v for k, v in (("min_pixels", kwargs.min_pixels), ("max_pixels", kwargs.max_pixels)) if v is not None}
        return processing.restored(pixels) if pixels else processing
    except (UsageError, ValueError) as err:
        raise RequestError(400, "mm_processor_kwargs", str(err)) from None


async def models(request: Request, service: Service) -> Response:
    return JSONResponse({"object": "list", "data": [card(service, name) for name in service.model_names]})


async def model_card(request: Request, service: Service) -> Response:
    return JSONResponse(card(service, served_name(service, request.path_params["model_id"], "model_id")))




async def score(request: Request, service: Service) -> Response:
    arrived = time.monotonic()
    body = validated(ScoreRequest, await read_json(request, service.limits.max_request_bytes))
    items, what = body.items, body.field
    if len(items) > service.limits.max_samples:
        raise RequestError(413, what, f"{len(items)} {what}, over this server's limit of {service.limits.max_samples} (--max_samples)")
    for k, item in enumerate(items):
        rubric = service.rubrics.get(item.category)
        if rubric is None:
            raise RequestError(400, f"{what}[{k}].category", f"no rubric for category {item.category!r}; this server has {sorted(service.rubrics)}")
        if what == "samples" and rubric.kind == "pairwise":
            raise RequestError(400, f"{what}[{k}].category", f"the rubric of category {item.category!r} compares two answers; send the sample as a pair")
        if what == "pairs" and rubric.kind == "pairwise" and service.reward_model:
            raise RequestError(400, f"{what}[{k}].category", f"the rubric of category {item.category!r} asks for a verdict, and this server's "
                                                                 "model is a reward model, which scores each answer alone: send the pair under a "
                                                                 "pointwise rubric's category")
        if what == "pairs" and rubric.kind == "pairwise" and service.score_options.structured:
            raise RequestError(400, f"{what}[{k}].category", f"the rubric of category {item.category!r} asks for a verdict, and this server "
                                                                 "holds each answer to its rubric's score lines (--structured)")
        if len(item.images()) > service.limits.max_images:
            raise RequestError(413, f"{what}[{k}]", f"{len(item.images())} images, over this server's limit of {service.limits.max_images} (--max_images)")
    images = RequestImages(service.image_root, service.limits.max_image_pixels)
    try:
        results = await judged(service, lambda: with_image_files(items, what, images), what, request)
    finally:
        images.close()
    service.metrics.e2e.observe(time.monotonic() - arrived)
    return JSONResponse({"results": [result.model_dump(exclude=CALIBRATOR_FIELDS if what == "samples" else None) for result in results]})






def with_image_files(items: list[Sample] | list[Pair], what: str, images: RequestImages) -> Steps[list[Sample] | list[Pair]]:
    """The samples (or pairs) with each image's reference replaced by the file that holds it, checked an image a piece."""
    checked = []
    for k, item in enumerate(items):
        parts = {}
        for part in ("question", "answer_a", "answer_b") if isinstance(item, Pair) else ("question", "answer"):
            parts[part] = []
            for n, segment in enumerate(getattr(item, part)):
                if segment.image is not None:
                    segment = segment.model_copy(update={"image": str(images.file(segment.image, f"{what}[{k}].{part}[{n}].image"))})
                    yield
                parts[part].append(segment)
        checked.append(item.model_copy(update=parts))
    return checked


async def chat_completions(request: Request, service: Service) -> Response:
    arrived = time.monotonic()
    if service.reward_model:
        raise RequestError(400, "model", "this server's model is a reward model: it gives each answer a reward (/v1/score, /classify, "
                                         "/get_reward, /v1/score/evaluation) and writes no text")
    body = chat_request(await read_json(request, service.limits.max_request_bytes))
    body = body.model_copy(update={"model": served_name(service, body.model, "model")})  # the name the answer gives
    system, user = body.turns()
    stops = body.stop_sequences()
    index = len(body.messages) - 1
    image_parts = user.images()
    if len(image_parts) > service.limits.max_images:
        raise RequestError(413, f"messages[{index}].content", f"{len(image_parts)} images, over this server's limit of {service.limits.max_images} (--max_images)")
    query = user_query(user.text(), len(image_parts))
    settings = service.judge.settings
    processing = processing_of(settings, body)
    low_detail = processing.with_max_tiles(1)  # OpenAI's low detail: one tile of the whole image (a Qwen-VL judge's images are whole already)
    images = RequestImages(service.image_root, service.limits.max_image_pixels)
    constraint = body.constraint()

    def tokenized() -> Steps[tuple[torch.Tensor, Pixels | None]]:
        loaded = []
        for n, part in image_parts:  # an image a piece: read, checked and tiled
            loaded.append(load_pixels(images.file(part.image_url.url, f"messages[{index}].content[{n}].image_url.url"),
                                      low_detail if part.image_url.detail == "low" else processing))
            yield
        # Rendered as judge-score renders a prompt: what the user wrote is read as text, whatever tokens it spells.
        text, controls = render_query(settings.template, query, [placeholder(processing, p.tokens) for p in loaded],
                                      settings.system_message if system is None else system)
        return torch.tensor(encode_prompt(service.tokenizer, text, controls)), Pixels.cat(loaded)

    try:
        input_ids, pixels = await service.prepared(tokenized())
    finally:
        images.close()
    rules = None if constraint is None else await run_in_threadpool(compiled, service, constraint)  # a large schema takes a while
    room = service.context - len(input_ids)
    if room < 1:
        raise context_exceeded(service, "messages", len(input_ids))
    answer = Answer(service, body, stops, len(input_ids), 0 if pixels is None else pixels.tiles, request.state.request_id, arrived)
    # the written token's log-probability is the first of its step's likeliest
    logprobs = max(1, body.top_logprobs or 0) if body.logprobs else 0
    prompt = ChatPrompt(input_ids, pixels, body.new_tokens(service.score_options.max_new_tokens, room), logprobs, sampling(body),
                        body.n or 1, answer.on_token, answer.gone.is_set, rules)
    future = submitted(service, service.worker.chat(prompt))
    if body.stream:
        return StreamingResponse(answer.stream(future, request), media_type="text/event-stream")
    try:
        completions = answer.checked(await until_answered(service, future, request, answer.gone))
    except ClientGone:
        service.metrics.finished["abort"] += body.n or 1  # vLLM's finish reason for a request its client left
        raise
    whole, texts = await run_in_threadpool(answer.whole, completions)
    answer.counted(completions, texts)
    return JSONResponse(whole)


def compiled(service: Service, constraint: Constraint) -> grammar.Grammar:
    """The request's structured output as a grammar of the judge's tokens; a 400 naming the field where it
    does not compile, no text satisfies it, or it is past this server's size or time limit."""
    if isinstance(service.vocabulary, str):
        raise RequestError(400, constraint.field, f"this judge cannot constrain its answers: {service.vocabulary}")
    size, limits = len(constraint.value) if isinstance(constraint.value, str) else len(json.dumps(constraint.value)), service.limits
    if size > limits.max_grammar_chars:
        raise RequestError(400, constraint.field, f"{size:,} characters, over this server's limit of {limits.max_grammar_chars:,} (--max_grammar_chars)")
    build = {"json": lambda v, value: grammar.json_schema(v, value, constraint.whitespace), "regex": grammar.regex,
             "choice": grammar.choice, "grammar": grammar.grammar}[constraint.kind]
    try:
        return grammar.within(limits.max_grammar_seconds, lambda: build(service.vocabulary, constraint.value))
    except grammar.GrammarBusy as err:  # the server's state, not the request's fault
        raise RequestError(503, constraint.field, str(err), kind="server_error", code="server_busy") from None
    except grammar.GrammarError as err:
        raise RequestError(400, constraint.field, f"does not compile to a grammar: {err}") from None


def sampling(body: ChatRequest) -> Sampling:
    """Greedy unless the request gives a temperature above 0 (OpenAI's default is 1; a judge's is greedy)."""
    return Sampling(temperature=body.temperature or 0.0, top_p=1.0 if body.top_p is None else body.top_p,
                    top_k=max(0, body.top_k or 0), seed=body.seed, presence_penalty=body.presence_penalty or 0.0,
                    frequency_penalty=body.frequency_penalty or 0.0)


def user_query(text: str, n_images: int) -> Query:
    """The user's text with a slot where each image goes. A text with exactly one `<image>` per image part
    places them there (InternVL's and vLLM's convention); any other text is text, an `<image>` in it
    included, and the images go before it, each on a line of its own, as InternVL's chat() puts images its
    query does not place. Image tokens it spells are read as text (encode_prompt)."""
    pieces = text.split(IMAGE_PLACEHOLDER)
    if n_images and len(pieces) - 1 == n_images:
        return [pieces[0], *(part for piece in pieces[1:] for part in (None, piece))]
    return [*(part for _ in range(n_images) for part in (None, "\n")), text]








class Answer:
    """One chat request's answer as it is written: its choices' texts, for the whole answer or its stream."""

    def __init__(self, service: Service, body: ChatRequest, stops: list[str], prompt_tokens: int, n_tiles: int, request_id: str, arrived: float):
        self.service, self.body, self.stops, self.prompt_tokens, self.n_tiles = service, body, stops, prompt_tokens, n_tiles
        self.id, self.created, self.arrived = f"chatcmpl-{request_id}", now(), arrived
        self.decode = service.judge.decode
        self.stop_ids = service.judge.stop_ids
        self.gone = threading.Event()  # the client disconnected: the model thread ends the request
        self.first_token_at: float | None = None
        # Streamed text goes out as it is written, unless each token goes with its log-probabilities (the
        # model thread returns those with the whole answer).
        self.live = bool(body.stream and not body.logprobs)
        self.choices = [ChoiceText(self.decode, stops, self.stop_ids) for _ in range(body.n or 1)]
        self.loop = asyncio.get_running_loop()
        self.written: asyncio.Queue[int] = asyncio.Queue()  # choices with new text, while live

    def on_token(self, choice: int, token: int) -> bool:
        """Told by the model thread of each token written; False ends the choice: its stop sequence is
        there, or its client is gone. The text is decoded here only where a stop sequence or a live stream
        needs it."""
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        going = not self.gone.is_set()
        if self.stops or self.live:
            going &= self.choices[choice].add(token)
        if self.live:
            self.loop.call_soon_threadsafe(self.written.put_nowait, choice)
        return going

    def checked(self, completions: list[Completion]) -> list[Completion]:
        """The completions, or a 400 naming the structured output's field where a choice reached text its
        grammar allows no continuation of: its answer would be cut short yet say "stop"."""
        for k, completion in enumerate(completions):
            if completion.finish_reason == "grammar":
                raise RequestError(400, self.body.constraint().field,
                                   f"choice {k} came, after {len(completion.tokens) - 1} tokens, to text no continuation of satisfies "
                                   f"the grammar ({completion.grammar_error.splitlines()[0] if completion.grammar_error else 'no reason given'}): "
                                   "it admits text it cannot complete")
        return completions

    def texts(self, completions: list[Completion]) -> list[ChoiceText]:
        return [ChoiceText.of(c.tokens, self.decode, self.stops, self.stop_ids) for c in completions]

    def counted(self, completions: list[Completion], texts: list[ChoiceText]) -> None:
        metrics = self.service.metrics
        metrics.e2e.observe(time.monotonic() - self.arrived)
        if self.first_token_at is not None:
            metrics.ttft.observe(self.first_token_at - self.arrived)
        metrics.prompt_tokens += self.prompt_tokens
        metrics.generation_tokens += sum(len(c.tokens) for c in completions)
        metrics.finished.update(text.finish_reason() for text in texts)

    def whole(self, completions: list[Completion]) -> tuple[dict, list[ChoiceText]]:
        """The answer as one chat.completion, and its choices' texts (decoded in a worker thread: long
        answers take a while)."""
        texts = self.texts(completions)
        choices = []
        for k, (completion, text) in enumerate(zip(completions, texts)):
            logprobs = {"content": logprob_entries(self.decode, text.tokens, completion, self.body.top_logprobs or 0,
                                                         self.service.token_bytes)} if self.body.logprobs else None
            choices.append({"index": k, "message": {"role": "assistant", "content": text.text}, "finish_reason": text.finish_reason(),
                            "logprobs": logprobs})
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.body.model, "choices": choices,
                "usage": usage(self.prompt_tokens, completions), "n_tiles": self.n_tiles}, texts

    async def stream(self, answer, request: Request):
        """The answer as server-sent events: a first chunk naming the role, the text, a last chunk with the
        finish reason for each choice, the usage when stream_options.include_usage asks, then [DONE]."""
        with_usage = bool(self.body.stream_options and self.body.stream_options.include_usage)
        extra = {"usage": None} if with_usage else {}
        piece = lambda choices, **more: sse(chunk(self.id, self.created, self.body.model, choices, **{**extra, **more}))  # noqa: E731
        n = self.body.n or 1
        try:
            yield piece([{"index": k, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None} for k in range(n)])
            sent = [""] * n
            gone, written = asyncio.ensure_future(disconnected(request)), None
            try:
                while self.live and not answer.done():
                    written = asyncio.ensure_future(self.written.get())
                    await asyncio.wait({answer, written, gone}, return_when=asyncio.FIRST_COMPLETED)
                    if gone.done():
                        return
                    if not written.done():
                        break
                    ready = {written.result()}
                    while not self.written.empty():  # every token written meanwhile, decoded once
                        ready.add(self.written.get_nowait())
                    for k in sorted(ready):
                        if delta := self.choices[k].settled()[len(sent[k]):]:
                            sent[k] += delta
                            yield piece([{"index": k, "delta": {"content": delta}, "logprobs": None, "finish_reason": None}])
            finally:  # both, however the loop ends: a task left pending is logged as destroyed once it is collected
                gone.cancel()
                if written is not None:
                    written.cancel()
            try:
                completions = self.checked(await until_answered(self.service, answer, request, self.gone))
            except ClientGone:
                return
            except RequestError as err:
                yield sse(err.body())
                yield sse("[DONE]")
                return
            texts = await run_in_threadpool(self.texts, completions)
            for k, (completion, text) in enumerate(zip(completions, texts)):
                if self.body.logprobs:
                    entries = await run_in_threadpool(logprob_entries, self.decode, text.tokens, completion, self.body.top_logprobs or 0,
                                                      self.service.token_bytes)
                    if "".join(e["token"] for e in entries) == text.text:  # a chunk per token, with its log-probabilities
                        for entry in entries:
                            yield piece([{"index": k, "delta": {"content": entry["token"]}, "logprobs": {"content": [entry]}, "finish_reason": None}])
                    else:
                        yield piece([{"index": k, "delta": {"content": text.text}, "logprobs": {"content": entries}, "finish_reason": None}])
                elif rest := text.text[len(sent[k]):]:
                    yield piece([{"index": k, "delta": {"content": rest}, "logprobs": None, "finish_reason": None}])
                yield piece([{"index": k, "delta": {}, "logprobs": None, "finish_reason": text.finish_reason()}])
            self.counted(completions, texts)
            if with_usage:
                yield piece([], usage=usage(self.prompt_tokens, completions))
            yield sse("[DONE]")
        finally:
            if not answer.done():  # the client left (a closed stream ends this generator at its next piece)
                self.gone.set()
            if self.gone.is_set():
                self.service.metrics.finished["abort"] += n
