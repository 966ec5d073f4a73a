"""judge-score's engine against the reference-style loop (one sample at a time through HF generate).

    python benchmarks/score_throughput.py                      # full-size InternVL2-4B, random weights, GPU
    python benchmarks/score_throughput.py --model_path CKPT    # a real checkpoint
    python benchmarks/score_throughput.py --tiny --samples 4 --new_tokens 4 --max_tiles 1 --device cpu   # smoke test

The full-size architecture is configs/model/internvl2-4b.json, in the original checkpoint format and
built by the loader's own conversion (its rope factors are placeholders: with random weights they cost
the same). Workload (seeded, MMIE-shaped): 1-4 images per sample, tiles per image drawn from
{1, 3, 5, 7, 7, 9, 13} (grid + thumbnail), 500-1200 text tokens of the judge's tokenizer. Both sides
generate exactly --new_tokens tokens (the stop token is ignored) so they do equal work, and each runs
the first eighth of its samples once untimed before it is timed (cold kernels and allocator). Prefill
utilisation is measured in logits mode (one forward pass per sample, no decoding) against --peak_tflops.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from mmjudge.judge.cpu import use_free_cores

# Before torch loads: the engine computes in this process, so on a CPU it takes judge-score's threads (judge/cpu.py),
# not torch's own choice, which beside other work on a small machine spins on cores that are not free.
use_free_cores()

import torch  # noqa: E402
from PIL import Image
from transformers import GenerationConfig, InternVLForConditionalGeneration

from mmjudge.infer.cache import kv_bytes_per_token
from mmjudge.infer.engine import Scorer, prepare
from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.cli import add_revision_flag
from mmjudge.judge.data import load_samples
from mmjudge.judge.backbones.internvl import native_config_from_original, settings_from_original
from mmjudge.judge.checkpoint import load_tokenizer
from mmjudge.judge.model import Judge, load_judge
from mmjudge.judge.tiling import IMAGE_TOKENS
from mmjudge.configs import CONFIG_DIR
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.kernels import use_fused_kernels
from mmjudge.judge.rope import use_rowwise_rope
from mmjudge.judge.testing import write_original_checkpoint, write_tokenizer

# Image sizes whose InternVL grid (max 12 tiles) plus thumbnail gives these tile counts.
SIZE_FOR_TILES = {1: (448, 448), 3: (896, 448), 5: (896, 896), 7: (1344, 896), 9: (1792, 896), 13: (1792, 1344)}
WORDS = "the answer shows a boat leaving the harbour while the text explains each step of the plan".split()
FULL_SIZE = CONFIG_DIR / "model" / "internvl2-4b.json"
MMIE_SAMPLES = 20_100


def full_size_judge(device: str, tokenizer_dir: Path) -> Judge:
    """InternVL2-4B's architecture (InternViT-300M + Phi-3-mini, configs/model/internvl2-4b.json) with
    random bf16 weights."""
    write_tokenizer(tokenizer_dir)
    tokenizer = load_tokenizer(tokenizer_dir, IMAGE_TOKENS)
    config = json.loads(FULL_SIZE.read_text())
    native = native_config_from_original(config, tokenizer)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = InternVLForConditionalGeneration(native).eval()
    torch.set_default_dtype(torch.float32)
    use_rowwise_rope(model.model.language_model)  # as load_judge does
    return Judge(model, tokenizer, settings_from_original(FULL_SIZE.parent, config, native), "native")


def vision_tokens_per_tile(judge: Judge) -> int:
    """Patches of one tile plus the class token, as the vision tower sees it (1025 for InternViT-448)."""
    vision = judge.model.config.vision_config
    return (vision.image_size[0] // vision.patch_size[0]) ** 2 + 1


def write_workload(root: Path, n: int, seed: int, tokenizer) -> Path:
    rng = random.Random(seed)
    (root / "images").mkdir(parents=True)
    samples = []
    for i in range(n):
        images = []
        for k in range(rng.randint(1, 4)):
            path = f"images/{i}_{k}.png"
            Image.new("RGB", SIZE_FOR_TILES[rng.choice([1, 3, 5, 7, 7, 9, 13])], tuple(rng.randrange(256) for _ in range(3))).save(root / path)
            images.append(path)
        question, answer = _text(rng, tokenizer, rng.randint(500, 1200))
        samples.append({"id": f"SA_{i:05d}", "model": "bench", "question": [{"text": question, "image": images[0]}],
                        "answer": [{"text": answer}] + [{"image": p} for p in images[1:]]})
    (root / "data.json").write_text(json.dumps(samples))
    return root


def _text(rng: random.Random, tokenizer, n_tokens: int) -> tuple[str, str]:
    """A question and an answer text of n_tokens tokens together (a third, two thirds). Every word is at
    least one token, so n_tokens words are enough to cut from."""
    ids = tokenizer(" ".join(rng.choice(WORDS) for _ in range(n_tokens)), add_special_tokens=False).input_ids[:n_tokens]
    return tokenizer.decode(ids[: n_tokens // 3]), tokenizer.decode(ids[n_tokens // 3:])


def warm_up_share(items: list) -> list:
    """What each side runs untimed before it is timed: the first eighth of its samples, at least one."""
    return items[: max(1, len(items) // 8)]


def reference_loop(judge: Judge, items, new_tokens: int, device: str) -> tuple[float, list[list[int]]]:
    """MMIE's way: per sample, decode its images, then batch-1 HF generate."""
    from mmjudge.infer.engine import _load_pixels, unwritable_tokens

    dtype = next(judge.model.parameters()).dtype
    # The engine's decoding rule (no image tokens written), so that greedy agreement compares like with like.
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                              pad_token_id=judge.tokenizer.pad_token_id, suppress_tokens=unwritable_tokens(judge))
    outputs = []
    _sync(device)
    start = time.perf_counter()
    for item in items:
        pixels = _load_pixels(item, dtype, pin=False)
        ids = item.input_ids[None].to(device, torch.long)
        images = {} if pixels is None else judge.backbone.model_inputs(pixels.to(device, dtype))
        out = judge.model.generate(input_ids=ids, **images, generation_config=config)
        outputs.append(out[0, ids.shape[1]:].tolist())
    _sync(device)
    return time.perf_counter() - start, outputs


class Run(NamedTuple):
    seconds: float
    records: dict  # by sample id
    steps: int  # decoding steps (one for every busy slot of a cache)
    prefills: int  # prefill forward passes (groups or chunks)
    split_kv: bool  # the decoding steps' attention: split-KV, or SDPA
    deterministic: bool  # judge-score --deterministic: each record the same bits in any batch


def engine_run(judge, rubrics, items, options, device, split_kv: bool | None = None) -> Run:
    """The engine's wall time, records and forward passes; `split_kv`: its decoding steps' attention,
    split-KV or SDPA (None: the decoder's own choice, split-KV on a GPU)."""
    scorer = Scorer(judge, rubrics, options, device)
    if split_kv is not None:
        scorer.decoder.runner.split_kv = split_kv
    _sync(device)
    start = time.perf_counter()
    results = {r.id: r for batch in scorer.run(items) for _, r in batch}
    _sync(device)
    seconds = time.perf_counter() - start
    # as each run ends: a step cut by its time limit still shows how far it got
    # the decoder's own answer: the option's default (None) is deterministic on a GPU
    print(f"engine: {len(items)} samples, {options.mode}{', deterministic' if scorer.decoder.runner.deterministic else ''}: {seconds:.1f} s", flush=True)
    return Run(seconds, results, scorer.decoder.runner.steps, scorer.decoder.runner.prefills, scorer.decoder.runner.split_kv, scorer.decoder.runner.deterministic)


def invariance(judge, rubrics, samples, data, generate: ScoreOptions, logits: ScoreOptions, batched: dict, device: str) -> dict:
    """How many records scored alone differ from the same records scored in the benchmark's batches: the
    generated tokens and score distributions (generate mode) and the score distributions (logits mode, largest
    difference and argmax flips). On a GPU in bf16, batched kernels round differently from batch-1 ones
    unless scoring is deterministic."""
    alone = replace(generate, token_budget=1)
    gen_alone = engine_run(judge, rubrics, prepare(judge, samples, rubrics, data, alone), alone, device).records
    logit_items = prepare(judge, samples, rubrics, data, logits)
    log_batched = engine_run(judge, rubrics, logit_items, logits, device).records
    log_alone = engine_run(judge, rubrics, logit_items, replace(logits, token_budget=1), device).records
    gaps = [max(abs(log_alone[k].score_distribution[v] - log_batched[k].score_distribution[v]) for v in log_alone[k].score_distribution)
            for k in log_alone]
    return {
        "invariance_samples": len(samples),
        "generate_tokens_differ": sum(gen_alone[k].feedback != batched[k].feedback for k in gen_alone),
        # the recorded logits too: the same text may come with other bits in its score distribution
        "generate_distribution_differs": sum(gen_alone[k].score_distribution != batched[k].score_distribution for k in gen_alone),
        "logits_score_differs": sum(log_alone[k].score != log_batched[k].score for k in log_alone),
        "logits_max_distribution_gap": max(gaps),
    }


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prefill_flops(judge: Judge, items) -> float:
    """2 x parameters per token for the LLM and per vision token, plus attention's 4 x layers x hidden x n^2."""
    model = judge.model
    llm = sum(p.numel() for p in model.model.language_model.parameters()) - model.model.language_model.get_input_embeddings().weight.numel()
    vision = sum(p.numel() for p in model.model.vision_tower.parameters())
    text_cfg, vis_cfg = model.config.text_config, model.config.vision_config
    per_tile = vision_tokens_per_tile(judge)
    total = 0.0
    for item in items:
        n, tiles = len(item.input_ids), item.n_tiles
        total += 2 * llm * n + 4 * text_cfg.num_hidden_layers * text_cfg.hidden_size * n * n / 2  # causal: half the square
        total += tiles * (2 * vision * per_tile + 4 * vis_cfg.num_hidden_layers * vis_cfg.hidden_size * per_tile**2)
        total += 2 * text_cfg.hidden_size * text_cfg.vocab_size  # the one position whose logits are read
    return total


def decode_bytes(judge: Judge, items, new_tokens: int) -> float:
    """The keys and values each written token must read: its row's whole cache, prompt and tokens so far
    (the weights are read once per step for every row of the batch, so with many rows they are left out)."""
    per_token = kv_bytes_per_token(judge.model.config.text_config, next(judge.model.parameters()).dtype)  # as the decoder sizes its cache
    return sum(per_token * (len(item.input_ids) * new_tokens + new_tokens * (new_tokens - 1) / 2) for item in items)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_path", help="a checkpoint to load instead of random full-size weights: a directory or a Hugging Face Hub id")
    add_revision_flag(p)
    p.add_argument("--tiny", action="store_true", help="a tiny random judge (CPU smoke test)")
    p.add_argument("--samples", type=int, default=48, help="workload size (default: 48)")
    p.add_argument("--reference_samples", type=int, default=8, help="samples timed in the reference loop; 0: none (default: 8)")
    p.add_argument("--new_tokens", type=int, default=256, help="tokens generated per sample on both sides (default: 256)")
    p.add_argument("--token_budget", type=int, help="the engine's KV-cache tokens (default: judge-score's: what free GPU memory holds)")
    p.add_argument("--max_tiles", type=int, default=12, help="tiles per image, as MMIE-Eval uses (default: 12)")
    p.add_argument("--peak_tflops", type=float, default=989.0,
                   help="the bf16 matrix rate, for utilisation and the floor: gpu_limits.py measures it (default: 989, H100 SXM's datasheet)")
    p.add_argument("--copy_tb_s", type=float, default=3.0,
                   help="the memory bandwidth, for the floor: gpu_limits.py measures it (default: 3.0, an H100's measured copy)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--invariance_samples", type=int, default=0,
                   help="also score this many samples alone (--token_budget 1) and count records that differ from the batched ones")
    p.add_argument("--compare_deterministic", action="store_true",
                   help="also time both modes with judge-score's --deterministic the other way from its default here (on a GPU: off)")
    p.add_argument("--compare_sdpa", action="store_true",
                   help="also time generate mode with SDPA decoding steps, the attention used before split-KV (GPU)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.model_path:
            judge = load_judge(args.model_path, args.device, revision=args.revision)
        elif args.tiny:
            judge = load_judge(write_original_checkpoint(tmp / "tiny"), args.device)
        else:
            judge = full_size_judge(args.device, tmp / "tokenizer")
            use_fused_kernels(judge.model, args.device)  # as load_judge does on a GPU
        data = write_workload(tmp / "data", args.samples, args.seed, judge.tokenizer)
        samples = list(enumerate(load_samples(data / "data.json", data)))
        rubrics = load_rubrics()
        generate = ScoreOptions(max_new_tokens=args.new_tokens, token_budget=args.token_budget, ignore_stop=True, max_tiles=args.max_tiles)
        items = prepare(judge, samples, rubrics, data, generate)
        n_ref = min(args.reference_samples, len(items))
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        if n_ref:
            reference_loop(judge, warm_up_share(items[:n_ref]), args.new_tokens, args.device)
        ref_time, ref_out = reference_loop(judge, items[:n_ref], args.new_tokens, args.device) if n_ref else (None, [])
        engine_run(judge, rubrics, warm_up_share(items), generate, args.device)
        run = engine_run(judge, rubrics, items, generate, args.device)
        eng_time, eng_out = run.seconds, run.records
        if args.compare_sdpa:
            engine_run(judge, rubrics, warm_up_share(items), generate, args.device, split_kv=False)
            sdpa_time = engine_run(judge, rubrics, items, generate, args.device, split_kv=False).seconds
        logits = ScoreOptions(mode="logits", token_budget=args.token_budget, max_tiles=args.max_tiles)
        logit_items = prepare(judge, samples, rubrics, data, logits)
        engine_run(judge, rubrics, warm_up_share(logit_items), logits, args.device)
        log_time = engine_run(judge, rubrics, logit_items, logits, args.device).seconds
        if args.compare_deterministic:
            other_generate, other_logits = (replace(options, deterministic=not run.deterministic) for options in (generate, logits))
            engine_run(judge, rubrics, warm_up_share(items), other_generate, args.device)
            other = engine_run(judge, rubrics, items, other_generate, args.device)
            engine_run(judge, rubrics, warm_up_share(logit_items), other_logits, args.device)
            other_log_time = engine_run(judge, rubrics, logit_items, other_logits, args.device).seconds
        agree = sum(judge.decode(r) == eng_out[items[i].sample.id].feedback for i, r in enumerate(ref_out))
        prefill = prefill_flops(judge, logit_items)
        figures = {
            "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
            "samples": len(items), "new_tokens": args.new_tokens,
            "decoding_attention": "split-KV" if run.split_kv else "SDPA",
            "deterministic": run.deterministic,
            "reference_samples_per_s": n_ref / ref_time if n_ref else None,
            "engine_samples_per_s": len(items) / eng_time,
            # generate mode's forward passes: its time per decoding step is (wall - prefill) / steps at most
            "decode_steps": run.steps, "prefill_passes": run.prefills,
            "speedup": (len(items) / eng_time) / (n_ref / ref_time) if n_ref else None,
            "logits_samples_per_s": len(items) / log_time,
            "prefill_tflops": prefill / log_time / 1e12,
            "greedy_agreement": f"{agree}/{n_ref}",
            # The workload is MMIE-shaped: the whole benchmark's 20,100 samples at these rates.
            "mmie_hours_generate": MMIE_SAMPLES / (len(items) / eng_time) / 3600,
            "mmie_hours_logits": MMIE_SAMPLES / (len(items) / log_time) / 3600,
            "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None,
        }
        if args.compare_sdpa:
            figures["engine_samples_per_s_sdpa"] = len(items) / sdpa_time
        if args.compare_deterministic:
            # the time deterministic scoring takes over the time without it, in each mode
            gen_cost, log_cost = other.seconds / eng_time, other_log_time / log_time
            figures |= {"engine_samples_per_s_other": len(items) / other.seconds, "logits_samples_per_s_other": len(items) / other_log_time,
                        "other_prefill_passes": other.prefills,
                        "deterministic_cost_generate": 1 / gen_cost if run.deterministic else gen_cost,
                        "deterministic_cost_logits": 1 / log_cost if run.deterministic else log_cost}
        figures["prefill_utilisation"] = figures["prefill_tflops"] / args.peak_tflops
        # The physical floor: prefill FLOPs at the matrix rate, plus the cache each written token must read.
        prefill_floor_s = prefill / args.peak_tflops / 1e12
        generate_floor_s = prefill_floor_s + decode_bytes(judge, items, args.new_tokens) / args.copy_tb_s / 1e12
        figures |= {"peak_tflops": args.peak_tflops, "copy_tb_s": args.copy_tb_s,
                    "generate_floor_samples_per_s": len(items) / generate_floor_s, "generate_floor_ratio": eng_time / generate_floor_s,
                    "mmie_hours_generate_floor": MMIE_SAMPLES * generate_floor_s / len(items) / 3600,
                    "logits_floor_ratio": log_time / prefill_floor_s}
        if args.invariance_samples:
            figures |= invariance(judge, rubrics, samples[: args.invariance_samples], data, generate, logits, eng_out, args.device)
        for key, value in figures.items():
            print(f"{key:>26}: {value:.3f}" if isinstance(value, float) else f"{key:>26}: {value}")
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
