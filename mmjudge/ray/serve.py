"""judge-serve on Ray Serve: N replicas of the same Service behind one HTTP address, each request sent to the replica
whose prefix cache holds its question (docs/past-one-machine.md).

    judge-serve --model_path CKPT --reward score:SA --replicas 2            # joins the cluster `ray start` made, or starts one
    serve run judge-serve.yaml                         # the same application from a config file (serve/cli.py's ray_application)

Two deployments, both thin: `Ingress` takes every HTTP request from Ray Serve's proxy, reads its body (the proxy
hands a replica only the request's scope, so no router can see a body), computes its affinity key and passes the
request to `Judge` through a handle with the key beside it; each `Judge` replica is one judge-serve (serve/cli.py's
load_service, serve/app.py's build_app) answering the request in-process, as its own server would. `AffinityRouter`,
Ray Serve's request-router extension point, reads the key: a key goes to the first replica of its rendezvous order
(a hash of the key and each live replica's id, alike in every Ingress replica's router) that has at most
`max_imbalance` more requests in flight than the least loaded; a request without a key goes to the least loaded. A replica that dies is restarted by Ray Serve; a request it held is sent again, to another replica,
at most RETRIES times, then answered 503 naming the replica: never a reward made up.

Every answer carries `x-mmjudge-replica` (the replica's id) and `x-mmjudge-judge` (its judge's fingerprint), and a JSON
object answer a `replica` field as well. GET /metrics gathers every replica's, each series labelled `replica`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from dataclasses import dataclass, field

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import RayServeException
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from mmjudge.serve.api import RequestError, read_body  # light: no torch in the Ingress's process

RETRIES = 2  # sends of a request whose replica died before answering it, after the first
# Requests in flight a key's replica may have beyond the least loaded's before a key's request leaves it. Hashing puts
# 5 or 6 of 8 GRPO groups (8 answers each) in flight on one of two replicas now and then; a bound of 16 spilled such
# groups, each prefilling its question again on the next replica (1.10-1.21x the prompt tokens of one server over three
# runs at load 1.5-4.5), and 48 holds six groups' imbalance (1.02 and 1.04x). A replica batches what it holds.
MAX_IMBALANCE = 48
MAX_ONGOING = 256  # requests a Judge replica takes at once (its model thread batches them); Ray Serve's default is 5
APP = "judge-serve"  # the Ray Serve application's name
FASTAPI_DOORS = {"/get_reward", "/v1/score/evaluation"}  # refusals in FastAPI's shape there (serve/rewards.py)


# -- the affinity key ------------------------------------------------------------------------------------------

def affinity_key(path: str, body: object, reward: str | None) -> str | None:
    """The hash of what a request's prompts share before their first answer, which the replica's prefix cache keeps:
    the rubric, the question's text and its images (data URLs or paths as sent), of its first item. Answers are
    left out, so a GRPO group's answers and both orders of a pair have one key. None where nothing is shared beyond
    the rubric every replica has: a text judged whole (/classify's input, /v1/score/evaluation), a chat (judge-serve
    keeps no prefix of chats), a GET, or a body no door would take (the replica refuses it)."""
    try:
        shared = SHARED[path](body, reward) if path in SHARED and isinstance(body, dict) else None
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    if not shared:
        return None
    return hashlib.blake2b(json.dumps(shared, sort_keys=True).encode(), digest_size=16).hexdigest()


def _scored(body: dict, reward: str | None) -> list | None:
    """/v1/score: the first sample's (or pair's) rubric and question."""
    items = body.get("samples") or body.get("pairs")
    return [items[0].get("category"), items[0]["question"]] if items else None


def _get_reward(body: dict, reward: str | None) -> list | None:
    """OpenRLHF's /get_reward: the first query's prompt and images, as its question."""
    prompt = (body.get("prompts") or [None])[0]
    images = (body.get("images") or [None])[0]
    return [reward, prompt, images] if prompt or images else None


def _classify(body: dict, reward: str | None) -> list | None:
    """vLLM's /classify: a chat's user turn, its question; an input text is judged whole."""
    messages = body.get("messages")
    return [reward, messages[-2].get("content")] if messages and len(messages) >= 2 else None


def _decisions(body: dict, reward: str | None) -> list | None:
    """/v1/decisions: each question's instructions, the question its input is judged against."""
    return [reward, [question.get("instructions") for question in body["questions"]]]


SHARED = {"/v1/score": _scored, "/get_reward": _get_reward, "/classify": _classify, "/v1/decisions": _decisions}


# -- the router --------------------------------------------------------------------------------------------------

class AffinityRouter(RequestRouter):
    """A request with an affinity key goes to its key's replica: the first, in the key's rendezvous order of the live
    replicas (`ranked`), with at most `max_imbalance` requests in flight beyond the least loaded one; a request
    without a key, to the least loaded (Ray Serve's choice among the candidates). In flight: Ray Serve's count per
    replica, kept by every router from the replicas' answers.

    Ray Serve makes a router in each process that holds a handle to the Judge deployment: one per Ingress replica.
    A key's replica is a function of the key and the live replicas' ids alone, so every router, in every Ingress
    replica, sends a key to the same replica, with no map to share or keep; a replica that leaves (dies, is scaled
    down) moves only the keys it ranked first, to their next, and one that joins takes only the keys it now ranks
    first."""

    def initialize_state(self, max_imbalance: int = MAX_IMBALANCE):
        self.max_imbalance = max_imbalance

    def in_flight(self, replica: RunningReplica) -> int:
        return self._replica_queue_len_cache.get(replica.replica_id) or 0

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = pending_request.kwargs.get("affinity") if pending_request is not None else None
        if key is None:
            return [candidate_replicas]  # Ray Serve takes the one of fewest requests in flight
        bound = min(map(self.in_flight, candidate_replicas)) + self.max_imbalance
        order = ranked(key, candidate_replicas)
        home = next(r for r in order if self.in_flight(r) <= bound)  # the least loaded is within the bound: one is found
        return [[home], [r for r in order if r is not home]]  # the rest, in the key's order, where the home cannot take it


def ranked(key: str, replicas: list[RunningReplica]) -> list[RunningReplica]:
    """The replicas in the key's rendezvous (highest random weight) order: by a hash of the key and each replica's id,
    the same in every process."""
    weight = lambda replica: hashlib.blake2b(f"{key}/{replica.replica_id.unique_id}".encode(), digest_size=8).digest()  # noqa: E731
    return sorted(replicas, key=weight, reverse=True)


# -- the replicas -------------------------------------------------------------------------------------------------

@dataclass
class Forwarded:
    """An HTTP request as the ingress read it: what a replica's ASGI app is called with."""

    scope: dict
    body: bytes


@dataclass
class Reply:
    status: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytes = b""


class Judge:
    """One judge-serve: the Service loaded once, its Starlette app called in-process with each forwarded request."""

    def __init__(self, args, options, limits, api_key: str | None):
        from mmjudge.serve.app import build_app
        from mmjudge.serve.load import load_service

        self.service = load_service(args, options, limits, api_key)
        self.app = build_app(self.service)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.named = [(b"x-mmjudge-replica", self.replica.encode()), (b"x-mmjudge-judge", str(self.service.judge_fingerprint).encode())]
        print(f"judge-serve replica {self.replica}: {args.model_path} on {self.service.worker.device}", file=sys.stderr, flush=True)

    async def answer(self, request: Forwarded, affinity: str | None = None) -> Reply:
        """The app's whole answer, named."""
        reply = Reply(0)

        async def send(message):
            if message["type"] == "http.response.start":
                reply.status, reply.headers = message["status"], [*message.get("headers", []), *self.named]
            elif message["type"] == "http.response.body":
                reply.body += message.get("body", b"")

        await self.called(request, send)
        return self.with_replica(reply)

    async def stream(self, request: Forwarded, affinity: str | None = None):
        """The app's answer as it is written: the Reply of its status and headers first, then each piece of body."""
        pieces: asyncio.Queue = asyncio.Queue()

        async def send(message):
            if message["type"] == "http.response.start":
                pieces.put_nowait(Reply(message["status"], [*message.get("headers", []), *self.named]))
            elif message["type"] == "http.response.body":
                pieces.put_nowait(message.get("body", b""))
                if not message.get("more_body", False):
                    pieces.put_nowait(None)

        called = asyncio.ensure_future(self.called(request, send))
        while (piece := await pieces.get()) is not None:
            yield piece
        await called

    async def called(self, request: Forwarded, send) -> None:
        """The app called with the request; cancelled (its client left the proxy), the app is told of a disconnect, so
        the model thread ends the request at its next step, as judge-serve's own server does."""
        given, gone = False, asyncio.Event()

        async def receive():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": request.body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        app = asyncio.ensure_future(self.app(dict(request.scope), receive, send))
        try:
            await asyncio.shield(app)
        except asyncio.CancelledError:
            gone.set()
            raise

    def with_replica(self, reply: Reply) -> Reply:
        """A JSON object answer with `replica` beside what it says of the judge."""
        if reply.status < 300 and (b"content-type", b"application/json") in reply.headers:
            answer = json.loads(reply.body)
            if isinstance(answer, dict):
                reply.body = json.dumps({**answer, "replica": self.replica}, ensure_ascii=False, allow_nan=False).encode()
                reply.headers = [(k, str(len(reply.body)).encode() if k == b"content-length" else v) for k, v in reply.headers]
        return reply


class Ingress:
    """Ray Serve's HTTP door: each request's body read (at --max_request_bytes), keyed, and passed to a Judge replica."""

    def __init__(self, judge, limits):
        self.judge, self.limits = judge, limits

    async def __call__(self, request: Request) -> Response:
        path = request.url.path
        try:
            body = await read_body(request, self.limits.max_request_bytes)
        except RequestError as err:
            return refusal(path, err)
        forwarded = Forwarded(scope_of(request), body)
        if path == "/metrics" and request.method == "GET":
            return await self.metrics(forwarded)
        parsed = parsed_json(body) if request.method == "POST" else None
        key = affinity_key(path, parsed, self.limits.reward)
        if path == "/v1/chat/completions" and isinstance(parsed, dict) and parsed.get("stream") is True:
            return await self.streamed(path, forwarded, key)
        died = None
        for _ in range(1 + RETRIES):
            try:
                reply = await self.judge.answer.remote(forwarded, affinity=key)
            except RayActorError as err:  # the replica died with the request: sent again, to another
                died = err
                continue
            except RayServeException as err:
                return refusal(path, RequestError(503, None, f"no judge replica took the request: {type(err).__name__}: {err}",
                                                  "server_error", "replica_unavailable"))
            return Response(reply.body, reply.status, headers=dict_of(reply.headers))
        return refusal(path, died_error(died))

    async def streamed(self, path: str, forwarded: Forwarded, key: str | None) -> Response:
        """A streamed chat: sent again where its replica died before its first piece; after that, the stream ends with
        an error event naming the replica, as judge-serve's own stream ends on a failure."""
        died = None
        for _ in range(1 + RETRIES):
            pieces = self.judge.options(stream=True).stream.remote(forwarded, affinity=key)
            try:
                start = await pieces.__anext__()
            except RayActorError as err:
                died = err
                continue
            return StreamingResponse(rest_of(pieces), start.status, headers=dict_of(start.headers))
        return refusal(path, died_error(died))

    async def metrics(self, forwarded: Forwarded) -> Response:
        """Every replica's /metrics, each series labelled with its replica, one block per metric."""
        replies = await self.judge.broadcast("answer", forwarded).results_async(return_exceptions=True)
        live = [r for r in replies if isinstance(r, Reply)]
        if refused := next((r for r in live if r.status != 200), None):
            return Response(refused.body, refused.status, headers=dict_of(refused.headers))
        texts = [(dict(r.headers)[b"x-mmjudge-replica"].decode(), r.body.decode()) for r in live]
        return Response(merged_metrics(texts), 200, media_type="text/plain; version=0.0.4")


async def rest_of(pieces):
    try:
        async for piece in pieces:
            yield piece
    except RayActorError as err:
        error = died_error(err).body()
        yield f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode()


def died_error(err: Exception | None) -> RequestError:
    return RequestError(503, None, f"the judge replica died while judging this request, {1 + RETRIES} times; Ray Serve restarts it "
                                   f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})", "server_error", "replica_died")


def refusal(path: str, err: RequestError) -> Response:
    """A refusal in the door's own shape (serve/rewards.py's fastapi_errors, serve/app.py's endpoint)."""
    return JSONResponse({"detail": str(err)} if path in FASTAPI_DOORS else err.body(), status_code=err.status)


def parsed_json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None  # the replica refuses it, naming the field


def scope_of(request: Request) -> dict:
    """The request's ASGI scope, what judge-serve's app reads of it (Ray Serve's own keys left out: they stay here)."""
    scope = request.scope
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": scope.get("http_version", "1.1"), "method": scope["method"],
            "scheme": scope.get("scheme", "http"), "path": scope["path"], "raw_path": scope.get("raw_path"), "root_path": "",
            "query_string": scope.get("query_string", b""), "headers": list(scope["headers"]), "client": scope.get("client"),
            "server": scope.get("server")}


def dict_of(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Headers for Ray Serve's response: its proxy sets the length, and `x-request-id` (the client's, or its own, which the
    replica's app was given)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in headers if k.lower() not in (b"content-length", b"transfer-encoding", b"x-request-id")}


def merged_metrics(texts: list[tuple[str, str]]) -> str:
    """Prometheus texts of several replicas as one: each metric's HELP and TYPE once, then its series from every
    replica with a `replica` label added (a counter summed over replicas is the sum of its series)."""
    blocks: dict[str, tuple[list[str], list[str]]] = {}
    for replica, text in texts:
        name = None
        for line in text.splitlines():
            if line.startswith("# HELP "):
                name = line.split()[2]
                header = blocks.setdefault(name, ([], []))[0]
                if line not in header:
                    header.append(line)
            elif line.startswith("# "):
                if line not in blocks[name][0]:
                    blocks[name][0].append(line)
            elif line.strip():
                series, value = line.rsplit(" ", 1)
                labelled = f'{series[:-1]},replica="{replica}"}}' if series.endswith("}") else f'{series}{{replica="{replica}"}}'
                blocks[name][1].append(f"{labelled} {value}")
    return "".join(f"{line}\n" for header, lines in blocks.values() for line in [*header, *lines])


# -- the application ----------------------------------------------------------------------------------------------

def application(args, options, limits, api_key: str | None, replicas: int | None = None, router: str = "affinity",
                replica_options: dict | None = None):
    """The Ray Serve application: `replicas` Judge replicas (None: as the Judge deployment's config says, num_replicas or
    autoscaling) behind one Ingress. `router` "default" takes Ray Serve's own (power of two choices), to compare."""
    gpu = (args.device or "").startswith("cuda") or (args.device is None and _cluster_gpus())
    if gpu and args.device:
        args = argparse.Namespace(**{**vars(args), "device": "cuda"})  # each replica sees its own GPU, as cuda:0
    config = {"request_router_config": {"request_router_class": AffinityRouter}} if router == "affinity" else {}
    quiet = {"logging_config": {"enable_access_log": False, "log_level": "WARNING"}}  # a log line per request costs the CPU a request does
    judge = serve.deployment(Judge, name="Judge", max_ongoing_requests=MAX_ONGOING, **({"num_replicas": replicas} if replicas else {}),
                             ray_actor_options=replica_options or {"num_cpus": 1, "num_gpus": 1 if gpu else 0}, **config, **quiet)
    ingress = serve.deployment(Ingress, name="Ingress", max_ongoing_requests=4 * MAX_ONGOING, ray_actor_options={"num_cpus": 0}, **quiet)
    return ingress.bind(judge.bind(args, options, limits, api_key), limits)


def _cluster_gpus() -> bool:
    import ray

    return bool(ray.cluster_resources().get("GPU"))


def serve_replicas(args, options, limits, api_key: str | None) -> int:
    """judge-serve --replicas N: the application on the Ray cluster this machine belongs to (`ray start`'s), or on one
    started here, at --host:--port, until interrupted; then it is deleted, and Ray Serve shut down where it serves
    nothing else."""
    import time

    import ray

    ray.init(include_dashboard=False, logging_level="warning")  # RAY_ADDRESS's cluster, or `ray start`'s on this machine, or a new one
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(application(args, options, limits, api_key, limits.replicas), name=APP, route_prefix="/")
        print(f"judge-serve: {limits.replicas} replicas of {args.model_path} on Ray Serve, http://{args.host}:{args.port}/v1",
              file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:  # Ctrl-C: stopped, as judge-serve's own server stops
        return 0
    finally:
        serve.delete(APP)
        if not serve.status().applications:
            serve.shutdown()
        ray.shutdown()
