"""Issue 45, item 9: the bodies of judge-serve's endpoints, fuzzed with hypothesis (tests/test_hostile_inputs.py's
damaged files: values replaced, keys dropped or added, texts cut or spliced, bytes), bounded in count
(FUZZ_EXAMPLES) and each answer in time: every body is answered, or refused with a 4xx JSON error in OpenAI's
shape naming the field at fault; none is a 500. tests/test_hostile_inputs.py fuzzes plain chat bodies; these
are /v1/score's samples and pairs, and chat bodies with structured outputs and penalties."""

import json
import os

import httpx2
import pytest
from hypothesis import given
from PIL import Image

from mmjudge.judge.testing import HANG_S, write_original_checkpoint
from mmjudge.serve.process import free_port, start_server
from tests.test_hostile_inputs import FUZZ, PAIR, SAMPLE, file_bytes, kept_fast

pytestmark = pytest.mark.slow  # a server, and FUZZ_EXAMPLES bodies per test

HELLO = [{"role": "system", "content": "You judge."}, {"role": "user", "content": "Is 2 + 2 = 4 a good answer?"}]
VERDICT = {"type": "object", "properties": {"better": {"enum": ["A", "B", "tie"]}, "score": {"type": "integer", "minimum": 0, "maximum": 6}},
           "required": ["better", "score"], "additionalProperties": False}
STRUCTURED = {"model": "judge", "max_tokens": 4, "messages": HELLO, "presence_penalty": 0.5, "frequency_penalty": -0.5,
              "structured_outputs": {"json": VERDICT, "disable_any_whitespace": False}}
RESPONSE_FORMAT = {"model": "judge", "max_tokens": 4, "messages": HELLO, "temperature": 0.7, "seed": 1,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True}}}
GUIDED = {"model": "judge", "max_tokens": 4, "messages": HELLO, "guided_choice": ["A", "B", "tie"], "guided_decoding_backend": "guidance"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "images").mkdir()
    Image.new("RGB", (40, 30), "red").save(root / "images" / "a.png")
    port = free_port()
    process = start_server(["--model_path", str(write_original_checkpoint(root / "ckpt", seed=0)), "--served_model_name", "judge",
                            "--image_root", str(root), "--max_new_tokens", "2", "--max_tiles", "2"], port, root / "serve.log",
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=HANG_S)


def assert_answered_or_refused_by_field(url: str, data: bytes) -> None:
    response = httpx2.post(url, content=data, headers={"content-type": "application/json"}, timeout=HANG_S)
    assert response.status_code < 500, (data[:300], response.text[:2000])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["param"] and error["code"] and error["message"].startswith(error["param"]), error


@FUZZ
@given(data=file_bytes({"samples": [SAMPLE, {**SAMPLE, "id": "SA_2"}]}))
def test_score_sample_bodies(server, data):
    assert_answered_or_refused_by_field(f"{server}/v1/score", data)


@FUZZ
@given(data=file_bytes({"pairs": [PAIR, {**PAIR, "id": "p2"}]}))
def test_score_pair_bodies(server, data):
    assert_answered_or_refused_by_field(f"{server}/v1/score", data)


@FUZZ
@given(data=file_bytes(STRUCTURED) | file_bytes(RESPONSE_FORMAT) | file_bytes(GUIDED))
def test_chat_bodies_with_structured_outputs_and_penalties(server, data):
    assert_answered_or_refused_by_field(f"{server}/v1/chat/completions", kept_fast(data))


def test_the_templates_themselves_are_answered(server):
    """The fuzz's starting points are valid requests: what it damages is answered undamaged."""
    for path, body in [("/v1/score", {"samples": [SAMPLE]}), *(("/v1/chat/completions", body) for body in (STRUCTURED, RESPONSE_FORMAT, GUIDED))]:
        response = httpx2.post(f"{server}{path}", content=json.dumps(body).encode(), headers={"content-type": "application/json"}, timeout=HANG_S)
        assert response.status_code == 200, (path, response.text[:2000])
