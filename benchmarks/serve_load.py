"""judge-serve under load: requests/s and latency percentiles at 1, 8 and 32 concurrent clients.

    python benchmarks/serve_load.py                                          # tiny random judge, CPU
    python benchmarks/serve_load.py --model_path CKPT --device cuda --new_tokens 256 --requests 256

Starts judge-serve on a free 127.0.0.1 port (loopback only) and, at each client count, sends a fixed
number of POST /v1/chat/completions requests (--requests) from that many threads, each thread sending its
next request as soon as its last is answered; a level stops early at --time_limit_s, and the server is
stopped at the end. Each request is a judge prompt of the synthetic dataset (the sample's text and its
first image, as a data URL) with max_tokens --new_tokens, greedy; the random judge never stops early, so
every request generates exactly that many tokens. The forward passes of each level (prefill groups and
decoding steps; alone, a request takes one prefill and a step per token after its first) come from /metrics.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2

from mmjudge.judge.testing import write_dataset, write_original_checkpoint
from mmjudge.serve.process import free_port, start_server


SERVED = "judge"  # the name the server answers to (--served_model_name) and every request asks for


def requests_of(data_dir: Path, new_tokens: int) -> list[dict]:
    """One chat request per sample: its question and answer texts, and its first image if it has one."""
    bodies = []
    for sample in json.loads((data_dir / "data.json").read_text()):
        segments = sample["question"] + (sample["answer"] if isinstance(sample["answer"], list) else [{"text": sample["answer"]}])
        text = "\n".join(s["text"] for s in segments if s.get("text"))
        content = [{"type": "text", "text": f"Judge this answer.\n{text}"}]
        if image := next((s["image"] for s in segments if s.get("image")), None):
            url = "data:image/png;base64," + base64.b64encode((data_dir / image).read_bytes()).decode()
            content.append({"type": "image_url", "image_url": {"url": url}})
        bodies.append({"model": SERVED, "messages": [{"role": "user", "content": content}], "max_tokens": new_tokens, "temperature": 0})
    return bodies


def forward_passes(base: str) -> tuple[int, int]:
    """Prefill groups and decoding steps the server has run."""
    lines = httpx2.get(f"{base}/metrics").text.splitlines()
    return tuple(int(next(line.split()[1] for line in lines if line.startswith(f"{name} ")))
                 for name in ("judge_prefill_batches_total", "judge_decoding_steps_total"))


def load_level(base: str, bodies: list[dict], clients: int, count: int, time_limit_s: float) -> dict:
    """`count` requests from `clients` threads, stopped early at the time limit; latencies of those answered."""
    latencies, failures, next_index, lock = [], [], iter(range(count)), threading.Lock()
    passes_before = forward_passes(base)
    start = time.perf_counter()

    def client() -> None:
        with httpx2.Client(timeout=time_limit_s) as http:
            while time.perf_counter() - start < time_limit_s:
                with lock:
                    k = next(next_index, None)
                if k is None:
                    return
                sent = time.perf_counter()
                response = http.post(f"{base}/v1/chat/completions", json=bodies[k % len(bodies)])
                with lock:
                    (latencies if response.status_code == 200 else failures).append(time.perf_counter() - sent)

    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    elapsed = time.perf_counter() - start
    ordered = sorted(latencies)
    percentile = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None  # noqa: E731
    return {"clients": clients, "requests": len(latencies), "failed": len(failures), "seconds": elapsed,
            "requests_per_s": len(latencies) / elapsed, "p50_s": percentile(0.5), "p90_s": percentile(0.9), "p99_s": percentile(0.99),
            "mean_s": statistics.fmean(latencies) if latencies else None,
            **{name: after - before for name, after, before in zip(("prefills", "steps"), forward_passes(base), passes_before)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_path", help="the judge to serve (default: a tiny random one, written to a temporary directory)")
    p.add_argument("--device", default="cpu", help="judge-serve's --device (default: cpu)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="concurrent clients of each level (default: 1 8 32)")
    p.add_argument("--requests", type=int, default=64, help="requests per level (default: 64)")
    p.add_argument("--new_tokens", type=int, default=16, help="max_tokens of each request (default: 16)")
    p.add_argument("--time_limit_s", type=float, default=120, help="a level stops sending after this long (default: 120)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_path = args.model_path or str(write_original_checkpoint(tmp / "tiny"))
        data_dir = write_dataset(tmp / "data", 32, seed=0).parent
        port = free_port()
        server = start_server(["--model_path", model_path, "--served_model_name", SERVED, "--device", args.device, "--max_new_tokens", str(args.new_tokens)],
                              port, tmp / "serve.log", env={**os.environ})
        base = f"http://127.0.0.1:{port}"
        try:
            bodies = requests_of(data_dir, args.new_tokens)
            load_level(base, bodies, 1, 2, args.time_limit_s)  # warm-up, untimed
            levels = [load_level(base, bodies, clients, args.requests, args.time_limit_s) for clients in args.clients]
        finally:
            server.terminate()
            server.wait(timeout=60)
    print(f"{'clients':>8} {'requests':>9} {'failed':>7} {'req/s':>8} {'p50 s':>8} {'p90 s':>8} {'p99 s':>8} {'prefills':>9} {'steps':>6}")
    for level in levels:
        print(f"{level['clients']:>8} {level['requests']:>9} {level['failed']:>7} {level['requests_per_s']:>8.2f} {level['p50_s']:>8.3f} "
              f"{level['p90_s']:>8.3f} {level['p99_s']:>8.3f} {level['prefills']:>9} {level['steps']:>6}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "new_tokens": args.new_tokens, "levels": levels}, indent=2))


if __name__ == "__main__":
    main()
