"""Training throughput as judge-train trains: full-size InternVL2-4B architecture (random weights, the shape
in configs/model/internvl2-4b.json, built as the scoring benchmark builds it), LoRA r 16 on the language
model (judge-train's `apply_lora` and defaults), bf16, the fused kernels judge-train uses on a GPU,
sequences of about 4096 tokens (6 tiles + text). The training loop itself is this script's own, a plain
step (or DeepSpeed's engine), so that the figure is the model's step without the Trainer's bookkeeping.

    python benchmarks/train_throughput.py                          # one GPU, plain PyTorch + PEFT
    python benchmarks/train_throughput.py --deepspeed configs/deepspeed/zero2.json   # ZeRO-2, world size 1
    python benchmarks/train_throughput.py --tiny --steps 2 --device cpu             # smoke test

MFU counts model FLOPs: the language model's forward (2 x matmul params x tokens, the output layer
included and the embedding lookup not), its backward for activation gradients only (2 x, frozen weights
need no weight gradients; LoRA's are negligible), causal attention (4 x layers x hidden x n^2 / 2 a
forward; backward twice that), and the vision forward (2 x params x 1025 tokens x tiles, for 448-pixel
tiles of 14-pixel patches plus a class token). HFU also counts the forward that gradient checkpointing
recomputes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import tempfile
import time
from pathlib import Path

import torch

from mmjudge.judge.kernels import use_fused_kernels
from mmjudge.judge.model import load_judge
from mmjudge.judge.testing import write_original_checkpoint
from mmjudge.train.config import TrainConfig
from mmjudge.train.recipe import apply_lora

# The scoring benchmark, this script's neighbour, holds the one builder of the full-size judge.
from score_throughput import full_size_judge, vision_tokens_per_tile


def full_size(device: str):
    return full_size_judge(device, Path(tempfile.mkdtemp()) / "tokenizer")


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def batch(judge, seq_len: int, tiles: int, batch_size: int, device: str, dtype) -> dict:
    """Random text with `tiles` tiles of image tokens; the second half of the text is the loss target."""
    image_id = judge.image_token_id
    n_image = tiles * judge.settings.images.tokens_per_tile
    text = torch.randint(10, judge.tokenizer.convert_tokens_to_ids("<|endoftext|>"), (batch_size, seq_len - n_image))
    ids = torch.cat([torch.full((batch_size, n_image), image_id), text], dim=1)
    labels = ids.clone()
    labels[:, : n_image + text.shape[1] // 2] = -100
    size = judge.settings.images.image_size
    return {"input_ids": ids.to(device), "labels": labels.to(device), "attention_mask": torch.ones_like(ids).to(device),
            "pixel_values": torch.randn(batch_size * tiles, 3, size, size, device=device, dtype=dtype)}


def step_flops(judge, seq_len: int, batch_size: int, tiles: int, recompute: bool) -> float:
    model = judge.model.model
    # The matmul weights: the language model's without its embedding lookup, plus the output layer.
    llm = (sum(p.numel() for p in model.language_model.parameters()) - model.language_model.get_input_embeddings().weight.numel()
           + judge.model.lm_head.weight.numel())
    vision = sum(p.numel() for p in model.vision_tower.parameters())
    text = judge.model.config.text_config
    attention = 4 * text.num_hidden_layers * text.hidden_size * seq_len**2 / 2  # one causal forward: half of QK^T and AV
    tokens = seq_len * batch_size
    # linear layers: forward, activation backward (2 + 2), and with recompute one more forward; attention: forward,
    # backward (2 x), and with recompute one more forward
    passes = 3 if recompute else 2
    return 2 * passes * llm * tokens + (passes + 1) * attention * batch_size + 2 * vision * vision_tokens_per_tile(judge) * tiles


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny random judge (CPU smoke test)")
    p.add_argument("--seq_len", type=int, default=4096, help="tokens per sequence (default: 4096)")
    p.add_argument("--tiles", type=int, default=6, help="image tiles per sequence (default: 6)")
    p.add_argument("--batch_size", type=int, default=1, help="sequences per step (default: 1)")
    p.add_argument("--steps", type=int, default=10, help="timed steps after 2 warm-up steps (default: 10)")
    p.add_argument("--deepspeed", help="a DeepSpeed JSON (ZeRO-2) to wrap the model with, world size 1")
    p.add_argument("--gradient_checkpointing", action="store_true", help="recompute activations in backward (judge-train's flag)")
    p.add_argument("--unfused", action="store_true", help="transformers' own kernels instead of the fused ones judge-train uses on a GPU")
    p.add_argument("--peak_tflops", type=float, default=989.0, help="bf16 dense peak of the GPU (default: 989, H100 SXM)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    with tempfile.TemporaryDirectory() as tmp:
        judge = load_judge(write_original_checkpoint(Path(tmp) / "tiny"), args.device, dtype) if args.tiny else full_size(args.device)
    fused = not args.unfused and use_fused_kernels(judge.model, args.device)
    model = apply_lora(judge, TrainConfig())
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=4e-5)
    engine = None
    if args.deepspeed:
        import deepspeed

        # World size 1 without a launcher; a free port, as a fixed one collides with other runs on the machine.
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": free_port()}.items():
            os.environ.setdefault(key, value)
        config = json.loads(Path(args.deepspeed).read_text())
        config |= {"train_micro_batch_size_per_gpu": args.batch_size, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
                   "bf16": {"enabled": dtype == torch.bfloat16}}
        config.pop("optimizer", None), config.pop("scheduler", None)
        config["zero_allow_untested_optimizer"] = True
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    inputs = batch(judge, args.seq_len, args.tiles, args.batch_size, args.device, dtype)

    def train_step():
        loss = (engine or model)(**inputs).loss
        if engine:
            engine.backward(loss)
            engine.step()
        else:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        train_step()
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        train_step()
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / args.steps
    tokens = args.seq_len * args.batch_size
    figures = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "deepspeed": args.deepspeed, "seq_len": args.seq_len, "tiles": args.tiles, "batch_size": args.batch_size,
        "ms_per_step": 1000 * seconds, "tokens_per_s": tokens / seconds,
        "gradient_checkpointing": args.gradient_checkpointing, "fused_kernels": fused,
        # model FLOPs (forward and activation backward); "hfu" also counts the recomputed forward
        "mfu": step_flops(judge, args.seq_len, args.batch_size, args.tiles * args.batch_size, False) / seconds / 1e12 / args.peak_tflops,
        "hfu": step_flops(judge, args.seq_len, args.batch_size, args.tiles * args.batch_size, args.gradient_checkpointing) / seconds / 1e12 / args.peak_tflops,
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else None,
    }
    for key, value in figures.items():
        print(f"{key:>20}: {value:.3f}" if isinstance(value, float) else f"{key:>20}: {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
