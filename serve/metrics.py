"""judge-serve's /metrics: Prometheus text in the shape of vLLM's, so that dashboards built on vLLM read it.

    http_requests_total{handler, method, status}    every answer, its status class ("2xx", "4xx") a label of its own
    vllm:e2e_request_latency_seconds                histogram: arrival to last token, requests that reached the model
    vllm:time_to_first_token_seconds                histogram: arrival to first written token, chat requests
    vllm:prompt_tokens_total, vllm:generation_tokens_total
    vllm:request_success_total{finished_reason}     chat choices by how they ended ("abort": the client left)
    vllm:num_requests_running, vllm:num_requests_waiting
    judge_*                                         the model thread's own counters: forward passes (a decoding
                                                    step is one token for every answer being written), rounds,
                                                    samples, completions, failures

Every vllm: series carries `model_name`. The names, types and histogram buckets are vLLM's (docs/serve.md
says where they were read); the judge_* counters are this server's.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

# vLLM's buckets for the two latencies, in seconds
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


@dataclass
class Histogram:
    buckets: list[float]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last is +Inf
    total: float = 0.0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value

    def lines(self, name: str, labels: str) -> list[str]:
        counts = self.counts or [0] * (len(self.buckets) + 1)
        cumulative, lines = 0, []
        for bound, count in zip([*map(str, self.buckets), "+Inf"], counts):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{bound}",{labels}}} {cumulative}')
        return lines + [f"{name}_sum{{{labels}}} {self.total}", f"{name}_count{{{labels}}} {cumulative}"]


@dataclass
class Metrics:
    """What the event loop's thread records (no lock needed: one thread writes, the endpoint reads there too)."""

    model_name: str
    http: Counter = field(default_factory=Counter)  # (handler, method, status class) -> answers
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: Counter = field(default_factory=Counter)  # finish_reason -> choices
    in_model: int = 0  # requests handed to the model thread and not yet answered

    def text(self, worker_counts: Counter, forwards: dict[str, int], queued: int) -> str:
        model = f'model_name="{escaped(self.model_name)}"'
        lines = ["# HELP http_requests_total Answers by handler, method and status class", "# TYPE http_requests_total counter"]
        lines += [f'http_requests_total{{handler="{escaped(handler)}",method="{method}",status="{status}"}} {n}'
                  for (handler, method, status), n in sorted(self.http.items())]
        for name, kind, help_text, value in [
            ("vllm:num_requests_running", "gauge", "Requests the model thread has taken and not yet answered", self.in_model - queued),
            ("vllm:num_requests_waiting", "gauge", "Requests waiting for the model thread", queued),
            ("vllm:prompt_tokens_total", "counter", "Prompt tokens of chat requests", self.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", "Tokens written for chat requests", self.generation_tokens),
        ]:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{{model}}} {value}"]
        lines += ["# HELP vllm:request_success_total Chat choices finished, by finish reason", "# TYPE vllm:request_success_total counter"]
        lines += [f'vllm:request_success_total{{finished_reason="{reason}",{model}}} {n}' for reason, n in sorted(self.finished.items())]
        for name, histogram, help_text in [
            ("vllm:e2e_request_latency_seconds", self.e2e, "Seconds from a request's arrival to its answer, requests that reached the model"),
            ("vllm:time_to_first_token_seconds", self.ttft, "Seconds from a chat request's arrival to its first written token"),
        ]:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram", *histogram.lines(name, model)]
        for name, value, help_text in [
            ("judge_prefix_cache_limit_tokens", forwards["prefix_limit"], "tokens of keys and values the prefix caches may hold (0: none)"),
            ("judge_prefix_cache_tokens", forwards["prefix_tokens"], "tokens of keys and values the prefix caches hold"),
        ]:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        for name, value, help_text in [
            ("judge_prefill_batches_total", forwards["prefill"], "prefill forward passes: each a group of prompts or a chunk of one, scoring and chat alike"),
            ("judge_prefill_tokens_total", forwards["prefill_tokens"], "prompt tokens prefilled (a prompt left half way counts its chunks)"),
            ("judge_prefix_cache_hits_total", forwards["prefix_hits"], "prompts whose part before their first answer came from the prefix cache or another prompt of their prefill group"),
            ("judge_prefix_cache_misses_total", forwards["prefix_misses"], "prompts whose part before their first answer was prefilled (and kept, where the cache admitted it)"),
            ("judge_decoding_steps_total", forwards["step"], "decoding forward passes: each one token for every sequence being written"),
            ("judge_rounds_total", worker_counts["rounds"], "rounds of the model thread: the requests waiting, taken together"),
            ("judge_samples_total", worker_counts["samples"], "samples scored through /v1/score"),
            ("judge_completions_total", worker_counts["completions"], "chat completions generated"),
            ("judge_failed_requests_total", worker_counts["failed_requests"], "requests that failed in the model thread"),
        ]:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]
        return "\n".join(lines) + "\n"


def escaped(label: str) -> str:
    """A label value as Prometheus' text format writes it."""
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
