"""judge-serve, started by its own command line, on the Bradley-Terry export of every family (InternVL2's original
layout exported, Qwen2.5-VL, Qwen3-VL, Qwen3.5): /v1/score, /get_reward (OpenRLHF) and /classify (vLLM's, verl's) answer
with the rewards judge-score gives the same answers, images included. Before this, a Qwen export stopped
judge-serve at start-up (the judge's stop tokens were read from a generation config, which transformers gives
only a model that can generate). The server runs in a thread of the test's process, every step of its start-up
its command's own: a process of its own would add the seconds of importing torch and transformers per family."""

import json
import math
import threading
import time
from contextlib import contextmanager

import pytest
import uvicorn

from mmjudge.infer.cli import main as score_main
from mmjudge.judge.testing import HANG_S, write_dataset
from mmjudge.judge.testing.families import write_reward_checkpoint
from mmjudge.serve.cli import main as serve_main
from mmjudge.serve.process import free_port
from tests.serve.test_rewards import post

SERVED = "reward"
QUESTION = "What does the picture show, and what happens next?"
RESPONSES = ("A red circle; it rolls away.", "Nothing at all.")


@contextmanager
def judge_serve(flags: list[str], monkeypatch):
    """`judge-serve FLAGS` on a free loopback port while the block runs: its URL."""
    servers = []

    class Kept(uvicorn.Server):  # the one handle to stop it by, as Ctrl-C would
        def __init__(self, config):
            super().__init__(config)
            servers.append(self)

    monkeypatch.setattr(uvicorn, "Server", Kept)
    port, exit_code = free_port(), []
    thread = threading.Thread(target=lambda: exit_code.append(serve_main([*flags, "--port", str(port)])), daemon=True)
    thread.start()
    deadline = time.monotonic() + HANG_S
    while not (servers and servers[0].started) and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert servers and servers[0].started, f"judge-serve did not start (exit code {exit_code})"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        servers[0].should_exit = True
        thread.join(timeout=HANG_S)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["internvl2-4b", "qwen2.5-vl-3b", "qwen3-vl-4b", "qwen3.5-4b"])
def test_every_familys_reward_export_is_served_with_judge_scores_rewards(family, tmp_path, monkeypatch):
    export = write_reward_checkpoint(tmp_path / "model", family=family, seed=1)
    data = write_dataset(tmp_path / "data", 4, seed=0).parent
    image = sorted(str(p.relative_to(data)) for p in (data / "images").glob("q_*"))[0]
    samples = [{"id": f"SA_{k}", "question": [{"image": image}, {"text": QUESTION}], "answer": answer} for k, answer in enumerate(RESPONSES)]
    (tmp_path / "samples.json").write_text(json.dumps(samples))
    assert score_main(["--model_path", str(export), "--input_file", str(tmp_path / "samples.json"), "--input_dir", str(data),
                       "--output_dir", str(tmp_path / "scored"), "--max_tiles", "1"]) == 0
    want = [r["reward"] for r in json.loads((tmp_path / "scored" / "eval_result.json").read_text())]
    assert len(want) == 2 and want[0] != want[1]

    flags = ["--model_path", str(export), "--image_root", str(data), "--reward", "score:SA", "--served_model_name", SERVED, "--max_tiles", "1"]
    with judge_serve(flags, monkeypatch) as url:
        records = post(url, "/v1/score", {"samples": samples}).json()["results"]
        assert [r["reward"] for r in records] == pytest.approx(want, abs=1e-6)
        openrlhf = post(url, "/get_reward", {"query": [QUESTION + r for r in RESPONSES], "prompts": [QUESTION] * 2, "images": [[image]] * 2})
        assert openrlhf.json()["rewards"] == pytest.approx(want, abs=1e-6)
        for response, reward in zip(RESPONSES, want):
            chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": QUESTION}]},
                    {"role": "assistant", "content": response}]
            raw = post(url, "/classify", {"model": SERVED, "messages": chat, "use_activation": False}).json()
            assert raw["data"][0]["probs"] == pytest.approx([reward], abs=1e-6)
            vllm = post(url, "/classify", {"model": SERVED, "messages": chat}).json()  # vLLM's one-label classifier: its sigmoid
            assert vllm["data"][0]["probs"] == pytest.approx([1 / (1 + math.exp(-reward))], abs=1e-6)
