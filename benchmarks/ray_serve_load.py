"""judge-serve's replicas on Ray Serve (mmjudge/ray/serve.py) under RL reward load, against one plain judge-serve.

    python benchmarks/ray_serve_load.py                                  # tiny judge, CPU: 32 questions x 8 answers, 64 clients
    python benchmarks/ray_serve_load.py --json figures.json
    python benchmarks/ray_serve_load.py --model_path CKPT --device cuda --replicas 1     # one replica per GPU

Writes the tiny judge and a 32-sample synthetic dataset (or serves --model_path), starts one plain judge-serve and a
local Ray cluster on free 127.0.0.1 ports, and deploys on Ray Serve in turn: --replicas Judge replicas routed by
mmjudge's AffinityRouter, the same with Ray Serve's own router (power of two choices), and one replica. Each load is
sent to the plain judge-serve and, right after, through Ray Serve's proxy, so that each pair of figures is taken
under the same machine load. Every server runs --reward score:SA --mode logits --max_tiles 1 (a reward is one
prefill, its question's rubric, text and image kept in the reward endpoints' prefix cache), each judge process with
--threads OpenMP threads.

GRPO's load: --questions questions (new ones for each run, so that no server has them cached), each its text and an
image of its own, with --answers answers each, every answer a one-sample /get_reward request (as verl and OpenRLHF
send per-sample rewards) from --clients concurrent senders (reward_load.py's), the questions in turn: samples/s and
the prompt tokens prefilled (from /metrics, summed over replicas), Ray Serve's over the plain server's. Then the
proxy's cost: reward_load.py's --samples distinct one-sample requests, straight to judge-serve and through the proxy
to one replica (issue 52's goal: 0.7 of the samples/s or more). Rewards are compared with the plain server's (1e-6).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from reward_load import bodies_of, sent

from mmjudge.judge.testing import write_dataset, write_original_checkpoint
from mmjudge.serve.process import free_port, start_server

FLAGS = ["--reward", "score:SA", "--mode", "logits", "--max_tiles", "1"]


def grpo_bodies(data_dir: Path, questions: int, answers: int, tag: str = "") -> list[dict]:
    """Each question's answers, each a one-sample /get_reward body: the question's text and an image of its own (the
    dataset's image files in turn), the answers those of the samples after it."""
    samples = json.loads((data_dir / "data.json").read_text())
    files = sorted(str(f.relative_to(data_dir)) for f in (data_dir / "images").iterdir())
    text = lambda segments: segments if isinstance(segments, str) else " ".join(s["text"] for s in segments if s.get("text"))  # noqa: E731
    bodies = []
    for q in range(questions):
        sample = samples[q % len(samples)]
        prompt = f"({tag} {q}) {text(sample['question'])}"
        images = [files[q % len(files)]]
        for k in range(answers):
            answer = f" {text(samples[(q + 1 + k) % len(samples)]['answer'])} ({k})"
            bodies.append({"query": [prompt + answer], "prompts": [prompt], "images": [images]})
    return bodies


def prefilled(base: str) -> int:
    """Prompt tokens prefilled, summed over the server's replicas (mmjudge.ray.serve labels each one's series)."""
    import httpx2

    return sum(int(float(line.rsplit(" ", 1)[1])) for line in httpx2.get(f"{base}/metrics", timeout=60).text.splitlines()
               if line.startswith(("judge_prefill_tokens_total ", "judge_prefill_tokens_total{")))


def loaded(base: str, bodies: list[dict], clients: int, timeout_s: float) -> dict:
    before = prefilled(base)
    answers, latencies, seconds = sent(base, bodies, clients, timeout_s)
    failed = sum(a is None for a in answers)
    return {"samples": len(bodies), "clients": clients, "seconds": seconds, "samples_per_s": (len(bodies) - failed) / seconds,
            "failed": failed, "prefill_tokens": prefilled(base) - before, "rewards": [a and a["rewards"][0] for a in answers]}


def warmed(base: str, timeout_s: float) -> None:
    """Each replica's first requests, untimed: a question of no group, from a client per replica."""
    import httpx2

    for _ in range(4):
        httpx2.post(f"{base}/get_reward", json={"query": ["Warm-up. Yes."], "prompts": ["Warm-up. "]}, timeout=timeout_s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_path", help="the judge to serve (default: a tiny random one, written to a temporary directory)")
    p.add_argument("--device", default="cpu", help="judge-serve's --device; cuda: a GPU per replica (default: cpu)")
    p.add_argument("--replicas", type=int, default=2, help="Judge replicas of the GRPO runs (default: 2)")
    p.add_argument("--questions", type=int, default=32, help="GRPO questions (default: 32)")
    p.add_argument("--answers", type=int, default=8, help="answers per question (default: 8)")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (default: 64)")
    p.add_argument("--samples", type=int, default=512, help="one-sample requests of the proxy's comparison (default: 512)")
    p.add_argument("--threads", type=int, default=1, help="OpenMP threads of each judge process, plain or replica (default: 1)")
    p.add_argument("--timeout_s", type=float, default=3600, help="the longest a request may take (default: 3600)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args()

    import ray
    from ray import serve

    from mmjudge.ray.serve import application
    from mmjudge.serve.cli import build_parser, settings

    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_path = args.model_path or str(write_original_checkpoint(tmp / "tiny"))
        data_dir = write_dataset(tmp / "data", 32, seed=0).parent
        flags = ["--model_path", model_path, "--image_root", str(data_dir), "--device", args.device, *FLAGS]
        port = free_port()
        plain = start_server(flags, port, tmp / "plain.log", env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        gpu = args.device.startswith("cuda")
        ray.init(include_dashboard=False, logging_level="warning", num_cpus=max(args.replicas * args.threads, os.cpu_count() or 1))
        try:
            direct, proxied = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}"
            serve.start(http_options={"host": "127.0.0.1", "port": int(proxied.rsplit(":", 1)[1])})
            parsed = build_parser(flags).parse_args(flags)
            options, limits, api_key = settings(parsed, listening=False)
            warmed(direct, args.timeout_s)
            for name, router, replicas in (("affinity", "affinity", args.replicas), ("default", "default", args.replicas), ("one_sample", "affinity", 1)):
                started = time.perf_counter()
                serve.run(application(parsed, options, limits, api_key, replicas, router,
                                      {"num_cpus": args.threads, "num_gpus": 1 if gpu else 0}), name="judge-serve", route_prefix="/")
                print(f"{name}: {replicas} replicas up in {time.perf_counter() - started:.1f} s", flush=True)
                warmed(proxied, args.timeout_s)
                # questions of this run's own (none in the plain server's cache yet), the plain server's run just before Ray's
                bodies = bodies_of(data_dir, args.samples) if name == "one_sample" else grpo_bodies(data_dir, args.questions, args.answers, name)
                runs[name] = {"replicas": replicas, "plain": loaded(direct, bodies, args.clients, args.timeout_s),
                              "ray": loaded(proxied, bodies, args.clients, args.timeout_s)}
                serve.delete("judge-serve")
        finally:
            serve.shutdown()
            ray.shutdown()
            plain.terminate()
            plain.wait(timeout=60)

    report(args, runs)


def report(args, runs: dict[str, dict]) -> None:
    """Each Ray Serve run beside the plain server's run of the same requests just before it."""
    record = {"device": args.device, "replicas": args.replicas, "questions": args.questions, "answers": args.answers, "clients": args.clients,
              "samples": args.samples, "threads": args.threads, "load_average": os.getloadavg()[0], "commit": source_commit(), "runs": {}}
    for name, run in runs.items():
        plain, ray = run["plain"], run["ray"]
        differ = sum(r is None or b is None or abs(r - b) > 1e-6 for r, b in zip(ray["rewards"], plain["rewards"]))
        record["runs"][name] = {"replicas": run["replicas"], "plain": {k: v for k, v in plain.items() if k != "rewards"},
                                "ray": {k: v for k, v in ray.items() if k != "rewards"}, "rewards_differing": differ,
                                "prefill_tokens_ratio": ray["prefill_tokens"] / plain["prefill_tokens"],
                                "samples_per_s_ratio": ray["samples_per_s"] / plain["samples_per_s"]}
        print(f"{name}: {ray['samples']} one-sample rewards from {ray['clients']} clients, {run['replicas']} replicas: {ray['samples_per_s']:.2f} "
              f"samples/s ({ray['failed']} failed), {ray['prefill_tokens']:,} prompt tokens prefilled; one judge-serve just before: "
              f"{plain['samples_per_s']:.2f} samples/s, {plain['prefill_tokens']:,} tokens; Ray Serve / plain: prefilled "
              f"{record['runs'][name]['prefill_tokens_ratio']:.2f}, samples/s {record['runs'][name]['samples_per_s_ratio']:.2f}; "
              f"{differ} rewards differ")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))


def source_commit() -> str:
    """The checkout's commit, `+dirty` where it has uncommitted changes."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip()
    return commit + ("+dirty" if dirty else "")


def markdown(record: dict) -> str:
    """The table of a run's record (--json), as docs/past-one-machine.md shows it."""
    load = {"affinity": f"GRPO: {record['questions']} questions x {record['answers']} answers", "default": "the same, new questions",
            "one_sample": f"{record['samples']} distinct one-sample requests"}
    router = {"affinity": "mmjudge's AffinityRouter", "default": "Ray Serve's own (power of two choices)", "one_sample": "mmjudge's AffinityRouter"}
    lines = ["| load | replicas, router | samples/s: Ray Serve / one judge-serve | ratio | prompt tokens prefilled: Ray Serve / one judge-serve | ratio | rewards differing |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, run in record["runs"].items():
        ray, plain = run["ray"], run["plain"]
        lines.append(f"| {load[name]} | {run['replicas']}, {router[name]} | {ray['samples_per_s']:.2f} / {plain['samples_per_s']:.2f} | "
                     f"{run['samples_per_s_ratio']:.2f} | {ray['prefill_tokens']:,} / {plain['prefill_tokens']:,} | {run['prefill_tokens_ratio']:.2f} | "
                     f"{run['rewards_differing']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
