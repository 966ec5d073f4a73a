"""judge-score --backend openai without a model: requests, retries, the key, the distribution read from
top_logprobs, and flags refused before anything connects (the server end to end: tests/serve)."""

import math

import httpx2
import pytest

from mmjudge.infer import openai_backend
from mmjudge.infer.cli import main
from mmjudge.infer.openai_backend import Logprobs, Server, ServerError, TokenLogprob, TopLogprob, chat_request, score_distribution, score_sample
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import load_samples
from mmjudge.judge.outputs import LOCK_FILE
from mmjudge.judge.parsing import ScoreScale
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), 6, seed=1).parent


def completion(content: str, logprobs=None) -> dict:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop", "logprobs": logprobs}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}


def server_answering(answers: list, monkeypatch, key_env=None, request_timeout_s=60.0, overslept_s=0.0) -> tuple[Server, list, list]:
    """A Server whose transport plays `answers` in turn (a status and JSON, or an exception to raise); it
    records the requests and the waits between tries, which pass on a clock of the test's own (each
    `overslept_s` longer than asked, as on a busy machine)."""
    requests, waits, clock = [], [], [0.0]
    monkeypatch.setattr(openai_backend.time, "monotonic", lambda: clock[0])

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds + overslept_s

    monkeypatch.setattr(openai_backend.time, "sleep", sleep)
    replies = iter(answers)

    def handle(request: httpx2.Request) -> httpx2.Response:
        requests.append(request)
        reply = next(replies)
        if isinstance(reply, Exception):
            raise reply
        status, body, headers = reply
        return httpx2.Response(status, json=body, headers=headers)

    return Server("http://127.0.0.1:9/v1/", "judge", key_env, 3, 2, request_timeout_s, transport=httpx2.MockTransport(handle)), requests, waits


def test_429_5xx_and_no_answer_are_retried_with_growing_waits_and_retry_after_is_honoured(monkeypatch):
    server, requests, waits = server_answering([
        httpx2.ConnectError("refused"),
        (429, {"error": {"message": "slow down"}}, {"retry-after": "7"}),
        (503, {"error": {"message": "overloaded"}}, {}),
        (200, completion("fine"), {}),
    ], monkeypatch)
    assert server.complete({"max_tokens": 9}, "SA_1").choices[0].message.content == "fine"
    assert len(requests) == 4 and all(str(r.url) == "http://127.0.0.1:9/v1/chat/completions" for r in requests)
    assert 0.5 <= waits[0] <= 1 and waits[1] == 7 and 2 <= waits[2] <= 4  # backoff 1 s, Retry-After, backoff 4 s (with jitter)


def test_a_request_the_server_refuses_is_not_retried_and_names_the_sample(monkeypatch):
    server, requests, waits = server_answering([(400, {"error": {"message": "image too large"}}, {})], monkeypatch)
    with pytest.raises(ServerError, match=r"refused sample 'SA_1': HTTP 400: image too large"):
        server.complete({"max_tokens": 9}, "SA_1")
    assert len(requests) == 1 and waits == []


def test_retries_run_out_with_a_message_that_says_how_to_resume(monkeypatch):
    server, requests, _ = server_answering([(500, {"error": {"message": "boom"}}, {})] * 4, monkeypatch)
    with pytest.raises(ServerError, match=r"sample 'SA_2' failed 4 time\(s\), last with HTTP 500: boom; .* rerun the same command to resume"):
        server.complete({"max_tokens": 9}, "SA_2")
    assert len(requests) == 4


def test_retries_stop_at_the_request_timeout_and_each_try_is_cut_at_what_is_left(monkeypatch):
    """Six tries of up to 600 s each: a server trickling its answers, or asking to come back later, held a run
    for about an hour on one sample. --request_timeout bounds the tries and the waits between them together."""
    overloaded = (503, {"error": {"message": "overloaded"}}, {"retry-after": "60"})
    server, requests, waits = server_answering([overloaded] * 6, monkeypatch, request_timeout_s=150)
    with pytest.raises(ServerError, match=r"sample 'SA_1' failed 3 time\(s\) in --request_timeout 150 s, last with HTTP 503: overloaded; "):
        server.complete({"max_tokens": 9}, "SA_1")
    assert waits == [60, 60] and len(requests) == 3  # at 0, 60 and 120 s; a fourth would start past 150 s
    assert [r.extensions["timeout"]["read"] for r in requests] == [150, 90, 30]  # each try cut at what is left


def test_a_wait_that_oversleeps_the_request_timeout_leaves_the_next_try_a_moment_not_a_negative_timeout(monkeypatch):
    """httpx refuses a negative timeout with a ValueError, which ended the run as an internal failure."""
    overloaded = (503, {"error": {"message": "overloaded"}}, {"retry-after": "60"})
    server, requests, _ = server_answering([overloaded] * 2, monkeypatch, request_timeout_s=100, overslept_s=50)
    with pytest.raises(ServerError, match=r"sample 'SA_1' failed 2 time\(s\) in --request_timeout 100 s, last with HTTP 503"):
        server.complete({"max_tokens": 9}, "SA_1")
    assert [r.extensions["timeout"]["read"] for r in requests] == [100, 1e-3]  # woken at 110 s


def test_the_key_is_read_from_the_named_variable_and_sent_as_a_bearer_token(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_KEY", "s3cret")
    server, requests, _ = server_answering([(200, completion("ok"), {})], monkeypatch, key_env="MY_JUDGE_KEY")
    server.complete({"max_tokens": 9}, "SA_1")
    assert requests[0].headers["authorization"] == "Bearer s3cret"
    unkeyed, requests, _ = server_answering([(200, completion("ok"), {})], monkeypatch)
    unkeyed.complete({"max_tokens": 9}, "SA_1")
    assert "authorization" not in requests[0].headers


def test_a_request_holds_the_local_prompts_user_turn_and_its_images_in_order(dataset):
    from mmjudge.judge.prompts import build_prompt
    from mmjudge.judge.templates import get_template
    from mmjudge.judge.tiling import TilingConfig

    sample = next(s for s in load_samples(dataset / "data.json", dataset) if len(s.images()) >= 2)
    rubric = load_rubrics()[sample.category]
    options = ScoreOptions(max_new_tokens=9)
    prompt = build_prompt(sample, rubric, openai_backend.USER_TURN, None, dataset, TilingConfig())
    request = chat_request(prompt, "judge", options)
    text, *images = request["messages"][0]["content"]
    # the local judge's prompt is this turn inside its chat template
    local = build_prompt(sample, rubric, get_template("phi3-chat"), None, dataset, TilingConfig())
    assert get_template("phi3-chat").render(text["text"]).count("<image>") == len(images) == len(sample.images())
    assert local.query == text["text"] and "<image>" in text["text"]
    assert [i["image_url"]["url"].split(",")[0] for i in images] == [
        "data:image/png;base64" if p.endswith("png") else "data:image/jpeg;base64" for p in sample.images()]
    assert request["max_tokens"] == 9 and request["temperature"] == 0 and request["top_logprobs"] == 20
    assert "mm_processor_kwargs" not in request  # GPT-4o's API refuses what it does not know
    two = build_prompt(sample, rubric, openai_backend.USER_TURN, None, dataset, TilingConfig(max_tiles=2))
    assert chat_request(two, "judge", ScoreOptions(max_tiles=2))["mm_processor_kwargs"] == {"max_dynamic_patch": 2}
    # tiles lowered to fit the image-token budget: the server must tile as the budget planned
    budgeted = build_prompt(sample, rubric, openai_backend.USER_TURN, None, dataset, TilingConfig(), image_token_budget=256 * len(images))
    assert budgeted.truncated and chat_request(budgeted, "judge", options)["mm_processor_kwargs"] == {"max_dynamic_patch": 1}


def test_the_distribution_is_read_from_the_top_logprobs_of_the_token_that_wrote_the_score():
    def step(token, alternatives):
        return TokenLogprob(token=token, logprob=max(alternatives.values()), top_logprobs=[TopLogprob(token=t, logprob=p) for t, p in alternatives.items()])

    content = [step("Good", {"Good": -0.1}), step(" answer", {" answer": -0.2}), step(".\n### Score", {".\n### Score": -0.1}),
               step("\n", {"\n": -0.01}),
               # "4" written; " 4" is the same score spelled with a space; "Four" and "9" are no score of 0-6
               step("4", {"4": math.log(0.5), "5": math.log(0.2), " 4": math.log(0.1), "Four": math.log(0.1), "9": math.log(0.05)})]
    distribution = score_distribution(Logprobs(content=content), 4, ScoreScale())
    assert distribution == pytest.approx({"0": 0, "1": 0, "2": 0, "3": 0, "4": 0.6 / 0.8, "5": 0.2 / 0.8, "6": 0})
    # the score's token before the heading does not count; a 4 written in the critique is not the score
    early = [step("4", {"4": -0.1, "2": -3})] + content
    assert score_distribution(Logprobs(content=early), 4, ScoreScale()) == distribution
    assert score_distribution(None, 4, ScoreScale()) is None  # a server that returns no logprobs
    assert score_distribution(Logprobs(content=content), 4, ScoreScale(0, 1, 0.1)) is None  # scores of several tokens


def test_a_sample_result_from_a_scored_answer(dataset, monkeypatch):
    text = "Clear and well illustrated.\nText quality: 5\nImage quality: 4\nText-image coherence: 5\nStylistic consistency: 4\n### Score\n5"
    logprobs = {"content": [{"token": text[:-1], "logprob": -0.1, "top_logprobs": []},
                            {"token": "5", "logprob": math.log(0.9), "top_logprobs": [{"token": "5", "logprob": math.log(0.9)},
                                                                                     {"token": "4", "logprob": math.log(0.1)}]}]}
    server, _, _ = server_answering([(200, completion(text, logprobs), {})], monkeypatch)
    sample = load_samples(dataset / "data.json", dataset)[0]
    result = score_sample(server, sample, load_rubrics()[sample.category], dataset, ScoreOptions())
    assert result.score == 5 and result.parse_error is None and result.feedback == text
    assert result.criteria == {"text_quality": 5, "image_quality": 4, "text_image_coherence": 5, "style_consistency": 4}
    assert result.score_distribution["5"] == pytest.approx(0.9) and result.expected_score == pytest.approx(4.9)
    assert (result.prompt_tokens, result.generated_tokens, result.n_images) == (11, 7, len(sample.images()))


@pytest.mark.parametrize("flags, message", [
    (["--backend", "openai"], "--backend openai needs --base_url http(s)://HOST:PORT/v1, got None"),
    (["--backend", "openai", "--base_url", "ftp://x"], "needs --base_url http(s)://HOST:PORT/v1, got 'ftp://x'"),
    (["--backend", "openai", "--base_url", "http://[::1"], "--base_url 'http://[::1': not a URL (Invalid port: ':1')"),
    (["--backend", "openai", "--base_url", "http://:80/v1"], "--base_url 'http://:80/v1': names no host"),
    (["--backend", "openai", "--base_url", "http://127.0.0.1:99999/v1"], "port 99999 is not a TCP port (1-65535)"),
    (["--base_url", "http://127.0.0.1:1/v1"], "--base_url applies to --backend openai only"),
    (["--backend", "openai", "--base_url", "http://127.0.0.1:1/v1", "--device", "cpu"], "--device applies to the local backend only"),
    (["--backend", "openai", "--base_url", "http://127.0.0.1:1/v1", "--concurrency", "0"], "--concurrency must be at least 1, got 0"),
    (["--backend", "openai", "--base_url", "http://127.0.0.1:1/v1", "--request_timeout", "0"], "--request_timeout must be a number of seconds above 0, got 0"),
    (["--backend", "openai", "--base_url", "http://127.0.0.1:1/v1", "--request_timeout", "nan"], "--request_timeout must be a number of seconds above 0, got nan"),
    (["--backend", "openai", "--base_url", "http://127.0.0.1:1/v1", "--api_key_env", "NO_SUCH_KEY_VAR"], "--api_key_env NO_SUCH_KEY_VAR: that environment variable is not set"),
    (["--backend", "openai", "--base_url", "http://127.0.0.1:1/v1", "--mode", "logits"], "--mode logits reads the score after a forced"),
    (["--backend", "openai", "--base_url", "http://127.0.0.1:1/v1", "--deterministic"], "--deterministic applies to the local backend"),
    (["--backend", "openai", "--base_url", "http://127.0.0.1:1/v1", "--format", "milebench"], "prompt_token_budget 8192 counts the judge's tokens"),
])
def test_backend_flags_that_cannot_work_are_refused_before_anything_connects(dataset, tmp_path, capsys, flags, message):
    code = main(["--model_path", "judge", "--input_dir", str(dataset), "--input_file", "data.json", "--output_dir", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_no_server_answering_stops_the_run_saying_so_with_nothing_written_but_the_lock(dataset, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(openai_backend, "BACKOFF_S", 0.01)
    from mmjudge.serve.process import free_port

    code = main(["--model_path", "judge", "--input_dir", str(dataset), "--input_file", "data.json", "--output_dir", str(tmp_path),
                 "--backend", "openai", "--base_url", f"http://127.0.0.1:{free_port()}/v1", "--max_retries", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "failed 2 time(s), last with no answer (ConnectError" in err and "Traceback" not in err
    # the first request (what the server does with images) failed before any journal was opened; the lock: one run at a time
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]


def test_an_answer_is_stripped_as_internvl_chat_strips_it(dataset, monkeypatch):
    """A tab and \\x1e are whitespace to Python's str.strip(), which InternVL's chat() applies to the judge's answer."""
    text = "\t\x1eClear.\n### Score\n5\x1f\n"
    server, _, _ = server_answering([(200, completion(text, None), {})], monkeypatch)
    sample = load_samples(dataset / "data.json", dataset)[0]
    result = score_sample(server, sample, load_rubrics()[sample.category], dataset, ScoreOptions())
    assert result.feedback == "Clear.\n### Score\n5" and result.score == 5
