"""The RL frameworks' reward doors (mmjudge/rewards.py) against a stand-in /get_reward that records what it
is sent, and the in-process door against the tiny judge: what each framework passes reaches the judge,
images included; retries and timeouts are bounded; a failed judgement is each framework's skip value,
counted, never a made-up reward. A fake judge answers what a reward is not (a redirect to a good answer, 204, an
HTML page, an empty 200, NaN, inf, a number outside the reward's range, strings, booleans, nested lists, a list
short or long by one, an answer past the timeout): each is a failed judgement of each response in every adapter,
counted once and logged, never a number, and a call's metrics describe that call alone."""

import asyncio
import base64
import importlib.util
import io
import inspect
import logging
import pickle
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from importlib import metadata
from pathlib import Path

import numpy
import pytest
import skyrl_gym
import torch
import uvicorn
from packaging.requirements import Requirement
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import mmjudge
import mmjudge.rewards
from mmjudge.judge.rewards import score_reward
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_dataset, write_original_checkpoint
from mmjudge.rewards import (Asked, ImageError, LocalRewards, ServerRewards, TRLReward, compute_score, compute_score_batch, local_image,
                             response_of, reward_func)
from mmjudge.serve.process import free_port


@dataclass
class StandIn:
    """What the stand-in server answers: first `failures` (status codes) in turn, then each query's length / 100."""

    failures: list[int] = field(default_factory=list)
    bodies: list[dict] = field(default_factory=list)


@pytest.fixture
def stand_in():
    behaviour = StandIn()

    async def get_reward(request: Request):
        body = await request.json()
        behaviour.bodies.append(body)
        if behaviour.failures:
            status = behaviour.failures.pop(0)
            return JSONResponse({"detail": f"query: failed with {status}"}, status_code=status)
        rewards = [len(q) / 100 for q in body["query"]]
        return JSONResponse({"rewards": rewards, "scores": rewards, "extra_logs": {"n_images": [len(i) for i in body["images"]]}})

    with served([Route("/get_reward", get_reward, methods=["POST"])]) as url:
        yield url, behaviour


@contextmanager
def served(routes: list[Route]):
    """A Starlette app of these routes on a free loopback port, in a thread of this process, while the block runs."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=routes), host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_trl_gets_a_reward_per_completion_with_the_conversations_text_and_the_images_column_sent_as_data_urls(stand_in):
    url, behaviour = stand_in
    metrics = {}
    reward = TRLReward(ServerRewards(url))
    prompts = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]] * 2
    completions = [[{"role": "assistant", "content": "Red."}], [{"role": "assistant", "content": "Blue, mostly."}]]
    images = [[Image.new("RGB", (8, 8), "red")], [Image.new("RGB", (8, 8), "blue")]]
    got = asyncio.run(reward(prompts=prompts, completions=completions, images=images, completion_ids=[[1], [2]],
                             log_metric=lambda name, value: metrics.__setitem__(name, value)))
    body, = behaviour.bodies  # the whole batch in one request
    assert body["prompts"] == ["What colour?"] * 2 and body["query"] == ["What colour?Red.", "What colour?Blue, mostly."]
    assert all(len(i) == 1 and i[0].startswith("data:image/png;base64,") for i in body["images"]) and "labels" not in body
    assert got == [len(q) / 100 for q in body["query"]]
    assert metrics == {"mmjudge/failed": 0.0, "mmjudge/images_judged": 2.0} and reward.__name__ == "mmjudge"


def test_trl_reward_is_an_async_function_to_every_check_trl_has_made_of_one():
    """TRL 0.29 asks asyncio.iscoroutinefunction, 1.0 inspect's, later minors is_async_callable; a reward function
    that fails its TRL's check is called without being awaited, and the step fails ('coroutine' object is not
    iterable): tests/test_rewards_trl.py runs it through TRL's own GRPOTrainer."""
    reward = TRLReward(ServerRewards("http://127.0.0.1:1"))
    assert asyncio.iscoroutinefunction(reward) and inspect.iscoroutinefunction(reward) and reward.__name__ == "mmjudge"
    assert reward.rewarder.base_url == "http://127.0.0.1:1" and pickle.loads(pickle.dumps(reward)).rewarder == reward.rewarder


def test_a_transport_failure_or_5xx_is_retried_a_bounded_number_of_times_and_a_4xx_not_at_all(stand_in):
    url, behaviour = stand_in
    behaviour.failures = [503, 502]
    rewarder = ServerRewards(url, retries=2, backoff_s=0)
    assert asyncio.run(rewarder.ask([Asked("q", "r")])).rewards == [0.02] and len(behaviour.bodies) == 3 and rewarder.failed == 0
    behaviour.failures, behaviour.bodies = [400], []
    assert asyncio.run(TRLReward(rewarder)(prompts=["q", "q"], completions=["r", "s"])) == [None, None]  # TRL's skip
    assert len(behaviour.bodies) == 1 and rewarder.failed == 2
    unreachable = ServerRewards(f"http://127.0.0.1:{free_port()}", retries=1, timeout_s=5, backoff_s=0)
    assert asyncio.run(unreachable.ask([Asked("q", "r")])).rewards == [None] and unreachable.failed == 1
    for bad in ({"timeout_s": 0}, {"timeout_s": 10_000}, {"retries": -1}, {"retries": 100}, {"backoff_s": 60}):
        with pytest.raises(ValueError):
            ServerRewards(url, **bad)


def test_verl_easyr1_and_openrlhf_files_send_their_fields_and_mark_a_failure_as_a_metric_not_a_reward(stand_in, monkeypatch):
    url, behaviour = stand_in
    monkeypatch.setenv("MMJUDGE_URL", url)
    got = asyncio.run(compute_score("geo", "It is 4.", "4", {"question": "How many?", "images": ["images/q_0001_0.png"]}))
    assert behaviour.bodies[-1] == {"query": ["How many?It is 4."], "prompts": ["How many?"], "images": [["images/q_0001_0.png"]], "labels": ["4"]}
    assert got == {"score": len("How many?It is 4.") / 100, "judge_failed": 0.0}
    assert compute_score_batch([{"response": "ab", "response_length": 1, "ground_truth": None}]) == [{"overall": 0.02, "judge_failed": 0.0}]
    # a dataset's answer column as EasyR1 and verl pass it, a number too: sent as text, which judge-serve's labels must be
    assert len(compute_score_batch([{"response": "ab", "response_length": 1, "ground_truth": 5}, {"response": "c", "response_length": 1, "ground_truth": "x"}])) == 2
    assert behaviour.bodies[-1]["labels"] == ["5", "x"]
    asyncio.run(compute_score("gsm8k", "It is 4.", 4, {"question": "How many?"}))
    assert behaviour.bodies[-1]["labels"] == ["4"]
    answer = reward_func(["Q? A."], ["Q?"], [None])
    assert behaviour.bodies[-1]["prompts"] == ["Q?"] and behaviour.bodies[-1]["query"] == ["Q? A."]
    assert torch.equal(answer["rewards"], torch.tensor([0.05])) and torch.equal(answer["extra_logs"]["judge_failed"], torch.tensor([0.0]))
    behaviour.failures = [422]
    assert asyncio.run(compute_score("geo", "x", None, {}, base_url=url)) == {"score": 0.0, "judge_failed": 1.0}


def slime_sample(prompt, response: str, images=None, label=None) -> SimpleNamespace:
    """A sample as slime's Dataset and rollout leave it (slime.utils.types.Sample's fields the reward reads)."""
    return SimpleNamespace(prompt=prompt, response=response, label=label, multimodal_inputs={"images": images, "videos": None},
                           metadata={}, remove_sample=False)


def verifiers_task(prompt, answer=None) -> SimpleNamespace:
    return SimpleNamespace(prompt=prompt, answer=answer)


def test_slime_roll_and_prime_rl_send_their_prompt_response_reference_and_images(stand_in, monkeypatch):
    """Each framework's own shapes (docs/rewards/check_slime.py, check_roll.py, check_prime_rl.py drive their code):
    slime's Sample with its PIL images, one or a group; ROLL's multi_modal_data entries; verifiers' messages with
    image_url parts (dicts here; pydantic models in verifiers)."""
    url, behaviour = stand_in
    monkeypatch.setenv("MMJUDGE_URL", url)
    red = Image.new("RGB", (4, 4), "red")
    messages = [{"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "What colour?"}]}]
    sample = slime_sample(messages, "Red.", [red], "red")
    assert asyncio.run(mmjudge.rewards.slime_reward(SimpleNamespace(rm_url=url), sample)) == len("What colour?Red.") / 100
    assert behaviour.bodies[-1] == {"query": ["What colour?Red."], "prompts": ["What colour?"], "labels": ["red"],
                                    "images": [["data:image/png;base64," + base64.b64encode(png("red")).decode()]]}
    group, sent = [slime_sample("Q?", "A."), slime_sample("Q?", "AB.")], len(behaviour.bodies)
    assert asyncio.run(mmjudge.rewards.slime_reward(SimpleNamespace(rm_url=None), group)) == [0.04, 0.05]
    assert len(behaviour.bodies) == sent + 1  # --group-rm's group in one request
    assert sample.metadata == {"judge_failed": 0.0} and not sample.remove_sample

    entries = [{"prompt_token_ids": [1], "multi_modal_data": {"image": [red]}}, {"prompt_token_ids": [1]}]
    assert mmjudge.rewards.roll_rewards(["Q?", "R?"], ["A.", "B."], ["a", 3], entries) == {"scores": [0.04, 0.04], "judge_failed": [0.0, 0.0]}
    assert [len(i) for i in behaviour.bodies[-1]["images"]] == [1, 0] and behaviour.bodies[-1]["labels"] == ["a", "3"]

    task = verifiers_task([{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                                        {"type": "text", "text": "What colour?"}]}], answer="red")
    assert asyncio.run(mmjudge.rewards.prime_rl_reward(task, SimpleNamespace(last_reply="Red."))) == len("Be brief.\n\nWhat colour?Red.") / 100
    assert behaviour.bodies[-1]["images"] == [["data:image/png;base64,AAAA"]] and behaviour.bodies[-1]["labels"] == ["red"]
    behaviour.failures = [422]
    with pytest.raises(mmjudge.rewards.RewardError):  # verifiers errors the rollout; prime-rl trains none of it
        asyncio.run(mmjudge.rewards.prime_rl_reward(verifiers_task("Q?"), SimpleNamespace(last_reply="A.")))


def test_the_file_loads_by_path_as_openrlhf_verl_and_easyr1_load_a_reward_file(stand_in, monkeypatch):
    url, behaviour = stand_in
    monkeypatch.setenv("MMJUDGE_URL", url)
    module = reward_file()
    assert torch.equal(module.reward_func(["Q? A."], ["Q?"], [None])["rewards"], torch.tensor([0.05]))
    assert module.REWARD_TYPE == "batch" and module.REWARD_NAME == "mmjudge" and asyncio.run(module.compute_score("geo", "ab", None, {}))["score"] == 0.02


@pytest.mark.slow
def test_an_in_process_judge_rewards_as_the_server_does_the_expected_score_mapped_to_0_1(tmp_path):
    checkpoint = write_original_checkpoint(tmp_path / "ckpt", seed=0)
    data = write_dataset(tmp_path / "data", 2, seed=0).parent
    image = str(next((data / "images").iterdir()))
    judge = mmjudge.Judge.load(checkpoint, device="cpu", mode="logits", max_tiles=1, workers=1)
    rewarder = LocalRewards(judge, "score:SA")
    metrics = {}
    got = asyncio.run(TRLReward(rewarder)(prompts=["What is shown?"] * 2, completions=["A circle.", "Nothing at all."],
                                          images=[[Image.open(image)], []], log_metric=metrics.__setitem__))
    assert metrics == {"mmjudge/failed": 0.0, "mmjudge/images_judged": 1.0} and rewarder.failed == 0
    record = judge.score([{"id": "SA_1", "question": [{"image": image}, {"text": "What is shown?"}], "answer": "A circle."}], progress=False)[0]
    assert got[0] == pytest.approx(score_reward(mmjudge.judge.data.JudgeResult.model_validate(record), load_rubrics()["SA"]), abs=1e-6)
    assert 0 <= got[1] <= 1 and got[1] != got[0]


# -- a fake judge answering what a reward is not: each a failed judgement, in every adapter --------------------

TIMEOUT_S = 0.5


def rewards_of(n: int, value: str = "0.5") -> str:
    return '{"rewards": [%s], "extra_logs": {"n_images": [%s]}}' % (", ".join([value] * n), ", ".join(["1"] * n))


# what the fake server answers, for a request of n queries: (status, content type, body)
ANSWERS = {
    "redirect": lambda n: (302, "application/json", rewards_of(n, "0.99")),
    "no content": lambda n: (204, None, ""),
    "html": lambda n: (200, "text/html", "<html><body>Bad gateway</body></html>"),
    "empty 200": lambda n: (200, "application/json", ""),
    "nan": lambda n: (200, "application/json", rewards_of(n, "NaN")),
    "inf": lambda n: (200, "application/json", rewards_of(n, "Infinity")),
    "1e30": lambda n: (200, "application/json", rewards_of(n, "1e30")),
    "-5": lambda n: (200, "application/json", rewards_of(n, "-5")),
    "strings": lambda n: (200, "application/json", rewards_of(n, '"0.5"')),
    "booleans": lambda n: (200, "application/json", rewards_of(n, "true")),
    "nested lists": lambda n: (200, "application/json", rewards_of(n, "[0.5]")),
    "short list": lambda n: (200, "application/json", rewards_of(n - 1)),
    "long list": lambda n: (200, "application/json", rewards_of(n + 1)),
    "not an object": lambda n: (200, "application/json", "[0.5]"),
    "slow": lambda n: (200, "application/json", rewards_of(n)),
}


@pytest.fixture(scope="module")
def fake():
    """The fake judge: /get_reward answers ANSWERS[the mode set], /good answers a good reward per query."""
    state = {"mode": "good", "requests": 0}

    async def get_reward(request: Request):
        n = len((await request.json())["query"])
        state["requests"] += 1
        if state["mode"] == "good":
            return Response(rewards_of(n, "0.25"), media_type="application/json")
        if state["mode"] == "slow":
            await asyncio.sleep(TIMEOUT_S * 6)
        status, kind, body = ANSWERS[state["mode"]](n)
        return Response(body, status_code=status, media_type=kind, headers={"location": "/good"} if status == 302 else None)

    async def good(request: Request):
        return Response(rewards_of(len((await request.json())["query"]), "0.99"), media_type="application/json")

    with served([Route("/get_reward", get_reward, methods=["POST"]), Route("/good", good, methods=["POST", "GET"])]) as url:
        yield url, state


def reward_file():
    """mmjudge/rewards.py loaded by path, as OpenRLHF, verl and EasyR1 load a reward file: a module of its own."""
    spec = importlib.util.spec_from_file_location("reward_func", mmjudge.rewards.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", list(ANSWERS))
def test_an_answer_that_is_not_one_reward_per_response_is_a_failed_judgement_in_every_adapter(fake, mode, monkeypatch, caplog):
    url, state = fake
    monkeypatch.setenv("MMJUDGE_URL", url)
    monkeypatch.setenv("MMJUDGE_TIMEOUT_S", str(TIMEOUT_S))
    monkeypatch.setenv("MMJUDGE_RETRIES", "0")
    module = reward_file()
    rewarder = ServerRewards(url, timeout_s=TIMEOUT_S, retries=0)
    trl_reward = TRLReward(rewarder)
    prompts, completions = ["What colour?", "How many?"], ["Red.", "Three."]

    # a good call first: the failed call's metrics and counts must not describe it
    state["mode"] = "good"
    metrics = {}
    assert asyncio.run(trl_reward(prompts=prompts, completions=completions, log_metric=metrics.__setitem__)) == [0.25, 0.25]
    assert metrics == {"mmjudge/failed": 0.0, "mmjudge/images_judged": 2.0} and rewarder.failed == 0

    state["mode"], state["requests"] = mode, 0
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mmjudge.rewards"):
        metrics = {}
        assert asyncio.run(trl_reward(prompts=prompts, completions=completions, log_metric=metrics.__setitem__)) == [None, None]  # TRL's skip
        assert metrics == {"mmjudge/failed": 1.0, "mmjudge/images_judged": 0.0} and rewarder.failed == 2

        assert asyncio.run(module.compute_score("geo", "Red.", None, {"question": "What colour?"})) == {"score": 0.0, "judge_failed": 1.0}  # verl
        assert module.compute_score_batch([{"response": r, "response_length": 1, "ground_truth": None} for r in completions]) == \
            [{"overall": 0.0, "judge_failed": 1.0}] * 2  # EasyR1
        answer = module.reward_func([p + c for p, c in zip(prompts, completions)], prompts, [None, None])  # OpenRLHF
        assert torch.equal(answer["rewards"], torch.zeros(2)) and torch.equal(answer["scores"], torch.zeros(2))
        assert torch.equal(answer["extra_logs"]["judge_failed"], torch.ones(2))
        group = [slime_sample("What colour?", "Red."), slime_sample("How many?", "Three.")]
        assert asyncio.run(module.slime_reward(SimpleNamespace(rm_url=url), group)) == [0.0, 0.0]  # slime
        assert all(s.remove_sample and s.metadata == {"judge_failed": 1.0} for s in group)
        assert module.roll_rewards(prompts, completions, [None, None]) == {"scores": [0.0, 0.0], "judge_failed": [1.0, 1.0]}  # ROLL
        with pytest.raises(module.RewardError):  # prime-rl (verifiers): the rollout errors, never a number
            asyncio.run(module.prime_rl_reward(verifiers_task("What colour?"), SimpleNamespace(last_reply="Red.")))
        # each response counted once: 1 (verl) + 2 (EasyR1) + 2 (OpenRLHF) + 2 (slime) + 2 (ROLL) + 1 (prime-rl)
        assert module._SERVERS[url].failed == 10

        areal_judge = ServerRewards(url, timeout_s=TIMEOUT_S, retries=0)  # AReaL: a RewardError, its workflow's rejection
        with pytest.raises(mmjudge.rewards.RewardError):
            asyncio.run(mmjudge.rewards.areal_reward("What colour?", "Red.<|im_end|>", [1], [2], judge=areal_judge, answer="red"))
        assert areal_judge.failed == 1
        monkeypatch.setattr(mmjudge.rewards, "_SERVERS", {})
        env = skyrl_env(url)  # SkyRL: 0.0, judge_failed 1 in the step's metadata and the episode's metrics
        env.init([{"role": "user", "content": "What colour?"}])
        step = env.step("Red.")
        assert step["reward"] == 0.0 and step["metadata"]["judge_failed"] == 1.0 and env.get_metrics()["judge_failed"] == 1.0
        assert mmjudge.rewards._SERVERS[url].failed == 1
    assert state["requests"] == 9  # one request per call: no retry, and no redirect followed
    warnings = [r for r in caplog.records if r.name == "mmjudge.rewards" and r.levelno == logging.WARNING]
    assert len(warnings) == 9 and all("no reward for" in r.getMessage() for r in warnings)


def skyrl_env(url: str):
    """mmjudge's environment as SkyRL makes one: registered by its entry point, made by skyrl_gym.make."""
    if "mmjudge" in skyrl_gym.registry:  # a name is registered once; this test's server is another's
        skyrl_gym.envs.deregister("mmjudge")
    skyrl_gym.register(id="mmjudge", entry_point="mmjudge.rewards:SkyRLJudgeEnv", kwargs={"base_url": url})
    return skyrl_gym.make("mmjudge", env_config={}, extras={"reward_spec": {"ground_truth": None}})


def test_a_served_reward_models_range_is_the_users_and_a_judges_is_0_to_1(fake):
    url, state = fake
    state["mode"] = "-5"
    assert asyncio.run(ServerRewards(url, retries=0, reward_range=(-10.0, 10.0)).ask([mmjudge.rewards.Asked("q", "r")])).rewards == [-5.0]
    assert asyncio.run(ServerRewards(url, retries=0).ask([mmjudge.rewards.Asked("q", "r")])).rewards == [None]
    for bad in ((1.0, 0.0), (0.0, float("inf")), (float("nan"), 1.0)):
        with pytest.raises(ValueError, match="reward_range"):
            ServerRewards(url, reward_range=bad)


# -- images in every shape the frameworks' loaders give ---------------------------------------------------------

def png(colour: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_image_shape_a_framework_gives_reaches_the_judge_and_any_other_fails_its_response_alone(stand_in, monkeypatch, tmp_path, caplog):
    """Paths and data URLs as they are; bytes, {"bytes", "path"} dicts (datasets' Image feature, Parquet via verl,
    ms-swift's load_dataset), PIL images and numpy arrays as data URLs of their bytes (PNG where encoded here).
    An image of any other shape fails its own response's judgement, counted and logged, never an exception."""
    url, behaviour = stand_in
    monkeypatch.setenv("MMJUDGE_URL", url)
    path = tmp_path / "red.png"
    path.write_bytes(png("red"))
    red_url = "data:image/png;base64," + base64.b64encode(png("red")).decode()
    given = {"a path": str(path), "a PathLike": path, "a data URL": red_url, "bytes": png("red"), "a bytes and path dict": {"bytes": png("red"), "path": "x.png"},
             "a path dict": {"bytes": None, "path": "images/q_1.png"}, "a PIL image": Image.new("RGB", (4, 4), "red"),
             "a numpy array": numpy.full((4, 4, 3), (255, 0, 0), dtype=numpy.uint8), "a JPEG's bytes": jpeg_bytes()}
    sent = {"a path": str(path), "a PathLike": str(path), "a data URL": red_url, "bytes": red_url, "a bytes and path dict": red_url,
            "a path dict": "images/q_1.png", "a PIL image": red_url, "a numpy array": red_url,
            "a JPEG's bytes": "data:image/jpeg;base64," + base64.b64encode(jpeg_bytes()).decode()}
    bad = [7, {"url": "x.png"}, {"bytes": None, "path": None}, "", b"", numpy.zeros((2, 2, 7), dtype=numpy.float64), object()]
    rewarder = ServerRewards(url)
    names = list(given)
    with caplog.at_level(logging.WARNING, logger="mmjudge.rewards"):
        got = asyncio.run(TRLReward(rewarder)(prompts=["What colour?"] * (len(names) + len(bad)), completions=["Red."] * (len(names) + len(bad)),
                                              images=[[given[n]] for n in names] + [[b] for b in bad]))
    assert got[:len(names)] == [0.16] * len(names) and got[len(names):] == [None] * len(bad) and rewarder.failed == len(bad)
    assert dict(zip(names, (i[0] for i in behaviour.bodies[-1]["images"]))) == sent  # only the good ones were sent
    assert "an image must be" in caplog.text
    # TRL's `image` column, one image a row; a row's images as a numpy array (datasets' numpy format)
    assert asyncio.run(TRLReward(rewarder)(prompts=["q"] * 3, completions=["r"] * 3, image=[png("red"), None, str(path)])) == [0.02] * 3
    assert behaviour.bodies[-1]["images"] == [[red_url], [], [str(path)]]
    asyncio.run(TRLReward(rewarder)(prompts=["q"], completions=["r"], images=[numpy.array([str(path), png("red")], dtype=object)]))
    assert behaviour.bodies[-1]["images"] == [[str(path), red_url]]
    # verl: Parquet gives extra_info["images"] as a numpy array of {"bytes", "path"} dicts
    parquet_row = numpy.array([{"bytes": png("red"), "path": None}], dtype=object)
    assert asyncio.run(compute_score("geo", "Red.", None, {"question": "What colour?", "images": parquet_row}))["judge_failed"] == 0.0
    assert behaviour.bodies[-1]["images"] == [[red_url]]
    assert asyncio.run(compute_score("geo", "Red.", None, {"question": "What colour?", "images": [{"url": 1}]})) == {"score": 0.0, "judge_failed": 1.0}


def jpeg_bytes() -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), "red").save(buffer, format="JPEG")
    return buffer.getvalue()


def test_an_in_process_judge_reads_each_image_shape_from_a_file_of_its_bytes(tmp_path):
    red = Image.new("RGB", (4, 4), "red")
    for image in (png("red"), {"bytes": png("red"), "path": None}, "data:image/png;base64," + base64.b64encode(png("red")).decode(), red,
                  numpy.asarray(red)):
        written = local_image(image, str(tmp_path), "one")
        assert Image.open(written).convert("RGB").tobytes() == red.tobytes()
    assert local_image({"bytes": None, "path": "a/b.png"}, str(tmp_path), "two") == "a/b.png"
    for bad in ("data:image/png,abc", "data:image/png;base64,!!", 3.5):
        with pytest.raises(ImageError):
            local_image(bad, str(tmp_path), "three")


# -- the response as the framework means it ---------------------------------------------------------------------

QWEN_PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What colour?<|im_end|>\n<|im_start|>assistant\n"
FEW_SHOT = QWEN_PROMPT + "Blue.<|im_end|>\n" + QWEN_PROMPT


@pytest.mark.parametrize("query, prompt, response", [
    ("Q? A.", "Q?", " A."),
    ("Q?", "Q?", ""),  # an empty completion is an empty answer, not the whole query
    (QWEN_PROMPT + "Red.<|im_end|>", QWEN_PROMPT, "Red."),  # the end-of-turn token is not the answer's
    # the image token expanded, one per patch, as a vision-language policy's tokens decode
    (QWEN_PROMPT.replace("<|image_pad|>", "<|image_pad|>" * 5) + "Red.<|im_end|><|endoftext|>", QWEN_PROMPT, "Red."),
    # a few-shot prompt asking the same of two images: its own answer stays in the prompt (the first place the prompt's
    # end was found was the first question's), and the response may repeat the marker
    (FEW_SHOT.replace("<|image_pad|>", "<|image_pad|>" * 3) + "Red; <|im_start|>assistant\nBlue.<|im_end|>", FEW_SHOT,
     "Red; <|im_start|>assistant\nBlue."),
    ("<|vision_start|><|image_pad|><|image_pad|><|vision_end|>Describe.It is red.", "<|vision_start|><|image_pad|><|vision_end|>Describe.", "It is red."),
    ("<|vision_start|><|image_pad|><|image_pad|><|vision_end|>Describe.", "<|vision_start|><|image_pad|><|vision_end|>Describe.", ""),
    ("Something else entirely. A.", "Q?", None),  # no marker: the split cannot be told
    ("<|im_start|>user\nWhich colour?<|im_end|>\n", QWEN_PROMPT, None),  # the prompt's assistant marker is not in it
])
def test_the_response_is_what_follows_the_prompt_or_its_assistant_marker_never_a_text_search(query, prompt, response):
    assert response_of(query, prompt) == response


def test_openrlhfs_reward_func_judges_an_empty_completion_empty_and_fails_a_query_it_cannot_split(stand_in, monkeypatch):
    url, behaviour = stand_in
    monkeypatch.setenv("MMJUDGE_URL", url)
    server = mmjudge.rewards._server()
    before = server.failed
    prompt = "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    answer = reward_func([prompt + "<|im_end|>", "no prompt here"], [prompt, "Q?"], [None, None])
    assert behaviour.bodies[-1]["query"] == [prompt] and behaviour.bodies[-1]["prompts"] == [prompt]  # the empty answer sent
    assert torch.equal(answer["extra_logs"]["judge_failed"], torch.tensor([0.0, 1.0])) and answer["rewards"][1] == 0
    assert server.failed == before + 1


# -- the reward file in a venv of its declared light dependencies alone -------------------------------------------

def distributions(name: str, found: dict | None = None) -> dict:
    """The installed distribution `name` and every one it requires here, by name."""
    found = {} if found is None else found
    dist = metadata.distribution(name)
    if dist.metadata["Name"].lower() not in found:
        found[dist.metadata["Name"].lower()] = dist
        for requirement in map(Requirement, dist.requires or []):
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                distributions(requirement.name, found)
    return found


LIGHT = '''
import asyncio, importlib.util, sys
spec = importlib.util.spec_from_file_location("reward_func", sys.argv[1])  # as OpenRLHF, verl and EasyR1 load it
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
png = open(sys.argv[3], "rb").read()
score = asyncio.run(module.compute_score("geo", "It is 4.", None, {"question": "How many?", "images": [{"bytes": png, "path": None}, "a.png"]}))
batch = module.compute_score_batch([{"response": "ab", "response_length": 1, "ground_truth": 5}])
split = module.response_of("<|im_start|>user\\n<|image_pad|><|image_pad|>Q?<|im_start|>assistant\\nA.<|im_end|>", "<|im_start|>user\\n<|image_pad|>Q?<|im_start|>assistant\\n")
import mmjudge.rewards  # the package's own import, from a folder holding mmjudge/__init__.py and rewards.py alone
heavy = sorted(m for m in ("torch", "transformers", "tokenizers", "sentencepiece", "numpy", "PIL", "mmjudge.judge") if m in sys.modules)
print(repr((score, batch, split, heavy, mmjudge.rewards.TRLReward.__name__)))
'''


def test_the_reward_file_runs_in_a_venv_of_httpx2_and_what_it_needs_alone_no_tokenizer_stack(stand_in, tmp_path):
    """verl's, EasyR1's and OpenRLHF's reward file, and the package's mmjudge.rewards, where only httpx2 (the light
    dependency the module declares) is installed: judge/prompts.py's sentencepiece once failed every OpenRLHF reward."""
    url, behaviour = stand_in
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    for dist in distributions("httpx2").values():  # each distribution's own files: a venv of these alone, without pip's download
        for file in dist.files:
            source = Path(dist.locate_file(file))
            if source.is_file() and not str(file).startswith(".."):
                (site / file).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, site / file)
    package = tmp_path / "package" / "mmjudge"
    package.mkdir(parents=True)
    for name in ("__init__.py", "rewards.py"):
        shutil.copyfile(Path(mmjudge.rewards.__file__).with_name(name), package / name)
    (tmp_path / "red.png").write_bytes(png("red"))
    done = subprocess.run([str(venv / "bin" / "python"), "-c", LIGHT, str(package / "rewards.py"), url, str(tmp_path / "red.png")],
                          capture_output=True, text=True, timeout=120, env={"MMJUDGE_URL": url, "PYTHONPATH": str(package.parent)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr(({"score": 0.17, "judge_failed": 0.0}, [{"overall": 0.02, "judge_failed": 0.0}], "A.", [], "TRLReward"))
    assert behaviour.bodies[-2]["images"] == [["data:image/png;base64," + base64.b64encode(png("red")).decode(), "a.png"]]


def test_openrlhfs_labels_carry_each_prompts_images_to_the_judge(stand_in, monkeypatch):
    """OpenRLHF passes its reward function the query, the prompt and the label alone: a {"reference", "images"} label
    (its --label_key column), as a dict or its JSON text, brings the prompt's images; any other label is the reference."""
    url, behaviour = stand_in
    monkeypatch.setenv("MMJUDGE_URL", url)
    labels = [{"reference": "4", "images": ["images/q_1.png"]}, '{"images": ["images/q_2.png", "images/q_3.png"]}', "{not json", None,
              '{"answer": 4}']
    reward_func(["Q? A."] * 5, ["Q?"] * 5, labels)
    body = behaviour.bodies[-1]
    assert body["images"] == [["images/q_1.png"], ["images/q_2.png", "images/q_3.png"], [], [], []]
    assert body["labels"] == ["4", None, "{not json", None, '{"answer": 4}']  # a reference that is JSON of another shape stays its text


# -- AReaL and SkyRL: each sample's images and question from where the framework holds them ---------------------

def test_areal_sends_the_samples_images_and_question_and_skyrl_the_prompts_image_parts(stand_in, tmp_path):
    """AReaL's vision workflow passes the sample's fields to the reward: its `images` (bytes, as its vision datasets
    write them), the chat-templated `messages`, the `answer`. SkyRL's environment reads the prompt's image parts
    (OpenAI's `image_url`, with the null keys a Parquet row's parts carry, and `image`) and its text."""
    url, behaviour = stand_in
    red_url = "data:image/png;base64," + base64.b64encode(png("red")).decode()
    judge = ServerRewards(url)
    templated = "<|im_start|>user\n<image>How many?<|im_end|>\n<|im_start|>assistant\n"
    got = asyncio.run(mmjudge.rewards.areal_reward(prompt="decoded, its image tokens expanded", completions="[3]<|im_end|>", prompt_ids=[1],
                                                   completion_ids=[2], judge=judge, images=[png("red")], messages=templated, answer=3))
    assert behaviour.bodies[-1] == {"query": [templated + "[3]"], "prompts": [templated], "images": [[red_url]], "labels": ["3"]}
    assert got == len(templated + "[3]") / 100 and judge.failed == 0
    asyncio.run(mmjudge.rewards.areal_reward("Q?", "A.", [1], [2], judge=judge, messages_chat=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": ""}}, {"type": "text", "text": "How many?"}]}]))
    assert behaviour.bodies[-1]["prompts"] == ["How many?"] and behaviour.bodies[-1]["images"] == [[]]

    path = tmp_path / "blue.png"
    path.write_bytes(png("blue"))
    env = skyrl_env(url)
    prompt = [{"role": "system", "content": [{"type": "text", "text": "Be brief.", "image_url": None, "image": None}]},
              {"role": "user", "content": [{"type": "image_url", "image_url": {"url": red_url}, "text": None, "image": None},
                                           {"type": "image", "image": str(path), "text": None, "image_url": None},
                                           {"type": "text", "text": "What colours?", "image_url": None, "image": None}]}]
    assert env.init(prompt) == (prompt, {})
    step = env.step("Red and blue.<|im_end|>")
    assert behaviour.bodies[-1] == {"query": ["Be brief.\nWhat colours?Red and blue."], "prompts": ["Be brief.\nWhat colours?"],
                                    "images": [[red_url, str(path)]]}
    assert step["reward"] == len("Be brief.\nWhat colours?Red and blue.") / 100 and step["done"] and step["metadata"]["judge_failed"] == 0.0
    assert env.get_metrics() == {"judge_failed": 0.0, "images_judged": 2.0}


def test_skyrls_step_in_its_event_loops_thread_runs_the_judge_in_a_thread_of_its_own(stand_in):
    """SkyRL steps an environment in its event loop's thread where max_env_workers is 0, where asyncio.run fails."""
    url, _ = stand_in
    env = skyrl_env(url)
    env.init([{"role": "user", "content": "Q?"}])

    async def in_the_loop():
        return env.step("A.")

    assert asyncio.run(in_the_loop())["reward"] == len("Q?A.") / 100
