"""The names judge-serve answers to, as harnesses send them (issue 43, item 1): several served names as vLLM
takes them, a request without `model` answered by the served model, the judge names harness tasks hard-code
taken only where the server is told to (--harness_names), and docs/harnesses.md's table of those names the
code's own."""

import re
from pathlib import Path

import httpx2
import openai
import pytest

from mmjudge.judge.testing import HANG_S, write_original_checkpoint
from mmjudge.serve.cli import build_parser
from mmjudge.serve.options import HARNESS_NAMES, ServeOptions
from mmjudge.serve.process import free_port, start_server

DOCS = Path(__file__).resolve().parents[2] / "docs" / "harnesses.md"
HELLO = [{"role": "user", "content": "Is this answer good?"}]


def test_the_served_names_are_the_flags_then_the_harness_names_each_once():
    assert ServeOptions().served_names("org/judge") == ("org/judge",)
    assert ServeOptions(served_model_name=["judge", "gpt-4o", "judge"]).served_names("org/judge") == ("judge", "gpt-4o")
    names = ServeOptions(served_model_name=["judge", "gpt-4o"], harness_names=True).served_names("org/judge")
    assert names[:2] == ("judge", "gpt-4o") and set(names) == {"judge", *HARNESS_NAMES} and len(names) == len(set(names))
    args = build_parser(["--model_path", "m"]).parse_args(["--model_path", "m", "--served_model_name", "a", "b", "--harness_names"])
    assert (args.served_model_name, args.harness_names) == (["a", "b"], True)


def test_the_docs_list_the_harness_names_the_server_takes():
    """docs/harnesses.md's table of the names --harness_names takes is this code's list, name for name."""
    section = DOCS.read_text().split("## The judge names harnesses send", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE)
    assert documented == list(HARNESS_NAMES)


@pytest.mark.slow
def test_a_request_is_answered_under_any_served_name_or_none_and_a_name_not_served_is_404(tmp_path):
    port, log = free_port(), tmp_path / "serve.log"
    process = start_server(["--model_path", str(write_original_checkpoint(tmp_path / "ckpt", seed=0)), "--served_model_name", "judge",
                            "gpt-4o", "--harness_names", "--max_new_tokens", "2", "--max_tiles", "2", "--workers", "1"], port, log)
    try:
        server = f"http://127.0.0.1:{port}"
        client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
        listed = [card.id for card in client.models.list().data]
        assert listed[:2] == ["judge", "gpt-4o"] and set(listed) == {"judge", *HARNESS_NAMES}
        # each name answered under itself: VLMEvalKit's --judge gpt-4o arrives dated, lmms-eval's hallusion_bench as gpt-4
        for name in ("gpt-4o", "gpt-4o-2024-05-13", "gpt-4"):
            assert client.chat.completions.create(model=name, messages=HELLO, max_tokens=2).model == name
        # no model (lmms-eval's egothink, as to Azure): the first served name's
        answer = httpx2.post(f"{server}/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2}, timeout=HANG_S)
        assert answer.status_code == 200 and answer.json()["model"] == "judge"
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(model="gpt-5", messages=HELLO, max_tokens=2)
        assert err.value.code == "model_not_found" and "'gpt-5' does not exist" in err.value.message
        assert client.models.retrieve("gpt-4o-2024-05-13").id == "gpt-4o-2024-05-13"
    finally:
        process.terminate()
        process.wait(timeout=HANG_S)
