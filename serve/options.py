"""judge-serve's own settings, each a flag of its name: how long a batch waits to fill, and the limits
that keep a request from taking the server's memory or time. Free of torch, like infer/options.py, so
that the command line is read and checked before any model code loads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mmjudge.judge.cli import setting_problems
from mmjudge.judge.data import UsageError


def _limit(default: int, help: str, minimum: int):
    return field(default=default, metadata={"help": help, "minimum": minimum})


# Prompt tokens per engine step when --max_num_batched_tokens is not given. On a CPU a 2048-token chunk
# beside a 16,000-token prompt took seconds, so short requests waited longer than for the unchunked prefill;
# 512 halved their median and p99 (docs/serve.md, "Long prompts").
GPU_PREFILL_BUDGET, CPU_PREFILL_BUDGET = 2048, 512


def prefill_budget(given: int | None, device: str) -> int:
    if given is not None:
        return given
    return GPU_PREFILL_BUDGET if device.startswith("cuda") else CPU_PREFILL_BUDGET


@dataclass(frozen=True)
class ServeOptions:
    batch_wait_ms: int = _limit(20, "how long the first request of a batch waits for others to join it, in ms", 0)
    max_request_bytes: int = _limit(64 * 2**20, "largest request body in bytes (images travel base64 inside it)", 1)
    max_samples: int = _limit(256, "samples per /v1/score request", 1)
    max_images: int = _limit(64, "images per sample or per chat request", 0)
    max_image_pixels: int = _limit(40_000_000, "width x height of an image, read from its header before it is decoded", 1)
    max_num_batched_tokens: int | None = field(default=None, metadata={
        "help": "prompt tokens prefilled per engine step at most (vLLM's name): a longer chat prompt is prefilled in chunks between the "
                "decoding steps of the answers being written, and stops at the next chunk when its client leaves; none: "
                f"{GPU_PREFILL_BUDGET} on a GPU (vLLM's), {CPU_PREFILL_BUDGET} on a CPU, where a chunk of {GPU_PREFILL_BUDGET} takes seconds "
                "that every short answer beside it waits", "minimum": 1})
    max_model_len: int | None = field(default=None, metadata={
        "help": "tokens a request's prompt and answer hold together at most (vLLM's name): a longer prompt is refused (400) before it "
                "reaches the model, an answer is cut there; none: the model's context", "minimum": 2})
    reward: str | None = field(default=None, metadata={
        "help": "what the reward endpoints (/classify, /get_reward, /v1/score/evaluation, /v1/decisions) answer, KIND:CATEGORY "
                "(docs/rewards.md): score:CATEGORY, a pointwise rubric's expected score mapped to [0, 1] (score:CATEGORY:CALIBRATOR.json "
                "through a judge-calibrate map); preference:CATEGORY, the probability that the response beats the reference answer "
                "under a pairwise rubric, both orders averaged; verdict:CATEGORY, 1 where a judge being trained writes the labelled "
                "verdict; none: the reward endpoints refuse"})

    def __post_init__(self):
        if problems := setting_problems(ServeOptions, asdict(self)):
            raise UsageError("invalid server options:\n  " + "\n  ".join(problems))
