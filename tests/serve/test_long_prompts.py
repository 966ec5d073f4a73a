"""Long prompts through judge-serve (issue 31, item 2): prefilled in chunks of --max_num_batched_tokens
between the other answers' steps, so that a short request is answered while a long one is still running;
a client that leaves a long prompt stops it at the next chunk (counted in /metrics); --max_model_len refuses
a longer prompt before it reaches the model, and cuts an answer there."""

import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2
import openai
import pytest

from mmjudge.judge.testing import HANG_S, write_original_checkpoint
from mmjudge.serve.process import free_port, start_server

pytestmark = pytest.mark.slow

SERVED, CHUNK, MAX_LEN = "judge", 64, 10_000
LONG = "a " * 8_000  # 8,002 tokens of text in the prompt: 125 chunks and more


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("long")
    port = free_port()
    process = start_server(["--model_path", str(write_original_checkpoint(root / "ckpt", seed=0)), "--served_model_name", SERVED,
                            "--max_num_batched_tokens", str(CHUNK), "--max_model_len", str(MAX_LEN), "--max_new_tokens", "8"],
                           port, root / "serve.log", env={**os.environ, "OMP_NUM_THREADS": "1"})
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=HANG_S)


def client(server, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, **options)


def metric(server, name: str, **labels) -> float:
    for line in httpx2.get(f"{server}/metrics").text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] == name and all(f'{k}="{v}"' in series for k, v in labels.items()):
            return float(value)
    return 0.0


def prefills(server) -> int:
    return int(metric(server, "judge_prefill_batches_total"))


def ask(server, text: str, **fields):
    return client(server).chat.completions.create(model=SERVED, messages=[{"role": "user", "content": text}], **fields)


def settled(server) -> tuple[int, int]:
    """The forward passes once the model thread has nothing left to run."""
    deadline = time.monotonic() + HANG_S
    while metric(server, "vllm:num_requests_running", model_name=SERVED) > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    return prefills(server), int(metric(server, "judge_decoding_steps_total"))


def test_a_short_request_is_answered_while_a_long_prompt_is_still_being_prefilled_or_written(server):
    before = prefills(server)
    with ThreadPoolExecutor(1) as pool:
        long = pool.submit(ask, server, LONG, max_tokens=300)
        while prefills(server) == before and not long.done():
            time.sleep(0.01)
        short = ask(server, "Is this answer good?", max_tokens=4)
        assert not long.done()  # before, it waited for the long prompt's whole answer
        assert short.usage.completion_tokens == 4
        answer = long.result(timeout=HANG_S)
    assert answer.usage.prompt_tokens > 8_000 and answer.choices[0].finish_reason in ("length", "stop")
    assert prefills(server) - before >= answer.usage.prompt_tokens // CHUNK + 1  # the long prompt's chunks, and the short one's prefill


def test_a_long_prompt_whose_client_leaves_stops_at_the_next_chunk(server):
    before_prefills, before_steps = settled(server)
    before_tokens = metric(server, "judge_prefill_tokens_total")
    aborted = metric(server, "vllm:request_success_total", finished_reason="abort")
    with client(server).chat.completions.create(model=SERVED, messages=[{"role": "user", "content": LONG}], max_tokens=8, stream=True) as stream:
        next(iter(stream))  # the role's chunk: the request has reached the server
        while prefills(server) == before_prefills:
            time.sleep(0.005)
    chunks, steps = settled(server)
    time.sleep(1.0)
    assert settled(server) == (chunks, steps)  # nothing more computed for it
    ran, tokens = chunks - before_prefills, metric(server, "judge_prefill_tokens_total") - before_tokens
    # It left before its prefill was done. How many chunks ran before the server saw the client go depends on
    # how busy the machine is, and a chunk is CHUNK tokens at most (deeper into a prompt fewer, so that it costs
    # no more than the first: infer/scheduler.py's chunk_size), so the test asserts what depends on neither: the
    # prefill stopped short of the prompt, and no token was ever written.
    assert 0 < ran <= tokens <= CHUNK * ran and tokens < 8_000, (ran, tokens)
    assert steps == before_steps  # it never wrote a token
    assert metric(server, "vllm:request_success_total", finished_reason="abort") == aborted + 1


def test_max_model_len_refuses_a_longer_prompt_before_it_reaches_the_model_and_cuts_an_answer_there(server):
    assert client(server).models.list().data[0].max_model_len == MAX_LEN
    before = settled(server)
    with pytest.raises(openai.BadRequestError) as err:
        ask(server, "a " * MAX_LEN, max_tokens=4)
    assert err.value.code == "context_length_exceeded" and err.value.body["param"] == "messages"
    assert f"This model's maximum context length is {MAX_LEN} tokens (this server's --max_model_len)" in err.value.body["message"]
    assert settled(server) == before  # no forward pass for it
    cut = ask(server, "a " * (MAX_LEN - 250), max_tokens=1000, temperature=1.0, seed=12)
    assert cut.usage.prompt_tokens > MAX_LEN - 250
    assert cut.choices[0].finish_reason == "stop" or cut.usage.completion_tokens == MAX_LEN - cut.usage.prompt_tokens


def test_max_model_len_refuses_a_longer_sample_to_score_by_its_place_before_it_reaches_the_model(server):
    """/v1/score refuses by the engine's one check (infer/engine.py past_context) that judge-score and the
    Python API refuse by."""
    before = settled(server)
    samples = [{"id": "SA_1", "question": "q", "answer": "a"}, {"id": "SA_2", "question": "a " * MAX_LEN, "answer": "a"}]
    answer = httpx2.post(f"{server}/v1/score", json={"samples": samples}, timeout=HANG_S)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "context_length_exceeded" and error["param"] == "samples[1]"
    assert f"This model's maximum context length is {MAX_LEN} tokens (this server's --max_model_len)" in error["message"]
    assert settled(server) == before  # no forward pass for either


@pytest.mark.parametrize("given, device, budget", [(None, "cpu", 512), (None, "cuda", 2048), (None, "cuda:1", 2048), (64, "cpu", 64), (4096, "cuda", 4096)])
def test_the_prefill_budget_is_the_flag_or_the_device_s_default(given, device, budget):
    # On a CPU a 2048-token chunk keeps every short answer beside it waiting for seconds (docs/serve.md).
    from mmjudge.serve.options import prefill_budget

    assert prefill_budget(given, device) == budget
