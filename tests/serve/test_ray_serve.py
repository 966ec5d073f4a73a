"""judge-serve --replicas 2 (mmjudge/ray/serve.py): two replicas of the tiny judge on Ray Serve behind one loopback
address, beside one plain judge-serve of the same flags. Every door answers through it as the plain server does,
each answer naming its replica; a GRPO group's answers reach the replica that prefilled their question; a replica
killed under load loses and makes up no reward. One local Ray cluster for the module (2 CPUs, no dashboard)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx2
import pytest

from mmjudge.judge.testing import HANG_S, write_dataset, write_original_checkpoint
from mmjudge.serve.process import free_port, start_server

ray = pytest.importorskip("ray")
serve_module = pytest.importorskip("mmjudge.ray.serve")

SERVED = "tiny-judge"
FLAGS = ["--served_model_name", SERVED, "--reward", "score:SA", "--mode", "logits", "--max_tiles", "1", "--workers", "1"]
GROUPS, GROUP_SIZE, CLIENTS = 8, 8, 16


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    return write_original_checkpoint(root / "ckpt", seed=0), write_dataset(root / "data", GROUPS, seed=0).parent


@pytest.fixture(scope="module")
def servers(files, tmp_path_factory):
    """(Ray Serve's address, the plain judge-serve's): `judge-serve --replicas 2` run as users run it, joining this
    module's cluster (RAY_ADDRESS: never another on the machine), and judge-serve alone, started meanwhile."""
    logs = tmp_path_factory.mktemp("logs")
    flags = ["--model_path", str(files[0]), "--image_root", str(files[1]), *FLAGS]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    plain: dict = {}
    starting = threading.Thread(target=lambda: plain.update(process=start_server(flags, free_port_of(plain), logs / "plain.log", env=env)))
    starting.start()
    replicas = None
    try:
        context = ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
        port = free_port()
        with (logs / "replicas.log").open("wb") as log:
            replicas = subprocess.Popen([sys.executable, "-m", "mmjudge.serve.cli", *flags, "--replicas", "2", "--port", str(port)],
                                        stdout=log, stderr=subprocess.STDOUT,  # os.environ now: with the cluster's RAY_AUTH_MODE
                                        env={**os.environ, "OMP_NUM_THREADS": "1", "RAY_ADDRESS": context.address_info["gcs_address"]})
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while replicas_answering(base) < 2:  # both loaded: Ray Serve names a replica's actor before its judge is in memory
            assert replicas.poll() is None and time.monotonic() < deadline, (logs / "replicas.log").read_text()[-3000:]
            time.sleep(0.5)
        starting.join()
        yield base, f"http://127.0.0.1:{plain['port']}"
    finally:  # whatever failed: nothing of this module's left running
        if replicas is not None:
            replicas.send_signal(signal.SIGINT)  # judge-serve's Ctrl-C: its application deleted, Serve shut down
            replicas.wait(timeout=HANG_S)
        starting.join()
        if "process" in plain:
            plain["process"].terminate()
            plain["process"].wait(timeout=HANG_S)
        ray.shutdown()


def free_port_of(plain: dict) -> int:
    plain["port"] = free_port()
    return plain["port"]


def replicas_answering(base: str) -> int:
    """The replicas whose /metrics the application's /metrics gathers: those running."""
    try:
        return len(prefilled(httpx2.get(f"{base}/metrics", timeout=5).text))
    except httpx2.TransportError:
        return 0


def judge_replicas() -> list[dict]:
    return [a for a in ray.util.list_named_actors(all_namespaces=True) if "#Judge#" in a["name"]]


@pytest.fixture(scope="module")
def images(files) -> list[str]:
    return [str(p.relative_to(files[1])) for p in sorted((files[1] / "images").iterdir())]


def post(base: str, path: str, body: dict) -> httpx2.Response:
    return httpx2.post(f"{base}{path}", json=body, timeout=HANG_S)


def same(ours, theirs, where: str = "") -> None:
    """Two answers equal, numbers to 1e-6, leaving out what differs between any two answers (ids, times) and the replica."""
    if isinstance(ours, dict):
        left, right = ({k: v for k, v in d.items() if k not in ("id", "created", "replica")} for d in (ours, theirs))
        assert left.keys() == right.keys(), where
        for k in left:
            same(left[k], right[k], f"{where}.{k}")
    elif isinstance(ours, list):
        assert len(ours) == len(theirs), where
        for k, (a, b) in enumerate(zip(ours, theirs)):
            same(a, b, f"{where}[{k}]")
    elif isinstance(ours, float):
        assert ours == pytest.approx(theirs, abs=1e-6), where
    else:
        assert ours == theirs, where


@pytest.mark.slow
def test_every_door_answers_through_one_address_as_one_judge_serve_each_answer_naming_its_replica(servers, images):
    from openai import OpenAI

    from mmjudge.rewards import Asked, ServerRewards

    replicated, plain = servers
    question, response = "What does the picture show?", "A red circle; it rolls away."
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": images[0]}}, {"type": "text", "text": question}]},
            {"role": "assistant", "content": response}]
    sample = {"id": "SA_1", "question": [{"image": images[0]}, {"text": question}], "answer": response}
    pair = {"id": "p", "question": [{"image": images[1]}, {"text": question}], "answer_a": response, "answer_b": "A square.", "category": "general"}
    doors = [("/get_reward", {"query": [question + response], "prompts": [question], "images": [[images[0]]]}),
             ("/classify", {"model": SERVED, "messages": chat}), ("/classify", {"model": SERVED, "input": response}),
             ("/v1/score/evaluation", {"model": "model", "messages": [response]}),
             ("/v1/decisions", {"model": SERVED, "input": [{"role": "user", "content": [
                 {"type": "input_image", "image_url": images[0]}, {"type": "input_text", "text": f"{question} {response}"}]}], "questions": [
                 {"type": "predicate", "name": "fits", "instructions": "Does the caption fit?"},
                 {"type": "score", "name": "q", "instructions": "How good?",
                  "levels": [{"label": level, "description": ""} for level in ("poor", "fair", "good")]}]}),
             ("/v1/score", {"samples": [sample]}), ("/v1/score", {"pairs": [pair]}),
             ("/v1/chat/completions", {"model": SERVED, "messages": chat[:1], "max_tokens": 6, "temperature": 0})]
    seen = set()
    for path, body in doors:
        ours, theirs = post(replicated, path, body), post(plain, path, body)
        assert ours.status_code == theirs.status_code == 200, (path, ours.text)
        same(ours.json(), theirs.json(), path)
        assert ours.json()["replica"] == ours.headers["x-mmjudge-replica"] and len(ours.headers["x-mmjudge-judge"]) == 16
        seen.add(ours.headers["x-mmjudge-replica"])
    assert post(replicated, "/classify", {"model": "other", "input": "x"}).json() == post(plain, "/classify", {"model": "other", "input": "x"}).json()
    assert httpx2.get(f"{replicated}/v1/models").json()["data"][0]["id"] == SERVED

    # the reward adapters and OpenAI's client, unchanged, pointed at the one address
    asked = [Asked(question, response, [images[0]]), Asked("Is it raining?", "No.")]
    rewards = asyncio.run(ServerRewards(replicated).ask(asked)).rewards
    assert rewards == pytest.approx(asyncio.run(ServerRewards(plain).ask(asked)).rewards, abs=1e-6) and None not in rewards
    streamed = OpenAI(base_url=f"{replicated}/v1", api_key="none").chat.completions.create(
        model=SERVED, messages=chat[:1], max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == \
        post(plain, "/v1/chat/completions", doors[-1][1]).json()["choices"][0]["message"]["content"]

    # /metrics: each replica's series, labelled
    metrics = httpx2.get(f"{replicated}/metrics").text
    assert len(prefilled(metrics)) == 2 and metrics.count("# TYPE judge_prefill_tokens_total counter") == 1
    assert seen <= set(prefilled(metrics))


def prefilled(metrics: str) -> dict[str, int]:
    """Prompt tokens prefilled, per replica, from /metrics."""
    found = {}
    for line in metrics.splitlines():
        if line.startswith("judge_prefill_tokens_total"):
            series, value = line.rsplit(" ", 1)
            found[series.partition('replica="')[2].partition('"')[0]] = int(float(value))
    return found


def grpo_bodies(files, images: list[str], tag: str) -> list[dict]:
    """GROUPS questions, each its text and image, with GROUP_SIZE answers: each answer a one-sample /get_reward request,
    as verl and OpenRLHF send a group, the groups one after another."""
    samples = json.loads((files[1] / "data.json").read_text())
    text = lambda segments: segments if isinstance(segments, str) else " ".join(s["text"] for s in segments if s.get("text"))  # noqa: E731
    bodies = []
    for g in range(GROUPS):
        prompt = f"{tag} {text(samples[g]['question'])}"
        for k in range(GROUP_SIZE):
            answer = f" {text(samples[(g + 1 + k) % GROUPS]['answer'])} ({k})"
            bodies.append({"query": [prompt + answer], "prompts": [prompt], "images": [[images[g % len(images)]]]})
    return bodies


def sent(base: str, bodies: list[dict], during=None) -> list[httpx2.Response | Exception]:
    """Each body from CLIENTS concurrent senders, each sending its next when its last is answered; `during` called
    once the first answer is in."""
    answers: list = [None] * len(bodies)
    waiting = iter(range(len(bodies)))

    async def client(http):
        for k in waiting:
            try:
                answers[k] = await http.post(f"{base}/get_reward", json=bodies[k])
            except httpx2.TransportError as err:
                answers[k] = err
            if during is not None and sum(a is not None for a in answers) == 1:
                await asyncio.to_thread(during)

    async def all_of():
        async with httpx2.AsyncClient(timeout=HANG_S) as http:
            await asyncio.gather(*(client(http) for _ in range(CLIENTS)))

    asyncio.run(all_of())
    return answers


def total_prefilled(base: str) -> int:
    """Prompt tokens prefilled, summed over the server's replicas (a plain server's one series)."""
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in httpx2.get(f"{base}/metrics").text.splitlines()
               if line.startswith(("judge_prefill_tokens_total ", "judge_prefill_tokens_total{")))


@pytest.mark.slow
def test_a_groups_answers_reach_the_replica_that_prefilled_their_question_and_image(servers, files, images):
    replicated, plain = servers
    bodies = grpo_bodies(files, images, "Grouped.")
    costs, rewards = {}, {}
    for name, base in (("replicated", replicated), ("plain", plain)):
        before = total_prefilled(base)
        answers = sent(base, bodies)
        costs[name] = total_prefilled(base) - before
        assert all(isinstance(a, httpx2.Response) and a.status_code == 200 for a in answers), name
        rewards[name] = [a.json()["rewards"][0] for a in answers]
    assert rewards["replicated"] == pytest.approx(rewards["plain"], abs=1e-6)
    # each question, its rubric and its image prefilled by one replica: at most 1.2x one server's (Ray Serve's own router: ~1.8x)
    assert costs["replicated"] <= 1.2 * costs["plain"], costs


@pytest.mark.slow
def test_a_replica_killed_under_load_is_restarted_and_every_request_is_answered_or_failed_by_name(servers, files, images):
    replicated, plain = servers
    bodies = grpo_bodies(files, images, "Killed.")
    expected = [a.json()["rewards"][0] for a in sent(plain, bodies)]
    killed = judge_replicas()[0]

    def kill():
        ray.kill(ray.get_actor(killed["name"], namespace=killed["namespace"]))

    answers = sent(replicated, bodies, during=kill)
    failed = [a for a in answers if not (isinstance(a, httpx2.Response) and a.status_code == 200)]
    for answer, reward in zip(answers, expected):
        if isinstance(answer, httpx2.Response) and answer.status_code == 200:
            assert answer.json()["rewards"][0] == pytest.approx(reward, abs=1e-6)  # nothing made up
        else:  # failed by name: a 503 that the reward adapters count as failed
            assert isinstance(answer, httpx2.Response) and answer.status_code == 503 and "replica" in answer.json()["detail"], answer.text
    assert len(failed) < len(bodies)
    deadline = time.monotonic() + 300
    while killed in judge_replicas() or len(judge_replicas()) < 2:  # Ray Serve starts another in its place
        assert time.monotonic() < deadline
        time.sleep(0.5)


def test_a_groups_answers_and_both_orders_of_a_pair_share_one_key_and_other_questions_do_not():
    key = serve_module.affinity_key
    group = [{"query": [f"Q? A{k}"], "prompts": ["Q? "], "images": [["a.png"]]} for k in range(3)]
    assert len({key("/get_reward", body, "score:SA") for body in group}) == 1
    assert key("/get_reward", {**group[0], "images": [["b.png"]]}, "score:SA") != key("/get_reward", group[0], "score:SA")
    assert key("/get_reward", {**group[0], "prompts": ["R? "]}, "score:SA") != key("/get_reward", group[0], "score:SA")
    pair = {"id": "p", "question": [{"text": "Q"}, {"image": "a.png"}], "answer_a": "x", "answer_b": "y", "category": "general"}
    swapped = {**pair, "answer_a": "y", "answer_b": "x"}
    assert key("/v1/score", {"pairs": [pair]}, None) == key("/v1/score", {"pairs": [swapped]}, None) is not None
    assert key("/v1/score", {"pairs": [{**pair, "category": "other"}]}, None) != key("/v1/score", {"pairs": [pair]}, None)
    # nothing shared beyond the rubric, or a body no door takes: the least loaded replica
    for path, body in (("/classify", {"input": "text"}), ("/v1/score/evaluation", {"messages": ["t"]}), ("/get_reward", {"query": ["t"]}),
                       ("/v1/chat/completions", {"messages": []}), ("/v1/score", {"samples": "x"}), ("/get_reward", [1])):
        assert key(path, body, "score:SA") is None, (path, body)


def test_metrics_of_replicas_merge_into_one_text_each_series_labelled():
    one = '# HELP a_total A\n# TYPE a_total counter\na_total 3\n# HELP h H\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_sum 1.5\n'
    merged = serve_module.merged_metrics([("r1", one), ("r2", one.replace(" 3\n", " 4\n"))])
    assert merged.splitlines() == ["# HELP a_total A", "# TYPE a_total counter", 'a_total{replica="r1"} 3', 'a_total{replica="r2"} 4',
                                   "# HELP h H", "# TYPE h histogram", 'h_bucket{le="1",replica="r1"} 2', 'h_sum{replica="r1"} 1.5',
                                   'h_bucket{le="1",replica="r2"} 2', 'h_sum{replica="r2"} 1.5']


def test_the_docs_serve_run_config_is_ray_serves_schema_and_builds_the_application(files):
    import re

    import yaml
    from ray.serve import Application
    from ray.serve.schema import ServeDeploySchema

    from mmjudge.serve.cli import ray_application

    page = (Path(__file__).resolve().parents[2] / "docs" / "past-one-machine.md").read_text()
    config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", page, re.S).group(1))
    ServeDeploySchema.model_validate(config)  # as `serve run` and `serve deploy` read it
    application = config["applications"][0]
    module, name = application["import_path"].split(":")
    assert (module, name) == ("mmjudge.serve.cli", "ray_application") and application["deployments"][0]["name"] == "Judge"
    built = ray_application({**application["args"], "model_path": str(files[0]), "image_root": str(files[1])})
    assert isinstance(built, Application)


class Echo:
    """A Judge replica that answers which it is, at once."""

    def answer(self, affinity=None) -> str:
        return ray.serve.get_replica_context().replica_id.unique_id


class Door:
    """An Ingress replica: the key passed to the Judge deployment's handle beside the request, as Ingress passes it."""

    def __init__(self, judge):
        self.judge = judge

    async def __call__(self, key: str) -> tuple[str, str]:
        return ray.serve.get_replica_context().replica_id.unique_id, await self.judge.answer.remote(affinity=key)


@pytest.mark.slow
def test_two_ingress_replicas_send_each_key_to_one_judge_replica(servers):
    """The routers of two Ingress replicas, each its own: every request of a key reaches one replica of two, whichever
    Ingress replica it came through (replicas answering at once, on this module's cluster, beside the judges)."""
    from ray import serve

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Echo and Door: the workers cannot import this test module
    free = {"ray_actor_options": {"num_cpus": 0}, "max_ongoing_requests": serve_module.MAX_ONGOING}
    judge = serve.deployment(Echo, name="Judge", num_replicas=2, request_router_config={"request_router_class": serve_module.AffinityRouter}, **free)
    handle = serve.run(serve.deployment(Door, name="Ingress", num_replicas=2, **free).bind(judge.bind()), name="two-ingresses", route_prefix=None)
    try:
        keys = [f"key-{k}" for k in range(20)]
        answers = [(key, response.result()) for _ in range(10) for key, response in [(key, handle.remote(key)) for key in keys]]
    finally:
        serve.delete("two-ingresses")
    homes: dict[str, set[str]] = {}
    for key, (_, replica) in answers:
        homes.setdefault(key, set()).add(replica)
    assert len({ingress for _, (ingress, _) in answers}) == 2  # both Ingress replicas routed
    assert all(len(replicas) == 1 for replicas in homes.values()), homes
    assert len(set().union(*homes.values())) > 1


def test_every_ingress_replicas_router_sends_a_key_to_one_replica_until_it_is_overloaded():
    """Ray Serve makes a router in each Ingress replica: two of them, each with its own view, send every key to the same
    replica, keep it there until it has more than max_imbalance in flight beyond the least loaded, and, when a replica
    leaves, move only the keys it held."""
    from types import SimpleNamespace

    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID

    deployment = DeploymentID(name="Judge", app_name="judge-serve")
    replicas = [SimpleNamespace(replica_id=ReplicaID(unique_id=name, deployment_id=deployment), max_ongoing_requests=64) for name in "abc"]

    def router():
        made = serve_module.AffinityRouter(deployment_id=deployment, handle_source=DeploymentHandleSource.UNKNOWN, use_replica_queue_len_cache=True)
        made.initialize_state(max_imbalance=2)
        made._replicas = {r.replica_id: r for r in replicas}
        return made

    ingresses = [router(), router()]

    def loads(*in_flight):
        for made in ingresses:
            for replica, n in zip(replicas, in_flight):
                made._replica_queue_len_cache.update(replica.replica_id, n)

    def chosen(key, candidates=replicas, made=ingresses[0]):
        ranks = asyncio.run(made.choose_replicas(candidates, SimpleNamespace(kwargs={"affinity": key})))
        assert sorted(r.replica_id.unique_id for rank in ranks for r in rank) == sorted(r.replica_id.unique_id for r in candidates)
        return ranks[0][0].replica_id.unique_id

    keys = [f"key-{k}" for k in range(60)]
    loads(0, 0, 0)
    homes = {key: chosen(key) for key in keys}
    assert {key: chosen(key, made=ingresses[1]) for key in keys} == homes  # one replica per key, whichever Ingress routes it
    assert set(homes.values()) == {"a", "b", "c"}  # and the keys spread over the replicas
    key = next(k for k in keys if homes[k] == "b")
    loads(3, 4, 2)
    assert chosen(key) == "b"  # 2 beyond the least loaded: within the bound
    loads(3, 5, 2)
    spilled = chosen(key)
    assert spilled != "b" and chosen(key, made=ingresses[1]) == spilled  # past it: the key's next replica, the same in both
    loads(0, 0, 0)
    assert chosen(key) == "b"  # back home once the load falls
    without_b = [r for r in replicas if r.replica_id.unique_id != "b"]
    moved = {k: chosen(k, without_b) for k in keys}
    assert {k: h for k, h in moved.items() if homes[k] != "b"} == {k: h for k, h in homes.items() if h != "b"}  # only b's keys moved
    assert asyncio.run(ingresses[0].choose_replicas(replicas, SimpleNamespace(kwargs={"affinity": None}))) == [replicas]  # no key: least loaded
