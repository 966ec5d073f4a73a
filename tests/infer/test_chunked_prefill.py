"""Chunked prefill (infer/decoding.py, issue 31 item 2): a prompt longer than the per-step prefill budget is
prefilled a chunk per engine step, with the same tokens and (fp32, CPU) the same log-probabilities as
unchunked, on both sides of a long-rope switch and through image tokens; the other requests decode between
its chunks; a cancelled one stops at the next chunk."""

from types import SimpleNamespace

import pytest
import torch

from mmjudge.infer.sampler import Sampling
from mmjudge.infer.scheduler import Request, attention_weight, chunk_cost, chunk_size
from mmjudge.infer.engine import judge_decoder, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import load_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_dataset, write_original_checkpoint
from tests.infer.test_decoding import ROPE_SWITCH, _loader, chat_ids, no_images

CHUNK = 200  # the tiny dataset's prompts (673-781 tokens with --max_tiles 2) take 4 or 5 chunks, one crossing the switch


@pytest.fixture(scope="module")
def long_rope_judge(tmp_path_factory):
    return load_judge(write_original_checkpoint(tmp_path_factory.mktemp("long-rope"), seed=0, original_max_position_embeddings=ROPE_SWITCH))


@pytest.fixture(scope="module")
def items(long_rope_judge, tmp_path_factory):
    data = write_dataset(tmp_path_factory.mktemp("data"), 8, seed=0).parent
    return prepare(long_rope_judge, enumerate(load_samples(data / "data.json", data)), load_rubrics(), data, ScoreOptions(max_tiles=2))


def chunk_ends(prompt: int, budget: int, weight: float) -> list[int]:
    """Where a prompt of `prompt` tokens alone in its step is cut into chunks of a `budget`: chunk_size's rule."""
    ends = [0]
    while ends[-1] < prompt:
        ends.append(min(prompt, ends[-1] + chunk_size(budget, ends[-1], weight)))
    return ends[1:]


def run(judge, items, prefill_budget, **request):
    decoder = judge_decoder(judge, "cpu", None, columns=[], prefill_budget=prefill_budget)
    requests = [Request(k, item.input_ids.long(), max_new_tokens=12, **request) for k, item in enumerate(items)]
    done = {(c.index, c.choice): c for batch in decoder.generate(requests, _loader(items), 12, top_logprobs=4) for c in batch}
    return done, decoder


@pytest.mark.slow
def test_a_chunked_prefill_writes_what_an_unchunked_one_writes_across_the_long_rope_switch(long_rope_judge, items, monkeypatch):
    lengths = [len(item.input_ids) for item in items]
    assert min(lengths) < ROPE_SWITCH < max(lengths) and all(n > 3 * CHUNK for n in lengths)
    assert sum(item.n_tiles > 0 for item in items) > 4  # chunks cut through runs of image tokens
    for request in ({}, {"sampling": Sampling(temperature=0.9, seed=3), "n": 2}):
        whole, unchunked = run(long_rope_judge, items, None, **request)
        chunked, decoder = run(long_rope_judge, items, CHUNK, **request)
        assert decoder.runner.prefills == sum(len(chunk_ends(n, CHUNK, decoder.scheduler.attention_weight)) for n in lengths) and unchunked.runner.prefills < len(items)
        assert whole.keys() == chunked.keys()
        for key, one in whole.items():
            assert chunked[key].tokens == one.tokens and len(one.tokens) == 12
            torch.testing.assert_close(chunked[key].top_logprobs, one.top_logprobs, rtol=0, atol=1e-4)
            assert chunked[key].top_ids.tolist() == one.top_ids.tolist()
    # what makes it so past the switch: a chunk's rotary regime is its whole prompt's (its last position rides along)
    from mmjudge.infer.runner import Runner

    layers = Runner.layers
    monkeypatch.setattr(Runner, "layers", lambda self, *args, reach=None, **kwargs: layers(self, *args, **kwargs))
    blind, _ = run(long_rope_judge, items, CHUNK)
    whole, _ = run(long_rope_judge, items, None)
    past = [k for k, n in enumerate(lengths) if n > ROPE_SWITCH]
    assert any(not torch.allclose(blind[k, 0].top_logprobs, whole[k, 0].top_logprobs, atol=1e-3) for k in past)
    assert all(torch.allclose(blind[k, 0].top_logprobs, whole[k, 0].top_logprobs, atol=1e-4) for k in range(len(items)) if k not in past)


def test_short_requests_decode_between_a_long_prompts_chunks_and_write_what_they_write_alone(long_rope_judge):
    """A server's lanes side by side: the long prompt (a lane of its own) takes a chunk a step, the short
    ones are admitted whole within the step's budget (half of it, while the chunks go on) and finish while
    the long prompt is still being prefilled."""
    judge = long_rope_judge
    long = chat_ids(judge, "Judge this long answer. " + "The boat leaves the harbour at night, and the sea is grey. " * 400)
    shorts = [chat_ids(judge, q) for q in ("Is this answer good?", "Score it.")]
    budget = 512
    assert len(long) > 5 * budget and all(len(ids) <= budget // 2 for ids in shorts)
    decoder = judge_decoder(judge, "cpu", None, columns=[], prefill_budget=budget)
    requests = [Request(0, long, max_new_tokens=4), *(Request(k + 1, ids, max_new_tokens=6) for k, ids in enumerate(shorts))]
    finished = {c.index: decoder.runner.prefills for batch in decoder.generate(requests, no_images, 6, joining=lambda take: None) for c in batch}
    assert decoder.runner.prefill_tokens == len(long) + sum(map(len, shorts))
    assert decoder.runner.prefills >= -(-len(long) // budget) + 1  # the long prompt's chunks, and the short ones' prefill
    assert max(finished[1], finished[2]) < decoder.runner.prefills  # the short ones were done before the long prompt's last chunk
    together = {c.index: c.tokens for batch in judge_decoder(judge, "cpu", None, columns=[], prefill_budget=budget).generate(
        requests_again(requests), no_images, 6, joining=lambda take: None) for c in batch}
    for request in requests:
        alone = next(judge_decoder(judge, "cpu", None, columns=[]).generate(requests_again([request]), no_images, 6))[0]
        assert together[request.index] == alone.tokens


def requests_again(requests):
    return [Request(r.index, r.input_ids, max_new_tokens=r.max_new_tokens) for r in requests]


def test_a_cancelled_long_prompt_stops_at_the_next_chunk(long_rope_judge):
    judge = long_rope_judge
    long = chat_ids(judge, "Judge this long answer. " + "The boat leaves the harbour at night. " * 40)
    decoder = judge_decoder(judge, "cpu", None, columns=[], prefill_budget=64)
    chunks = -(-len(long) // 64)
    assert chunks > 6
    gone = Request(0, long, max_new_tokens=4, cancelled=lambda: decoder.runner.prefills >= 3)
    (done,), = list(decoder.generate([gone], no_images, 4))
    assert done.finish_reason == "cancelled" and done.tokens == []
    assert decoder.runner.prefills == 3 and decoder.runner.steps == 0  # the chunk under way when it was cancelled was the last


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen2.5-vl-7b", "qwen3-vl-4b"])
def test_a_chunked_prefill_of_a_qwen_judge_keeps_its_image_grid_positions_and_deepstack_features(family, tmp_path):
    """M-RoPE (3-D positions over each image's grid) and Qwen3-VL's DeepStack features for the image tokens:
    a chunk takes its part of the prompt's positions and of its image tokens' features, so that a prompt cut
    through its images writes what it writes whole."""
    from mmjudge.judge.testing.families import write_family_checkpoint

    judge = load_judge(write_family_checkpoint(family, tmp_path / "judge"))
    data = write_dataset(tmp_path / "data", 4, seed=0).parent
    items = prepare(judge, enumerate(load_samples(data / "data.json", data)), load_rubrics(), data, ScoreOptions())
    assert all(item.n_tiles > 0 for item in items) and min(len(item.input_ids) for item in items) > 3 * CHUNK // 2
    whole, _ = run(judge, items, None)
    chunked, decoder = run(judge, items, CHUNK // 2)
    assert decoder.runner.prefills > 2 * len(items)  # every prompt in several chunks, cut through its image tokens
    for key, one in whole.items():
        assert chunked[key].tokens == one.tokens
        torch.testing.assert_close(chunked[key].top_logprobs, one.top_logprobs, rtol=0, atol=1e-4)


INTERNVL2_4B = SimpleNamespace(hidden_size=3072, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32, head_dim=None)  # Phi-3-mini's


@pytest.mark.parametrize("config", [INTERNVL2_4B, SimpleNamespace(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                                                   num_key_value_heads=4, head_dim=None)], ids=["internvl2-4b", "tiny"])
def test_a_chunk_costs_no_more_deep_into_a_long_prompt_than_the_budget_at_its_start(config):
    """Issue 45, item 6: a chunk's attention grows with the prompt before it, so a fixed chunk of 512 tokens at
    60,000 held every decoding step beside it for seconds. Each chunk is the longest whose multiply-adds stay
    within the budget's at the prompt's start (or twice their linear layers'): whole chunks while attention is
    cheap, fewer tokens deeper in, never none."""
    weight = attention_weight(config)
    for budget in (64, 512, 2048):
        allowed = max(chunk_cost(budget, 0, weight), 2 * budget)
        sizes = [chunk_size(budget, start, weight) for start in range(0, 131_072, 997)]
        assert sizes[0] == budget and sizes == sorted(sizes, reverse=True) and sizes[-1] >= 1
        for start, size in zip(range(0, 131_072, 997), sizes):
            assert (chunk_cost(size, start, weight) <= allowed or size == 1) and (size == budget or chunk_cost(size + 1, start, weight) > allowed)
    if config is INTERNVL2_4B:  # a 512-token chunk at 60,000 tokens costs 2.1 times its bound: 239 tokens cost it
        assert chunk_cost(512, 60_000, weight) > 2 * max(chunk_cost(512, 0, weight), 1024) and chunk_size(512, 60_000, weight) == 239
        assert chunk_size(512, 16_000, weight) == 512  # attention below the linear layers' cost: whole chunks


@pytest.mark.slow
def test_each_decoding_step_beside_a_long_prompt_waits_for_one_chunk_within_the_budgets_cost(long_rope_judge, monkeypatch):
    """The rule in the decoder, counted rather than timed: every chunk of a long prompt is within its cost
    bound, the chunks shrink as the prompt grows, and the short request beside it takes one decoding step
    between each two chunks: none waits for more than one bounded chunk."""
    judge, budget = long_rope_judge, 256
    long = chat_ids(judge, "Judge this long answer. " + "The boat leaves the harbour at night, and the sea is grey. " * 240)
    decoder = judge_decoder(judge, "cpu", None, columns=[], prefill_budget=budget)
    chunks = []  # (start, end, decoding steps run before it)
    prefill_chunk = decoder.runner.prefill_chunk
    monkeypatch.setattr(decoder.runner, "prefill_chunk", lambda rows, cache, prompt, end: chunks.append((rows[0].position, end, decoder.runner.steps))
                        or prefill_chunk(rows, cache, prompt, end))
    requests = [Request(0, long, max_new_tokens=1), Request(1, chat_ids(judge, "Score it."), max_new_tokens=200)]
    list(decoder.generate(requests, no_images, 200, joining=lambda take: None))
    weight, allowed = decoder.scheduler.attention_weight, max(chunk_cost(budget, 0, decoder.scheduler.attention_weight), 2 * budget)
    assert chunks[-1][1] == len(long) and [start for start, _, _ in chunks[1:]] == [end for _, end, _ in chunks[:-1]]
    assert all(chunk_cost(end - start, start, weight) <= allowed for start, end, _ in chunks)
    assert chunks[0][1] - chunks[0][0] > 2 * (chunks[-2][1] - chunks[-2][0])  # shrunk more than twofold by the end
    # from the short request's first step on (its prompt is prefilled beside the long one's first chunk), one step per chunk
    assert [after - before for (_, _, before), (_, _, after) in zip(chunks[1:], chunks[2:])] == [1] * (len(chunks) - 2)
