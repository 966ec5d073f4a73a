"""judge-serve's reward endpoints (serve/rewards.py) with the tiny judge on a free loopback port: each client's
shape answers the reward --reward declares, the same alone and in any batch, images included; bad requests
are refused naming the field, in each client's own error shape."""

import base64
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import httpx2
import pytest
import uvicorn

from mmjudge.infer.options import MAX_PREFIX_CACHE, ScoreOptions
from mmjudge.judge.data import PairResult, UsageError
from mmjudge.judge.formats import FORMATS
from mmjudge.judge.model import judge_tokenizer, load_judge, with_max_tiles
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.rewards import parse_reward, preference_reward
from mmjudge.judge.testing import HANG_S, write_dataset, write_original_checkpoint
from mmjudge.serve.cli import main as serve_main
from mmjudge.serve.api import RequestError
from mmjudge.serve.app import build_app
from mmjudge.serve.metrics import Metrics
from mmjudge.serve.options import ServeOptions, prefill_budget
from mmjudge.serve.process import free_port, start_server
from mmjudge.serve.rewards import reward_options, sigmoid, spec_of, with_prefix_cache
from mmjudge.serve.service import Service
from mmjudge.serve.worker import Worker

SERVED = "tiny-judge"
FLAGS = ["--served_model_name", SERVED, "--mode", "logits", "--max_tiles", "1", "--workers", "1"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    return write_original_checkpoint(root / "ckpt", seed=0), write_dataset(root / "data", 4, seed=0).parent


@pytest.fixture(scope="module")
def images(files) -> list[str]:
    """Three of the dataset's images, as paths under the server's --image_root."""
    return [str(p.relative_to(files[1])) for p in sorted((files[1] / "images").iterdir())[:3]]


def started(files, reward: str, log: Path):
    port = free_port()
    # --prefix_cache as the reward endpoints have it unasked for this judge, so that /v1/score's records are theirs to the
    # bit (a prompt's two pieces are cut where its shared part ends, whatever the cache's size)
    process = start_server(["--model_path", str(files[0]), "--image_root", str(files[1]), "--reward", reward, *FLAGS,
                            "--prefix_cache", str(MAX_PREFIX_CACHE)], port, log,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def server(files):
    """A deterministic server (each prompt prefilled alone: the same bits in any batch) whose reward is MMIE's SA
    rubric's expected score mapped from 0-6 to [0, 1]; in process, as judge-serve assembles it: judge-serve refuses
    --deterministic on a CPU, where the batch-invariant kernels of decoding cannot run, but logits mode only prefills."""
    # /v1/score with the prefix cache the reward endpoints have unasked for this judge: both doors prefill a prompt in the same pieces
    with serving(files, ScoreOptions(mode="logits", deterministic=True, max_tiles=1, workers=1, prefix_cache=MAX_PREFIX_CACHE)) as (url, _, _):
        yield url


@contextmanager
def serving(files, options: ScoreOptions, mode: str | None = None, name: str = SERVED):
    """judge-serve in process, serving the checkpoint files[0] as `name`, with the reward score:SA, while the block
    runs: its URL, the judge and its rubrics. `mode`: its --reward_mode, the reward endpoints' own options
    (reward_options) beside the server's; none: the server's options (a reward model's, which has no mode)."""
    judge = load_judge(files[0])
    judge.settings = with_max_tiles(judge.settings, options.max_tiles)
    rubrics = load_rubrics(FORMATS["pairs"].default_rubrics)
    spec = parse_reward("score:SA", rubrics)
    rewarding = None if mode is None else with_prefix_cache(reward_options(spec, rubrics, judge.tokenizer, options, mode), judge, "cpu")
    worker = Worker(judge, rubrics, options, "cpu", batch_wait_s=0.02, prefill_budget=prefill_budget(None, "cpu"),
                    reward=None if rewarding is None else (rewarding, rubrics["SA"]))
    service = Service((name,), judge, rubrics, options, ServeOptions(max_images=3), files[1], None, worker, 0, worker.context, Metrics(name),
                      "no structured outputs in these tests", "tiny", spec, rewarding)
    with running(service) as url:
        yield url, judge, rubrics


@contextmanager
def running(service: Service):
    """The service's app on a free loopback port, in a thread of this process, while the block runs; its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(service), host="127.0.0.1", port=port, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=HANG_S)


def post(server, path, body):
    return httpx2.post(f"{server}{path}", json=body, timeout=HANG_S)


def reward(server, prompt: str, response: str, images: list[str] = ()) -> float:
    answer = post(server, "/get_reward", {"query": [prompt + response], "prompts": [prompt], "images": [list(images)]})
    assert answer.status_code == 200, answer.text
    return answer.json()["rewards"][0]


def chat(prompt: str, response: str, images: list[str] = ()) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": image}} for image in images] + [{"type": "text", "text": prompt}]
    return [{"role": "user", "content": parts}, {"role": "assistant", "content": response}]


@pytest.mark.slow
def test_every_clients_shape_answers_the_declared_reward_the_expected_score_of_v1_score_mapped_to_0_1(server, images):
    question, response = "What does the picture show, and what happens next?", "A red circle; it rolls away."
    sample = {"id": "SA_1", "question": [{"image": images[0]}, {"text": question}], "answer": response}
    expected = post(server, "/v1/score", {"samples": [sample]}).json()["results"][0]["expected_score"]
    declared = expected / 6  # SA scores 0-6
    openrlhf = post(server, "/get_reward", {"query": [question + response], "prompts": [question], "images": [[images[0]]]}).json()
    assert openrlhf["rewards"] == openrlhf["scores"] == [declared] and openrlhf["reward"] == "score:SA"
    assert openrlhf["extra_logs"] == {"n_images": [1], "expected_score": [expected]}  # the judge was shown the image
    # OpenRLHF's own client posts query, prompts and labels alone: its --label_key column carries the images
    for label in ({"images": [images[0]]}, json.dumps({"reference": None, "images": images[0]})):
        labelled = post(server, "/get_reward", {"query": [question + response], "prompts": [question], "labels": [label]}).json()
        assert labelled["rewards"] == [declared] and labelled["extra_logs"]["n_images"] == [1]
    vllm = post(server, "/classify", {"model": SERVED, "messages": chat(question, response, images[:1])}).json()
    assert vllm["data"][-1]["probs"][-1] == declared and vllm["data"][-1]["num_classes"] == 2  # where verl reads it
    assert sum(vllm["data"][-1]["probs"]) == pytest.approx(1) and vllm["data"][-1]["label"] == "score:SA"
    # a text alone (verl's templated string, LLaMA-Factory's message) is judged whole as the response
    alone = reward(server, "", response)
    assert post(server, "/classify", {"model": SERVED, "input": response, "use_activation": False}).json()["data"][0]["probs"][1] == alone
    # LLaMA-Factory's client names the model "model" whatever the server serves
    assert post(server, "/v1/score/evaluation", {"model": "model", "messages": [response]}).json()["scores"] == [alone]
    assert alone != declared  # the question and its image changed what the judge read


@pytest.mark.slow
def test_openrlhfs_query_of_decoded_tokens_with_its_image_token_expanded_is_rewarded_as_the_prompt_and_response(server):
    prompt = "<|vision_start|><|image_pad|><|vision_end|>What colour is the square? Answer in one word, then say why.\n"
    decoded = prompt.replace("<|image_pad|>", "<|image_pad|>" * 16) + "Red."  # OpenRLHF decodes the expanded prompt tokens
    answer = post(server, "/get_reward", {"query": [decoded], "prompts": [prompt]})
    assert answer.json()["rewards"] == [reward(server, prompt, "Red.")]


@pytest.mark.slow
def test_a_reward_is_the_same_alone_and_in_any_batch_from_any_number_of_clients(server, images):
    same_alone_and_in_any_batch(server, images)


def same_alone_and_in_any_batch(server, images: list[str]) -> None:
    """Four responses' rewards, to the bit the same alone, in a request of all four in any order, and from
    concurrent clients (test_reward_model.py's reward model as this judge)."""
    asked = [("Describe the image.", "A blue square.", images[:1]), ("What happens next?", "It falls.", []),
             ("Compare the two pictures.", "The second is darker, and larger than the first one.", images[1:3]),
             ("Is it raining?", "No.", images[2:3])]
    alone = [reward(server, *one) for one in asked]
    assert len(set(alone)) == len(alone)

    def batch(order):
        body = {"query": [asked[k][0] + asked[k][1] for k in order], "prompts": [asked[k][0] for k in order],
                "images": [list(asked[k][2]) for k in order]}
        return dict(zip(order, post(server, "/get_reward", body).json()["rewards"]))

    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        assert batch(order) == dict(enumerate(alone))  # to the bit
    with ThreadPoolExecutor(8) as pool:  # concurrent one-sample requests share the model thread's rounds
        assert list(pool.map(lambda k: reward(server, *asked[k % 4]), range(16))) == [alone[k % 4] for k in range(16)]


def data_url(files, image: str) -> str:
    path = files[1] / image
    return f"data:image/{path.suffix.lstrip('.').replace('jpg', 'jpeg')};base64,{base64.b64encode(path.read_bytes()).decode()}"


QUESTIONS = [{"type": "predicate", "name": "faithful", "instructions": "Does the caption fit the image?"},
             {"type": "choice", "name": "shape", "instructions": "Which shape is shown?",
              "choices": [{"value": "circle", "description": "round"}, {"value": "square"}, {"value": True, "description": "a star"},
                          {"value": "true"}]},  # typed values: the string "true" and true are two choices
             {"type": "score", "instructions": [{"type": "input_text", "text": "How good is the caption?"}],  # unnamed: its answer's name is null
              "levels": [{"label": "poor", "description": "wrong"}, {"label": "fair"}, {"label": "good"}, {"label": "great"}]}]


@pytest.mark.slow
def test_openais_decisions_client_is_answered_every_question_type_with_and_without_images_in_its_own_types(server, files, images):
    """The openai SDK's own client.decisions.create, as its users call it: 200, each answer in question order
    validating as the SDK's own types, probabilities that sum to 1, the image reaching the judge."""
    from openai import OpenAI
    from openai.types.decision import (AnswerAnswerResourceChoice, AnswerAnswerResourcePredicate, AnswerAnswerResourceScore,
                                       Decision)

    client = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=HANG_S)
    caption = {"type": "input_text", "text": "A red circle on a table."}
    pictured = [{"role": "user", "content": [caption, {"type": "input_image", "image_url": data_url(files, images[0])}]}]
    asked = {"text": client.decisions.with_raw_response.create(model=SERVED, input="A red circle on a table.", questions=QUESTIONS),
             "image": client.decisions.with_raw_response.create(model=SERVED, input=pictured, questions=QUESTIONS)}
    answers = {}
    for way, raw in asked.items():
        assert raw.status_code == 200, raw.http_response.text
        assert isinstance(raw.parse(), Decision)  # what client.decisions.create returns
        decision = Decision.model_validate(raw.http_response.json())  # the SDK's own pydantic types, validated (its client only constructs them)
        predicate, choice, score = decision.answers
        assert isinstance(predicate, AnswerAnswerResourcePredicate) and predicate.name == "faithful" and 0 <= predicate.probability <= 1
        assert isinstance(choice, AnswerAnswerResourceChoice) and choice.name == "shape"
        assert [p.value for p in choice.probabilities] == ["circle", "square", True, "true"]
        assert sum(p.probability for p in choice.probabilities) == pytest.approx(1)
        assert choice.confidence == max(p.probability for p in choice.probabilities) == next(p.probability for p in choice.probabilities
                                                                                             if p.value == choice.choice)
        assert isinstance(score, AnswerAnswerResourceScore) and score.name is None
        assert [(p.value, p.label) for p in score.probabilities] == [(0, "poor"), (1, "fair"), (2, "good"), (3, "great")]
        assert sum(p.probability for p in score.probabilities) == pytest.approx(1)
        assert score.score == pytest.approx(sum(p.value * p.probability for p in score.probabilities))
        assert decision.model == SERVED and decision.usage.input_tokens > 0
        assert decision.usage.total_tokens == decision.usage.input_tokens + decision.usage.output_tokens
        answers[way] = decision
    assert answers["image"].usage.input_tokens > answers["text"].usage.input_tokens
    assert answers["image"].answers[0].probability != answers["text"].answers[0].probability  # the image reached the judge
    # the predicate is the reward of the same judgement: the instructions as the question, the input as the answer
    same = post(server, "/classify", {"model": SERVED, "messages": [{"role": "user", "content": "Does the caption fit the image?"},
                                                                    {"role": "assistant", "content": "A red circle on a table."}]})
    assert same.json()["data"][0]["probs"][1] == answers["text"].answers[0].probability


@pytest.mark.slow
@pytest.mark.parametrize("question, field", [
    ({"type": "choice", "instructions": "i", "choices": [{"value": "a"}, {"value": "b", "description": "x"}, {"value": "b"}]},
     "questions[0].choices[2].value"),
    ({"type": "choice", "instructions": "i", "choices": [{"value": False}, {"value": False}]}, "questions[0].choices[1].value"),
    ({"type": "score", "instructions": "i", "levels": [{"label": "low"}, {"label": "high"}, {"label": "low", "description": "d"}]},
     "questions[0].levels[2].label"),
], ids=["choice", "boolean choice", "level"])
def test_openais_decisions_client_is_refused_a_repeated_choice_or_level_by_name(server, question, field):
    """A repeated choice or level would split one answer's probability in two (and sum past 1 where read apart):
    400, naming the repeat, as the SDK raises it."""
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=HANG_S)
    with pytest.raises(BadRequestError) as refused:
        client.decisions.create(model=SERVED, input="x", questions=[question])
    assert refused.value.body["param"] == field and "each must be unique" in refused.value.body["message"]


def test_a_question_the_judge_gives_no_number_for_is_a_refusal_in_the_sdks_type():
    from openai.types.decision import AnswerAnswerResourceRefusal, Decision

    from mmjudge.serve.rewards import Question, Reward, decision

    refused = decision(Question(type="predicate", name="p", instructions="i"), [Reward(None)], None)
    usage = {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": 0,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 1}
    answer = Decision.model_validate({"model": SERVED, "answers": [refused], "usage": usage}).answers[0]
    assert isinstance(answer, AnswerAnswerResourceRefusal) and answer.name == "p"


REFUSED = [  # path, body, status, what the error names (OpenAI's `param`, or the head of FastAPI's `detail`)
    ("/classify", {"model": SERVED}, 400, "body"),
    ("/classify", {"model": "other", "input": "x"}, 404, "model"),
    ("/classify", {"model": SERVED, "input": []}, 400, "body"),
    ("/classify", {"model": SERVED, "messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "r"}]}, 400, "messages"),
    ("/classify", {"model": SERVED, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "/etc/passwd"}}]},
                                                 {"role": "assistant", "content": "r"}]}, 400, "messages[0].content[0].image_url.url"),
    ("/classify", {"model": SERVED, "input": "x" * 2_000_000}, 400, "input"),
    ("/get_reward", {"query": []}, 400, "query"),
    ("/get_reward", {"query": ["q r"], "prompts": ["p"]}, 400, "query[0]"),  # the prompt nowhere in its query
    ("/get_reward", {"query": ["q r"], "prompts": ["q", "r"]}, 400, "body"),
    ("/get_reward", {"query": ["q r", "s"], "images": [[], ["http://example.com/a.png"]]}, 400, "images[1][0]"),
    ("/get_reward", {"query": ["q"], "images": [["a.png"] * 4]}, 413, "query[0]"),
    ("/get_reward", {"query": ["q"], "labels": [3]}, 400, "labels[0]"),
    ("/get_reward", {"query": ["q"], "labels": [{"answer": "x"}]}, 400, "labels[0]"),
    ("/get_reward", {"query": ["q"], "labels": [{"reference": 3, "images": []}]}, 400, "labels[0].reference"),
    ("/get_reward", {"query": ["q"], "labels": [{"images": [3]}]}, 400, "labels[0].images[0]"),
    ("/get_reward", {"query": ["q"], "labels": ['{"images": ["a.png"]}'], "images": [["a.png"]]}, 400, "labels[0].images"),
    ("/get_reward", {"query": ["q"], "labels": [{"images": ["/etc/passwd"]}]}, 400, "labels[0].images[0]"),
    ("/v1/score/evaluation", {"model": SERVED, "messages": "one text"}, 400, "messages"),
    ("/v1/score/evaluation", {"model": SERVED, "messages": ["x"], "temperature": 0}, 400, "temperature"),
    ("/v1/decisions", {"model": SERVED, "input": "x", "questions": [{"type": "choice", "name": "c", "instructions": "i"}]}, 400, "questions[0]"),
    ("/v1/decisions", {"model": SERVED, "input": "x", "questions": [{"type": "score", "instructions": "i", "levels": [{"label": "one"}]}]},
     400, "questions[0].levels"),
    ("/v1/decisions", {"model": SERVED, "input": "x", "questions": [{"type": "choice", "instructions": "i", "choices": ["a", "b"]}]},
     400, "questions[0].choices[0]"),  # OpenAI's choices are {value, description}
    ("/v1/decisions", {"model": SERVED, "input": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}}]}],
                       "questions": [{"type": "predicate", "instructions": "i"}]}, 400, "input[0].content[0].type"),  # OpenAI's parts: input_image
    ("/v1/decisions", {"model": SERVED, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "a.png", "detail": "low"}]}],
                       "questions": [{"type": "predicate", "instructions": "i"}]}, 400, "input[0].content[0].detail"),
    ("/v1/decisions", {"model": SERVED, "input": [{"role": "assistant", "content": "x"}], "questions": [
        {"type": "predicate", "name": "p", "instructions": "i"}]}, 400, "input[0].role"),
]


@pytest.mark.slow
@pytest.mark.parametrize("path, body, status, field", REFUSED, ids=[f"{r[0]} {r[3]}" for r in REFUSED])
def test_a_bad_reward_request_is_refused_naming_the_field_in_its_clients_error_shape(server, path, body, status, field):
    answer = post(server, path, body)
    assert answer.status_code == status, answer.text
    if path in ("/get_reward", "/v1/score/evaluation"):  # FastAPI's servers: OpenRLHF's, LLaMA-Factory's
        assert answer.json()["detail"].startswith(f"{field}: ") or (field == "body" and "detail" in answer.json())
    else:  # vLLM's, OpenAI's
        assert answer.json()["error"]["param"] == field


@pytest.mark.slow
def test_a_preference_reward_is_the_probability_the_response_beats_the_reference_both_orders_averaged(files, images, tmp_path):
    process, url = started(files, "preference:general", tmp_path / "serve.log")
    try:
        question, response, reference = "What is in the image?", "A red circle.", "A blue square on a table."
        pair = {"id": "p", "category": "general", "question": [{"image": images[0]}, {"text": question}], "answer_a": response,
                "answer_b": reference}
        record = PairResult.model_validate(post(url, "/v1/score", {"pairs": [pair]}).json()["results"][0])
        answer = post(url, "/get_reward", {"query": [question + response], "prompts": [question], "labels": [reference], "images": [[images[0]]]})
        assert answer.json()["rewards"] == [preference_reward(record)] and answer.json()["reward"] == "preference:general"
        assert record.forward and record.reverse  # both orders judged
        missing = post(url, "/get_reward", {"query": [question + response], "prompts": [question]})
        assert missing.status_code == 400 and missing.json()["detail"].startswith("labels[0]: this server's reward is preference:general")
        nowhere = post(url, "/classify", {"model": SERVED, "input": response})
        assert nowhere.status_code == 400 and "no place for one: use /get_reward's labels" in nowhere.json()["error"]["message"]
    finally:
        process.terminate()
        process.wait(timeout=HANG_S)


def test_a_reward_that_cannot_work_is_refused_before_the_model_loads(tmp_path, capsys):
    assert serve_main(["--model_path", str(tmp_path / "no-model"), "--reward", "preference:SA", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "--reward preference:SA: a preference reward reads a pairwise rubric, and category 'SA' has a pointwise one" in err
    assert "Traceback" not in err


def test_a_reward_models_probability_is_finite_at_any_reward():
    """issue 56: /classify on a reward below about -709 was a 500 OverflowError (exp(-r) past a float)."""
    assert sigmoid(-1000.0) == 0.0 and sigmoid(-745.0) >= 0 and sigmoid(1000.0) == 1.0 and sigmoid(0.0) == 0.5
    assert [sigmoid(r) for r in (-3.0, 2.0)] == pytest.approx([1 / (1 + 2.718281828459045 ** 3), 1 / (1 + 2.718281828459045 ** -2)])


def test_without_reward_the_reward_endpoints_say_how_to_start_one():
    class NoReward:
        reward = None

    with pytest.raises(RequestError, match=r"start judge-serve with --reward KIND:CATEGORY"):
        spec_of(NoReward())


def test_the_reward_judges_in_logits_mode_where_its_rubric_allows_and_generates_elsewhere(files):
    """--reward_mode auto: logits where each of the rubric's scores is one token of the judge's tokenizer (SA's
    0-6), generate mode where not (a scale in halves: 2.5 is written in several tokens), whatever the server's
    --mode; logits asked of that rubric is refused; generate is generate; a verdict reward judges nothing."""
    tokenizer = judge_tokenizer(files[0])
    rubrics = load_rubrics(FORMATS["pairs"].default_rubrics)
    halves = rubrics["SA"].model_copy(update={"category": "HALVES", "step": 0.5})
    rubrics = {**rubrics, "HALVES": halves}
    generate = ScoreOptions(structured=True)
    chosen = reward_options(parse_reward("score:SA", rubrics), rubrics, tokenizer, generate, "auto")
    assert chosen.mode == "logits" and not chosen.structured  # logits writes nothing to constrain
    assert reward_options(parse_reward("score:SA", rubrics), rubrics, tokenizer, generate, "generate") == generate
    assert reward_options(parse_reward("score:HALVES", rubrics), rubrics, tokenizer, generate, "auto").mode == "generate"
    with pytest.raises(UsageError, match="--reward_mode logits: --mode logits reads the score from one token, but rubric 'HALVES'"):
        reward_options(parse_reward("score:HALVES", rubrics), rubrics, tokenizer, generate, "logits")
    assert reward_options(parse_reward("score:HALVES", rubrics), rubrics, tokenizer, ScoreOptions(mode="logits"), "auto").mode == "generate"


def test_concurrent_requests_images_and_prompts_are_prepared_in_one_thread_one_hop_each(server, images, monkeypatch):
    """The event loop hands each request's preparing (its images read and checked, then its prompts tokenized) to one
    thread, once: a thread more beside the model thread contends for the GIL (Service.prepared); Starlette's pool of 40,
    twice a request, was where a sixth of the one-sample rewards' time went."""
    import mmjudge.serve.images
    import mmjudge.serve.service

    threads = {"images": [], "prompts": []}
    check, prepare = mmjudge.serve.images.RequestImages.file, mmjudge.serve.service.prepare

    def file(self, *args):
        threads["images"].append(threading.current_thread().name)
        return check(self, *args)

    def prepared(*args):
        threads["prompts"].append(threading.current_thread().name)
        return prepare(*args)

    monkeypatch.setattr(mmjudge.serve.images.RequestImages, "file", file)
    monkeypatch.setattr(mmjudge.serve.service, "prepare", prepared)
    with ThreadPoolExecutor(8) as pool:
        rewards = list(pool.map(lambda k: reward(server, f"Describe image {k}.", "A square.", images[k % 3:k % 3 + 1]), range(16)))
    assert len(rewards) == 16 and len(threads["images"]) == len(threads["prompts"]) == 16
    assert set(threads["images"]) == set(threads["prompts"]) == {"judge-prepare"}


def test_a_large_requests_preparing_holds_the_small_ones_beside_it_for_a_piece_at_most(server, images, monkeypatch):
    """Ten one-image requests sent while one of 18 images is being prepared reach the model before it: the preparing
    thread runs requests in turns, a piece each (an image checked, a prompt tokenized, an image's tiles made), not each
    request whole in arrival order. Without a timing threshold: turns of no length (PREPARING_TURN_S 0), and the large
    request's first image waits until the ten are handed to the preparing thread."""
    import mmjudge.serve.images
    import mmjudge.serve.service
    import mmjudge.serve.worker

    monkeypatch.setattr(mmjudge.serve.service, "PREPARING_TURN_S", 0, raising=False)
    handed, entered, started = [], [], threading.Event()
    check, prepared, score = mmjudge.serve.images.RequestImages.file, mmjudge.serve.service.Service.prepared, mmjudge.serve.worker.Worker.score

    def file(self, reference, field):
        if reference != images[0] and not started.is_set():  # the large request's first image: the small ones come meanwhile
            started.set()
            deadline = time.monotonic() + 60
            while len(handed) < 11 and time.monotonic() < deadline:
                time.sleep(0.01)
        return check(self, reference, field)

    def handing(self, steps):
        handed.append(steps)
        return prepared(self, steps)

    def scoring(self, items, *args, **kwargs):
        entered.append(len(items))
        return score(self, items, *args, **kwargs)

    monkeypatch.setattr(mmjudge.serve.images.RequestImages, "file", file)
    monkeypatch.setattr(mmjudge.serve.service.Service, "prepared", handing)
    monkeypatch.setattr(mmjudge.serve.worker.Worker, "score", scoring)
    large = {"query": [f"Q{k}. A" for k in range(6)], "prompts": [f"Q{k}." for k in range(6)], "images": [images[:3]] * 6}
    with ThreadPoolExecutor(11) as pool:
        answered = pool.submit(post, server, "/get_reward", large)
        assert started.wait(timeout=HANG_S)
        small = list(pool.map(lambda k: reward(server, f"Describe image {k}.", "A square.", images[:1]), range(10)))
        assert answered.result().status_code == 200 and len(small) == 10
    assert entered == [1] * 10 + [6]  # every small request reached the model before the large one


def test_a_request_that_stops_waiting_for_its_preparing_leaves_the_preparing_thread_serving():
    """A handler cancelled while its request waits to be prepared (its server shutting down) must not stop the one
    thread every request is prepared in: its answer is set unheard."""
    import asyncio

    from mmjudge.serve.service import Preparer

    preparer, started = Preparer(), threading.Event()

    def slow():
        started.set()
        for _ in range(3):
            time.sleep(0.01)
            yield
        return "slow"

    def quick():
        return "quick"
        yield

    async def asked():
        first = asyncio.ensure_future(asyncio.wrap_future(preparer.submit(slow())))
        waiting = asyncio.ensure_future(asyncio.wrap_future(preparer.submit(quick())))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, HANG_S)
        waiting.cancel()  # before its turn
        # a bound on a hang only (the thread gone), the work is milliseconds
        return await asyncio.wait_for(first, 60), await asyncio.wait_for(asyncio.wrap_future(preparer.submit(quick())), 60)

    assert asyncio.run(asked()) == ("slow", "quick")


@pytest.mark.slow
def test_a_generating_servers_rewards_are_read_in_logits_mode_and_say_so(files, server, images):
    """A server whose /v1/score generates (--mode generate), its reward endpoints in logits mode (auto): each
    answer names the mode, and the reward is the logits-mode server's to the bit, the prompt prefilled once."""
    with serving(files, ScoreOptions(max_new_tokens=4, max_tiles=1, workers=1), "auto") as (url, _, _):
        question, response = "What does the picture show?", "A red circle."
        body = {"query": [question + response], "prompts": [question], "images": [[images[0]]]}
        answer = post(url, "/get_reward", body).json()
        assert answer["reward_mode"] == "logits" and answer["rewards"] == post(server, "/get_reward", body).json()["rewards"]
        assert post(url, "/classify", {"model": SERVED, "input": response}).json()["reward_mode"] == "logits"
        record = post(url, "/v1/score", {"samples": [{"id": "s", "question": question, "answer": response, "category": "SA"}]}).json()
        assert record["results"][0]["generated_tokens"] > 0  # /v1/score still generates
