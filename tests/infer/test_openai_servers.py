"""judge-score --backend openai against OpenAI-compatible servers that do not behave as judge-serve does,
played by a small Starlette server on a free loopback port: one that returns no logprobs, drops the images,
writes scores its own distribution does not put first, refuses a penalty field it does not have, trickles
its answer a byte at a time, sends a gzip bomb, or answers 200 with what is not a chat completion.
(The real ones, `transformers serve` and llama-cpp-python's server: docs/openai-backend.md.)"""

import asyncio
import gzip
import json
import math
import re
import threading
import time
from dataclasses import dataclass, field

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mmjudge.infer import openai_backend
from mmjudge.infer.cli import main
from mmjudge.judge.testing import write_dataset
from mmjudge.serve.process import free_port

FEEDBACK = "Clear and well illustrated.\n### Score\n"


@dataclass
class Behaviour:
    """What the fake server does; the tests change it, the server records what it was sent."""

    logprobs: bool | None = True  # False: tokens without top_logprobs; None: no logprobs at all
    sees_images: bool = True
    needs_images: bool = False  # refuses a text whose images are missing, as judge-serve refuses placeholders without images
    top: str = "5"  # the likeliest score at the score's token; the server always writes 5
    refuses: tuple[str, ...] = ()  # fields it refuses by name with a 400, as judge-serve refuses what it does not know
    unexpected: tuple[str, ...] = ()  # fields it refuses with 422 as `transformers serve` does (FastAPI's shape)
    n_tiles: int | None = None
    answer: object = None  # a whole 200 body of its own, or a callable making the response
    good_answers: int = 10**9  # answers before `answer` is sent instead (probes, answers of one token, are always good)
    requests: list = field(default_factory=list)


def completion(behaviour: Behaviour, body: dict) -> dict:
    """An answer that writes score 5, with top_logprobs at each token (the score's putting `top` first)."""
    text = FEEDBACK + "5"
    steps = [{"token": FEEDBACK, "logprob": -0.1, "top_logprobs": [{"token": FEEDBACK, "logprob": -0.1}]}]
    others = {"5": math.log(0.3), "4": math.log(0.2), "3": math.log(0.1)}
    others[behaviour.top] = math.log(0.6)
    steps.append({"token": "5", "logprob": others["5"], "top_logprobs": [{"token": t, "logprob": p} for t, p in others.items()]})
    if body["max_tokens"] == 1:
        text, steps = FEEDBACK[:5], [{"token": FEEDBACK[:5], "logprob": -0.1, "top_logprobs": [{"token": FEEDBACK[:5], "logprob": -0.1}]}]
    parts = body["messages"][0]["content"]
    images = sum(part["type"] == "image_url" for part in parts) if behaviour.sees_images else 0
    answer = {"id": "x", "object": "chat.completion", "model": body["model"],
              "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop",
                           "logprobs": {"content": steps if behaviour.logprobs else [dict(s, top_logprobs=None) for s in steps]}
                           if behaviour.logprobs is not None else None}],
              "usage": {"prompt_tokens": len(parts[0]["text"]) // 4 + 256 * images, "completion_tokens": len(steps), "total_tokens": 0}}
    if behaviour.n_tiles is not None:
        answer["n_tiles"] = behaviour.n_tiles
    return answer


def app_for(behaviour: Behaviour) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        behaviour.requests.append(body)
        if refused := [name for name in behaviour.refuses if name in body]:
            return JSONResponse({"error": {"message": f"{refused[0]}: unknown field", "type": "invalid_request_error"}}, status_code=400)
        if unexpected := {name for name in behaviour.unexpected if name in body}:
            return JSONResponse({"detail": f"Unexpected fields in the request: {unexpected}"}, status_code=422)
        if behaviour.needs_images and len(body["messages"][0]["content"]) == 1:
            return JSONResponse({"error": {"message": "the text has 1 <image> placeholder for 0 images"}}, status_code=400)
        real = [b for b in behaviour.requests if b["max_tokens"] > 1 and not set(behaviour.refuses + behaviour.unexpected) & set(b)]
        if behaviour.answer is None or body["max_tokens"] == 1 or len(real) <= behaviour.good_answers:
            return JSONResponse(completion(behaviour, body))
        if callable(behaviour.answer):
            return behaviour.answer()
        return Response(behaviour.answer if isinstance(behaviour.answer, bytes) else json.dumps(behaviour.answer), media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


@pytest.fixture
def fake_server():
    """Starts the fake server for a Behaviour; stops it at the end."""
    started = []

    def start(behaviour: Behaviour) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app_for(behaviour), host="127.0.0.1", port=port, log_level="error", lifespan="off"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        started.append((server, thread))
        while not server.started and thread.is_alive():
            time.sleep(0.02)
        return f"http://127.0.0.1:{port}/v1"

    yield start
    for server, thread in started:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), 6, seed=1).parent


def score(dataset, out, base_url, capsys, *flags) -> tuple[int, str, str]:
    code = main(["--model_path", "judge", "--input_dir", str(dataset), "--input_file", "data.json", "--output_dir", str(out),
                 "--backend", "openai", "--base_url", base_url, "--concurrency", "1", "--max_retries", "0", *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_request_asks_for_greedy_decoding_with_every_penalty_neutral(dataset, tmp_path, fake_server, capsys):
    behaviour = Behaviour(n_tiles=7)
    code, out, err = score(dataset, tmp_path, fake_server(behaviour), capsys)
    assert code == 0, err
    for body in behaviour.requests:
        assert {k: body[k] for k in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "repeat_penalty")} == {
            "temperature": 0, "top_p": 1, "presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "repeat_penalty": 1}
    assert len(behaviour.requests) == 1 + 6  # the probe (the tiles it says it cut show it sees the images), then each sample
    results = json.loads((tmp_path / "eval_result.json").read_text())
    assert [r["n_tiles"] for r in results] == [7] * 6  # the server's, not the client's tiling
    assert [r["score"] for r in results] == [5] * 6 and all(r["score_distribution"]["5"] == pytest.approx(0.6 / 0.9) for r in results)
    # the fake server gives every sample 5: the summary's collapse warning is the only one
    assert "warning" not in err and [line for line in out.splitlines() if "warning" in line] == [
        "warning: overall scores collapse: 100% of 6 are 5 (over 80% on one level measures little); histogram 0: 0  1: 0  2: 0  3: 0  4: 0  5: 6  6: 0"]
    assert json.loads((tmp_path / "summary.json").read_text())["warnings"] == []


def test_a_penalty_the_server_refuses_by_name_is_not_sent_again(dataset, tmp_path, fake_server, capsys):
    behaviour = Behaviour(refuses=("repeat_penalty",))
    code, _, err = score(dataset, tmp_path, fake_server(behaviour), capsys)
    assert code == 0, err
    refused = [b for b in behaviour.requests if "repeat_penalty" in b]
    assert len(refused) == 1 and len(behaviour.requests) == 1 + 2 + 6  # refused once, then each request (two probes) sent once without it
    assert all(b["repetition_penalty"] == 1 for b in behaviour.requests)


def test_a_tile_limit_the_server_refuses_is_dropped_with_a_warning_that_its_own_tiling_applies(dataset, tmp_path, fake_server, capsys):
    """`transformers serve` answers 422 to vLLM's mm_processor_kwargs (docs/openai-backend.md): the request goes
    again at once without it (and without the penalties it refuses alongside), and the run says so once."""
    behaviour = Behaviour(unexpected=("mm_processor_kwargs", "repeat_penalty", "repetition_penalty"))
    base_url = fake_server(behaviour)
    code, _, err = score(dataset, tmp_path, base_url, capsys, "--max_tiles", "2")
    assert code == 0, err
    refused = [b for b in behaviour.requests if {"mm_processor_kwargs", "repeat_penalty"} & set(b)]
    assert len(refused) == 1 and refused[0]["mm_processor_kwargs"] == {"max_dynamic_patch": 2}
    assert len(behaviour.requests) == 1 + 2 + 6  # refused once, then each request (two probes) sent once without them
    warning = (f"{base_url}/chat/completions refuses mm_processor_kwargs (vLLM's per-request tile limit, sent for --max_tiles or "
               "image_token_budget): requests go without it, and the server's own tiling applies")
    assert err.count(warning) == 1
    assert json.loads((tmp_path / "summary.json").read_text())["warnings"] == [warning]


def test_a_standard_field_the_server_refuses_stops_the_run_naming_it(dataset, tmp_path, fake_server, capsys):
    code, _, err = score(dataset, tmp_path, fake_server(Behaviour(refuses=("top_p",))), capsys)
    assert code == 2 and "refused sample 'SA_0001': HTTP 400: top_p: unknown field" in err and "Traceback" not in err


@pytest.mark.parametrize("logprobs", [None, False])
def test_no_logprobs_dropped_images_and_unknown_tiles_are_said_once_and_in_the_summary(dataset, tmp_path, fake_server, capsys, logprobs):
    code, out, err = score(dataset, tmp_path, fake_server(Behaviour(logprobs=logprobs, sees_images=False)), capsys)
    assert code == 0, err
    assert err.count("returns no logprobs") == 1 and err.count("drops images: sample 'SA_0001'") == 1  # the first sample with images
    results = json.loads((tmp_path / "eval_result.json").read_text())
    assert all(r["score"] == 5 and r["score_distribution"] is None and r["n_tiles"] is None for r in results)
    warnings = json.loads((tmp_path / "summary.json").read_text())["warnings"]
    assert len(warnings) == 2 and "returns no logprobs" in warnings[0] and "counts 419 prompt tokens with its 1 image(s) and 419 without" in warnings[1]
    assert [line for line in out.splitlines() if line.startswith("warning: ") and "collapse" not in line] == [f"warning: {w}" for w in warnings]


@pytest.mark.parametrize("behaviour, warned", [
    (Behaviour(n_tiles=0), "drops images: it cut 0 tile(s) from the 1 image(s) of sample 'SA_0001'"),
    (Behaviour(n_tiles=1), None),
    (Behaviour(needs_images=True), None),  # refusing the text alone shows it reads the images
])
def test_a_server_that_says_its_tiles_or_refuses_text_without_images_is_taken_at_its_word(dataset, tmp_path, fake_server, capsys, behaviour, warned):
    code, _, err = score(dataset, tmp_path, fake_server(behaviour), capsys)
    assert code == 0, err
    warnings = json.loads((tmp_path / "summary.json").read_text())["warnings"]
    assert [warned in w for w in warnings] == ([] if warned is None else [True])
    assert (warned is None) == ("warning" not in err)
    assert len(behaviour.requests) == 6 + (2 if behaviour.needs_images else 1)


def test_scores_that_are_not_their_distributions_top_are_said_once_and_counted_in_the_summary(dataset, tmp_path, fake_server, capsys):
    behaviour = Behaviour(top="4")
    base_url = fake_server(behaviour)
    code, out, err = score(dataset, tmp_path, base_url, capsys, "--limit", "4")
    assert code == 0, err
    assert err.count("the written score is not the top of its own score_distribution") == 1 and "sample 'SA_0001'" in err
    warnings = json.loads((tmp_path / "summary.json").read_text())["warnings"]
    assert warnings == [openai_backend.NOT_GREEDY.format(what="4 of 4 samples ('SA_0001', 'PBL_0002', 'MSR_0003' ...)")]
    # resumed: the records of the earlier run are counted too
    behaviour.top = "5"
    code, out, err = score(dataset, tmp_path, base_url, capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "summary.json").read_text())["warnings"] == [
        openai_backend.NOT_GREEDY.format(what="4 of 6 samples ('SA_0001', 'PBL_0002', 'MSR_0003' ...)")]


@pytest.mark.slow  # a second, by design
def test_a_trickled_answer_is_cut_at_the_request_timeout_whatever_the_retries_left(dataset, tmp_path, fake_server, capsys):
    """A server trickling its answer a byte at a time, each byte well within httpx's read timeout: each try was
    cut only after 600 s, and with the default retries one sample held the run for about an hour."""
    async def trickle():
        for byte in json.dumps(completion(Behaviour(), {"max_tokens": 9, "model": "judge", "messages": [{"content": [{"type": "text", "text": ""}]}]})):
            yield byte.encode()
            await asyncio.sleep(0.1)

    code, _, err = score(dataset, tmp_path, fake_server(Behaviour(answer=lambda: StreamingResponse(trickle()), good_answers=2)), capsys,
                         "--max_retries", "5", "--request_timeout", "1")
    assert code == 2 and re.search(r"sample 'MSR_0003' failed 1 time\(s\) in --request_timeout 1 s, last with no answer "
                                   r"\(TimeoutError: unfinished after [\d.]+ s\)", err), err
    journal = (tmp_path / "eval_result.json.journal.rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in journal[1:]] == ["SA_0001", "PBL_0002"]  # the finished results are kept


@pytest.mark.slow  # 200 MB to compress and expand
def test_a_gzip_bomb_is_refused_once_past_what_an_answer_can_hold(dataset, tmp_path, fake_server, capsys):
    bomb = gzip.compress(b" " * 200 * 2**20, compresslevel=9)  # 200 KB that expand to 200 MB
    answer = lambda: Response(bomb, headers={"content-encoding": "gzip", "content-type": "application/json"})  # noqa: E731
    code, _, err = score(dataset, tmp_path, fake_server(Behaviour(answer=answer, good_answers=0)), capsys, "--max_new_tokens", "16")
    assert code == 2 and "the answer for sample 'SA_0001' cannot be read (AnswerTooLarge: more than 1,179,648 bytes for 16 new tokens)" in err, err


GOOD = completion(Behaviour(), {"max_tokens": 9, "model": "judge", "messages": [{"content": [{"type": "text", "text": ""}]}]})


def changed(path: str, value) -> dict:
    answer = json.loads(json.dumps(GOOD))
    *parents, last = path.split(".")
    container = answer
    for key in parents:
        container = container[int(key) if key.isdigit() else key]
    container[int(last) if last.isdigit() else last] = value
    return answer


@pytest.mark.parametrize("answer, where", [
    (changed("choices.0.logprobs", "not logprobs"), "choices.0.logprobs"),
    (changed("choices", []), "choices: List should have at least 1 item"),
    (changed("choices.0.message", None), "choices.0.message"),
    (changed("choices.0.message.content", 5), "choices.0.message.content"),
    (changed("usage.prompt_tokens", -3), "usage.prompt_tokens: Input should be greater than or equal to 0"),
    (changed("usage.completion_tokens", "7"), "usage.completion_tokens"),
    (changed("usage", None), "usage"),
    (changed("choices.0.logprobs.content.1.top_logprobs.0.logprob", 2.5), "top_logprobs.0.logprob: Input should be less than or equal to 0"),
    (changed("choices.0.logprobs.content.1.token", None), "choices.0.logprobs.content.1.token"),
    (changed("n_tiles", True), "n_tiles"),
    ([GOOD], "the answer"),
    (b"\xff\xfe not json", "is not JSON"),
    (b"[" * 100_000, "is not JSON"),
])
def test_a_malformed_answer_is_a_named_failure_of_its_sample_and_the_finished_ones_are_kept(dataset, tmp_path, fake_server, capsys, answer, where):
    code, _, err = score(dataset, tmp_path, fake_server(Behaviour(answer=answer, good_answers=1)), capsys)
    assert code == 2 and "Traceback" not in err and "internal failure" not in err, err
    assert "the answer for sample 'PBL_0002'" in err and where in err, err
    journal = (tmp_path / "eval_result.json.journal.rank0.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in journal[1:]] == ["SA_0001"]
