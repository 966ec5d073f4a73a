"""judge-serve under load: requests/s and latency percentiles at 1, 8 and 32 concurrent clients.

    python benchmarks/serve_load.py                                          # tiny random judge, CPU
    python benchmarks/serve_load.py --model_path CKPT --device cuda --new_tokens 256 --requests 256
    python benchmarks/serve_load.py --clients 4 --long_prompt_tokens 40000 --cancel_long   # beside long prompts

Starts judge-serve on a free 127.0.0.1 port (loopback only) and, at each client count, sends a fixed
number of POST /v1/chat/completions requests (--requests) from that many threads, each thread sending its
next request as soon as its last is answered; a level stops early at --time_limit_s, and the server is
stopped at the end. Each request is a judge prompt of the synthetic dataset (the sample's text and its
first image, as a data URL) with max_tokens --new_tokens, greedy; the random judge never stops early, so
every request generates exactly that many tokens. The forward passes of each level (prefill groups and
decoding steps; alone, a request takes one prefill and a step per token after its first) come from /metrics.

With --long_prompt_tokens, each level runs twice: alone, then while one more client sends prompts of that
many tokens of text (max_tokens 1) one after another, so that the short requests' latency beside a long
prompt shows. With --cancel_long, a last long prompt is sent streamed and left --cancel_after_s later: the
figures say how many prefill passes and prompt tokens it cost, and how long after its client left the
model thread was idle again. --serve_flag passes a flag to judge-serve (e.g. --serve_flag=--max_num_batched_tokens=512).
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
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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


PASSES = ("judge_prefill_batches_total", "judge_decoding_steps_total", "judge_prefill_tokens_total")


def forward_passes(base: str) -> tuple[int, int, int]:
    """Prefill passes, decoding steps and prompt tokens prefilled the server has run."""
    return metric_values(base, PASSES)


def metric_values(base: str, names: tuple[str, ...]) -> tuple[int, ...]:
    """The server's figures of these unlabelled /metrics lines (0 for one a server of an earlier version does not have)."""
    lines = httpx2.get(f"{base}/metrics").text.splitlines()
    return tuple(int(float(next((line.split()[1] for line in lines if line.startswith(f"{name} ")), 0))) for name in names)


def running(base: str) -> float:
    line = next(line for line in httpx2.get(f"{base}/metrics").text.splitlines() if line.startswith("vllm:num_requests_running"))
    return float(line.rsplit(" ", 1)[1])


def long_body(tokens: int, stream: bool = False) -> dict:
    """A prompt of `tokens` tokens of text (a word and its space each, with the tiny judge's tokenizer)."""
    return {"model": SERVED, "messages": [{"role": "user", "content": "a " * tokens}], "max_tokens": 1, "temperature": 0, "stream": stream}


def percentile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def load_level(base: str, bodies: list[dict], clients: int, count: int, time_limit_s: float, long_tokens: int | None = None) -> dict:
    """`count` requests from `clients` threads, stopped early at the time limit; latencies of those answered.
    With `long_tokens`, one more client sends long prompts one after another meanwhile."""
    latencies, failures, next_index, lock = [], [], iter(range(count)), threading.Lock()
    passes_before = forward_passes(base)
    start = time.perf_counter()
    finished, long_latencies = threading.Event(), []

    def long_client() -> None:
        with httpx2.Client(timeout=time_limit_s * 10) as http:
            while not finished.is_set():
                sent = time.perf_counter()
                if http.post(f"{base}/v1/chat/completions", json=long_body(long_tokens)).status_code == 200:
                    long_latencies.append(time.perf_counter() - sent)

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

    with ThreadPoolExecutor(clients + 1) as pool:
        beside = pool.submit(long_client) if long_tokens else None
        if beside is not None:  # the short requests start once a long prompt is in the model thread
            while running(base) == 0 and not beside.done():
                time.sleep(0.01)
            start = time.perf_counter()
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
        elapsed = time.perf_counter() - start
        finished.set()
        if beside is not None:
            beside.result()
    return {"clients": clients, "long_prompt_tokens": long_tokens, "long_answered": len(long_latencies),
            "long_mean_s": statistics.fmean(long_latencies) if long_latencies else None,
            "requests": len(latencies), "failed": len(failures), "seconds": elapsed,
            "requests_per_s": len(latencies) / elapsed, "p50_s": percentile(latencies, 0.5), "p90_s": percentile(latencies, 0.9),
            "p99_s": percentile(latencies, 0.99), "mean_s": statistics.fmean(latencies) if latencies else None,
            **{name: after - before for name, after, before in zip(("prefills", "steps", "prefill_tokens"), forward_passes(base), passes_before)}}


def cancelled_long(base: str, tokens: int, after_s: float) -> dict:
    """A long prompt sent streamed, its client gone `after_s` later: what it cost, and how long after its client
    left the model thread ran nothing."""
    while running(base) > 0:
        time.sleep(0.05)
    before = forward_passes(base)
    with httpx2.stream("POST", f"{base}/v1/chat/completions", json=long_body(tokens, stream=True), timeout=None) as response:
        next(response.iter_lines())  # the first chunk: the request has reached the model thread
        time.sleep(after_s)
        left = time.perf_counter()
    while running(base) > 0:
        time.sleep(0.005)
    idle = time.perf_counter()
    costs = {name: after - earlier for name, after, earlier in zip(("prefills", "steps", "prefill_tokens"), forward_passes(base), before)}
    return {"prompt_tokens": tokens, "left_after_s": after_s, "idle_after_leaving_s": idle - left, **costs}


@contextmanager
def served(model_path: str | None, flags: list[str], image_root: bool = False) -> Iterator[tuple[str, Path]]:
    """judge-serve on `model_path` (default: a tiny random judge) with `flags`, beside a synthetic dataset (its
    --image_root where `image_root`): its base URL and the dataset's folder, the server stopped on leaving."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_path = model_path or str(write_original_checkpoint(tmp / "tiny"))
        data_dir = write_dataset(tmp / "data", 32, seed=0).parent
        port = free_port()
        server = start_server(["--model_path", model_path, *(["--image_root", str(data_dir)] if image_root else []), *flags], port, tmp / "serve.log", env={**os.environ})
        try:
            yield f"http://127.0.0.1:{port}", data_dir
        finally:
            server.terminate()
            server.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_path", help="the judge to serve (default: a tiny random one, written to a temporary directory)")
    p.add_argument("--device", default="cpu", help="judge-serve's --device (default: cpu)")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32], help="concurrent clients of each level (default: 1 8 32)")
    p.add_argument("--requests", type=int, default=64, help="requests per level (default: 64)")
    p.add_argument("--new_tokens", type=int, default=16, help="max_tokens of each request (default: 16)")
    p.add_argument("--time_limit_s", type=float, default=120, help="a level stops sending after this long (default: 120)")
    p.add_argument("--long_prompt_tokens", type=int, help="also run each level beside a client sending prompts of this many tokens (default: none)")
    p.add_argument("--cancel_long", action="store_true", help="at the end, leave a long prompt of --long_prompt_tokens part way (default: off)")
    p.add_argument("--cancel_after_s", type=float, default=0.5, help="seconds after sending it that --cancel_long leaves (default: 0.5)")
    p.add_argument("--serve_flag", action="append", default=[], help="a flag for judge-serve, as --serve_flag=--name=value (repeatable)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()

    with served(args.model_path, ["--served_model_name", SERVED, "--device", args.device, "--max_new_tokens", str(args.new_tokens),
                                  *args.serve_flag]) as (base, data_dir):
        bodies = requests_of(data_dir, args.new_tokens)
        load_level(base, bodies, 1, 2, args.time_limit_s)  # warm-up, untimed
        levels = [load_level(base, bodies, clients, args.requests, args.time_limit_s, long_tokens)
                  for clients in args.clients for long_tokens in (None, args.long_prompt_tokens)[: 1 + bool(args.long_prompt_tokens)]]
        cancelled = cancelled_long(base, args.long_prompt_tokens, args.cancel_after_s) if args.cancel_long else None
    print(f"{'clients':>8} {'beside':>8} {'requests':>9} {'failed':>7} {'req/s':>8} {'p50 s':>8} {'p90 s':>8} {'p99 s':>8} {'prefills':>9} {'steps':>6}"
          f" {'long answered':>14}")
    for level in levels:
        beside = f"{level['long_prompt_tokens']}" if level["long_prompt_tokens"] else "-"
        print(f"{level['clients']:>8} {beside:>8} {level['requests']:>9} {level['failed']:>7} {level['requests_per_s']:>8.2f} {level['p50_s']:>8.3f} "
              f"{level['p90_s']:>8.3f} {level['p99_s']:>8.3f} {level['prefills']:>9} {level['steps']:>6} {level['long_answered']:>14}")
    if cancelled:
        print(f"a {cancelled['prompt_tokens']}-token prompt left after {cancelled['left_after_s']:g} s: {cancelled['prefills']} prefill pass(es), "
              f"{cancelled['prefill_tokens']} prompt tokens prefilled, {cancelled['steps']} steps; idle {cancelled['idle_after_leaving_s']:.3f} s after")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "new_tokens": args.new_tokens, "serve_flags": args.serve_flag,
                                               "levels": levels, "cancelled_long": cancelled}, indent=2))


if __name__ == "__main__":
    main()
