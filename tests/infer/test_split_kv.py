"""Split-KV decoding attention (infer/split_kv.py), in Triton's interpreter where there is no GPU
(conftest.py): the attention of each row over its own length, nothing read past it, bit for bit the same
alone and in any batch; and the decoder's steps with it write what its SDPA steps write, for a judge with one
key/value head per query head (Phi-3) and judges with grouped queries (InternLM2, Qwen2.5-VL, Qwen3-VL). On a
GPU the same tests run compiled kernels, in fp32."""

from concurrent.futures import Future

import pytest
import torch
from transformers import AttentionInterface

import mmjudge.infer.split_kv
from mmjudge.infer.scheduler import Request
from mmjudge.infer.engine import judge_decoder
from mmjudge.infer.split_kv import ATTENTION, SPAN, slot_attention
from mmjudge.judge.model import load_judge
from mmjudge.judge.testing import write_original_checkpoint
from mmjudge.judge.testing.families import write_family_checkpoint


LENGTHS = [1, SPAN - 1, SPAN, SPAN + 1, 2 * SPAN + 3]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(query, keys, values, lengths):
    """Softmax attention of each row over its first `length` positions, in float64."""
    group = query.shape[1] // keys.shape[1]
    out = []
    for row, length in enumerate(lengths):
        k = keys[row, :, :length].double().repeat_interleave(group, 0)
        v = values[row, :, :length].double().repeat_interleave(group, 0)
        weights = (query[row].double() @ k.transpose(-1, -2) * query.shape[-1] ** -0.5).softmax(-1)
        out.append((weights @ v)[:, 0])
    return torch.stack(out)[:, None]  # (rows, 1, heads, head_dim)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(4, 4, 96), (8, 2, 64)])
def test_each_row_attends_to_its_own_length_alone_and_batched_alike(heads, kv_heads, head_dim):
    generator = torch.Generator().manual_seed(0)
    width, rows = max(LENGTHS) + 40, len(LENGTHS)
    keys = torch.randn(rows, kv_heads, width, head_dim, generator=generator)
    values = torch.randn(rows, kv_heads, width, head_dim, generator=generator)
    for row, length in enumerate(LENGTHS):  # past a row's length: what it must never read
        keys[row, :, length:], values[row, :, length:] = float("nan"), float("inf")
    query = torch.randn(rows, heads, 1, head_dim, generator=generator)
    query, keys, values, lengths = (t.to(DEVICE) for t in (query, keys, values, torch.tensor(LENGTHS)))
    batched, _ = slot_attention(None, query, keys, values, None, slot_lengths=lengths)
    assert batched.shape == (rows, 1, heads, head_dim) and batched.isfinite().all()
    torch.testing.assert_close(batched.double(), reference(query, keys, values, LENGTHS), rtol=0, atol=2e-6)
    for row, length in enumerate(LENGTHS):  # alone, in a cache as wide as its own length: the same bits
        alone, _ = slot_attention(None, query[row:row + 1], keys[row:row + 1, :, :length], values[row:row + 1, :, :length], None,
                                  slot_lengths=lengths[row:row + 1])
        assert torch.equal(alone[0], batched[row])


def no_images(request):
    future = Future()
    future.set_result(None)
    return future


@pytest.fixture
def split_kv_calls():
    """How many times decoding called the split-KV attention function, counted through its registration."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(kwargs["slot_lengths"])
        return slot_attention(*args, **kwargs)

    AttentionInterface.register(ATTENTION, counted)
    yield calls
    AttentionInterface.register(ATTENTION, slot_attention)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["internvl2-4b", "internvl2-8b", "qwen2.5-vl-3b", "qwen3-vl-4b"])
def test_decoding_steps_with_split_kv_attention_write_what_sdpa_steps_write(tmp_path, family, monkeypatch, split_kv_calls):
    """Prompts of different lengths decoded side by side and in turn (a budget of two slots), greedy, rows
    crossing spans (of 16 here), for Phi-3, InternLM2 (grouped queries), Qwen2.5-VL and Qwen3-VL: the same
    tokens and recorded logits as the SDPA steps, and as each row alone (to rounding: the CPU's matrix
    products are not batch-invariant, the attention is)."""
    monkeypatch.setattr(mmjudge.infer.split_kv, "SPAN", 16)
    checkpoint = write_original_checkpoint(tmp_path / "judge") if family == "internvl2-4b" else write_family_checkpoint(family, tmp_path / "judge")
    judge = load_judge(checkpoint, DEVICE, torch.float32)
    questions = ["Is this answer good?", "Rate the answer, and say why in a few words.", "Score it.",
                 "The answer names the wrong color of the car; how many points does it lose?"]
    prompts = [judge.tokenizer(judge.settings.template.render(q), return_tensors="pt").input_ids[0] for q in questions]
    columns = torch.arange(8)

    def run(split_kv: bool, indices, budget=None):
        decoder = judge_decoder(judge, DEVICE, budget, columns=columns.tolist())  # on a GPU: CUDA graphs
        decoder.runner.split_kv = split_kv
        requests = [Request(i, prompts[i], max_new_tokens=4 + 3 * i) for i in indices]
        return {c.index: c for done in decoder.generate(requests, no_images, 12) for c in done}

    sdpa = run(False, range(4))
    assert not split_kv_calls
    batched = run(True, range(4))
    assert split_kv_calls  # the steps ran it (on a GPU: as their graphs were captured)
    in_turn = run(True, range(4), budget=2 * (max(map(len, prompts)) + 20))
    assert batched.keys() == sdpa.keys() == in_turn.keys()
    for index, expected in sdpa.items():
        assert batched[index].tokens == expected.tokens
        torch.testing.assert_close(batched[index].logits, expected.logits, rtol=0, atol=1e-4)
        assert in_turn[index].tokens == batched[index].tokens
        torch.testing.assert_close(in_turn[index].logits, batched[index].logits, rtol=0, atol=1e-5)
    for index in (0, 3):  # the shortest limit and the longest prompt, each alone
        alone = run(True, [index])[index]
        assert alone.tokens == batched[index].tokens
        torch.testing.assert_close(alone.logits, batched[index].logits, rtol=0, atol=1e-5)
