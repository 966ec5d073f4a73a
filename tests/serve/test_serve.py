"""judge-serve on a free loopback port with the tiny judge: the official openai client, judge-score
--backend openai against it, concurrent batching, refusals, and a server killed mid-run."""

import base64
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import openai
import pytest
from huggingface_hub import constants
from PIL import Image

from mmjudge.infer.cli import main as score_main
from mmjudge.judge.data import JudgeResult
from mmjudge.judge.testing import HANG_S, write_dataset, write_hub_cache, write_original_checkpoint
from mmjudge.serve.cli import main as serve_main
from mmjudge.serve.process import free_port, start_server

# Every test talks to a judge-serve started as a child process (seconds each, a minute in all).
pytestmark = pytest.mark.slow

KEY_ENV, KEY = "JUDGE_SERVE_TEST_KEY", "test-key-0123456789"
SERVED = "org/tiny-judge"  # the module server's --served_model_name: a Hub id, slash included
FAST = ["--max_new_tokens", "6", "--max_tiles", "2", "--workers", "2"]
LIMITS = ["--max_image_pixels", "250000", "--max_request_bytes", str(2 * 2**20), "--max_images", "4"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny judge and the 8 synthetic samples that the module's server and its local runs share."""
    root = tmp_path_factory.mktemp("files")
    return write_original_checkpoint(root / "ckpt", seed=0), write_dataset(root / "data", 8, seed=0).parent


@pytest.fixture(scope="module")
def checkpoint(files):
    return files[0]


@pytest.fixture(scope="module")
def dataset(files):
    return files[1]


@pytest.fixture(scope="module")
def server_log(tmp_path_factory):
    return tmp_path_factory.mktemp("server") / "serve.log"


@pytest.fixture(scope="module")
def server(checkpoint, dataset, server_log):
    """One judge-serve for the module, with an API key and small limits."""
    port, log = free_port(), server_log
    process = start_server(["--model_path", str(checkpoint), "--image_root", str(dataset), "--api_key_env", KEY_ENV,
                            "--served_model_name", SERVED, *FAST, *LIMITS],
                           port, log, env={**os.environ, KEY_ENV: KEY, "OMP_NUM_THREADS": "1"})
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=HANG_S)


def post(server, path, body, key=KEY, headers=(), **kwargs):
    return httpx2.post(f"{server}{path}", headers={"Authorization": f"Bearer {key}", **dict(headers)}, timeout=HANG_S, **kwargs,
                       **({"content": body} if isinstance(body, (bytes, str)) else {"json": body}))


def metrics_text(server) -> str:
    return httpx2.get(f"{server}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text


def sample_value(text: str, name: str, **labels) -> float:
    """The value of the sample of `name` whose labels include `labels` (0 when there is none)."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                return float(value)
    return 0.0


def metric(server, name: str, **labels) -> int:
    return int(sample_value(metrics_text(server), name, **labels))


def forward_passes(server) -> tuple[int, int]:
    """Prefill groups and decoding steps the model has run."""
    return metric(server, "judge_prefill_batches_total"), metric(server, "judge_decoding_steps_total")


def data_url(path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode()


def png(width, height) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), "teal").save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_completion_through_the_official_openai_client(server, dataset):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [client.models.list().data[0].id] and client.models.list().data
    image = next((dataset / "images").glob("*.png"))
    answer = client.chat.completions.create(
        model=SERVED, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3,
        messages=[{"role": "system", "content": "You judge answers."},
                  {"role": "user", "content": [{"type": "text", "text": "Image-0: <image>\nIs this answer good?"},
                                               {"type": "image_url", "image_url": {"url": data_url(image)}}]}])
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and answer.usage.completion_tokens == 5  # the random judge never stops early
    assert answer.usage.prompt_tokens > 20  # the template, the text and the image's tokens
    tokens = choice.logprobs.content
    # each token is the text it adds, so together they are the answer (how a client finds the score's token)
    assert "".join(t.token for t in tokens) == choice.message.content and len(tokens) == 5
    for t in tokens:
        assert len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob == t.logprob  # greedy: the likeliest was written
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    again = client.chat.completions.create(model=SERVED, max_tokens=5, temperature=0, messages=[
        {"role": "system", "content": "You judge answers."},
        {"role": "user", "content": [{"type": "text", "text": "Image-0: <image>\nIs this answer good?"}, {"type": "image_url", "image_url": {"url": data_url(image)}}]}])
    assert again.choices[0].message.content == choice.message.content  # greedy: the same answer twice


def test_judge_score_through_the_server_and_v1_score_give_the_records_judge_score_writes_locally(server, checkpoint, dataset, tmp_path, monkeypatch):
    args = ["--model_path", str(checkpoint), "--input_dir", str(dataset), "--input_file", "data.json", *FAST]
    assert score_main([*args, "--output_dir", str(tmp_path / "local")]) == 0
    monkeypatch.setenv("SCORE_KEY", KEY)
    remote_args = ["--model_path", SERVED, *args[2:]]  # the model as the server names it
    assert score_main([*remote_args, "--output_dir", str(tmp_path / "remote"), "--backend", "openai", "--base_url", f"{server}/v1",
                       "--api_key_env", "SCORE_KEY", "--concurrency", "4"]) == 0
    local = json.loads((tmp_path / "local" / "eval_result.json").read_text())
    remote = json.loads((tmp_path / "remote" / "eval_result.json").read_text())
    assert [list(r) for r in remote] == [list(r) for r in local]
    # The random judge writes no score: each record is a parse failure, whose local distribution is read after a
    # score heading appended to the judge's own tokens, which a chat API cannot do (docs/openai-scoring.md): none remotely.
    assert all(r["parse_error"] for r in local)
    assert all(r["score_distribution"] is None and r["expected_score"] is None for r in remote)
    # judge-score stamps the judge (its weights' fingerprint, which a chat API does not show) and the rubric
    same = lambda r: {k: v for k, v in r.items() if k not in ("score_distribution", "expected_score", "judge_fingerprint")}  # noqa: E731
    assert [same(r) for r in remote] == [same(r) for r in local]  # feedback, token counts, tiles and rubrics included
    assert remote[0]["judge_fingerprint"] is None and local[0]["judge_fingerprint"]
    assert len({r["feedback"] for r in remote}) > 1
    summary = json.loads((tmp_path / "remote" / "summary.json").read_text())
    assert summary == json.loads((tmp_path / "local" / "summary.json").read_text())

    # /v1/score runs the local engine itself: its records are the local ones, distributions included
    scored = post(server, "/v1/score", {"samples": json.loads((dataset / "data.json").read_text())}).json()["results"]
    assert [same(r) for r in scored] == [same(r) for r in local] and [list(r) for r in scored] == [list(r) for r in local]
    assert {r["judge_fingerprint"] for r in scored} == {local[0]["judge_fingerprint"]}  # the judge named as judge-score names it
    for s, r in zip(scored, local):
        assert s["score_distribution"] == pytest.approx(r["score_distribution"], abs=1e-5)
        assert s["expected_score"] == pytest.approx(r["expected_score"], abs=1e-4)


def pairs_of(dataset) -> list[dict]:
    """Four pairs of the dataset's answers, of category general (the pairwise rubric), one of SA (MMIE's, pointwise)."""
    samples = json.loads((dataset / "data.json").read_text())
    return [{"id": f"pair{k}", "question": samples[2 * k]["question"], "answer_a": samples[2 * k]["answer"], "answer_b": samples[2 * k + 1]["answer"],
             "model_a": samples[2 * k]["model"], "model_b": samples[2 * k + 1]["model"], "category": "SA" if k == 3 else "general"} for k in range(4)]


def same_pair(one: dict, other: dict) -> None:
    """Two pair records equal but for the last digits of their distributions (computed in other batches)."""
    for key, value in one.items():
        if isinstance(value, dict) and key.endswith("distribution"):
            assert other[key] == pytest.approx(value, abs=1e-5), key
        elif key in ("forward", "reverse"):
            assert len(value) == len(other[key])
            for a, b in zip(value, other[key]):
                same_pair(a, b)
        elif key == "scores" and value is not None:
            for side in value:
                same_pair({k: v for k, v in value[side].items() if k != "expected_score"}, other[key][side])
        elif key != "expected_score":
            assert other[key] == value, key


def test_v1_score_judges_pairs_in_both_orders_as_judge_score_does(server, checkpoint, dataset, tmp_path):
    pairs = pairs_of(dataset)
    (dataset / "pairs.json").write_text(json.dumps(pairs))
    assert score_main(["--model_path", str(checkpoint), "--input_dir", str(dataset), "--input_file", "pairs.json", "--output_dir",
                       str(tmp_path / "local"), *FAST]) == 0
    local = json.loads((tmp_path / "local" / "eval_result.json").read_text())
    served = post(server, "/v1/score", {"pairs": pairs}).json()["results"]
    assert [list(r) for r in served] == [list(r) for r in local] and [r["id"] for r in served] == [p["id"] for p in pairs]
    for s, r in zip(served, local):
        same_pair(r, s)
    assert served[0]["forward"][0]["first"] == "A" and served[0]["reverse"][0]["first"] == "B"
    assert served[3]["rule"] == "expected_score" and set(served[3]["scores"]) == {"A", "B"}
    # each pair alone answers what it answers beside the others
    with ThreadPoolExecutor(4) as pool:
        alone = list(pool.map(lambda pair: post(server, "/v1/score", {"pairs": [pair]}).json()["results"][0], pairs))
    for a, s in zip(alone, served):
        same_pair(s, a)
    refused = post(server, "/v1/score", {"samples": [json.loads((dataset / "data.json").read_text())[0]], "pairs": pairs})
    assert refused.status_code == 400 and "give 'samples' (to score) or 'pairs'" in refused.json()["error"]["message"]
    no_rubric = post(server, "/v1/score", {"pairs": [{**pairs[0], "category": "X"}]})
    assert no_rubric.status_code == 400 and no_rubric.json()["error"]["param"] == "pairs[0].category"


def chat_body(dataset, k: int) -> dict:
    """32 different requests: texts of the dataset's samples, some with one of its images."""
    samples = json.loads((dataset / "data.json").read_text())
    sample = samples[k % len(samples)]
    text = f"Request {k}. " + json.dumps(sample["answer"])[:300]
    images = sorted((dataset / "images").iterdir())
    content = [{"type": "text", "text": text}] + ([{"type": "image_url", "image_url": {"url": data_url(images[k % len(images)])}}] if k % 3 else [])
    return {"model": SERVED, "messages": [{"role": "user", "content": content}], "max_tokens": 4 + k % 3, "logprobs": True, "top_logprobs": 2}


def test_concurrent_requests_share_forward_passes_and_answer_as_alone(server, dataset):
    bodies = [chat_body(dataset, k) for k in range(32)]
    prefills, steps = forward_passes(server)
    alone = [post(server, "/v1/chat/completions", body).json() for body in bodies]
    written = sum(a["usage"]["completion_tokens"] for a in alone)
    # one request at a time: a prefill each, then a step for each token after the first
    assert forward_passes(server) == (prefills + 32, steps + written - 32)
    prefills, steps = forward_passes(server)
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda body: post(server, "/v1/chat/completions", body).json(), bodies))
    batched_prefills, batched_steps = (after - before for after, before in zip(forward_passes(server), (prefills, steps)))
    assert batched_prefills < 32 and batched_prefills + batched_steps < written, (batched_prefills, batched_steps, written)
    for a, t in zip(alone, together):
        assert t["choices"][0]["message"] == a["choices"][0]["message"] and t["usage"] == a["usage"]
        for x, y in zip(a["choices"][0]["logprobs"]["content"], t["choices"][0]["logprobs"]["content"]):
            assert y["token"] == x["token"] and y["logprob"] == pytest.approx(x["logprob"], abs=1e-5)
            assert [u["token"] for u in y["top_logprobs"]] == [u["token"] for u in x["top_logprobs"]]
            assert y["top_logprobs"][0]["token"] == y["token"]  # the first of the likeliest is the written token
    assert len({a["choices"][0]["message"]["content"] for a in alone}) > 1


def test_concurrent_score_requests_answer_as_alone(server, dataset):
    samples = json.loads((dataset / "data.json").read_text())
    steps = forward_passes(server)[1]
    alone = [post(server, "/v1/score", {"samples": [s]}).json()["results"][0] for s in samples]
    steps_alone, steps = forward_passes(server)[1] - steps, forward_passes(server)[1]
    with ThreadPoolExecutor(len(samples)) as pool:
        together = [r.json()["results"][0] for r in pool.map(lambda s: post(server, "/v1/score", {"samples": [s]}), samples)]
    # their answers written side by side (each prompt is prefilled apart: its question's part through the prefix cache)
    assert forward_passes(server)[1] - steps < steps_alone
    exact = lambda r: {k: v for k, v in r.items() if k not in ("score_distribution", "expected_score")}  # noqa: E731
    assert [exact(r) for r in together] == [exact(r) for r in alone]
    for a, t in zip(alone, together):
        assert t["score_distribution"] == pytest.approx(a["score_distribution"], abs=1e-5)
    assert [r["id"] for r in alone] == [s["id"] for s in samples]


def test_score_reads_images_under_the_image_root_and_as_data_urls_alike(server, dataset):
    sample = next(s for s in json.loads((dataset / "data.json").read_text()) if any("image" in seg for seg in s["question"]))
    inline = json.loads(json.dumps(sample))
    for segment in inline["question"] + (inline["answer"] if isinstance(inline["answer"], list) else []):
        if "image" in segment:
            segment["image"] = data_url(dataset / segment["image"])
    by_path, by_url = (post(server, "/v1/score", {"samples": [s]}).json()["results"][0] for s in (sample, inline))
    assert by_url == by_path and by_path["n_images"] >= 1


def image_sample(image: str) -> dict:
    return {"samples": [{"id": "SA_1", "question": [{"text": "What next?", "image": image}], "answer": "The boat leaves."}]}


def chat_with_image(url: str) -> dict:
    return {"model": SERVED, "messages": [{"role": "user", "content": [{"type": "text", "text": "Judge this."}, {"type": "image_url", "image_url": {"url": url}}]}]}


HELLO = [{"role": "user", "content": "Is this answer good?"}]
OUTSIDE = "no image at this path under the server's --image_root"
REFUSALS = {
    "not JSON": ("/v1/score", b'{"samples": [', 400, "body", "not JSON"),
    "deeply nested JSON": ("/v1/chat/completions", b"[" * 100000 + b"]" * 100000, 400, "body", "not JSON"),
    "no samples": ("/v1/score", {"samples": []}, 400, "samples", "at least 1 item"),
    "a sample without an answer": ("/v1/score", {"samples": [{"id": "SA_1", "question": "q"}]}, 400, "samples[0].answer", "Field required"),
    "a category without a rubric": ("/v1/score", {"samples": [{"id": "X_1", "category": "X", "question": "q", "answer": "a"}]}, 400,
                                    "samples[0].category", "no rubric for category 'X'"),
    "an absolute path outside the root": ("/v1/score", image_sample("/etc/passwd"), 400, "samples[0].question[0].image", OUTSIDE),
    "a relative path out of the root": ("/v1/score", image_sample("../../../../etc/hostname"), 400, "samples[0].question[0].image", OUTSIDE),
    "a missing file inside the root": ("/v1/score", image_sample("images/none.png"), 400, "samples[0].question[0].image", OUTSIDE),
    "a file inside the root that is no image": ("/v1/score", image_sample("data.json"), 400, "samples[0].question[0].image", OUTSIDE),
    # issue 56: a name longer than the filesystem takes was a 500 naming the server's absolute --image_root
    "a 5,000-character path": ("/v1/score", image_sample("a" * 5000), 400, "samples[0].question[0].image", OUTSIDE),
    "a 5,000-character path in a chat": ("/v1/chat/completions", chat_with_image("a" * 5000), 400, "messages[0].content[1].image_url.url", OUTSIDE),
    "a URL to fetch": ("/v1/chat/completions", chat_with_image("http://127.0.0.1:1/x.png"), 400,
                       "messages[0].content[1].image_url.url", "fetches no URL"),
    "an image detail OpenAI does not have": ("/v1/chat/completions", {"model": SERVED, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,", "detail": "ultra"}}]}]}, 400, "messages[0].content[0].image_url.detail",
        "Input should be 'auto', 'low' or 'high'"),
    "a data URL that is not base64": ("/v1/chat/completions", chat_with_image("data:image/png;base64,@@@"), 400,
                                      "messages[0].content[1].image_url.url", "does not decode"),
    "a data URL that is no image": ("/v1/chat/completions", chat_with_image("data:image/png;base64," + base64.b64encode(b"hello").decode()), 400,
                                    "messages[0].content[1].image_url.url", "not a decodable image"),
    "an oversized image": ("/v1/chat/completions", chat_with_image("data:image/png;base64," + base64.b64encode(png(600, 600)).decode()), 413,
                           "messages[0].content[1].image_url.url", "600 x 600 pixels, over this server's limit of 250000"),
    "too many images": ("/v1/chat/completions", {"model": SERVED, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,"}}] * 5}]}, 413, "messages[0].content", "5 images, over this server's limit of 4"),
    "a body over the size limit": ("/v1/chat/completions", {"model": SERVED, "messages": [{"role": "user", "content": "x" * 3 * 2**20}]}, 413,
                                   "body", "over this server's limit of 2097152"),
    "two user turns": ("/v1/chat/completions", {"model": SERVED, "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, 400,
                       "messages", "one user message"),
    "an unknown content part": ("/v1/chat/completions", {"model": SERVED, "messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 400,
                                "messages[0].content[0].type", "Input should be 'text' or 'image_url'"),
    "an unknown path": ("/v1/embeddings", {}, 404, None, "Not Found"),
    # issue 21: what the server cannot honour is refused by name, never ignored
    **{f"{field} {value}": ("/v1/chat/completions", {"model": SERVED, field: value, "messages": [{"role": "user", "content": "hi"}]}, 400,
                            field, message) for field, value, message in [
        ("tools", [{"type": "function", "function": {"name": "f"}}], "tool calls are not implemented"),
        ("tool_choice", "auto", "tool calls are not implemented"),
        ("logit_bias", {"13": 5}, "logit_bias is not implemented"),
        ("store", True, "this server stores no completion"),
        ("service_tier", "flex", "this server has one tier of service"),
        ("presence_penalty", 2.5, "Input should be less than or equal to 2"),  # OpenAI's range, -2 to 2
        ("frequency_penalty", -3, "Input should be greater than or equal to -2"),
        ("repetition_penalty", 1.1, "repetition_penalty is not implemented"),
        ("guided_decoding_backend", "outlines", "this server's grammars are llguidance's"),
        # OpenAI's field (the 400 said it was not), for hidden reasoning a judge does not do
        ("reasoning_effort", "low", "this judge does no hidden reasoning whose effort could be set"),
        ("max_tokens", True, "Input should be a valid integer"),
        ("temperature", "0", "Input should be a valid number"),
        ("stream_options", {"include_usage": True}, "only with stream: true"),
    ]},
    # a field with an empty name is named as JSON writes it (the fuzz test found it refused with an empty param)
    "an empty field name": ("/v1/chat/completions", {"model": SERVED, "": [], "messages": HELLO}, 400, '""',
                            "a field this server does not take"),
    "an empty stop sequence": ("/v1/chat/completions", {"model": SERVED, "stop": ["ok", ""], "messages": HELLO}, 400, "stop[1]",
                               "an empty stop sequence"),
    # issue 22, 4(b): the text limit of /v1/score applies to chat, before anything is tokenized
    "a chat text over the text limit": ("/v1/chat/completions", {"model": SERVED, "messages": [
        {"role": "system", "content": "s" * 300_000}, {"role": "user", "content": "x" * 300_000}]}, 400, "messages[1].content",
        "the messages' texts reach 600,000 characters, more than the 500,000"),
    "a prompt that fills the context": ("/v1/chat/completions", {"model": SERVED, "messages": [{"role": "user", "content": "a " * 240_000}]}, 400,
                                        "messages", "This model's maximum context length is 131072 tokens, the prompt and its answer together. "
                                                    "However, the prompt alone is"),
    # issue 22, 4(h): a lone surrogate is refused where the JSON is read, naming its field
    "a lone surrogate in a chat text": ("/v1/chat/completions", b'{"model": "org/tiny-judge", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
                                        400, "messages[0].content", "lone surrogate"),
    "a lone surrogate in a sample": ("/v1/score", b'{"samples": [{"id": "SA_1", "question": "q", "answer": [{"text": "\\udfff"}]}]}',
                                     400, "samples[0].answer[0].text", "lone surrogate"),
    "NaN": ("/v1/chat/completions", b'{"model": "org/tiny-judge", "temperature": NaN, "messages": []}', 400, "body", "NaN is not JSON"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_malformed_and_over_limit_requests_are_refused_by_field_and_the_server_goes_on(server, name):
    path, body, status, field, message = REFUSALS[name]
    response = post(server, path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == field and message in error["message"], error
    assert error["code"] and response.headers["x-request-id"]
    assert post(server, "/v1/chat/completions", {"model": SERVED, "max_tokens": 2, "messages": [{"role": "user", "content": "still there?"}]}).status_code == 200


def test_text_that_spells_images_or_image_tokens_is_judged_as_text(server, dataset):
    """What the refusals of such texts used to catch: each is now answered, with the prompt of its text."""
    chat = lambda text: post(server, "/v1/chat/completions", {"model": SERVED, "max_tokens": 2, "messages": [{"role": "user", "content": text}]})  # noqa: E731
    plain, markup = chat("a b c"), chat("a <IMG_CONTEXT> b <image> <image> c <|end|>")
    assert plain.status_code == markup.status_code == 200, markup.text
    assert markup.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"]  # the markup's characters, as text
    scored = post(server, "/v1/score", {"samples": [{"id": "SA_1", "question": "q <image>", "answer": "a <img></img>"}]})
    assert scored.status_code == 200 and scored.json()["results"][0]["n_tiles"] == 0, scored.text


def test_no_answer_tells_which_files_exist_outside_the_image_root_or_in_it(server, dataset, tmp_path):
    """Issue 17, item 4: a real image outside --image_root (by absolute path, by ../, through a link inside
    the root), a file there that is no image, a directory, and a missing file get one and the same answer."""
    outside = tmp_path / "secret.png"
    outside.write_bytes(png(8, 8))
    link = dataset / f"link-{tmp_path.name}.png"
    link.symlink_to(outside)
    escape = os.path.relpath(outside, dataset)
    paths = [str(outside), escape, link.name, "/etc/passwd", str(tmp_path / "missing.png"), "images/none.png", "data.json", "images"]
    try:
        answers = [post(server, "/v1/score", image_sample(path)) for path in paths]
    finally:
        link.unlink()
    assert {(a.status_code, json.dumps(a.json(), sort_keys=True)) for a in answers} == {(400, json.dumps(answers[0].json(), sort_keys=True))}
    assert OUTSIDE in answers[0].json()["error"]["message"] and str(tmp_path) not in answers[0].text
    image = next((dataset / "images").glob("*.png")).relative_to(dataset)
    assert post(server, "/v1/score", image_sample(str(image))).status_code == 200  # an image under the root is read


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-key", f"Bearer {KEY}x", KEY, f"Basic {KEY}"])
def test_a_missing_or_wrong_key_is_refused_and_health_needs_none(server, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    for path, method in (("/v1/models", "GET"), ("/metrics", "GET"), ("/v1/score", "POST"), ("/v1/chat/completions", "POST")):
        response = httpx2.request(method, f"{server}{path}", headers=headers, json={})
        assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    assert httpx2.get(f"{server}/health").json() == {"status": "ok"}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server}/v1", api_key=f"not-{KEY}", max_retries=0).models.list()


@pytest.mark.parametrize("flags, env, message", [
    (["--host", "0.0.0.0"], {}, "--host 0.0.0.0 lets other machines in: give an API key with --api_key_env"),
    (["--host", "judge.example"], {}, "--host judge.example lets other machines in"),
    (["--api_key_env", "NO_SUCH_VARIABLE_HERE"], {}, "--api_key_env NO_SUCH_VARIABLE_HERE: that environment variable is not set"),
    (["--api_key_env", "UTF8_KEY"], {"UTF8_KEY": "sëcret-key"}, "--api_key_env UTF8_KEY: the key must be printable ASCII"),
    (["--max_image_pixels", "0", "--batch_wait_ms", "-1"], {}, "max_image_pixels must be a whole number of at least 1"),
    (["--image_root", "/no/such/dir"], {}, "--image_root /no/such/dir: folder not found"),
    (["--device", "cpu", "--deterministic"], {}, "--deterministic runs batch-invariant Triton kernels on a CUDA GPU, and --device cpu"),
])
def test_a_server_that_cannot_start_safely_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, flags, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert serve_main(["--model_path", str(tmp_path / "no-model"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "no-model" not in err and "Traceback" not in err


def test_a_port_in_use_is_refused_before_the_model_loads(tmp_path, capsys):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert serve_main(["--model_path", str(tmp_path / "no-model"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"--host 127.0.0.1 --port {port}: cannot listen there" in err and "no-model" not in err and "Traceback" not in err


def test_the_server_killed_mid_run_loses_nothing_and_scores_nothing_twice(checkpoint, tmp_path, wait_for_lines):
    data = write_dataset(tmp_path / "data", 16, seed=5).parent
    port, log = free_port(), tmp_path / "serve.log"
    flags = ["--model_path", str(checkpoint), "--served_model_name", "judge", "--max_new_tokens", "16", "--max_tiles", "2", "--batch_wait_ms", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = start_server(flags, port, log, env)
    out = tmp_path / "out"
    client = [sys.executable, "-m", "mmjudge.infer.cli", "--model_path", "judge", "--input_dir", str(data), "--input_file", "data.json",
              "--output_dir", str(out), "--max_new_tokens", "16", "--max_tiles", "2", "--backend", "openai",
              "--base_url", f"http://127.0.0.1:{port}/v1", "--concurrency", "2", "--max_retries", "0"]
    run = subprocess.Popen(client, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    journal = out / "eval_result.json.journal.rank0.jsonl"
    assert wait_for_lines(journal, 4, run)
    os.kill(server.pid, signal.SIGKILL)
    server.wait()
    _, err = run.communicate(timeout=HANG_S)
    assert run.returncode == 2 and "rerun the same command to resume" in err, err
    before = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert 3 <= len(before) < 16 and not (out / "eval_result.json").exists()

    server = start_server(flags, port, log, env)
    try:
        done = subprocess.run(client, capture_output=True, text=True, env=env, timeout=HANG_S)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"resuming: {len(before)} sample(s)" in done.stderr
        completions = metric(f"http://127.0.0.1:{port}", "judge_completions_total")
    finally:
        server.terminate()
        server.wait(timeout=HANG_S)
    assert completions == 16 - len(before) + 1  # the restarted server scored exactly what the journal lacked, after one probe
    lines = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert len(lines) == 16 and len({r["id"] for r in lines}) == 16  # each sample once
    results = json.loads((out / "eval_result.json").read_text())
    assert [r["id"] for r in results] == [s["id"] for s in json.loads((data / "data.json").read_text())]
    by_id = {r["id"]: JudgeResult.model_validate(r) for r in results}
    assert all(by_id[r["id"]] == JudgeResult.model_validate(r) for r in before)  # the work finished before the kill was kept, not redone


def test_the_judge_is_named_by_a_hub_id_at_a_revision_as_judge_score_names_it(server, checkpoint, tmp_path):
    write_hub_cache(tmp_path / "hf" / "hub", "org/tiny-judge", checkpoint, revision="v1")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_CACHE", None)
    port = free_port()
    hub_server = start_server(["--model_path", "org/tiny-judge", "--revision", "v1", *FAST], port, tmp_path / "serve.log", env)
    body = {"model": "org/tiny-judge", "max_tokens": 4, "messages": [{"role": "user", "content": "Is this answer good?"}]}
    try:
        assert [m["id"] for m in httpx2.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]] == ["org/tiny-judge"]
        answer = httpx2.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=HANG_S).json()
    finally:
        hub_server.terminate()
        hub_server.wait(timeout=HANG_S)
    assert answer["choices"] == post(server, "/v1/chat/completions", body).json()["choices"]  # the module's server: the same files
    assert "org/tiny-judge (revision v1): " in (tmp_path / "serve.log").read_text()


def test_a_hub_id_missing_from_the_offline_cache_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    assert serve_main(["--model_path", "org/missing", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --model_path org/missing: no local directory of that name, and revision main of that Hub id is not (fully) in the "
                          "Hugging Face cache") and "Traceback" not in err


def client_of(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


def test_what_openai_clients_send_is_answered_as_the_api_reference_says(server):
    """Issue 21, item 2: null fields are absent, the developer role is the system message, a Hub id is a
    model's id, a wrong model is 404 model_not_found, max_tokens far above the server's default is taken,
    and every answer has an x-request-id."""
    client = client_of(server)
    assert client.models.retrieve(SERVED).id == SERVED  # GET /v1/models/org/tiny-judge
    card = client.models.list().data[0]
    assert card.id == SERVED and card.max_tiles == 2 and card.max_model_len == 131072
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("org/other-judge")
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=2)
    assert err.value.code == "model_not_found" and err.value.body["param"] == "model"

    plain = post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 4})
    nulls = {field: None for field in ("n", "stream", "stream_options", "temperature", "top_p", "stop", "seed", "logprobs", "top_logprobs",
                                       "max_completion_tokens", "presence_penalty", "frequency_penalty", "logit_bias", "response_format",
                                       "tools", "tool_choice", "user", "mm_processor_kwargs")}
    with_nulls = post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 4, **nulls})
    neutral = post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 4, "presence_penalty": 0, "frequency_penalty": 0.0,
                                                    "logit_bias": {}, "response_format": {"type": "text"}, "user": "u1", "n": 1, "stream": False,
                                                    "store": False, "service_tier": "auto", "prompt_cache_key": "k", "safety_identifier": "s"})
    assert plain.status_code == with_nulls.status_code == neutral.status_code == 200, (with_nulls.text, neutral.text)
    assert with_nulls.json()["choices"] == neutral.json()["choices"] == plain.json()["choices"]

    system = [{"role": "system", "content": "You are a strict judge."}, *HELLO]
    developer = [{"role": "developer", "content": "You are a strict judge."}, *HELLO]
    as_system, as_developer = (client.chat.completions.create(model=SERVED, messages=m, max_tokens=4) for m in (system, developer))
    assert as_developer.choices[0].message == as_system.choices[0].message and as_developer.usage == as_system.usage
    assert as_system.usage.prompt_tokens != plain.json()["usage"]["prompt_tokens"]  # the system text replaced the default one

    # the client's own request id is echoed; otherwise one is made, a different one per answer
    assert post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 2}, headers={"x-request-id": "run-7.sample-3"}
                ).headers["x-request-id"] == "run-7.sample-3"
    ids = {httpx2.get(f"{server}{path}", headers={"Authorization": f"Bearer {KEY}"}).headers["x-request-id"] for path in ("/health", "/v1/models", "/nowhere")}
    assert len(ids) == 3

    long = client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=2048)  # VLMEvalKit's default; the server's is 6
    written = long.usage.completion_tokens
    assert written > 6 and long.choices[0].finish_reason == ("length" if written == 2048 else "stop"), written


def test_an_images_low_detail_is_one_tile_of_the_whole_image_and_high_or_auto_the_servers_tiling(server, dataset):
    """OpenAI's `detail` (issue 31, item 4): honoured, where vLLM ignores it."""
    def n_tiles(image, **detail):
        part = {"type": "image_url", "image_url": {"url": data_url(image), **detail}}
        answer = post(server, "/v1/chat/completions", {"model": SERVED, "max_tokens": 1, "messages": [{"role": "user", "content": [part]}]})
        assert answer.status_code == 200, answer.text
        return answer.json()["n_tiles"]

    tiled = max(sorted((dataset / "images").glob("*.png")), key=n_tiles)
    assert n_tiles(tiled) == n_tiles(tiled, detail="auto") == n_tiles(tiled, detail="high") == 3  # --max_tiles 2 and the thumbnail
    assert n_tiles(tiled, detail="low") == 1


def test_a_data_url_whose_base64_holds_whitespace_reads_as_without_it(server, dataset):
    """Issue 31, item 3: lmms-eval's wildvision sends `data:image/jpeg;base64, <data>` (a space after the comma),
    as OpenAI's service takes it; line breaks (MIME's 76-column base64) likewise. Other characters are refused."""
    image = next((dataset / "images").glob("*.png")).read_bytes()
    data = base64.b64encode(image).decode()
    plain = post(server, "/v1/chat/completions", {**chat_with_image(f"data:image/png;base64,{data}"), "max_tokens": 3})
    assert plain.status_code == 200, plain.text
    lines = "\r\n".join(data[k:k + 76] for k in range(0, len(data), 76))
    for url in (f"data:image/jpeg;base64, {data}", f"data:image/png;base64,\n{lines}\n", f"data:image/png;base64,\t{data} "):
        answer = post(server, "/v1/chat/completions", {**chat_with_image(url), "max_tokens": 3})
        assert answer.status_code == 200 and answer.json()["choices"] == plain.json()["choices"], answer.text
        assert answer.json()["usage"] == plain.json()["usage"]
    refused = post(server, "/v1/chat/completions", chat_with_image(f"data:image/png;base64,{data[:40]}*{data[40:]}"))
    assert refused.status_code == 400 and "does not decode" in refused.json()["error"]["message"]


def test_stop_sequences_cut_the_answer_exactly_where_they_begin(server):
    client = client_of(server)
    whole = client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=24, logprobs=True)
    text = whole.choices[0].message.content
    tokens = [t.token for t in whole.choices[0].logprobs.content]
    assert "".join(tokens) == text and len(tokens) == 24
    # a stop sequence inside one token, one across three tokens, and a list whose later member comes first
    first, spanning = tokens[3].strip()[:1], "".join(tokens[5:8])[1:-1]
    assert first and len(spanning) > 2
    for stop in (first, spanning, ["no such text", spanning], [spanning, first]):
        answer = client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=24, stop=stop)
        cut = min(text.find(s) for s in ([stop] if isinstance(stop, str) else stop) if s in text)
        assert answer.choices[0].message.content == text[:cut] and answer.choices[0].finish_reason == "stop", (stop, text)
    absent = client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=24, stop="no such text")
    assert absent.choices[0].message.content == text and absent.choices[0].finish_reason == "length"


def events(server, body) -> list:
    """The server-sent events of a streamed answer, as sent."""
    with httpx2.stream("POST", f"{server}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=HANG_S) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    return [line.removeprefix("data: ") for line in lines]


def test_a_streamed_answer_is_the_whole_answer_in_chunks_the_sdk_reads(server, dataset):
    client = client_of(server)
    image = data_url(next((dataset / "images").glob("*.png")))
    messages = [{"role": "user", "content": [{"type": "text", "text": "Judge <image> this."}, {"type": "image_url", "image_url": {"url": image}}]}]
    whole = client.chat.completions.create(model=SERVED, messages=messages, max_tokens=12, logprobs=True, top_logprobs=2)
    assert whole.model_extra["n_tiles"] >= 1
    for extra in ({}, {"logprobs": True, "top_logprobs": 2}, {"stop": whole.choices[0].message.content[4:7]}):
        chunks = list(client.chat.completions.create(model=SERVED, messages=messages, max_tokens=12, stream=True,
                                                     stream_options={"include_usage": True}, **extra))
        assert chunks[0].choices[0].delta.role == "assistant" and all(c.object == "chat.completion.chunk" for c in chunks)
        assert len({c.id for c in chunks}) == 1
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        usage = chunks[-1]
        assert usage.choices == [] and all(c.usage is None for c in chunks[:-1])
        if "stop" in extra:
            cut = whole.choices[0].message.content.find(extra["stop"])
            assert text == whole.choices[0].message.content[:cut] and finish == ["stop"]
        else:
            assert text == whole.choices[0].message.content and finish == ["length"] and usage.usage == whole.usage
        if "logprobs" in extra:
            streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
            assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in whole.choices[0].logprobs.content]
    # the wire: [DONE] ends it; without include_usage no chunk has a usage field
    sent = events(server, {"model": SERVED, "messages": HELLO, "max_tokens": 3, "stream": True})
    assert sent[-1] == "[DONE]" and all("usage" not in json.loads(e) for e in sent[:-1])


def test_metrics_are_vllms_with_the_status_in_a_label_of_its_own(server):
    """Issue 21, item 4: the status a label of its own (summing over handlers counts each answer once),
    latency and time-to-first-token histograms, token counters, running and waiting gauges, the model named."""
    before = metrics_text(server)
    ok = [post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 3 + k}).json() for k in range(3)]
    neutral = post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "tools": []})  # a neutral value: taken
    wrong = post(server, "/v1/chat/completions", {"model": "gpt-4o", "messages": HELLO})
    assert neutral.status_code == 200 and wrong.status_code == 404
    for k, method in enumerate(("PROPFIND", "MKCOL", "LOCK")):  # made-up paths and methods HTTP knows count under one label each
        httpx2.request(method, f"{server}/v1/tea/{k}", headers={"Authorization": f"Bearer {KEY}"})
    # a method HTTP does not know is refused by the HTTP parser (httptools, as vLLM's server has it), before the app
    assert httpx2.request("BREW", f"{server}/v1/tea", headers={"Authorization": f"Bearer {KEY}"}).status_code == 400
    after = metrics_text(server)
    delta = lambda name, **labels: sample_value(after, name, **labels) - sample_value(before, name, **labels)  # noqa: E731
    chat = {"handler": "/v1/chat/completions", "method": "POST"}
    assert delta("http_requests_total", **chat, status="2xx") == 4 and delta("http_requests_total", **chat, status="4xx") == 1
    assert delta("http_requests_total", handler="none", method="other", status="4xx") == 3
    model = {"model_name": SERVED}
    answers = [*ok, neutral.json()]
    assert delta("vllm:prompt_tokens_total", **model) == sum(a["usage"]["prompt_tokens"] for a in answers)
    assert delta("vllm:generation_tokens_total", **model) == sum(a["usage"]["completion_tokens"] for a in answers)
    assert delta("vllm:e2e_request_latency_seconds_count", **model) == 4
    assert delta("vllm:e2e_request_latency_seconds_bucket", **model, le="+Inf") == 4
    assert delta("vllm:time_to_first_token_seconds_count", **model) == 4
    assert delta("vllm:request_success_total", **model, finished_reason="length") == 4
    assert sample_value(after, "vllm:num_requests_running", **model) == 0 and sample_value(after, "vllm:num_requests_waiting", **model) == 0
    for name, kind in [("vllm:e2e_request_latency_seconds", "histogram"), ("vllm:time_to_first_token_seconds", "histogram"),
                       ("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"), ("http_requests_total", "counter"),
                       ("vllm:prompt_tokens_total", "counter"), ("vllm:generation_tokens_total", "counter")]:
        assert f"# TYPE {name} {kind}" in after


def test_a_seeded_sampled_answer_is_the_same_alone_and_batched_and_retries_at_any_temperature_are_answered(server):
    """Issue 21, item 1: temperature, top_p, top_k, seed and n reach the decoder; each choice draws from its
    own generator, so a seeded answer does not depend on what is batched beside it."""
    client = client_of(server)

    def ask(**fields):
        return client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=8, **fields)

    sampled = {"temperature": 1.0, "top_p": 0.9, "seed": 1234, "extra_body": {"top_k": 50}}
    alone = ask(**sampled)
    others = [{"temperature": 0.7, "seed": k} for k in range(6)] + [{"temperature": 0}]
    with ThreadPoolExecutor(8) as pool:
        batched = list(pool.map(lambda fields: ask(**fields), [sampled, *others, sampled]))
    assert batched[0].choices[0].message.content == batched[-1].choices[0].message.content == alone.choices[0].message.content
    assert len({a.choices[0].message.content for a in batched[1:-2]}) > 1  # other seeds, other answers
    assert batched[-2].choices[0].message.content == ask(temperature=0).choices[0].message.content  # greedy stays greedy

    several = ask(**sampled, n=3)
    assert [c.index for c in several.choices] == [0, 1, 2] and several.usage.prompt_tokens == alone.usage.prompt_tokens
    assert several.choices[0].message.content == alone.choices[0].message.content  # choice 0 draws as a lone answer does
    assert len({c.message.content for c in several.choices}) > 1
    streamed = ["", "", ""]
    with client.chat.completions.create(model=SERVED, messages=HELLO, max_tokens=8, n=3, stream=True, **sampled) as stream:
        for piece in stream:
            for choice in piece.choices:
                streamed[choice.index] += choice.delta.content or ""
    assert streamed == [c.message.content for c in several.choices]
    # MM-Vet's judge retries at 0.5, 1.0, ...; lmms-eval judges some tasks at 0.2: each answered, unseeded
    for temperature in (0.2, 0.5, 1.0, 1.5, 2.0):
        assert ask(temperature=temperature).choices[0].finish_reason in ("stop", "length")
    # issue 45, item 10: OpenAI's presence_penalty and frequency_penalty reach the decoder, greedy or sampled (their rule
    # is checked by hand in tests/infer/test_decoding.py); harnesses that send them are no longer refused
    greedy = ask(temperature=0).choices[0].message.content
    assert ask(temperature=0, presence_penalty=2.0, frequency_penalty=2.0).choices[0].message.content != greedy
    assert ask(presence_penalty=-2, frequency_penalty=0.0).choices[0].message.content != greedy
    assert ask(**sampled, presence_penalty=1.0).choices[0].message.content != alone.choices[0].message.content


def steps(server) -> int:
    return metric(server, "judge_decoding_steps_total")


def finished(server) -> int:
    """Chat choices finished, whatever their reason."""
    text = metrics_text(server)
    return sum(int(sample_value(text, "vllm:request_success_total", finished_reason=reason)) for reason in ("stop", "length", "abort"))


def left_its_slot(server, finished_before: int) -> None:
    """Waits until the request a client left is finished and out of the model: at once when the server sees
    the disconnect, or, were it to compute on for nobody, after its 3000 tokens; however busy the machine."""
    deadline = time.monotonic() + HANG_S
    while (finished(server) == finished_before or metric(server, "vllm:num_requests_running", model_name=SERVED)) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_streams_left_part_way_leave_no_task_behind_in_the_log(server, server_log):
    # Each stream left while the model was writing left its wait for the next token pending; once collected,
    # asyncio logged "Task was destroyed but it is pending!" (16 times in 40 streams left after two chunks).
    body = {"model": SERVED, "messages": HELLO, "max_tokens": 64, "stream": True}
    for _ in range(30):
        with httpx2.stream("POST", f"{server}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=HANG_S) as response:
            lines = response.iter_lines()
            next(lines), next(lines)
    for k in range(3):  # the server goes on (and collects what the streams left)
        assert post(server, "/v1/chat/completions", {"model": SERVED, "messages": HELLO, "max_tokens": 2 + k}).status_code == 200
    assert "Task was destroyed" not in server_log.read_text()


def leave_on_timeout(server, body) -> tuple[int, int]:
    """A client that gives up on its whole answer, once the answer is out of the model: the decoding steps and
    aborted requests before it. A client that left before its answer's first step shows nothing, so a busy
    machine's client waits longer (1.5 s was short of the first step beside two busy loops and other work)."""
    for seconds in (1.5, 3.0, 6.0, 12.0, 24.0):
        before, aborted, before_finished = steps(server), metric(server, "vllm:request_success_total", finished_reason="abort"), finished(server)
        with pytest.raises(openai.APITimeoutError):
            openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=seconds).chat.completions.create(**body)
        left_its_slot(server, before_finished)
        if steps(server) > before:
            return before, aborted
    pytest.fail("no client waited long enough for its answer's first step, even 24 s")


def leave_a_stream(server, body) -> tuple[int, int]:
    """A client that closes its stream after three chunks, once the answer is out of the model (as above)."""
    before, aborted, before_finished = steps(server), metric(server, "vllm:request_success_total", finished_reason="abort"), finished(server)
    with client_of(server).chat.completions.create(**body, stream=True) as stream:
        for _ in zip(range(3), stream):
            pass
    left_its_slot(server, before_finished)
    return before, aborted


def test_a_client_that_leaves_stops_costing_decoding_steps(server):
    """Issue 21, item 3: a client that times out (whole answer) or closes its stream frees its slot; the
    model computes nothing more for it. Counted in decoding steps: the request asks for 3000 tokens, the
    tiny judge writes a few hundred a second."""
    # sampled, and seeded with one whose answer on this checkpoint runs to its 3000 tokens: no early stop token
    long = {"model": SERVED, "messages": HELLO, "max_tokens": 3000, "temperature": 1.0, "seed": 3}
    for leave in (leave_on_timeout, leave_a_stream):
        before, aborted = leave(server, long)
        settled = steps(server)
        time.sleep(2.0)
        assert steps(server) == settled, leave.__name__  # nothing more computed for it
        assert 0 < settled - before < 3000 - 1, (leave.__name__, settled - before)
        assert metric(server, "vllm:num_requests_running", model_name=SERVED) == 0
        assert metric(server, "vllm:request_success_total", finished_reason="abort") == aborted + 1
