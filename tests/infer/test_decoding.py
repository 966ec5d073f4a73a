"""The decoder behind judge-score (infer/decoding.py) on the tiny judge: each row computed as it would be
alone, whatever its batch, its slot or its neighbours' lengths; and equal to transformers' own generate."""

import inspect
from dataclasses import replace
import warnings

import pytest
import torch
import transformers
from transformers import GenerationConfig

from mmjudge.infer.cache import SlotCache
from mmjudge.infer.decoding import Completion, Decoder
from mmjudge.infer.engine import Scorer, _load_pixels, judge_decoder, prepare, unwritable_tokens
from mmjudge.infer.options import ScoreOptions
from mmjudge.infer.runner import Runner
from mmjudge.infer.sampler import Sampling
from mmjudge.infer.scheduler import Request
from mmjudge.judge.data import load_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_dataset, write_original_checkpoint

# The tiny dataset's prompts run from 673 to 781 tokens with --max_tiles 2: a long-rope switch at 700
# puts prompts on both sides of it, and 16 new tokens take the prompts just under it across it.
ROPE_SWITCH = 700


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), 8, seed=0).parent


@pytest.fixture(scope="module")
def samples(dataset):
    return list(enumerate(load_samples(dataset / "data.json", dataset)))


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    return load_judge(write_original_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0))


@pytest.fixture(scope="module")
def long_rope_judge(tmp_path_factory):
    return load_judge(write_original_checkpoint(tmp_path_factory.mktemp("long-rope"), seed=0, original_max_position_embeddings=ROPE_SWITCH))


def records(judge, samples, dataset, **options):
    rubrics = load_rubrics()
    options = ScoreOptions(max_tiles=2, **options)
    items = prepare(judge, samples, rubrics, dataset, options)
    return {r.id: r for batch in Scorer(judge, rubrics, options, "cpu").run(items) for _, r in batch}


def assert_same_records(batched, alone):
    assert batched.keys() == alone.keys()
    for key, one in alone.items():
        other = batched[key]
        assert (other.feedback, other.score, other.criteria, other.generated_tokens) == (one.feedback, one.score, one.criteria, one.generated_tokens)
        assert other.score_distribution.keys() == one.score_distribution.keys()
        assert other.score_distribution == pytest.approx(one.score_distribution, abs=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["generate", "logits"])
def test_a_record_is_the_same_in_one_large_batch_and_alone_on_both_sides_of_the_long_rope_switch(long_rope_judge, samples, dataset, mode):
    """Phi-3's long rope picks its factors from the largest position of a forward call; batched with a
    longer prompt, a short one used to get the long factors and another score. Each row now has its own."""
    new_tokens = 16 if mode == "generate" else 1
    batched = records(long_rope_judge, samples, dataset, mode=mode, max_new_tokens=new_tokens, token_budget=10**7)
    alone = records(long_rope_judge, samples, dataset, mode=mode, max_new_tokens=new_tokens, token_budget=1)
    prompts = [r.prompt_tokens for r in alone.values()]
    assert min(prompts) < ROPE_SWITCH < max(prompts)
    if mode == "generate":  # some rows cross the switch while they write (and while their score heading is forced)
        assert any(r.prompt_tokens < ROPE_SWITCH < r.prompt_tokens + r.generated_tokens for r in alone.values())
        assert len({r.feedback for r in alone.values()}) > 1  # not a degenerate constant output
    assert_same_records(batched, alone)


@pytest.mark.slow
def test_a_long_rope_judge_alone_writes_what_transformers_generate_writes(long_rope_judge, samples, dataset):
    """Batch size 1 through transformers' own generate is the reference (MMIE's loop): same tokens, and
    the recorded score logits are the very values of its full logits, at every step."""
    judge = long_rope_judge
    rubrics = load_rubrics()
    options = ScoreOptions(max_new_tokens=12, max_tiles=2, token_budget=10**7)
    items = prepare(judge, samples, rubrics, dataset, options)
    scorer = Scorer(judge, rubrics, options, "cpu")
    decoder = scorer.decoder
    requests = [Request(i, item.input_ids.long()) for i, item in enumerate(items)]
    completions = {c.index: c for done in decoder.generate(requests, _loader(items), 12) for c in done}
    suppress = unwritable_tokens(judge)
    for i, item in enumerate(items):
        pixels = _load_pixels(item, torch.float32, pin=False)
        config = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=list(judge.stop_ids), pad_token_id=decoder.runner.pad_id,
                                  suppress_tokens=suppress, return_dict_in_generate=True, output_logits=True)
        ids = item.input_ids[None].long()
        reference = judge.model.generate(input_ids=ids, **({} if pixels is None else judge.backbone.model_inputs(pixels)), generation_config=config)
        assert completions[i].tokens == reference.sequences[0, ids.shape[1]:].tolist()
        full = torch.stack(reference.logits, dim=1)[0]  # (steps, vocabulary)
        torch.testing.assert_close(completions[i].logits, full[:, decoder.sampler.columns], rtol=0, atol=1e-5)


def _loader(items):
    from concurrent.futures import Future

    def load(request):
        future = Future()
        future.set_result(_load_pixels(items[request.index], torch.float32, pin=False))
        return future

    return load


@pytest.mark.slow
def test_follow_up_tokens_read_what_a_forward_pass_over_the_whole_text_reads(judge, samples, dataset):
    """The forced score heading is fed after what the judge wrote, through its own cache; one forward pass
    over prompt, output and heading, alone, reads the same logits."""
    rubrics = load_rubrics()
    options = ScoreOptions(max_new_tokens=6, max_tiles=2, token_budget=10**7)
    items = prepare(judge, samples[:4], rubrics, dataset, options)
    scorer = Scorer(judge, rubrics, options, "cpu")
    heading = scorer.forced_heading
    requests = [Request(i, item.input_ids.long()) for i, item in enumerate(items)]
    completions = list(c for done in scorer.decoder.generate(requests, _loader(items), 6, lambda i, t: list(heading), len(heading)) for c in done)
    assert len(completions) == 4
    for completion in completions:
        item = items[completion.index]
        written = [t for t in completion.tokens if t not in judge.stop_ids]
        pixels = _load_pixels(item, torch.float32, pin=False)
        ids = torch.tensor([[*item.input_ids.tolist(), *written, *heading]])
        logits = judge.model(input_ids=ids, **({} if pixels is None else judge.backbone.model_inputs(pixels))).logits[0, -1]
        torch.testing.assert_close(completion.follow_up_logits, logits[scorer.decoder.sampler.columns], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_rows_that_stop_early_leave_their_slot_to_the_next_prompt_and_write_what_they_write_alone(judge, samples, dataset, monkeypatch):
    """A token the random judge writes at different steps in different samples stands in for its stop
    token. With two slots for eight prompts, a prompt starts as soon as a slot frees, not when its batch
    ends, and every output equals its batch-1 output."""
    rubrics = load_rubrics()
    free_run = records(judge, samples, dataset, max_new_tokens=8, token_budget=10**7)
    tokens = {key: judge.tokenizer(r.feedback, add_special_tokens=False).input_ids for key, r in free_run.items()}
    firsts = {}
    for written in tokens.values():
        for step, token in enumerate(written):
            firsts.setdefault(token, {}).setdefault(id(written), step)
    stop = max(firsts, key=lambda t: len(set(firsts[t].values())))
    outputs, steps = {}, {}
    capacity = max(len(i.input_ids) for i in prepare(judge, samples, rubrics, dataset, ScoreOptions(max_tiles=2))) + 8 + 8
    for budget in (2 * capacity, 1):
        options = ScoreOptions(max_new_tokens=8, token_budget=budget, max_tiles=2)
        scorer = Scorer(judge, rubrics, options, "cpu")
        monkeypatch.setitem(judge.__dict__, "stop_ids", (stop,))  # the judge's cached stop tokens: its answers end there
        scorer.decoder.stop_ids = frozenset({stop})
        scorer._follow_up = lambda item, tokens: []  # count the written tokens' steps only
        count = []
        run_step = scorer.decoder.runner.run_step
        monkeypatch.setattr(scorer.decoder.runner, "run_step", lambda *args: count.append(1) or run_step(*args))
        items = prepare(judge, samples, rubrics, dataset, options)
        outputs[budget] = {r.id: (r.feedback, r.generated_tokens) for batch in scorer.run(items) for _, r in batch}
        steps[budget] = len(count)
    assert outputs[2 * capacity] == outputs[1]
    lengths = [n for _, n in outputs[1].values()]
    assert min(lengths) < 8 and max(lengths) == 8  # some stopped while others went on
    # A row's first token comes from its prefill, each other from a step. One slot: a step per token. Two
    # slots kept busy: about half, and at most what pairs that wait for their longer row would take.
    by_prompt = [outputs[1][item.sample.id][1] for item in sorted(items, key=lambda item: -len(item.input_ids))]
    assert steps[1] == sum(n - 1 for n in lengths)
    assert steps[2 * capacity] <= sum(max(pair) - 1 for pair in zip(by_prompt[::2], by_prompt[1::2]))
    assert steps[2 * capacity] <= steps[1] / 2 + 8


def test_prefill_groups_hold_at_most_the_budget_longest_first_and_drop_nothing(judge):
    decoder = Decoder(judge.model, device="cpu", pad_id=0, stop_ids=(), suppress=[], columns=torch.tensor([1]), token_budget=1200)
    lengths = [2000, 900, 300, 300, 100, 50]
    requests = [Request(i, torch.ones(n, dtype=torch.long)) for i, n in enumerate(lengths)]
    from mmjudge.infer.scheduler import Lookahead

    waiting = Lookahead(requests, 3, lambda request: None)
    groups = []
    while waiting:
        groups.append([r.index for r, _ in decoder.scheduler.group(waiting, 8)])
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert groups[0] == [0]  # longer than the budget: alone, not dropped
    for g in groups[1:]:
        assert len(g) * max(lengths[i] for i in g) <= 1200
    assert groups == [[0], [1], [2, 3, 4, 5]]


def test_requests_are_cut_where_a_cache_would_hold_twice_the_slots():
    """Every slot of a cache holds its longest request: a benchmark's one longest prompt must not size the
    slots of all the others."""
    from mmjudge.infer.scheduler import segments

    requests = [Request(i, torch.ones(n, dtype=torch.long)) for i, n in enumerate([2000, 1500, 900, 800, 300, 100])]
    assert [[len(r.input_ids) for r in segment] for segment in segments(requests, lambda r: len(r.input_ids) + 100)] == [[2000, 1500], [900, 800], [300], [100]]


@pytest.mark.slow
def test_out_of_memory_in_prefill_splits_the_group_instead_of_losing_samples(judge, samples, dataset, monkeypatch):
    # prompts prefilled whole, in groups: with the prefix cache each prompt of a judge is a group of its own
    expected = records(judge, samples, dataset, max_new_tokens=4, token_budget=10**7, prefix_cache=0)
    prefill, sizes = Runner.prefill, []

    def small_memory(self, group, *args):  # a device that prefills at most 2 prompts at once
        sizes.append(len(group))
        if len(group) > 2:
            raise torch.OutOfMemoryError("simulated")
        return prefill(self, group, *args)

    monkeypatch.setattr(Runner, "prefill", small_memory)
    assert_same_records(records(judge, samples, dataset, max_new_tokens=4, token_budget=10**7, prefix_cache=0), expected)
    assert sizes[0] == 8 and max(s for s in sizes if s <= 2) == 2


def test_top_logprobs_are_those_of_transformers_logits_and_each_request_stops_at_its_own_limit(long_rope_judge, samples, dataset):
    """A chat request's answer (judge-serve): its own max_new_tokens, and each step's k likeliest tokens with
    their log-probabilities over the whole vocabulary, the written token first; the reference is batch-1
    transformers generate, whose logits are log-softmaxed with the same tokens suppressed."""
    judge, k = long_rope_judge, 5
    options = ScoreOptions(max_tiles=2, token_budget=10**7)
    items = prepare(judge, samples, load_rubrics(), dataset, options)
    scorer = Scorer(judge, load_rubrics(), options, "cpu")
    decoder = scorer.decoder
    limits = [3 + i % 4 for i in range(len(items))]
    requests = [Request(i, item.input_ids.long(), max_new_tokens=limits[i]) for i, item in enumerate(items)]
    requests.sort(key=lambda r: -len(r.input_ids))
    completions = {c.index: c for done in decoder.generate(requests, _loader(items), max(limits), top_logprobs=k) for c in done}
    suppress = unwritable_tokens(judge)
    for i, item in enumerate(items):
        pixels = _load_pixels(item, torch.float32, pin=False)
        config = GenerationConfig(max_new_tokens=limits[i], do_sample=False, eos_token_id=list(judge.stop_ids), pad_token_id=decoder.runner.pad_id,
                                  suppress_tokens=suppress, return_dict_in_generate=True, output_logits=True)
        ids = item.input_ids[None].long()
        reference = judge.model.generate(input_ids=ids, **({} if pixels is None else judge.backbone.model_inputs(pixels)), generation_config=config)
        written = reference.sequences[0, ids.shape[1]:].tolist()
        assert completions[i].tokens == written and len(written) == limits[i]  # the random judge never stops early
        full = torch.stack(reference.logits, dim=1)[0].float()
        full[:, suppress] = float("-inf")
        values, top_ids = full.log_softmax(-1).topk(k, dim=-1)
        assert completions[i].top_ids.tolist() == top_ids.tolist() and completions[i].top_ids[:, 0].tolist() == written
        torch.testing.assert_close(completions[i].top_logprobs, values, rtol=0, atol=1e-5)


def test_scoring_asks_for_no_top_logprobs_and_computes_none(judge, samples, dataset, monkeypatch):
    calls = []
    log_softmax = torch.Tensor.log_softmax
    monkeypatch.setattr(torch.Tensor, "log_softmax", lambda self, *args, **kwargs: calls.append(1) or log_softmax(self, *args, **kwargs))
    completions = records(judge, samples[:2], dataset, max_new_tokens=3, token_budget=10**7)
    assert len(completions) == 2 and not calls


# -- the cache's contract with transformers' attention ----------------------------------------------------

def test_the_slot_cache_takes_every_call_transformers_cache_update_takes():
    """Attention stores keys and values through transformers' public `Cache.update(key_states, value_states,
    layer_idx, *args, **kwargs)`; 5.24's attention passes `kwargs=`, which the cache's narrower signature
    refused (judge-score's first sample: TypeError)."""
    public = inspect.signature(transformers.Cache.update).parameters.values()
    ours = inspect.signature(SlotCache.update).parameters.values()
    assert [(p.name, p.kind) for p in ours] == [(p.name, p.kind) for p in public]
    cache = SlotCache(layers=2, slots=3, heads=2, capacity=8, head_dim=4, dtype=torch.float32, device="cpu")
    cache.positions = torch.tensor([0, 5, 2])
    key, value = torch.randn(3, 2, 1, 4), torch.randn(3, 2, 1, 4)
    keys, values = cache.update(key_states=key, value_states=value, layer_idx=1, kwargs={"position_ids": None})
    assert torch.equal(keys[[0, 1, 2], :, [0, 5, 2]], key[:, :, 0]) and torch.equal(values[[0, 1, 2], :, [0, 5, 2]], value[:, :, 0])
    assert not cache.keys[0].any()


def test_decoding_passes_the_cache_as_the_installed_transformers_names_it(judge, prompts):
    """5.24 renamed the decoder layers' cache argument (`past_key_values` to `cache`): the old name warns, and
    from 5.40 would reach attention as an unknown keyword, leaving every step with no cache. The decoder
    passes it under the name the layers declare: no warning, and greedy tokens equal to transformers'."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        written = answers(chat_decoder(judge), [Request(0, prompts[0], max_new_tokens=6)])[0, 0].tokens
    reference = judge.model.generate(input_ids=prompts[0][None], max_new_tokens=6, do_sample=False, eos_token_id=None,
                                     suppress_tokens=unwritable_tokens(judge), pad_token_id=0)
    assert written == reference[0, len(prompts[0]):].tolist()


# -- sampling, choices, ending early (judge-serve's chat answers) -----------------------------------------

QUESTIONS = ["Is this answer good?", "Rate the answer to the question about the picture, and say why in a few words.",
             "Score it.", "The answer names the wrong color of the car; how many points does it lose, and what would a careful judge write?"]


def chat_ids(judge, text: str) -> torch.Tensor:

    return judge.tokenizer(judge.settings.template.render(text), return_tensors="pt").input_ids[0]


def no_images(request):
    from concurrent.futures import Future

    future = Future()
    future.set_result(None)
    return future


def answers(decoder, requests, max_new_tokens=8, **options) -> dict[tuple[int, int], Completion]:
    """Every choice's completion by (request index, choice)."""
    return {(c.index, c.choice): c for done in decoder.generate(requests, no_images, max_new_tokens, **options) for c in done}


def tokens_of(completions) -> dict:
    return {key: c.tokens for key, c in completions.items()}


@pytest.fixture(scope="module")
def prompts(judge):
    return [chat_ids(judge, q) for q in QUESTIONS]


def chat_decoder(judge, token_budget=None):
    return judge_decoder(judge, "cpu", token_budget, columns=[])


@pytest.mark.slow
def test_a_seeded_sampled_answer_is_the_same_alone_and_beside_any_other_requests_in_any_order(judge, prompts):
    """Each choice draws from its own generator, seeded from the request's seed and its index: neither its
    slot, nor the rows beside it, nor the order or budgets of the batch change what it writes."""
    sampled = Sampling(temperature=0.8, top_p=0.95, top_k=200, seed=1234)
    target = lambda: Request(0, prompts[0], max_new_tokens=10, sampling=sampled)  # noqa: E731
    others = lambda: [Request(1, prompts[1], max_new_tokens=4), Request(2, prompts[2], max_new_tokens=12, sampling=Sampling(1.0, seed=5)),  # noqa: E731
                      Request(3, prompts[3], max_new_tokens=6, sampling=Sampling(0.6, top_k=20, seed=5), n=2)]
    alone = answers(chat_decoder(judge), [target()])[0, 0]
    greedy = answers(chat_decoder(judge), [Request(0, prompts[0], max_new_tokens=10)])[0, 0]
    assert len(alone.tokens) == 10 and alone.tokens != greedy.tokens  # it samples
    each_alone = {key: c for r in others() for key, c in answers(chat_decoder(judge), [r]).items()}
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [2, 0, 3, 1]):
        for budget in (None, 1):  # every row in its own slot at once, or one slot taken in turn
            requests = [target(), *others()]
            batched = answers(chat_decoder(judge, budget), [requests[k] for k in order], max_new_tokens=3)
            assert batched[0, 0].tokens == alone.tokens
            assert tokens_of({key: batched[key] for key in each_alone}) == tokens_of(each_alone)


@pytest.mark.slow
def test_n_choices_from_one_prefill_are_the_choices_each_prefilled_alone(judge, prompts):
    """n answers share one prefill, its keys and values written into n slots; with one slot, each choice is
    prefilled in turn. The same answers either way; choice 0 is the answer of n = 1; the choices differ,
    and so do the seeds."""
    request = lambda seed, n: Request(0, prompts[1], max_new_tokens=8, sampling=Sampling(0.7, seed=seed), n=n)  # noqa: E731
    forked_decoder, turns_decoder = chat_decoder(judge), chat_decoder(judge, token_budget=1)
    forked = answers(forked_decoder, [request(99, 4)])
    in_turn = answers(turns_decoder, [request(99, 4)])
    assert (forked_decoder.runner.prefills, turns_decoder.runner.prefills) == (1, 4)
    assert sorted(forked) == [(0, c) for c in range(4)] and tokens_of(forked) == tokens_of(in_turn)
    assert answers(chat_decoder(judge), [request(99, 1)])[0, 0].tokens == forked[0, 0].tokens
    assert len({tuple(c.tokens) for c in forked.values()}) == 4
    assert answers(chat_decoder(judge), [request(100, 1)])[0, 0].tokens != forked[0, 0].tokens


@pytest.mark.slow
def test_temperature_0_top_k_1_and_a_tiny_top_p_write_the_greedy_answer(judge, prompts):
    requests = lambda sampling: [Request(k, ids, max_new_tokens=8, sampling=sampling) for k, ids in enumerate(prompts)]  # noqa: E731
    greedy = tokens_of(answers(chat_decoder(judge), requests(Sampling())))
    for sampling in (Sampling(temperature=0.0, seed=3), Sampling(temperature=1.5, top_k=1, seed=3), Sampling(temperature=1.5, top_p=1e-6, seed=3)):
        assert tokens_of(answers(chat_decoder(judge), requests(sampling))) == greedy
    assert tokens_of(answers(chat_decoder(judge), requests(Sampling(temperature=1.5, seed=3)))) != greedy


@pytest.mark.slow
def test_top_k_keeps_every_drawn_token_among_the_k_likeliest_and_the_written_token_comes_first(judge, prompts):
    """The written token leads each step's top log-probabilities (the model's own, whatever the temperature):
    with k + 1 of them, a token among the k likeliest is at least the last one shown."""
    k = 3
    def drawn(sampling):
        requests = [Request(i, ids, max_new_tokens=12, sampling=sampling, n=3) for i, ids in enumerate(prompts)]
        return answers(chat_decoder(judge), requests, top_logprobs=k + 1).values()

    def among_top_k(c):
        return (c.top_logprobs[:, 0] >= c.top_logprobs[:, 1:].min(-1).values).tolist()

    for c in drawn(Sampling(temperature=2.0, top_k=k, seed=7)):
        assert c.top_ids[:, 0].tolist() == c.tokens and all(among_top_k(c))
    assert not all(step for c in drawn(Sampling(temperature=2.0, seed=7)) for step in among_top_k(c))  # without the cut, some are not


def test_inverse_cdf_sampling_reads_each_rows_number_off_its_filtered_distribution():
    """Probabilities 0.5, 0.3, 0.15, 0.05 (and a suppressed token): the number u picks the first token whose
    cumulative probability, renormalized over what top-k and top-p keep, passes u."""
    from mmjudge.infer.sampler import Draws, sample

    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])
    logits = torch.cat([probs.log(), torch.tensor([float("-inf")])])

    def draw(u, temperature=1.0, top_p=1.0, top_k=0):
        draws = Draws(torch.tensor([temperature]), torch.tensor([top_p]), torch.tensor([top_k]), torch.tensor([u]))
        return sample(logits[None], draws).item()

    # sorted: token 1 (0.5), 3 (0.3), 0 (0.15), 2 (0.05)
    assert [draw(u) for u in (0.0, 0.49, 0.51, 0.79, 0.81, 0.94, 0.96, 0.9999999)] == [1, 1, 3, 3, 0, 0, 2, 2]
    assert [draw(u, top_p=0.7) for u in (0.0, 0.62, 0.63, 0.9999999)] == [1, 1, 3, 3]  # 0.5 + 0.3 reach 0.7: 5/8 each side
    assert [draw(u, top_p=0.5) for u in (0.0, 0.9999999)] == [1, 1]  # 0.5 reaches 0.5
    assert [draw(u, top_k=2) for u in (0.62, 0.63)] == [1, 3]
    assert [draw(u, top_k=3, top_p=0.99) for u in (0.0, 0.9999999)] == [1, 0]
    assert draw(0.9, temperature=1e-3) == 1  # a cold row is nearly greedy
    # a hot row flattens the distribution to nearly a quarter each: token 2 from 0.754 on
    assert [draw(u, temperature=100.0) for u in (0.25, 0.26, 0.75, 0.76)] == [1, 3, 0, 2]
    ties = torch.zeros(1, 4)  # equal probabilities: token order
    assert [sample(ties, Draws(torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([0]), torch.tensor([u]))).item()
            for u in (0.1, 0.3, 0.6, 0.9)] == [0, 1, 2, 3]


def test_on_token_returning_false_ends_the_choice_after_that_token_and_no_step_is_run_for_it(judge, prompts):
    told = []

    def on_token(choice, token):
        told.append((choice, token))
        return len(told) < 3

    decoder = chat_decoder(judge)
    full = answers(chat_decoder(judge), [Request(0, prompts[0], max_new_tokens=10)])[0, 0]
    ended = answers(decoder, [Request(0, prompts[0], max_new_tokens=10, on_token=on_token)])[0, 0]
    assert ended.tokens == full.tokens[:3] and ended.finish_reason == "ended" and full.finish_reason == "length"
    assert told == [(0, t) for t in full.tokens[:3]]
    assert decoder.runner.steps == 2  # the first token from the prefill, two from steps, none after
    # beside a request that goes on, the one that goes on writes what it writes alone
    other = Request(1, prompts[1], max_new_tokens=10, sampling=Sampling(0.9, seed=1))
    alone = answers(chat_decoder(judge), [Request(1, prompts[1], max_new_tokens=10, sampling=Sampling(0.9, seed=1))])[1, 0]
    told.clear()
    both = answers(chat_decoder(judge), [Request(0, prompts[0], max_new_tokens=10, on_token=on_token), other])
    assert both[0, 0].tokens == full.tokens[:3] and both[1, 0].tokens == alone.tokens


def test_a_cancelled_request_computes_nothing_before_its_turn_and_nothing_more_after_the_next_step(judge, prompts):
    decoder = chat_decoder(judge)
    gone = answers(decoder, [Request(0, prompts[0], n=3, sampling=Sampling(1.0), cancelled=lambda: True)])
    assert (decoder.runner.prefills, decoder.runner.steps) == (0, 0)
    assert [(key, c.tokens, c.finish_reason) for key, c in sorted(gone.items())] == [((0, c), [], "cancelled") for c in range(3)]
    # cancelled while it writes (the flag set as its third token comes): it leaves its one slot, which the
    # next request takes; the steps are its own two and the next request's
    flag = []
    decoder = chat_decoder(judge, token_budget=1)
    requests = [Request(0, prompts[3], max_new_tokens=10, on_token=lambda c, t: flag.append(t) or True, cancelled=lambda: len(flag) >= 3),
                Request(1, prompts[1], max_new_tokens=5)]
    done = answers(decoder, requests)
    full = answers(chat_decoder(judge), [Request(0, prompts[3], max_new_tokens=10)])[0, 0]
    assert done[0, 0].finish_reason == "cancelled" and done[0, 0].tokens == full.tokens[:3]
    assert done[1, 0].finish_reason == "length" and len(done[1, 0].tokens) == 5
    assert decoder.runner.prefills == 2 and decoder.runner.steps == 2 + 4


@pytest.mark.slow
def test_a_request_may_ask_for_more_than_generates_limit_up_to_the_context(judge, prompts):
    """generate's max_new_tokens is only the default: a request's own limit may be higher, its slot sized
    for it; prompt and answer together stay within the model's context, the answer cut there ("length")."""
    long = answers(chat_decoder(judge), [Request(0, prompts[0], max_new_tokens=40), Request(1, prompts[1])], max_new_tokens=4)
    assert len(long[0, 0].tokens) == 40 and len(long[1, 0].tokens) == 4
    decoder = chat_decoder(judge)
    assert decoder.scheduler.context == judge.model.config.text_config.max_position_embeddings
    decoder.scheduler.context = len(prompts[0]) + 25
    cut = answers(decoder, [Request(0, prompts[0], max_new_tokens=40), Request(1, prompts[1], max_new_tokens=40)])
    assert cut[0, 0].tokens == long[0, 0].tokens[:25] and cut[0, 0].finish_reason == "length"
    assert len(cut[1, 0].tokens) == 25 + len(prompts[0]) - len(prompts[1])


def full_logprobs(completion: Completion, size: int) -> torch.Tensor:
    """(tokens, vocabulary): each step's log-probabilities of every token, from top_logprobs of the whole vocabulary."""
    return torch.full((len(completion.tokens), size), float("-inf")).scatter(1, completion.top_ids, completion.top_logprobs)


@pytest.mark.slow
def test_penalties_take_presence_and_frequency_off_each_tokens_logit_by_its_count_in_the_answer(judge, prompts):
    """OpenAI's rule, computed by hand from the model's own log-probabilities at each step (which the
    penalties leave as they are): the token written is the argmax, or the draw, of logprob - presence *
    (count > 0) - frequency * count, over the tokens written before it. Greedy and sampled rows alike, beside
    a row without penalties, which writes what it writes alone."""
    from mmjudge.infer.sampler import Draws, generator, sample

    decoder = chat_decoder(judge)
    size = decoder.runner.vocab_size
    settings = [Sampling(presence_penalty=1.5, frequency_penalty=0.5), Sampling(presence_penalty=-0.5, frequency_penalty=2.0),
                Sampling(temperature=0.9, seed=11, presence_penalty=2.0, frequency_penalty=1.0)]
    requests = [Request(k, prompts[k], max_new_tokens=12, sampling=s) for k, s in enumerate(settings)] + [Request(3, prompts[3], max_new_tokens=12)]
    done = answers(decoder, requests, top_logprobs=size)
    plain = answers(chat_decoder(judge), [Request(k, prompts[k], max_new_tokens=12, sampling=replace(s, presence_penalty=0, frequency_penalty=0))
                                          for k, s in enumerate(settings)])
    for k, sampling in enumerate(settings):
        completion = done[k, 0]
        assert completion.tokens != plain[k, 0].tokens  # the penalties change the answer
        own = generator(sampling, 0)
        for step, logprobs in enumerate(full_logprobs(completion, size)):
            counts = torch.bincount(torch.tensor(completion.tokens[:step], dtype=torch.long), minlength=size).float()
            penalized = logprobs - sampling.presence_penalty * (counts > 0) - sampling.frequency_penalty * counts
            uniform = torch.rand((), generator=own) if own is not None else None
            if uniform is None:
                expected = int(penalized.argmax())
            else:
                expected = sample(penalized[None], Draws(torch.tensor([sampling.temperature]), torch.tensor([1.0]), torch.tensor([0]), uniform[None])).item()
            assert completion.tokens[step] == expected, (k, step)
    assert done[3, 0].tokens == answers(chat_decoder(judge), [Request(3, prompts[3], max_new_tokens=12)])[3, 0].tokens


def test_penalties_count_each_rows_written_tokens_and_a_steps_inputs_read_back_as_its_arguments():
    """The host side of a penalized step: each row's penalty vector by hand, none for a row without penalties,
    an empty slot or a row fed follow-up tokens; and the graph's flat inputs read back in _step's order for
    every mix of draws, masks and penalties (what a CUDA graph captures and replays)."""
    from mmjudge.infer.runner import step_arguments, step_inputs
    from mmjudge.infer.sampler import Draws, penalties_of
    from mmjudge.infer.scheduler import Row

    def row(tokens, **penalties):
        return Row(Request(0, torch.tensor([1]), sampling=Sampling(**penalties)), position=1, tokens=tokens)

    rows = [row([2, 2, 5], presence_penalty=0.5, frequency_penalty=0.25), None, row([1, 1], presence_penalty=0.0), row([3], frequency_penalty=-1.0)]
    assert penalties_of([rows[1], rows[2]], 6) is None and penalties_of([row([], presence_penalty=1.0)], 6) is None
    assert penalties_of(rows, 6).tolist() == [[0, 0, 0.5 + 0.5, 0, 0, 0.5 + 0.25], [0] * 6, [0] * 6, [0, 0, 0, -1.0, 0, 0]]
    rows[0].following = True
    assert penalties_of(rows, 6)[0].tolist() == [0] * 6
    tokens, masks, penalties = torch.arange(4), torch.ones(4, 1, dtype=torch.int32), torch.ones(4, 6)
    draws = Draws(torch.ones(4), torch.ones(4), torch.zeros(4, dtype=torch.long), torch.zeros(4))
    for given in [(d, m, p) for d in (None, draws) for m in (None, masks) for p in (None, penalties)]:
        inputs = step_inputs(tokens, *given)
        read = step_arguments(inputs, *(g is not None for g in given))
        assert read[0] is tokens and read[2] is given[1] and read[3] is given[2]
        assert read[1] is None if given[0] is None else all(a is b for a, b in zip(read[1], draws))
