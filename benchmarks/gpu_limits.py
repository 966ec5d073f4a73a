"""The two limits every GPU figure is read against, measured on the machine at hand: the bf16 matrix-product
rate and the memory copy bandwidth.

    python benchmarks/gpu_limits.py --json limits.json
    python benchmarks/gpu_limits.py --device cpu --size 512 --copy_mib 64    # smoke test

The matrix rate is a size^3 bf16 product (2 x size^3 FLOPs), the mean of --repeats timed products after
three untimed ones. The bandwidth is a device-to-device copy of --copy_mib MiB, counting the bytes read and
the bytes written, as GPU vendors and KINDS.md count it. Both are what a kernel can reach on this card, not
its datasheet: the scoring benchmark's floor (prefill FLOPs at the matrix rate, plus the keys and values each
written token must read at the copy bandwidth) and the training benchmark's MFU are taken against them.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def _timed(device: str, step, repeats: int) -> float:
    """Seconds per call of step, the mean of `repeats` after three untimed calls."""
    for _ in range(3):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats


def matmul_tflops(device: str, size: int, repeats: int) -> float:
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    return 2 * size**3 / _timed(device, lambda: a @ b, repeats) / 1e12


def copy_tb_s(device: str, mib: int, repeats: int) -> float:
    source = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    return 2 * source.numel() / _timed(device, lambda: target.copy_(source), repeats) / 1e12


def measure(device: str, size: int = 8192, copy_mib: int = 4096, repeats: int = 10) -> dict:
    return {"device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
            "matmul_tflops": matmul_tflops(device, size, repeats), "matmul_size": size,
            "copy_tb_s": copy_tb_s(device, copy_mib, repeats), "copy_mib": copy_mib}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--size", type=int, default=8192, help="the matrix product's side (default: 8192)")
    p.add_argument("--copy_mib", type=int, default=4096, help="MiB copied device to device (default: 4096)")
    p.add_argument("--repeats", type=int, default=10, help="timed repetitions of each (default: 10)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    figures = measure(args.device, args.size, args.copy_mib, args.repeats)
    print(f"matrix products {figures['matmul_tflops']:.1f} TFLOP/s, copies {figures['copy_tb_s']:.2f} TB/s ({figures['device']})")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
