"""Batch-invariant linear layers (infer/batch_invariant.py) and the deterministic decoder, in Triton's
interpreter where there is no GPU (conftest.py): each row's product the same bits alone and in batches of
any size, close to float64's; and a deterministic decoder writes each prompt's tokens and logits to the same
bits alone and batched, which the CPU's own products do not. On a GPU the same tests run compiled kernels
(tests/infer/test_decoding_gpu.py adds bf16 at a judge's real widths)."""

from concurrent.futures import Future

import pytest
import torch

import mmjudge.infer.batch_invariant as batch_invariant_module
import mmjudge.infer.split_kv
from mmjudge.infer.batch_invariant import batch_invariant, linear, splits, use_batch_invariant_linears
from mmjudge.infer.sampler import Sampling
from mmjudge.infer.scheduler import Request
from mmjudge.infer.engine import judge_decoder
from mmjudge.judge.model import load_judge
from mmjudge.judge.testing import write_original_checkpoint
from mmjudge.judge.testing.families import write_family_checkpoint

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 16 and a target of 64 programs: products of a few hundred columns cross tiles and splits."""
    for name, value in (("BLOCK_M", 16), ("BLOCK_N", 16), ("BLOCK_K", 16), ("PROGRAMS", 64)):
        monkeypatch.setattr(batch_invariant_module, name, value)


@pytest.mark.parametrize(("n", "k", "parts"), [(40, 256, 4), (100, 70, 1), (33, 512, 8)])
def test_each_row_is_the_same_bits_alone_and_in_batches_of_any_size(small_tiles, n, k, parts):
    """Column and K tiles left partial, K cut in 1, 4 and 8 splits; rows alone, in batches of 5 and of 37
    (three row tiles): the same bits, within fp32 rounding of float64's product."""
    assert splits(n, k) == parts
    generator = torch.Generator().manual_seed(n)
    weight, bias = torch.randn(n, k, generator=generator), torch.randn(n, generator=generator)
    x = torch.randn(37, k, generator=generator)
    weight, bias, x = weight.to(DEVICE), bias.to(DEVICE), x.to(DEVICE)
    batched = linear(x, weight, bias)
    torch.testing.assert_close(batched.double(), x.double() @ weight.double().T + bias.double(), rtol=0, atol=1e-4)
    assert torch.equal(linear(x[:5], weight, bias), batched[:5])
    for row in (0, 4, 17, 36):
        assert torch.equal(linear(x[row:row + 1], weight, bias)[0], batched[row])
    no_bias = linear(x[None, :3], weight)  # leading dimensions kept, as torch.nn.functional.linear keeps them
    assert no_bias.shape == (1, 3, n)
    torch.testing.assert_close(no_bias[0].double(), x[:3].double() @ weight.double().T, rtol=0, atol=1e-4)


def test_patched_linear_layers_run_the_kernel_inside_the_block_alone():
    """Outside batch_invariant() a patched layer is its own forward, bit for bit; inside, the kernel's."""
    layer = torch.nn.Linear(24, 40).to(DEVICE)
    x = torch.randn(3, 24, device=DEVICE)
    eager = layer(x)
    use_batch_invariant_linears(torch.nn.Sequential(layer))
    use_batch_invariant_linears(torch.nn.Sequential(layer))  # once only
    assert torch.equal(layer(x), eager)
    with batch_invariant():
        assert torch.equal(layer(x), linear(x, layer.weight, layer.bias))
        with batch_invariant(False):
            assert torch.equal(layer(x), eager)


def no_images(request):
    future = Future()
    future.set_result(None)
    return future


@pytest.mark.slow
@pytest.mark.parametrize(("family", "adapter"), [("internvl2-4b", False), ("internvl2-4b", True), ("internvl2-8b", False),
                                                ("qwen2.5-vl-3b", False), ("qwen3-vl-4b", False), ("qwen3.5-4b", False)],
                         ids=["internvl2-4b", "internvl2-4b-lora", "internvl2-8b", "qwen2.5-vl-3b", "qwen3-vl-4b", "qwen3.5-4b"])
def test_a_deterministic_decoder_writes_each_prompt_to_the_same_bits_alone_and_batched(tmp_path, monkeypatch, family, adapter):
    """Four prompts of different lengths decoded side by side, and each alone, fp32, two greedy and two
    sampled (one with two choices): with the decoder deterministic (its prefill a group per prompt, its
    steps' products batch-invariant, split-KV attention, as on a GPU) the tokens and every recorded logit
    are the same bits; the CPU's own products are not batch-invariant, so the same runs without it differ
    in the logits' last bits. For Phi-3 (InternVL2-4B), InternLM2 (InternVL2-8B), Qwen2.5-VL (biased
    projections) and Qwen3-VL, and with a LoRA adapter (as judge-train trains one, its weights random here):
    PEFT's layers and the ones they wrap run the kernel. Qwen3.5's Gated DeltaNet layers too: their projections run the
    kernel, and their convolution and recurrent step are a row's own (infer/cache.py's LinearAttentionCache)."""
    monkeypatch.setattr(mmjudge.infer.split_kv, "SPAN", 16)
    checkpoint = write_original_checkpoint(tmp_path / "judge") if family == "internvl2-4b" else write_family_checkpoint(family, tmp_path / "judge")
    judge = load_judge(checkpoint, DEVICE, torch.float32)
    if adapter:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=4, target_modules=r".*language_model.*\.(qkv_proj|o_proj|gate_up_proj|down_proj)", init_lora_weights=False)
        judge.model = get_peft_model(judge.model, lora).eval()
    questions = ["Is this answer good?", "Rate the answer, and say why in a few words.", "Score it.",
                 "The answer names the wrong color of the car; how many points does it lose?"]
    prompts = [judge.tokenizer(judge.settings.template.render(q), return_tensors="pt").input_ids[0] for q in questions]

    def run(deterministic: bool, indices):
        decoder = judge_decoder(judge, DEVICE, None, columns=list(range(judge.model.config.text_config.vocab_size)),
                                deterministic=deterministic)
        decoder.runner.split_kv = decoder.runner.batch_invariant = deterministic  # the GPU's kernels, in the interpreter on a CPU
        requests = [Request(i, prompts[i], max_new_tokens=3 + 2 * i, sampling=samplings[i], n=1 + (i == 3)) for i in indices]
        completions = {(c.index, c.choice): c for done in decoder.generate(requests, no_images, 12) for c in done}
        return completions, decoder.runner.prefills

    samplings = [Sampling(), Sampling(0.9, seed=1), Sampling(), Sampling(1.1, top_p=0.9, seed=2)]
    batched, prefills = run(True, range(4))
    assert len(batched) == 5 and prefills == 4  # a group per prompt (its choices share it)
    for index in range(4):
        alone, _ = run(True, [index])
        for key, completion in alone.items():
            assert completion.tokens == batched[key].tokens
            assert torch.equal(completion.logits, batched[key].logits)
    if DEVICE == "cpu" and family == "internvl2-4b" and not adapter:
        plain, _ = run(False, range(4))
        assert any(not torch.equal(run(False, [i])[0][i, 0].logits, plain[i, 0].logits) for i in range(4))


@pytest.mark.slow
def test_a_deterministic_decoder_cuts_chunked_prompts_at_the_same_places_alone_and_beside_others(tmp_path, monkeypatch):
    """A server's decoder (a prefill budget of 24 tokens a step): prompts longer than it are prefilled in
    chunks. Started together, they share each step's budget, so chunks without the deterministic rule are cut
    where the others leave room; with it every prompt is cut a quarter of the budget apart, alone or not, and
    each prompt's tokens and logits are the same bits alone and batched."""
    monkeypatch.setattr(mmjudge.infer.split_kv, "SPAN", 16)
    judge = load_judge(write_original_checkpoint(tmp_path / "judge"), DEVICE, torch.float32)
    questions = ["Rate the answer, and say why in a few words.", "Score it.", "Is this answer good? Think of its images too."]
    prompts = [judge.tokenizer(judge.settings.template.render(q), return_tensors="pt").input_ids[0] for q in questions]
    assert all(len(p) > 24 for p in prompts)
    chunks = []

    def run(indices):
        decoder = judge_decoder(judge, DEVICE, None, columns=list(range(8)), prefill_budget=24, deterministic=True)
        decoder.runner.split_kv = decoder.runner.batch_invariant = True  # the GPU's kernels, in the interpreter on a CPU
        prefill_chunk = decoder.runner.prefill_chunk

        def recorded(rows, cache, prompt, end):
            chunks.append((rows[0].request.index, rows[0].position, end))
            return prefill_chunk(rows, cache, prompt, end)

        decoder.runner.prefill_chunk = recorded
        requests = [Request(i, prompts[i], max_new_tokens=4) for i in indices]
        return {c.index: c for done in decoder.generate(requests, no_images, 4) for c in done}

    batched = run(range(3))
    cuts = {(index, start, end) for index, start, end in chunks}
    assert all((end - start == 6 or end == len(prompts[index])) and start % 6 == 0 for index, start, end in cuts)
    for index in range(3):
        chunks.clear()
        alone = run([index])
        assert set(chunks) == {cut for cut in cuts if cut[0] == index}
        assert alone[index].tokens == batched[index].tokens and torch.equal(alone[index].logits, batched[index].logits)
