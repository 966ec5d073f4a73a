"""judge-serve's fairness between clients: small /get_reward requests beside one of many large images, each small one's
latency while the large one is prepared and judged.

    python benchmarks/fair_preparing.py                                  # 64 images of 40 megapixels, 10 clients, the tiny judge, CPU
    python benchmarks/fair_preparing.py --images 8 --megapixels 4 --json figures.json
    python benchmarks/fair_preparing.py --model_path CKPT --device cuda

Starts judge-serve on a free 127.0.0.1 port with --reward score:SA --mode logits and its other limits at their defaults
(--max_images 64, --max_image_pixels 40,000,000). Writes --images flat PNGs of --megapixels each (8000 x 5000 pixels at
40, about 130 KB each, which decode to 120 MB each) under its --image_root, and sends them in one /get_reward request:
one query whose prompt shows them all (the large request). Meanwhile --clients senders each send a small request (a
synthetic question, its first image and an answer, as OpenRLHF sends one) and, --pause_s after its answer, the next,
until the large request is answered. A small request alone is timed first. Every latency is from the first byte sent
to the answer; each small request's reward is checked against the same request sent alone before (to 1e-6). --json's
record (each small request's [sent at, latency] in seconds, and the 1-minute load average before and after) renders as
docs/serving.md's table (markdown).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import time
from pathlib import Path

import httpx2
from PIL import Image
from reward_load import bodies_of
from serve_load import percentile, served


def large_images(data_dir: Path, count: int, megapixels: float) -> list[str]:
    """`count` flat PNGs of `megapixels` (8:5, 8000 x 5000 at 40) under data_dir/large, each another colour: paths
    under the server's --image_root."""
    width = int(math.sqrt(megapixels * 1e6 * 8 / 5))
    height = int(megapixels * 1e6 // width)
    (data_dir / "large").mkdir()
    paths = []
    for k in range(count):
        Image.new("RGB", (width, height), (k * 37 % 256, 90, 180)).save(data_dir / "large" / f"{k}.png")
        paths.append(f"large/{k}.png")
    return paths


async def beside(base: str, large: dict, smalls: list[dict], clients: int, pause_s: float, timeout_s: float) -> dict:
    """The large request, and small ones from `clients` senders until it is answered: its latency, and each small
    one's (latency, sent at, its body's index, reward)."""
    done = asyncio.Event()
    answered = []
    start = time.perf_counter()

    async def client(http: httpx2.AsyncClient, first: int) -> None:
        k = first
        while not done.is_set():
            sent = time.perf_counter()
            answer = await http.post(f"{base}/get_reward", json=smalls[k % len(smalls)])
            answered.append({"latency_s": time.perf_counter() - sent, "sent_at_s": sent - start, "body": k % len(smalls),
                             "reward": answer.json()["rewards"][0] if answer.status_code == 200 else None})
            k += clients
            await asyncio.sleep(pause_s)

    async def large_one(http: httpx2.AsyncClient) -> dict:
        try:
            answer = await http.post(f"{base}/get_reward", json=large)
            return {"status": answer.status_code, "seconds": time.perf_counter() - start, "reward": answer.json()["rewards"][0]}
        finally:
            done.set()

    async with httpx2.AsyncClient(timeout=timeout_s, limits=httpx2.Limits(max_connections=clients + 1)) as http:
        first, *_ = await asyncio.gather(large_one(http), *(client(http, k) for k in range(clients)))
    return {"large": first, "small": answered}


def measured(args) -> dict:
    load_before = os.getloadavg()[0]
    with served(args.model_path, ["--device", args.device, "--reward", "score:SA", "--mode", "logits", *args.serve_flag],
                image_root=True) as (base, data_dir):
        smalls = bodies_of(data_dir, args.clients * 4)
        paths = large_images(data_dir, args.images, args.megapixels)
        prompt = "Describe each of these pictures in a word."
        large = {"query": [prompt + " Colours."], "prompts": [prompt], "images": [paths]}
        alone = []
        with httpx2.Client(timeout=args.timeout_s) as http:
            for body in smalls:  # each small request alone: its reward, and the first one's latency (the second: warm)
                sent = time.perf_counter()
                answer = http.post(f"{base}/get_reward", json=body)
                answer.raise_for_status()
                alone.append((time.perf_counter() - sent, answer.json()["rewards"][0]))
        run = asyncio.run(beside(base, large, smalls, args.clients, args.pause_s, args.timeout_s))
    latencies = [s["latency_s"] for s in run["small"]]
    differing = sum(s["reward"] is None or abs(s["reward"] - alone[s["body"]][1]) > 1e-6 for s in run["small"])
    return {"device": args.device, "serve_flags": args.serve_flag, "images": args.images, "megapixels": args.megapixels,
            "clients": args.clients, "pause_s": args.pause_s, "load_before": load_before,
            "small_alone_s": alone[1][0], "large": run["large"], "small_requests": len(latencies), "small_rewards_differing": differing,
            "small_p50_s": percentile(latencies, 0.5), "small_max_s": max(latencies), "small_over_2s": sum(t > 2 for t in latencies),
            "load_after": os.getloadavg()[0], "small": [[round(s["sent_at_s"], 3), round(s["latency_s"], 3)] for s in run["small"]]}


def markdown(record: dict) -> str:
    """The table of a run's record (--json), as docs/serving.md shows it."""
    large = record["large"]
    return ("| large request | its seconds | small requests beside it | small latency p50 / max | small over 2 s | a small one alone | "
            "load before / after |\n|---|---:|---:|---:|---:|---:|---:|\n"
            f"| {record['images']} images of {record['megapixels']:g} MP | {large['seconds']:.1f} | {record['small_requests']} from "
            f"{record['clients']} clients | {record['small_p50_s']:.2f} s / {record['small_max_s']:.2f} s | {record['small_over_2s']} | "
            f"{record['small_alone_s']:.2f} s | {record['load_before']:.1f} / {record['load_after']:.1f} |\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_path", help="the judge to serve (default: a tiny random one, written to a temporary directory)")
    p.add_argument("--device", default="cpu", help="judge-serve's --device (default: cpu)")
    p.add_argument("--images", type=int, default=64, help="images of the large request (default: 64, --max_images' default)")
    p.add_argument("--megapixels", type=float, default=40, help="each large image's size (default: 40, --max_image_pixels' default)")
    p.add_argument("--clients", type=int, default=10, help="senders of small requests beside it (default: 10)")
    p.add_argument("--pause_s", type=float, default=1.0, help="a sender's pause between its small requests (default: 1)")
    p.add_argument("--timeout_s", type=float, default=3600, help="the longest a request may take (default: 3600)")
    p.add_argument("--serve_flag", action="append", default=[], help="a flag for judge-serve, as --serve_flag=--name=value (repeatable)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()
    record = measured(args)
    large = record["large"]
    print(f"large request ({args.images} images of {args.megapixels:g} MP): {large['status']} in {large['seconds']:.1f} s; "
          f"{record['small_requests']} small requests beside it from {args.clients} clients: p50 {record['small_p50_s']:.2f} s, "
          f"max {record['small_max_s']:.2f} s, {record['small_over_2s']} over 2 s, {record['small_rewards_differing']} rewards "
          f"differing from alone (alone: {record['small_alone_s']:.2f} s)")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))
    if large["status"] != 200 or record["small_rewards_differing"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
