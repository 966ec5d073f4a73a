"""judge-serve serving a reward model (judge-train --objective bradley_terry's output; judge/reward_model.py) with the
tiny Qwen2.5-VL reward model on a free loopback port: /v1/score and every reward endpoint answer its head's reward
of one prefill (the reward training gave the answer), the same alone and in any batch, and a pair's verdict is the
reward difference; what a reward model cannot do (write text, follow a pairwise rubric, a score distribution) is
refused saying why."""

import math

import pytest
import torch

from mmjudge.infer.engine import prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import Pair, Sample, Segment
from mmjudge.judge.reward_model import rewards
from mmjudge.judge.testing import write_dataset
from mmjudge.judge.testing.families import write_reward_checkpoint
from mmjudge.serve.cli import main as serve_main
from mmjudge.serve.process import free_port
from mmjudge.train.bradley_terry import answer_row
from mmjudge.train.data import Collator
from tests.serve.test_rewards import images, post, reward, same_alone_and_in_any_batch, serving  # noqa: F401 - images: a fixture

SERVED = "tiny-reward"
QUESTION, RESPONSE = "What does the picture show, and what happens next?", "A red circle; it rolls away."


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("files")
    return write_reward_checkpoint(root / "model", seed=0), write_dataset(root / "data", 4, seed=0).parent


@pytest.fixture(scope="module")
def served(files):
    """The reward model served as judge-serve assembles it, its reward read under MMIE's SA rubric (--reward score:SA)."""
    with serving(files, ScoreOptions(max_tiles=1, workers=1), name=SERVED) as served:
        yield served


def trained_reward(judge, rubric, image_root, question, response) -> float:
    """The answer's reward as judge-train computes it in training: its prompt as the trainer builds it, its batch
    as the trainer's collator makes it."""
    pair = Pair(id="p", question=question, answer_a=[Segment(text=response)], answer_b=[Segment(text="-")], category=rubric.category)
    row = answer_row(judge, pair, "A", rubric, image_root, None)
    batch = Collator(judge.pad_id, judge.backbone, judge.settings.images)([{**row, "labels": row["input_ids"]}])
    del batch["labels"]
    with torch.no_grad():
        return rewards(judge.model, batch).item()


@pytest.mark.slow
def test_every_door_answers_the_reward_training_gave_the_answer_from_one_prefill(served, files, images):
    url, judge, rubrics = served
    sample = {"id": "SA_1", "question": [{"image": images[0]}, {"text": QUESTION}], "answer": RESPONSE}
    record = post(url, "/v1/score", {"samples": [sample]}).json()["results"][0]
    question = [Segment(image=str(files[1] / images[0])), Segment(text=QUESTION)]
    assert record["reward"] == pytest.approx(trained_reward(judge, rubrics["SA"], files[1], question, RESPONSE), abs=1e-5)
    assert record["generated_tokens"] == 0 and record["score"] is None and record["prompt_tokens"] > 0  # a prefill, nothing written

    r = record["reward"]
    openrlhf = post(url, "/get_reward", {"query": [QUESTION + RESPONSE], "prompts": [QUESTION], "images": [[images[0]]]}).json()
    assert openrlhf["rewards"] == openrlhf["scores"] == [r] and openrlhf["reward"] == "score:SA"
    assert openrlhf["extra_logs"] == {"n_images": [1]}  # numbers only: OpenRLHF averages each list
    chat = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": images[0]}}, {"type": "text", "text": QUESTION}]},
            {"role": "assistant", "content": RESPONSE}]
    vllm = post(url, "/classify", {"model": SERVED, "messages": chat}).json()
    # vLLM's pooling runner on a one-label classifier: its sigmoid, where verl reads it (data[-1].probs[-1])
    assert vllm["data"] == [{"index": 0, "label": "score:SA", "probs": [1 / (1 + math.exp(-r))], "num_classes": 1}]
    raw = post(url, "/classify", {"model": SERVED, "messages": chat, "use_activation": False}).json()
    assert raw["data"][-1]["probs"] == [r] and vllm["usage"]["prompt_tokens"] == record["prompt_tokens"]
    # a text alone (verl's templated string, LLaMA-Factory's message) is judged whole as the response
    alone = reward(url, "", RESPONSE)
    assert post(url, "/v1/score/evaluation", {"model": "model", "messages": [RESPONSE]}).json()["scores"] == [alone]
    assert post(url, "/classify", {"model": SERVED, "input": RESPONSE, "use_activation": False}).json()["data"][0]["probs"] == [alone]
    assert alone != r  # the question and its image changed what the model read


@pytest.mark.slow
def test_a_pairs_verdict_is_its_answers_reward_difference_against_the_tie_margin(served, images):
    url, _, _ = served
    pair = {"id": "p", "category": "SA", "question": [{"image": images[0]}, {"text": QUESTION}], "answer_a": RESPONSE,
            "answer_b": "Nothing at all."}
    record = post(url, "/v1/score", {"pairs": [pair]}).json()["results"][0]
    a, b = (record["scores"][side]["reward"] for side in "AB")
    assert a != b and record["verdict"] == ("A" if a - b > 0.5 else "B" if b - a > 0.5 else "tie")  # ScoreOptions' tie_margin 0.5
    sample = {"id": "SA_b", "question": pair["question"], "answer": "Nothing at all."}
    assert post(url, "/v1/score", {"samples": [sample]}).json()["results"][0]["reward"] == b  # each answer scored alone


@pytest.mark.slow
def test_a_reward_is_the_same_alone_and_in_any_batch_from_any_number_of_clients(served, images):
    same_alone_and_in_any_batch(served[0], images)


@pytest.mark.slow
@pytest.mark.parametrize("path, body, field, why", [
    ("/v1/chat/completions", {"model": SERVED, "messages": [{"role": "user", "content": "Hi"}]}, "model", "is a reward model"),
    ("/v1/score", {"pairs": [{"id": "p", "category": "general", "question": "q", "answer_a": "a", "answer_b": "b"}]},
     "pairs[0].category", "a reward model, which scores each answer alone"),
    ("/v1/decisions", {"model": SERVED, "input": "x", "questions": [{"type": "predicate", "name": "p", "instructions": "i"}]}, None,
     "a reward model"),
], ids=["chat", "pairwise rubric", "decisions"])
def test_what_a_reward_model_cannot_do_is_refused_saying_why(served, path, body, field, why):
    answer = post(served[0], path, body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == field and why in answer.json()["error"]["message"]


@pytest.mark.slow
def test_a_preference_reward_is_refused_for_a_reward_model_before_the_model_loads(files, capsys):
    assert serve_main(["--model_path", str(files[0]), "--reward", "preference:general", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert f"--reward preference:general: {files[0]} is a reward model, whose reward is its head's own" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_reward_models_prompt_is_the_one_it_was_trained_on_in_either_mode(served, files, images):
    """--mode logits puts a score heading after a judge's prompt, to read the score there; a reward model reads its
    head at the prompt's last token, as trained, whatever the mode (the server above is in generate mode)."""
    _, judge, rubrics = served
    sample = Sample(id="SA_1", question=[Segment(image=str(files[1] / images[0])), Segment(text=QUESTION)], answer=[Segment(text=RESPONSE)])
    prompts = {mode: prepare(judge, [(0, sample)], rubrics, files[1], ScoreOptions(mode=mode))[0].input_ids for mode in ("generate", "logits")}
    assert torch.equal(prompts["generate"], prompts["logits"])
    pair = Pair(id="p", question=sample.question, answer_a=sample.answer, answer_b=[Segment(text="-")], category="SA")
    assert prompts["logits"].tolist() == answer_row(judge, pair, "A", rubrics["SA"], files[1], None)["input_ids"]
