"""Qwen3.5's Gated DeltaNet layers in the engine (infer/cache.py's LinearAttentionCache) on the tiny Qwen3.5 in its
released layout, fp32, prompts of the synthetic dataset with their images: the engine writes what transformers'
own generate writes, its logits within 1e-5 at every step; a prompt batched with others, and one prefilled in chunks
while the others decode, writes what it writes alone (within 1e-5: the CPU's products are not batch-invariant, and a
chunk starts the chunked delta rule at another place); the prefix cache is refused by name. The deterministic mode's
bits alone and batched: tests/infer/test_batch_invariant.py."""

from concurrent.futures import Future

import pytest
import torch

from mmjudge.infer.cache import LinearAttentionCache, kv_bytes_per_token
from mmjudge.infer.engine import _load_pixels, judge_decoder, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.infer.scheduler import Request
from mmjudge.judge.data import UsageError, load_samples
from mmjudge.judge.model import load_judge
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.testing import write_dataset
from mmjudge.judge.testing.families import write_family_checkpoint

NEW_TOKENS = 5


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    return load_judge(write_family_checkpoint("qwen3.5-4b", tmp_path_factory.mktemp("qwen3.5")), "cpu", torch.float32)


@pytest.fixture(scope="module")
def items(judge, tmp_path_factory):
    """Three samples' prompts with their images, of three lengths; a fourth as long as the second (prefilled with it)."""
    data = write_dataset(tmp_path_factory.mktemp("data") / "data", 3, seed=5).parent
    samples = load_samples(data / "data.json", data)
    prepared = prepare(judge, list(enumerate(samples)), load_rubrics(), data, ScoreOptions(max_tiles=1))
    return [*prepared, prepared[1]]


def loaded(items):
    def load(request: Request) -> Future:
        future = Future()
        future.set_result(_load_pixels(items[request.index], torch.float32, pin=False))
        return future
    return load


def generate(judge, items, indices, **decoder) -> tuple[dict, object]:
    vocabulary = judge.model.config.get_text_config().vocab_size
    engine = judge_decoder(judge, "cpu", None, columns=list(range(vocabulary)), **decoder)
    longest_first = sorted(indices, key=lambda i: -len(items[i].input_ids))  # as the engine's callers give them
    requests = [Request(i, items[i].input_ids.long(), max_new_tokens=NEW_TOKENS) for i in longest_first]
    joining = (lambda take: None) if decoder.get("prefill_budget") else None  # a server's steps: chunks beside decoding rows
    return {c.index: c for done in engine.generate(requests, loaded(items), NEW_TOKENS, joining=joining) for c in done}, engine


@pytest.fixture(scope="module")
def alone(judge, items):
    return {i: generate(judge, items, [i])[0][i] for i in range(3)}


@pytest.mark.slow
def test_the_engine_writes_what_transformers_generate_writes(judge, items, alone):
    """Each prompt alone, greedy, against the model's own generate (its prefill the chunked delta rule from a zero state,
    its steps the recurrent rule from the cache's states): the same tokens, logits within 1e-5 at every step."""
    assert all(item.n_tiles > 0 for item in items)
    for i, item in enumerate(items[:3]):
        pixels = _load_pixels(item, torch.float32, pin=False)
        ids = item.input_ids.long()[None]  # and which tokens are an image's, as its processor says (mm_token_type_ids)
        inputs = {"input_ids": ids, **({} if pixels is None else {**judge.backbone.model_inputs(pixels), "mm_token_type_ids": (ids == judge.image_token_id).int()})}
        with torch.no_grad():
            reference = judge.model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                             output_logits=True, return_dict_in_generate=True)
        assert alone[i].tokens == reference.sequences[0, len(item.input_ids):].tolist()
        torch.testing.assert_close(alone[i].logits, torch.stack(reference.logits)[:, 0], rtol=0, atol=1e-5)


@pytest.mark.slow
def test_a_prompt_batched_or_chunked_writes_what_it_writes_alone(judge, items, alone):
    """Four prompts decoded side by side: only the two of one length share a prefill (a right-padded row's state would
    carry its pads); then with a prefill budget of 256 tokens, every prompt prefilled in chunks (and a step's new
    prompt beside them), each continuing from the states its slot keeps while the other rows decode: a step leaves a
    chunking slot's state as it was. Each writes what it writes alone."""
    batched, engine = generate(judge, items, range(4))
    cache = engine.runner.new_cache(8, 1)  # a slot's state is counted where lanes are sized, as the tokens it weighs
    assert isinstance(cache, LinearAttentionCache)
    assert engine.runner.state_tokens * kv_bytes_per_token(engine.runner.config, torch.float32) >= cache.conv.nbytes + cache.recurrent.nbytes > 0
    prefills = engine.runner.prefills
    chunked, engine = generate(judge, items, range(4), prefill_budget=256)
    for run in (batched, chunked):
        for i, completion in run.items():
            own = alone[1 if i == 3 else i]  # the fourth is the second's prompt
            assert completion.tokens == own.tokens
            torch.testing.assert_close(completion.logits, own.logits, rtol=0, atol=1e-5)
    assert prefills == 3  # prompts 1 and 3 together
    assert engine.runner.prefills >= 3 * 4 and engine.runner.steps > NEW_TOKENS


def test_the_prefix_cache_is_refused_by_name_for_a_hybrid(judge):
    """Asked for, with the reason; unasked, judge-serve's reward endpoints leave it off (where they turn it on for others)."""
    from mmjudge.serve.rewards import with_prefix_cache

    with pytest.raises(UsageError, match=r"--prefix_cache 4096: no prefix cache for Qwen3.5: its linear-attention layers keep a recurrent state"):
        judge_decoder(judge, "cpu", None, columns=[0], prefix_cache=4096)
    assert with_prefix_cache(ScoreOptions(), judge, "cpu").prefix_cache == 0


@pytest.mark.slow
def test_the_same_code_carries_qwen3_5_moe(monkeypatch):
    """Qwen3.5-MoE's layers (the same Gated DeltaNet and attention, a sparse mixture of experts for the MLP), a tiny one
    from transformers' own config: three prompts, chunked beside each other's decoding, write what transformers'
    generate writes. The engine's part only: the backbone adapter names the families it loads (judge/backbones/),
    and this one is given Qwen-VL's rules here."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    import mmjudge.infer.runner as runner
    from mmjudge.infer.decoding import Decoder
    from mmjudge.judge.backbones.qwen_vl import QwenVL

    text = dict(vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                layer_types=["linear_attention"] * 3 + ["full_attention"], linear_conv_kernel_dim=4, linear_key_head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_value_head_dim=16, moe_intermediate_size=32,
                shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                 "mrope_interleaved": True})
    config = Qwen3_5MoeConfig(text_config=text, vision_config=dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64))
    torch.manual_seed(0)
    model = Qwen3_5MoeForConditionalGeneration(config).eval()
    monkeypatch.setattr(runner, "backbone_of", lambda config: QwenVL("Qwen3.5-MoE", config.image_token_id, mrope=True, vision_tower="visual"))
    decoder = Decoder(model, device="cpu", pad_id=0, stop_ids=(), suppress=[], columns=torch.arange(512), token_budget=None, prefill_budget=8)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 500, (n,), generator=generator) for n in (30, 30, 9)]
    no_images = Future()
    no_images.set_result(None)
    ours = {c.index: c for done in decoder.generate([Request(i, p) for i, p in enumerate(prompts)], lambda r: no_images, 5, joining=lambda take: None)
            for c in done}
    assert isinstance(decoder.runner.new_cache(8, 1), LinearAttentionCache) and decoder.runner.prefills > len(prompts)
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            reference = model.generate(input_ids=prompt[None], max_new_tokens=5, min_new_tokens=5, do_sample=False, output_logits=True,
                                       return_dict_in_generate=True)
        assert ours[i].tokens == reference.sequences[0, len(prompt):].tolist()
        torch.testing.assert_close(ours[i].logits, torch.stack(reference.logits)[:, 0], rtol=0, atol=1e-5)
