"""The model thread of judge-serve, in process: a request that fails there fails alone, and a chat answer is
the same whatever is batched beside it."""

from dataclasses import replace

import pytest
import torch

from mmjudge.infer.sampler import Sampling
from mmjudge.infer.engine import _load_pixels, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import UsageError, load_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.vision import Pixels, placeholder
from mmjudge.judge.testing import HANG_S, write_dataset, write_original_checkpoint
from mmjudge.serve.worker import Abandoned, ChatPrompt, Worker


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    return load_judge(write_original_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0))


def prompt(judge, text: str, tiles: int = 0, pixels: int = 0) -> ChatPrompt:
    images = judge.settings.images
    query = (placeholder(images, tiles * images.tokens_per_tile) + "\n" if tiles else "") + text
    ids = judge.tokenizer(judge.settings.template.render(query), return_tensors="pt").input_ids[0]
    size = images.image_size
    tiles_given = Pixels(torch.zeros(pixels, 3, size, size), pixels * images.tokens_per_tile) if pixels else None
    return ChatPrompt(ids, tiles_given, max_new_tokens=3, logprobs=0)


@pytest.mark.slow
def test_a_request_that_fails_in_the_model_thread_fails_alone_and_the_thread_goes_on(judge):
    worker = Worker(judge, load_rubrics(), ScoreOptions(max_new_tokens=3, max_tiles=2), "cpu", batch_wait_s=1.0)
    alone, = worker.chat(prompt(judge, "Is this answer good?")).result(timeout=HANG_S)
    before = worker.forward_passes()["prefill"]
    # submitted within one batch wait: one round, in which the middle request's one tile meets two tiles' tokens
    futures = [worker.chat(prompt(judge, "Is this answer good?")), worker.chat(prompt(judge, "Broken.", tiles=2, pixels=1)),
               worker.chat(prompt(judge, "Another answer.", tiles=1, pixels=1))]
    good, bad, other = (f.exception(timeout=HANG_S) or f.result()[0] for f in futures)
    assert isinstance(bad, Exception) and not isinstance(good, Exception) and not isinstance(other, Exception)
    assert good.tokens == alone.tokens and len(other.tokens) == 3
    # the round's one prefill group failed whole, then ran request by request: two prefills completed, the broken
    # request failed again alone
    assert worker.counts["failed_requests"] == 1 and worker.forward_passes()["prefill"] - before == 2
    assert worker.alive() and worker.chat(prompt(judge, "Still there?")).result(timeout=HANG_S)[0].tokens


# The tiny dataset's prompts run from 673 to 781 tokens with --max_tiles 2 (tests/infer/test_decoding.py): a
# long-rope switch at 700 puts them on both sides of it, and new tokens take some across it.
ROPE_SWITCH = 700


@pytest.mark.slow
def test_a_chat_answer_batched_with_longer_and_shorter_prompts_is_its_answer_alone(tmp_path):
    """Phi-3's long rope picks its regime from a row's largest position: batched beside a prompt past the
    switch, a shorter prompt must still get its own tokens and log-probabilities."""
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt", seed=0, original_max_position_embeddings=ROPE_SWITCH))
    data = write_dataset(tmp_path / "data", 8, seed=0).parent
    options = ScoreOptions(max_new_tokens=12, max_tiles=2)
    items = prepare(judge, enumerate(load_samples(data / "data.json", data)), load_rubrics(), data, options)
    prompts = [ChatPrompt(item.input_ids.long(), _load_pixels(item, torch.float32, pin=False), max_new_tokens=6 + k % 7, logprobs=1 + k % 4)
               for k, item in enumerate(items)]
    lengths = [len(p.input_ids) for p in prompts]
    assert min(lengths) < ROPE_SWITCH < max(lengths)
    assert any(n < ROPE_SWITCH < n + p.max_new_tokens for n, p in zip(lengths, prompts))
    worker = Worker(judge, load_rubrics(), options, "cpu", batch_wait_s=0.0)
    alone = [worker.chat(p).result(timeout=HANG_S)[0] for p in prompts]
    worker.batch_wait_s = 5.0  # every prompt below joins one round
    futures = [worker.chat(p) for p in prompts]
    before = worker.forward_passes()["prefill"]
    together = [f.result(timeout=HANG_S)[0] for f in futures]
    assert worker.forward_passes()["prefill"] - before < len(prompts)  # they shared prefill groups
    for prompt, one, batched in zip(prompts, alone, together):
        assert batched.tokens == one.tokens and len(one.tokens) == prompt.max_new_tokens  # the random judge never stops early
        # batched, each step has the round's largest k of likeliest tokens; their first k are those alone
        k = prompt.logprobs
        assert one.top_ids.shape[1] == k and batched.top_ids.shape[1] == max(p.logprobs for p in prompts)
        assert batched.top_ids[:, :k].tolist() == one.top_ids.tolist()
        torch.testing.assert_close(batched.top_logprobs[:, :k], one.top_logprobs, rtol=0, atol=1e-5)
        assert batched.top_ids[:, 0].tolist() == batched.tokens  # the first of the likeliest is the written token
    assert len({tuple(a.tokens) for a in alone}) > 1


def test_a_cancelled_prompt_is_answered_cancelled_without_computing_and_leaves_at_the_next_step(judge):
    """A client gone before its turn costs nothing; one gone while it writes stops at the next step, beside
    a prompt that goes on (to its own limit, above the server's max_new_tokens)."""
    worker = Worker(judge, load_rubrics(), ScoreOptions(max_new_tokens=3), "cpu", batch_wait_s=1.0)
    before = worker.forward_passes()
    gone = worker.chat(replace(prompt(judge, "Is this answer good?"), n=2, sampling=Sampling(0.8), cancelled=lambda: True)).result(timeout=HANG_S)
    assert [(c.choice, c.tokens, c.finish_reason) for c in gone] == [(0, [], "cancelled"), (1, [], "cancelled")]
    assert worker.forward_passes() == before
    written = []
    leaving = replace(prompt(judge, "Is this answer good?"), max_new_tokens=20, on_token=lambda c, t: written.append(t) or True,
                      cancelled=lambda: len(written) >= 3)
    staying = replace(prompt(judge, "Another answer, a longer one to judge."), max_new_tokens=5)
    futures = [worker.chat(leaving), worker.chat(staying)]  # one round
    (left,), (stayed,) = (f.result(timeout=HANG_S) for f in futures)
    assert (left.finish_reason, left.tokens) == ("cancelled", written) and len(written) == 3
    assert (stayed.finish_reason, len(stayed.tokens)) == ("length", 5)
    assert worker.forward_passes()["step"] - before["step"] == 4  # the staying prompt's four; the leaving one's two among them


def test_a_round_run_again_after_another_prompts_failure_tells_each_token_once_and_writes_the_same_answer(judge):
    """A prompt whose on_token fails mid-answer fails alone: the round runs again prompt by prompt. A sampled
    prompt of that round (its seed left to the server) is told each token once and writes the same answer."""
    worker = Worker(judge, load_rubrics(), ScoreOptions(max_new_tokens=3), "cpu", batch_wait_s=1.0)
    told = []
    streamed = replace(prompt(judge, "Is this answer good?"), max_new_tokens=10, n=2, sampling=Sampling(0.9),
                       on_token=lambda c, t: told.append((c, t)) or True)

    def broken(choice, token):
        if len(told) >= 4:
            raise RuntimeError("the client's stream broke")
        return True

    futures = [worker.chat(streamed), worker.chat(replace(prompt(judge, "Another answer."), max_new_tokens=10, on_token=broken))]
    choices, failed = futures[0].result(timeout=HANG_S), futures[1].exception(timeout=HANG_S)
    assert isinstance(failed, RuntimeError) and worker.counts["failed_requests"] == 1
    for c in choices:  # a sampled choice may write the stop token, which on_token is not told
        assert [t for choice, t in told if choice == c.choice] == (c.tokens[:-1] if c.finish_reason == "stop" else c.tokens)
        assert c.finish_reason == "stop" or len(c.tokens) == 10
    assert choices[0].tokens != choices[1].tokens


def test_a_chat_prompt_arriving_while_others_write_takes_a_freed_slot_and_writes_its_answer_alone(judge, tmp_path):
    """Submitted while a round's answers are being written (from one's on_token, so surely meanwhile), a chat
    prompt that fits the round's slots takes the slot another answer freed at the next step: one round, its
    steps shared, its answer the one it gets alone. One too long for the round's slots gets a lane (a cache)
    of its own in the same round; one behind a /v1/score request waits for the next round."""
    worker = Worker(judge, load_rubrics(), ScoreOptions(max_new_tokens=3, max_tiles=2), "cpu", batch_wait_s=1.0)
    joining = replace(prompt(judge, "Score it."), max_new_tokens=5, sampling=Sampling(0.8, seed=4))
    alone, = worker.chat(joining).result(timeout=HANG_S)
    short = replace(prompt(judge, "Another answer."), max_new_tokens=2)
    futures = []

    def submit(*prompts):
        def on_token(choice, token):
            if not futures:
                futures.extend(worker.score(p) if isinstance(p, list) else worker.chat(p) for p in prompts)
            return True
        return on_token

    def round_with(*prompts):
        futures.clear()
        long = replace(prompt(judge, "Is this answer good? Say why in a few words."), max_new_tokens=20, on_token=submit(*prompts))
        rounds, steps = worker.counts["rounds"], worker.chat_decoder.runner.steps
        (first,), _ = (f.result(timeout=HANG_S) for f in [worker.chat(long), worker.chat(short)])  # one round
        answers = [f.result(timeout=HANG_S) for f in futures]
        return len(first.tokens), answers, worker.counts["rounds"] - rounds, worker.chat_decoder.runner.steps - steps

    written, [(joined,)], rounds, steps = round_with(joining)
    assert (written, joined.tokens, rounds) == (20, alone.tokens, 1)
    assert steps == 19  # the long answer's; the short one's first, then the joined one's four, among them
    # too long for the round's slots, then a score request and a prompt behind it: the next round, all three
    data = write_dataset(tmp_path / "data", 1, seed=0).parent
    items = prepare(judge, enumerate(load_samples(data / "data.json", data)), load_rubrics(), data, ScoreOptions(max_tiles=2))
    answered_in_round = {}
    worker.chat_decoder.generate = watch(worker.chat_decoder.generate, lambda: worker.counts["rounds"], answered_in_round)
    rounds_before = worker.counts["rounds"]
    written, [(too_long,), scored, (behind,)], rounds, steps = round_with(replace(joining, max_new_tokens=200), items, joining)
    assert (written, len(too_long.tokens), len(scored), behind.tokens) == (20, 200, 1, alone.tokens)
    assert rounds == 2 and steps == 19 + 199 + 4  # each answer's steps in its own lane
    assert answered_in_round[200] == rounds_before + 1 and answered_in_round[5] == rounds_before + 2


def watch(generate, round_number, answered: dict):
    """generate, noting the round in which each answer finished, by its length."""
    def watched(*args, **kwargs):
        for done in generate(*args, **kwargs):
            answered.update({len(c.tokens): round_number() for c in done})
            yield done
    return watched


def test_an_answer_too_long_for_memory_fails_alone_saying_so(judge, monkeypatch):
    """A max_tokens within the context may still ask for a cache slot larger than the device holds: that
    request fails alone with what to change, the others of its round are answered."""
    import mmjudge.infer.runner

    slot_cache = mmjudge.infer.runner.slot_cache

    def small_device(config, slots, capacity, *args):  # a device with room for 300 tokens of cache
        if slots * capacity > 300:
            raise torch.OutOfMemoryError("simulated")
        return slot_cache(config, slots, capacity, *args)

    monkeypatch.setattr(mmjudge.infer.runner, "slot_cache", small_device)
    worker = Worker(judge, load_rubrics(), ScoreOptions(max_new_tokens=3), "cpu", batch_wait_s=1.0)
    futures = [worker.chat(replace(prompt(judge, "Is this answer good?"), max_new_tokens=1000)), worker.chat(prompt(judge, "Score it."))]
    failed, (answered,) = futures[0].exception(timeout=HANG_S), futures[1].result(timeout=HANG_S)
    assert isinstance(failed, UsageError) and "with up to 1000 new tokens does not fit in cpu memory even alone" in str(failed)
    assert len(answered.tokens) == 3


@pytest.mark.parametrize("mode", ["generate", "logits"])
def test_a_score_request_whose_client_left_is_dropped_before_its_prefill_or_at_the_next_step(judge, tmp_path, mode):
    """Issue 21, item 3, for /v1/score: samples whose client has gone cost no prefill, or leave their slots at
    the next decoding step for the samples waiting; a request beside them is answered in full, as alone."""
    data = write_dataset(tmp_path / "data", 4, seed=0).parent
    options = ScoreOptions(max_new_tokens=24, max_tiles=1, ignore_stop=True, mode=mode)  # every answer runs 24 tokens
    items = lambda: prepare(judge, list(enumerate(load_samples(data / "data.json", data))), load_rubrics(), data, options)  # noqa: E731
    # a cache of 4 slots (a slot: the longest prompt, its 24 tokens and the forced heading's few)
    options = replace(options, token_budget=4 * (max(len(item.input_ids) for item in items()) + 40))
    worker = Worker(judge, load_rubrics(), options, "cpu", batch_wait_s=1.0)
    alone = worker.score(items()).result(timeout=HANG_S)

    before = worker.forward_passes()
    left = worker.score(items(), cancelled=lambda: True)
    assert isinstance(left.exception(timeout=HANG_S), Abandoned) and worker.forward_passes() == before

    if mode == "logits":
        return
    steps = lambda: worker.forward_passes()["step"]  # noqa: E731
    start = steps()
    # submitted within one batch wait: one round of 8 samples in 4 slots; the first request's client leaves
    # after three steps, and its slots take the second request's samples that wait
    leaving, staying = worker.score(items(), cancelled=lambda: steps() - start >= 3), worker.score(items())
    assert isinstance(leaving.exception(timeout=HANG_S), Abandoned)
    assert [r.model_dump() for r in staying.result(timeout=HANG_S)] == [r.model_dump() for r in alone]
    # 24 tokens each: two of the staying samples from the first step, two from the fourth (not after all 48)
    assert steps() - start == 3 + 23, steps() - start
