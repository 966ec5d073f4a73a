"""The RL frameworks' reward doors (mmjudge/rewards.py) against a stand-in /get_reward that records what it
is sent, and the in-process door against the tiny judge: what each framework passes reaches the judge,
images included; retries and timeouts are bounded; a failed judgement is each framework's skip value,
counted, never a made-up reward."""

import asyncio
import importlib.util
import threading
import time
from dataclasses import dataclass, field

import pytest
import torch
import uvicorn
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import mmjudge
import mmjudge.rewards
from mmjudge.judge.rewards import score_reward
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_dataset, write_original_checkpoint
from mmjudge.rewards import Asked, LocalRewards, ServerRewards, TRLReward, compute_score, compute_score_batch, reward_func
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

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/get_reward", get_reward, methods=["POST"])]), host="127.0.0.1",
                                           port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", behaviour
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


def test_a_transport_failure_or_5xx_is_retried_a_bounded_number_of_times_and_a_4xx_not_at_all(stand_in):
    url, behaviour = stand_in
    behaviour.failures = [503, 502]
    rewarder = ServerRewards(url, retries=2, backoff_s=0)
    assert asyncio.run(rewarder.rewards([Asked("q", "r")])) == [0.02] and len(behaviour.bodies) == 3 and rewarder.failed == 0
    behaviour.failures, behaviour.bodies = [400], []
    assert asyncio.run(TRLReward(rewarder)(prompts=["q", "q"], completions=["r", "s"])) == [None, None]  # TRL's skip
    assert len(behaviour.bodies) == 1 and rewarder.failed == 2
    unreachable = ServerRewards(f"http://127.0.0.1:{free_port()}", retries=1, timeout_s=5, backoff_s=0)
    assert asyncio.run(unreachable.rewards([Asked("q", "r")])) == [None] and unreachable.failed == 1
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


def test_the_file_loads_by_path_as_openrlhf_verl_and_easyr1_load_a_reward_file(stand_in, monkeypatch):
    url, behaviour = stand_in
    monkeypatch.setenv("MMJUDGE_URL", url)
    spec = importlib.util.spec_from_file_location("reward_func", mmjudge.rewards.__file__)  # OpenRLHF's way: not in sys.modules
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert torch.equal(module.reward_func(["Q? A."], ["Q?"], [None])["rewards"], torch.tensor([0.05]))
    assert module.REWARD_TYPE == "batch" and module.REWARD_NAME == "mmjudge" and asyncio.run(module.compute_score("geo", "ab", None, {}))["score"] == 0.02


@pytest.mark.slow
def test_an_in_process_judge_rewards_as_the_server_does_the_expected_score_mapped_to_0_1(tmp_path):
    checkpoint = write_original_checkpoint(tmp_path / "ckpt", seed=0)
    data = write_dataset(tmp_path / "data", 2, seed=0).parent
    image = str(next((data / "images").iterdir()))
    judge = mmjudge.Judge.load(checkpoint, device="cpu", mode="logits", max_tiles=1, workers=1)
    rewarder = LocalRewards(judge, "score:SA")
    got = asyncio.run(TRLReward(rewarder)(prompts=["What is shown?"] * 2, completions=["A circle.", "Nothing at all."],
                                          images=[[Image.open(image)], []]))
    assert rewarder.n_images == [1, 0] and rewarder.failed == 0
    record = judge.score([{"id": "SA_1", "question": [{"image": image}, {"text": "What is shown?"}], "answer": "A circle."}], progress=False)[0]
    assert got[0] == pytest.approx(score_reward(mmjudge.judge.data.JudgeResult.model_validate(record), load_rubrics()["SA"]), abs=1e-6)
    assert 0 <= got[1] <= 1 and got[1] != got[0]
