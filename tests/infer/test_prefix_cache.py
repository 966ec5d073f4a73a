"""The prefix cache (infer/prefix_cache.py): the answers to one question prefill its shared part (rubric,
question, images) once, and a prompt whose shared part came from the cache is the same bits as the same
prompt prefilled fresh: its score distribution, expected score and written text, alone and in a batch, after
an eviction too, for InternVL and Qwen3-VL (M-RoPE, DeepStack) tiny judges, pointwise and pairwise. A shared
part with the same text beside another image is a miss; the cache holds no more than its limit; 0 turns it off."""

import socket
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmjudge.configs import CONFIG_DIR, DEFAULT_RUBRICS
from mmjudge.infer.engine import Scorer, prepare
from mmjudge.infer.options import MAX_PREFIX_CACHE, REWARD_PREFIX_CACHE_BYTES, ScoreOptions
from mmjudge.infer.prefix_cache import AGE_ASKS, Entry, PrefixCache, pixel_digest, prefix_key
from mmjudge.judge.data import Pair, Sample, Segment, UsageError
from mmjudge.judge.model import load_judge
from mmjudge.judge.parsing import SCORE_HEADING
from mmjudge.judge.prompts import encode_prompt, load_rubrics
from mmjudge.judge.testing.families import write_family_checkpoint

RUBRICS = load_rubrics([*DEFAULT_RUBRICS, CONFIG_DIR / "rubrics" / "pairwise.yaml"])
POINTWISE = "SA"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> list[Path]:
    """Four pictures of one size, each its own colour."""
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    for k, colour in enumerate(["red", "blue", "green", "white"]):
        Image.new("RGB", (96, 64), colour).save(root / f"{k}.png")
    return sorted(root.iterdir())


@pytest.fixture(scope="module", params=["qwen3-vl-4b", pytest.param("internvl2-4b", marks=pytest.mark.slow)])  # InternVL's tiles take seconds
def judge(request, checkpoint, tmp_path_factory):
    if request.param == "internvl2-4b":
        return load_judge(checkpoint)
    return load_judge(write_family_checkpoint(request.param, tmp_path_factory.mktemp(request.param)))


def group(images: list[Path], question_image: int = 0, size: int = 3) -> list[Sample]:
    """A GRPO group: one question and its image, `size` answers (one of them with an image of its own)."""
    question = [Segment(text="What does the picture show? Describe it."), Segment(image=str(images[question_image]))]
    return [Sample(id=str(k), question=question, category=POINTWISE,
                   answer=[Segment(text=f"It shows thing number {k}. " * (k + 1))] + ([Segment(image=str(images[3]))] if k == 2 else []))
            for k in range(size)]


def scored(scorer: Scorer, items) -> dict:
    return {index: result.model_dump() for batch in scorer.judged(items) for index, result in batch}


def options(mode: str, **given) -> ScoreOptions:
    return ScoreOptions(mode=mode, max_new_tokens=4, max_tiles=1, **{"prefix_cache": 16384, **given})


@pytest.mark.parametrize("mode", ["logits", pytest.param("generate", marks=pytest.mark.slow)])
def test_a_shared_part_from_the_cache_gives_the_same_bits_as_a_fresh_one(judge, images, mode):
    """A group scored together: the first answer prefills the shared part, the others copy it (two hits),
    and the whole group scored again (every one a hit) gives the same records, bit for bit. Each answer scored
    alone by a fresh decoder (a miss) and again (a hit) gives the same bits too; in logits mode, where the
    group's rests are one prefill (a CPU's products are not batch-invariant), alone and in the group are the
    same to float32 rounding (the bits: a deterministic decoder, test_a_deterministic_decoder_prefills_...)."""
    run = options(mode)
    items = prepare(judge, list(enumerate(group(images))), RUBRICS, Path("/"), run)
    shared = items[0].prefix
    assert shared > 0 and all(item.prefix == shared and torch.equal(item.input_ids[:shared], items[0].input_ids[:shared]) for item in items)
    assert "thing number" not in judge.tokenizer.decode(items[0].input_ids[:shared].tolist())  # cut before the answer
    scorer = Scorer(judge, RUBRICS, run, "cpu")
    first = scored(scorer, items)
    cache = scorer.decoder.runner.prefix_cache
    assert (cache.misses, cache.hits) == (1, 2)
    assert scored(scorer, items) == first and cache.hits == 5
    for k, item in enumerate(items[:2]):  # a miss and a hit in the group
        fresh = Scorer(judge, RUBRICS, run, "cpu")
        alone = scored(fresh, [item])
        assert fresh.decoder.runner.prefix_cache.misses == 1 and scored(fresh, [item]) == alone and fresh.decoder.runner.prefix_cache.hits == 1
        if mode == "logits":
            assert alone[k]["score_distribution"] == pytest.approx(first[k]["score_distribution"], abs=1e-6)
            assert alone[k]["expected_score"] == pytest.approx(first[k]["expected_score"], abs=1e-5)


def test_prompts_with_shared_parts_are_prefilled_together_each_shared_part_once(judge, images):
    """Two questions' groups in one logits-mode run, the same text beside two images: one pass prefills both
    shared parts (each once: two misses, the other answers two hits), one more every prompt's rest, against a
    pass per prompt and piece; each record is its prompt's alone, to float32 rounding."""
    samples = group(images, 0, 2) + group(images, 1, 2)
    items = prepare(judge, list(enumerate(samples)), RUBRICS, Path("/"), options("logits"))
    shared = items[0].prefix
    scorer = Scorer(judge, RUBRICS, options("logits"), "cpu")
    together = scored(scorer, items)
    decoder = scorer.decoder
    assert decoder.runner.prefills == 2 and (decoder.runner.prefix_cache.misses, decoder.runner.prefix_cache.hits) == (2, 2)
    assert decoder.runner.prefill_tokens == 2 * shared + sum(len(item.input_ids) - shared for item in items)
    assert together[0] != together[2]  # the other image's shared part
    for item in items:
        alone = scored(Scorer(judge, RUBRICS, options("logits"), "cpu"), [item])[item.index]
        assert alone["score_distribution"] == pytest.approx(together[item.index]["score_distribution"], abs=1e-6)


def test_a_part_the_cache_refused_serves_the_next_prefill_group(judge, images):
    """A cache too small to keep the shared part, and prefill groups of one prompt (as a server's round splits a
    GRPO group's answers among others of like length): the part is prefilled once, the next groups take it."""
    samples = list(enumerate(group(images)))
    longest = max(len(item.input_ids) for item in prepare(judge, samples, RUBRICS, Path("/"), options("logits")))
    run = options("logits", prefix_cache=8, token_budget=longest + 1)
    items = prepare(judge, samples, RUBRICS, Path("/"), run)
    scorer = Scorer(judge, RUBRICS, run, "cpu")
    scored(scorer, items)
    decoder, shared = scorer.decoder, items[0].prefix
    assert not decoder.runner.prefix_cache.entries and decoder.runner.prefills == 1 + len(items)  # the part once, each rest alone
    assert decoder.runner.prefill_tokens == shared + sum(len(item.input_ids) - shared for item in items)


def test_a_deterministic_decoder_prefills_each_cached_prompt_alone_to_the_same_bits(judge, images):
    """Logits mode with --deterministic: a group's prompts are prefilled one by one (the shared part once, then
    each rest in a pass of its own), so each record is its prompt's alone by a fresh decoder, bit for bit."""
    run = options("logits", deterministic=True)
    items = prepare(judge, list(enumerate(group(images))), RUBRICS, Path("/"), run)
    scorer = Scorer(judge, RUBRICS, run, "cpu")
    together = scored(scorer, items)
    assert scorer.decoder.runner.prefills == 1 + len(items)
    for item in items:
        assert scored(Scorer(judge, RUBRICS, run, "cpu"), [item])[item.index] == together[item.index]


def test_the_prefill_of_a_group_reads_its_shared_part_once(judge, images):
    """Prompt tokens prefilled for a group of 3: the shared part once and each answer's rest, against every
    prompt whole with the cache off."""
    on, off = options("logits"), options("logits", prefix_cache=0)
    samples = list(enumerate(group(images)))
    cached_items, whole_items = prepare(judge, samples, RUBRICS, Path("/"), on), prepare(judge, samples, RUBRICS, Path("/"), off)
    assert all(item.prefix == 0 for item in whole_items)
    cached, whole = Scorer(judge, RUBRICS, on, "cpu"), Scorer(judge, RUBRICS, off, "cpu")
    scored(cached, cached_items)
    scored(whole, whole_items)
    shared = cached_items[0].prefix
    assert whole.decoder.runner.prefix_cache is None and whole.decoder.runner.prefill_tokens == sum(len(item.input_ids) for item in whole_items)
    assert cached.decoder.runner.prefill_tokens == whole.decoder.runner.prefill_tokens - 2 * shared


def close(ours, theirs, abs_=1e-6):
    """Two records equal, their numbers within `abs_`: texts, verdicts and every key exact."""
    if isinstance(ours, dict):
        return isinstance(theirs, dict) and ours.keys() == theirs.keys() and all(close(ours[k], theirs[k], abs_) for k in ours)
    if isinstance(ours, list):
        return isinstance(theirs, list) and len(ours) == len(theirs) and all(map(close, ours, theirs, [abs_] * len(ours)))
    if isinstance(ours, float) and isinstance(theirs, float):
        return ours == pytest.approx(theirs, abs=abs_)
    return ours == theirs


def test_a_pairs_two_orders_share_their_question(judge, images):
    """Under a pairwise rubric a pair's two orders share the rubric and the question: the second order copies
    it, and each order's judgement is that order judged alone by a fresh decoder: its verdict exact, its
    distribution within 1e-6. Not to the bit: alone, the verdict's output layer runs on one row, and a CPU's BLAS
    may take another kernel for one row than for two (MKL on an AVX-512 Xeon does: a matrix-vector product, other
    bits at 1e-6 of these logits); the bits of a copied shared part are the fresh one's (the tests above), and bits
    in any batch are the deterministic mode's, on a GPU (tests/infer/test_batch_invariant.py)."""
    question = [Segment(text="Which answer describes the picture better?"), Segment(image=str(images[1]))]
    pair = Pair(id="p", question=question, answer_a=[Segment(text="A red square.")], answer_b=[Segment(text="Two blue circles on grey.")],
                category="general")
    run = options("logits")
    items = prepare(judge, [(0, pair)], RUBRICS, Path("/"), run)
    assert [item.view for item in items] == ["forward", "reverse"] and items[0].prefix == items[1].prefix > 0
    scorer = Scorer(judge, RUBRICS, run, "cpu")
    together = {item.view: result.model_dump() for batch in scorer.run(items) for item, result in batch}
    assert (scorer.decoder.runner.prefix_cache.misses, scorer.decoder.runner.prefix_cache.hits) == (1, 1)
    for item in items:
        alone = {i.view: result.model_dump() for batch in Scorer(judge, RUBRICS, run, "cpu").run([item]) for i, result in batch}
        assert close(alone[item.view], together[item.view]), (alone[item.view], together[item.view])


def test_an_evicted_shared_part_is_prefilled_again_to_the_same_bits(judge, images):
    """A cache that holds one shared part keeps the one asked for more often lately: a second question's group,
    asked for as often as the first's, is refused (the next prefill group still takes it); asked for more often,
    it evicts the first's, whose answers scored again prefill it afresh, to the same bits as at first."""
    first_group = prepare(judge, list(enumerate(group(images, 0, 2))), RUBRICS, Path("/"), options("logits"))
    second_group = prepare(judge, list(enumerate(group(images, 1, 2))), RUBRICS, Path("/"), options("logits"))
    run = options("logits", prefix_cache=first_group[0].prefix + 8)
    scorer = Scorer(judge, RUBRICS, run, "cpu")
    before = scored(scorer, first_group)
    second = scored(scorer, second_group)
    cache = scorer.decoder.runner.prefix_cache
    assert (cache.misses, cache.refusals, cache.evictions) == (2, 1, 0)
    assert scored(scorer, second_group) == second and cache.misses == 2  # the refused part, from the group before
    assert scored(scorer, first_group) == before and cache.misses == 2  # a hit, which lets the refused part go
    assert scored(scorer, second_group) == second and (cache.misses, cache.refusals, cache.evictions) == (3, 1, 1)
    assert cache.tokens <= cache.limit and len(cache.entries) == 1
    assert scored(scorer, first_group) == before and (cache.misses, cache.refusals) == (4, 2)


def test_the_same_text_beside_another_image_is_a_miss(judge, images):
    """Two questions of the same words, each with its own picture: the second finds nothing to reuse."""
    run = options("logits")
    items = prepare(judge, [(0, group(images, 0, 1)[0]), (1, group(images, 1, 1)[0])], RUBRICS, Path("/"), run)
    assert torch.equal(items[0].input_ids, items[1].input_ids)  # the same tokens: the images differ in their pixels alone
    scorer = Scorer(judge, RUBRICS, run, "cpu")
    results = scored(scorer, items)
    assert (scorer.decoder.runner.prefix_cache.misses, scorer.decoder.runner.prefix_cache.hits) == (2, 0)
    assert results[0]["score_distribution"] != results[1]["score_distribution"]



def test_the_pixels_are_hashed_where_they_are_loaded_never_on_the_model_thread(judge, images, monkeypatch):
    """The shared part's pixel digest comes with the loaded pixels, made in a loading thread: the thread that
    runs the model (here the test's own, as judge-serve's model thread runs Scorer.run) never hashes pixels. Every
    answer's key reads the digest of the question's image alone, not the third answer's own image."""
    import threading

    import mmjudge.infer.engine as engine
    import mmjudge.infer.runner as runner

    hashed_on, keyed = [], []
    monkeypatch.setattr(engine, "pixel_digest", lambda pixels: hashed_on.append(threading.current_thread()) or pixel_digest(pixels))
    monkeypatch.setattr(runner, "prefix_key", lambda ids, digest, frequencies: keyed.append(digest) or prefix_key(ids, digest, frequencies))
    run = options("logits")
    items = prepare(judge, list(enumerate(group(images))), RUBRICS, Path("/"), run)
    scorer = Scorer(judge, RUBRICS, run, "cpu")
    scored(scorer, items)
    assert len(hashed_on) == len(items) and threading.current_thread() not in hashed_on
    with_answer_image = engine._load_pixels(items[2], scorer.decoder.runner.dtype, pin=False)
    assert with_answer_image.shared_digest is None and len(hashed_on) == len(items)  # a decoder without a prefix cache asks for none
    question_image, answer_image = with_answer_image.split(int((items[2].input_ids[:items[2].prefix] == scorer.decoder.runner.backbone.image_token_id).sum()))
    assert answer_image is not None and keyed == [pixel_digest(question_image)] * len(items)


def test_a_questions_shared_part_is_tokenized_once_for_all_its_answers_across_requests(judge, images, monkeypatch):
    """Two one-sample-style requests of a group's answers (two prepare calls, as a server makes them): each whole
    prompt is tokenized, the question's shared part once in all, and each answer's prefix is where it is alone."""
    import mmjudge.infer.engine as engine

    encoded = []
    monkeypatch.setattr(engine, "encode_prompt", lambda tokenizer, text, controls: encoded.append(text) or encode_prompt(tokenizer, text, controls))
    question = [Segment(text="A question no other test asks: what colour is it?"), Segment(image=str(images[1]))]
    answers = [sample.model_copy(update={"question": question}) for sample in group(images)]
    alone = [prepare(judge, [(0, sample)], RUBRICS, Path("/"), options("logits"))[0] for sample in answers]
    again = prepare(judge, list(enumerate(answers)), RUBRICS, Path("/"), options("logits"))
    whole = [text for text in encoded if text.endswith(f"{SCORE_HEADING}\n")]  # logits mode: each whole prompt ends with the heading
    assert len(encoded) == 2 * len(answers) + 1 and len(whole) == 2 * len(answers)
    assert [(a.prefix, a.input_ids.tolist()) for a in alone] == [(b.prefix, b.input_ids.tolist()) for b in again] and alone[0].prefix > 0


def asked(cache: PrefixCache, key: int, n: int, times: int = 1) -> None:
    """As the decoder asks: get the key's part, and put it where it missed."""
    for _ in range(times):
        if cache.get(bytes([key]), torch.arange(n)) is None:
            cache.put(bytes([key]), Entry(torch.arange(n), torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2)))


def test_the_cache_holds_no_more_than_its_limit():
    """It keeps a part while it has room, and when full, one asked for more often than the first to leave."""
    cache = PrefixCache(10)
    for k, n, times in [(0, 4, 1), (1, 4, 1), (2, 4, 1), (2, 4, 1), (3, 11, 1), (4, 6, 3)]:
        asked(cache, k, n, times)
        assert cache.tokens <= 10 and cache.tokens == sum(len(e.input_ids) for e in cache.entries.values())
    assert list(cache.entries) == [bytes([2]), bytes([4])] and cache.evictions == 2  # 11 tokens are never kept
    assert cache.refusals == 2  # 2 asked as often as 0, and 4 as often as 1, the first time
    assert cache.get(bytes([2]), torch.arange(5)) is None  # the key's ids, compared whole
    assert cache.get(bytes([2]), torch.arange(4)) is not None


def test_questions_that_come_back_in_a_cycle_longer_than_the_cache_mostly_hit():
    """Three parts in a cycle, room for two: least recently used alone, each would evict the next to come back
    and every ask would miss; the cache keeps the two it holds, which hit on every pass after the first."""
    cache = PrefixCache(10)
    for _ in range(5):
        for key in range(3):
            asked(cache, key, 4)
    assert cache.hits == 2 * 4 and len(cache.entries) == 2


def test_a_new_question_asked_for_often_displaces_the_old_as_their_counts_age():
    """A GRPO step's new questions, asked for by each of their answers, come in once the old ones' counts age."""
    cache = PrefixCache(8)
    for key in range(2):
        asked(cache, key, 4, times=8)
    for _ in range(AGE_ASKS):  # other parts, of no room's worth
        asked(cache, 9, 11)
    for key in (2, 3):
        asked(cache, key, 4, times=8)
    assert sorted(cache.entries) == [bytes([2]), bytes([3])] and cache.hits > 2 * 7


@pytest.mark.parametrize("value", [-1, MAX_PREFIX_CACHE + 1, 2.5])
def test_a_prefix_cache_size_past_its_bounds_is_refused(value):
    with pytest.raises(UsageError, match="prefix_cache must be a whole number of at least 0 and below"):
        ScoreOptions(prefix_cache=value)


def test_judge_score_and_judge_serve_turn_the_cache_on_and_off_by_their_flag_and_only_the_reward_endpoints_have_it_unasked(tmp_path):
    """judge-score's --prefix_cache, and judge-serve's (the same ScoreOptions field): 0 turns it off. Not given,
    judge-score and /v1/score prefill each prompt whole, as MMIE's reference does, and the reward endpoints,
    whose RL groups share their rubric, question and images, keep what the judge's keys and values in
    REWARD_PREFIX_CACHE_BYTES hold (test_the_reward_endpoints_cache_is_sized_in_memory_not_tokens)."""
    from mmjudge.judge.rewards import parse_reward
    from mmjudge.serve.rewards import reward_options, with_prefix_cache
    from mmjudge.infer.cli import build_parser, score_options
    from mmjudge.judge.formats import FORMATS
    from mmjudge.serve.cli import build_parser as serve_parser, settings

    (tmp_path / "data.json").write_text("[]")
    argv = ["--model_path", "m", "--input_dir", str(tmp_path), "--input_file", "data.json", "--prefix_cache", "0"]
    assert score_options(build_parser(argv).parse_args(argv), FORMATS["mmie"]).prefix_cache == 0
    unasked = score_options(build_parser(argv[:-2]).parse_args(argv[:-2]), FORMATS["mmie"])
    assert unasked.prefix_cache is None and not unasked.prefix_cache
    rubrics = load_rubrics(FORMATS["mmie"].default_rubrics)
    judge = load_judge(write_family_checkpoint("qwen3-vl-4b", tmp_path / "judge"))
    for given, kept in ((unasked, MAX_PREFIX_CACHE), (replace(unasked, prefix_cache=0), 0), (replace(unasked, prefix_cache=64), 64)):
        rewarding = reward_options(parse_reward("score:SA", rubrics), rubrics, None, given, "generate")
        assert rewarding.prefix_cache == given.prefix_cache and with_prefix_cache(rewarding, judge, "cpu").prefix_cache == kept
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = str(free.getsockname()[1])
    assert settings(serve_parser().parse_args(["--model_path", "m", "--port", port, "--prefix_cache", "0"]))[0].prefix_cache == 0


def test_the_reward_endpoints_cache_is_sized_in_memory_not_tokens(monkeypatch):
    """Unasked, the reward endpoints' cache may hold REWARD_PREFIX_CACHE_BYTES of the judge's keys and values: InternVL2-4B's
    16,384 tokens in bf16 (384 KiB a token), a small judge's many more (capped at MAX_PREFIX_CACHE by with_prefix_cache),
    where 16,384 tokens were a few megabytes that missed; on a GPU, half the room its free memory leaves for keys and values."""
    import mmjudge.infer.cache as cache

    phi3 = SimpleNamespace(num_hidden_layers=32, num_key_value_heads=32, num_attention_heads=32, hidden_size=3072)  # InternVL2-4B's
    small = SimpleNamespace(num_hidden_layers=2, num_key_value_heads=2, num_attention_heads=4, hidden_size=64)
    cpu = torch.device("cpu")
    assert cache.prefix_cache_room(phi3, torch.bfloat16, cpu, REWARD_PREFIX_CACHE_BYTES) == 16384
    assert cache.prefix_cache_room(phi3, torch.float32, cpu, REWARD_PREFIX_CACHE_BYTES) == 8192
    assert cache.prefix_cache_room(small, torch.float32, cpu, REWARD_PREFIX_CACHE_BYTES) == 6 * 2**30 // (2 * 2 * 2 * 16 * 4) > MAX_PREFIX_CACHE
    monkeypatch.setattr(cache, "memory_budget", lambda device, per_token: 100_001)  # a GPU's room for keys and values, in tokens
    assert cache.prefix_cache_room(phi3, torch.bfloat16, torch.device("cuda"), REWARD_PREFIX_CACHE_BYTES) == 50_000


@pytest.mark.slow
def test_a_run_with_the_cache_and_one_without_do_not_resume_each_other(checkpoint, tmp_path, capsys):
    """The cache's prompts are prefilled in two pieces, whose last bits are not a whole prefill's: a journal of
    a run with it is not resumed by one without it, and the other way; its size alone changes nothing."""
    from mmjudge.infer.cli import main
    from mmjudge.judge.testing import write_dataset

    data = write_dataset(tmp_path / "data", 3, seed=3)
    run = ["--model_path", str(checkpoint), "--input_dir", str(data.parent), "--input_file", data.name, "--output_dir", str(tmp_path / "out"),
           "--mode", "logits", "--max_tiles", "1", "--workers", "1"]
    assert main([*run, "--limit", "2", "--prefix_cache", "16384"]) == 0
    capsys.readouterr()
    assert main(run) == 2
    assert "was written by a run with other settings (--prefix_cache (on or 0)); rerun with --no_resume" in capsys.readouterr().err
    assert main([*run, "--prefix_cache", "4096"]) == 0 and "resuming: 2 sample(s) already scored" in capsys.readouterr().err


@pytest.mark.slow
def test_a_deterministic_decoder_writes_a_cached_prompt_to_the_same_bits_alone_and_batched(images, monkeypatch, tmp_path):
    """Generate mode as on a GPU (split-KV attention and batch-invariant products, in Triton's interpreter, so
    Qwen3-VL's tiny judge alone and two answers: minutes otherwise): a group's answers decoded side by side, the
    second copying the shared part, are the same tokens and recorded logits, to the bit, as each answer decoded
    alone by a fresh decoder, which prefills it."""
    from concurrent.futures import Future

    import mmjudge.infer.split_kv
    from mmjudge.infer.scheduler import Request
    from mmjudge.infer.engine import _load_pixels, judge_decoder

    monkeypatch.setattr(mmjudge.infer.split_kv, "SPAN", 16)
    judge = load_judge(write_family_checkpoint("qwen3-vl-4b", tmp_path / "judge"))
    items = prepare(judge, list(enumerate(group(images, size=2))), RUBRICS, Path("/"), options("generate"))

    def load(request):
        future = Future()
        future.set_result(_load_pixels(items[request.index], torch.float32, pin=False, image_token_id=judge.backbone.image_token_id))
        return future

    def run(indices):
        decoder = judge_decoder(judge, "cpu", None, columns=list(range(16)), deterministic=True, prefix_cache=16384)
        decoder.runner.split_kv = decoder.runner.batch_invariant = True  # the GPU's kernels, in the interpreter on a CPU
        requests = [Request(i, items[i].input_ids.long(), prefix=items[i].prefix) for i in indices]
        return {c.index: c for done in decoder.generate(requests, load, 3) for c in done}, decoder.runner.prefix_cache

    batched, cache = run(range(len(items)))
    assert cache.hits == len(items) - 1
    for index in range(len(items)):
        alone, fresh = run([index])
        assert fresh.misses == 1
        assert alone[index].tokens == batched[index].tokens and torch.equal(alone[index].logits, batched[index].logits)
