"""The decoder's GPU-only paths on the tiny judge: CUDA-graph decoding and pinned tile transfers. Skipped
without a CUDA GPU (CI has none); run on a GPU machine with `pytest -m gpu`."""

import pytest
import torch

import mmjudge.infer.decoding
from mmjudge.infer.engine import Scorer, _load_pixels, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import load_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_dataset, write_original_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("data"), 8, seed=0).parent


def run(judge, dataset, cuda_graphs: bool, device="cuda", **options):
    rubrics = load_rubrics()
    options = ScoreOptions(max_tiles=2, **options)
    items = prepare(judge, list(enumerate(load_samples(dataset / "data.json", dataset))), rubrics, dataset, options)
    scorer = Scorer(judge, rubrics, options, device)
    scorer.decoder.runner.cuda_graphs = cuda_graphs
    return {r.id: r for batch in scorer.run(items) for _, r in batch}


def test_fused_kernels_write_what_transformers_kernels_write(tmp_path, dataset):
    """First in this file: the rotary kernel is patched into transformers' module once a judge is fused."""
    checkpoint = write_original_checkpoint(tmp_path / "ckpt", original_max_position_embeddings=700)
    unfused = load_judge(checkpoint, "cpu", torch.float32)  # loaded elsewhere than the GPU: nothing fused
    unfused.model.to("cuda")
    expected = run(unfused, dataset, True, max_new_tokens=24)
    fused = load_judge(checkpoint, "cuda", torch.float32)
    assert fused.model.model.language_model.norm.forward != type(fused.model.model.language_model.norm).forward
    got = run(fused, dataset, True, max_new_tokens=24)
    for key, one in expected.items():
        assert (got[key].feedback, got[key].generated_tokens) == (one.feedback, one.generated_tokens)
        assert got[key].score_distribution == pytest.approx(one.score_distribution, abs=1e-4)
    # the patched rotary function falls back to transformers' own for CPU tensors
    assert len(run(load_judge(checkpoint, "cpu", torch.float32), dataset, False, max_new_tokens=4, device="cpu")) == 8


def test_cuda_graph_steps_write_what_eager_steps_write(tmp_path, dataset, monkeypatch):
    """Graphs replayed at many widths (a small width step makes rows cross several), with slots refilled,
    forced score headings fed, and three caches in turn (each with its own graphs): the same tokens and
    distributions as the eager steps, in fp32."""
    monkeypatch.setattr(mmjudge.infer.decoding, "WIDTH_STEP", 64)
    monkeypatch.setattr(mmjudge.infer.decoding, "segments", lambda requests, extra: [requests[:3], requests[3:6], requests[6:]])
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt", original_max_position_embeddings=700), "cuda", torch.float32)
    slots3 = 2600  # three slots of a prompt (at most 781 tokens) + 40 new + the forced heading: eight prompts take turns
    graphs = run(judge, dataset, True, max_new_tokens=40, token_budget=slots3)
    eager = run(judge, dataset, False, max_new_tokens=40, token_budget=slots3)
    alone = run(judge, dataset, False, max_new_tokens=40, token_budget=1)
    for key, one in eager.items():
        for other in (graphs[key], alone[key]):
            assert (other.feedback, other.generated_tokens) == (one.feedback, one.generated_tokens)
            assert other.score_distribution == pytest.approx(one.score_distribution, abs=1e-4)


def test_bf16_scoring_on_the_gpu_gives_every_record(tmp_path, dataset):
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt"), "cuda")  # bf16, the GPU default
    for mode in ("generate", "logits"):
        results = run(judge, dataset, True, mode=mode, max_new_tokens=16)
        assert len(results) == 8 and all(r.score_distribution for r in results.values())


def test_sampled_cuda_graph_steps_write_what_eager_steps_and_each_request_alone_write(tmp_path, dataset, monkeypatch):
    """Sampling steps replay their own graphs (the draws are graph inputs): sampled and greedy rows side by
    side, choices forked from one prefill, rows crossing widths, in fp32: the same tokens as eager steps; and
    the greedy rows as each request alone. A sampled row alone may draw another token on the GPU: cuBLAS picks
    its matrix kernels by the batch's size, so a logit's last bit depends on it, and the tiny random judge's
    near-uniform distributions put many draws within a bit of a boundary (2026-11-27: 1 choice of 16). On
    the CPU, tests/infer/test_decoding.py checks that sampled rows alone write the same."""
    from concurrent.futures import Future

    from mmjudge.infer.sampler import Sampling
    from mmjudge.infer.scheduler import Request
    from mmjudge.infer.engine import judge_decoder

    monkeypatch.setattr(mmjudge.infer.decoding, "WIDTH_STEP", 64)
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt", original_max_position_embeddings=700), "cuda", torch.float32)
    options = ScoreOptions(max_tiles=2)
    items = prepare(judge, list(enumerate(load_samples(dataset / "data.json", dataset))), load_rubrics(), dataset, options)
    samplings = [Sampling(), Sampling(0.8, seed=1), Sampling(1.2, top_p=0.9, seed=2), Sampling(0.7, top_k=20, seed=3)]

    def requests(indices):
        return [Request(i, items[i].input_ids.long(), max_new_tokens=20 + 10 * (i % 3), sampling=samplings[i % 4], n=1 + i % 3) for i in indices]

    def load(request):
        future = Future()
        future.set_result(None if not items[request.index].images else _load_pixels(items[request.index], torch.float32, pin=True))
        return future

    def run(indices, cuda_graphs):
        decoder = judge_decoder(judge, "cuda", None, columns=[])
        decoder.runner.cuda_graphs = cuda_graphs
        return {(c.index, c.choice): c.tokens for done in decoder.generate(requests(indices), load, 8, top_logprobs=2) for c in done}

    everything = list(range(len(items)))
    graphs = run(everything, True)
    assert graphs == run(everything, False)
    alone = {key: tokens for i in everything if samplings[i % 4].temperature == 0 for key, tokens in run([i], True).items()}
    assert alone and alone == {key: graphs[key] for key in alone}


def test_penalized_cuda_graph_steps_write_what_eager_steps_write(tmp_path, dataset, monkeypatch):
    """Issue 45, item 10: penalties are a graph input like the draws (a step with penalized rows replays a graph
    of its own): penalized greedy and sampled rows beside plain ones, in fp32, write the same tokens under CUDA
    graphs as in eager steps; and the penalties change what they write. Their rule is checked by hand on the
    CPU (tests/infer/test_decoding.py)."""
    from concurrent.futures import Future

    from mmjudge.infer.sampler import Sampling
    from mmjudge.infer.scheduler import Request
    from mmjudge.infer.engine import judge_decoder

    monkeypatch.setattr(mmjudge.infer.decoding, "WIDTH_STEP", 64)
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt"), "cuda", torch.float32)
    items = prepare(judge, list(enumerate(load_samples(dataset / "data.json", dataset))), load_rubrics(), dataset, ScoreOptions(max_tiles=2))
    samplings = [Sampling(), Sampling(presence_penalty=1.5, frequency_penalty=0.5), Sampling(0.8, seed=2, frequency_penalty=2.0)]

    def load(request):
        future = Future()
        future.set_result(None if not items[request.index].images else _load_pixels(items[request.index], torch.float32, pin=True))
        return future

    def run(cuda_graphs, penalties=True):
        decoder = judge_decoder(judge, "cuda", None, columns=[])
        decoder.runner.cuda_graphs = cuda_graphs
        chosen = samplings if penalties else [Sampling(), Sampling(), Sampling(0.8, seed=2)]
        requests = [Request(i, item.input_ids.long(), max_new_tokens=24, sampling=chosen[i % 3]) for i, item in enumerate(items)]
        return {c.index: c.tokens for done in decoder.generate(requests, load, 24) for c in done}

    graphs = run(True)
    assert graphs == run(False)
    plain = run(True, penalties=False)
    assert all(graphs[i] != plain[i] for i in graphs if i % 3) and all(graphs[i] == plain[i] for i in graphs if i % 3 == 0)


def test_constrained_steps_and_chunked_prefills_under_cuda_graphs_write_what_eager_unchunked_steps_write(tmp_path, dataset, monkeypatch):
    """Token masks are graph inputs like the draws: rows under a JSON schema or a choice beside free rows,
    greedy and sampled, prompts prefilled in chunks of 256, fp32: the same tokens as eager steps after whole
    prefills. (Written without a GPU at hand: run it on one.)"""
    from concurrent.futures import Future

    from mmjudge.infer import grammar
    from mmjudge.infer.sampler import Sampling
    from mmjudge.infer.scheduler import Request
    from mmjudge.infer.engine import judge_decoder, judge_vocabulary

    monkeypatch.setattr(mmjudge.infer.decoding, "WIDTH_STEP", 64)
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt", original_max_position_embeddings=700), "cuda", torch.float32)
    vocabulary = judge_vocabulary(judge)
    schema = {"type": "object", "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 6}, "sure": {"type": "boolean"}},
              "required": ["score", "sure"], "additionalProperties": False}
    grammars = [None, grammar.json_schema(vocabulary, schema), grammar.choice(vocabulary, ["better", "worse", "tie"])]
    options = ScoreOptions(max_tiles=2)
    items = prepare(judge, list(enumerate(load_samples(dataset / "data.json", dataset))), load_rubrics(), dataset, options)

    def requests():
        return [Request(i, items[i].input_ids.long(), max_new_tokens=60, sampling=Sampling(0.8, seed=i) if i % 2 else Sampling(),
                        grammar=grammars[i % 3]) for i in range(len(items))]

    def load(request):
        future = Future()
        future.set_result(None if not items[request.index].images else _load_pixels(items[request.index], torch.float32, pin=True))
        return future

    def run(cuda_graphs, prefill_budget):
        decoder = judge_decoder(judge, "cuda", None, columns=[], prefill_budget=prefill_budget)
        decoder.runner.cuda_graphs = cuda_graphs
        return {(c.index, c.choice): c.tokens for done in decoder.generate(requests(), load, 60) for c in done}

    assert run(True, 256) == run(False, None)


def test_split_kv_attention_in_bf16_gives_each_row_the_same_bits_alone_and_batched():
    """What SDPA's masked kernels do not promise: a row's attention in bf16 is the same alone, in a slot as
    wide as its own length, as beside longer rows in a wider cache; and close to float64's."""
    from mmjudge.infer.split_kv import SPAN, slot_attention

    lengths = [1, 300, SPAN, SPAN + 1, 5 * SPAN + 77]
    generator = torch.Generator().manual_seed(0)
    for heads, kv_heads, head_dim in [(32, 32, 96), (16, 2, 128)]:  # Phi-3-mini's; Qwen2.5-VL-3B's
        keys, values = (torch.randn(len(lengths), kv_heads, max(lengths) + 512, head_dim, generator=generator).to("cuda", torch.bfloat16)
                        for _ in range(2))
        query = torch.randn(len(lengths), heads, 1, head_dim, generator=generator).to("cuda", torch.bfloat16)
        batched, _ = slot_attention(None, query, keys, values, None, slot_lengths=torch.tensor(lengths, device="cuda"))
        for row, length in enumerate(lengths):
            alone, _ = slot_attention(None, query[row:row + 1], keys[row:row + 1, :, :length], values[row:row + 1, :, :length], None,
                                      slot_lengths=torch.tensor([length], device="cuda"))
            assert torch.equal(alone[0], batched[row])
            k = keys[row, :, :length].double().repeat_interleave(heads // kv_heads, 0)
            v = values[row, :, :length].double().repeat_interleave(heads // kv_heads, 0)
            expected = ((query[row].double() @ k.transpose(-1, -2)) * head_dim**-0.5).softmax(-1) @ v
            torch.testing.assert_close(batched[row, 0].double(), expected[:, 0], rtol=0, atol=2e-2)


def test_generate_mode_uses_split_kv_attention_on_the_gpu_and_scores_as_sdpa_steps_do(tmp_path, dataset):
    """The decoder picks split-KV attention on a GPU; judge-score's records with it, in fp32 under CUDA
    graphs, are those of SDPA steps."""
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt"), "cuda", torch.float32)
    rubrics = load_rubrics()
    options = ScoreOptions(max_tiles=2, max_new_tokens=32)
    items = prepare(judge, list(enumerate(load_samples(dataset / "data.json", dataset))), rubrics, dataset, options)
    records = {}
    for split_kv in (True, False):
        scorer = Scorer(judge, rubrics, options, "cuda")
        assert scorer.decoder.runner.split_kv
        scorer.decoder.runner.split_kv = split_kv
        records[split_kv] = {r.id: r for batch in scorer.run(items) for _, r in batch}
    for key, one in records[False].items():
        assert (records[True][key].feedback, records[True][key].generated_tokens) == (one.feedback, one.generated_tokens)
        assert records[True][key].score_distribution == pytest.approx(one.score_distribution, abs=1e-4)


def test_batch_invariant_linear_in_bf16_gives_each_row_the_same_bits_in_any_batch():
    """At Phi-3-mini's widths (the attention's and the MLP's products, the output layer) and Qwen2.5-VL-3B's
    (with a bias), in bf16: each row the same bits alone and in batches of 3 to 200 rows (a step's rows), and
    within bf16's rounding of float64's product."""
    from mmjudge.infer.batch_invariant import linear

    generator = torch.Generator().manual_seed(0)
    for n, k, bias in [(9216, 3072, False), (3072, 8192, False), (16384, 3072, False), (32064, 3072, False), (2560, 2048, True)]:
        weight = (torch.randn(n, k, generator=generator) * k**-0.5).to("cuda", torch.bfloat16)
        offset = torch.randn(n, generator=generator).to("cuda", torch.bfloat16) if bias else None
        x = torch.randn(200, k, generator=generator).to("cuda", torch.bfloat16)
        batched = linear(x, weight, offset)
        expected = x.double() @ weight.double().T + (0 if offset is None else offset.double())
        torch.testing.assert_close(batched.double(), expected, rtol=1e-2, atol=2e-2)
        for rows in (1, 3, 48, 64, 65):
            assert torch.equal(linear(x[:rows], weight, offset), batched[:rows])
        assert torch.equal(linear(x[199:], weight, offset)[0], batched[199])


def test_scoring_in_bf16_is_deterministic_by_default_each_record_the_same_bits_alone_and_batched(tmp_path, dataset):
    """judge-score on a GPU, where --deterministic is on unless turned off, in bf16 under CUDA graphs: each
    record's feedback, generated tokens and score distribution, generate mode and logits mode, the same alone
    (a budget of one token) as batched."""
    judge = load_judge(write_original_checkpoint(tmp_path / "ckpt"), "cuda", torch.bfloat16)
    rubrics = load_rubrics()

    def records(**options):
        options = ScoreOptions(max_tiles=2, max_new_tokens=48, **options)
        items = prepare(judge, list(enumerate(load_samples(dataset / "data.json", dataset))), rubrics, dataset, options)
        scorer = Scorer(judge, rubrics, options, "cuda")
        assert scorer.decoder.runner.deterministic and scorer.decoder.runner.batch_invariant and scorer.decoder.runner.cuda_graphs
        return {r.id: (r.feedback, r.generated_tokens, r.score_distribution) for batch in scorer.run(items) for _, r in batch}

    for mode in ("generate", "logits"):
        batched = records(mode=mode)
        assert len(batched) == 8 and batched == records(mode=mode, token_budget=1)
