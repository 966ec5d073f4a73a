"""judge-serve's own settings, each a flag of its name: the names the judge is served under, how long a
batch waits to fill, and the limits that keep a request from taking the server's memory or time. Free of torch, like infer/options.py, so
that the command line is read and checked before any model code loads."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from mmjudge.judge.cli import setting_problems
from mmjudge.judge.data import UsageError


def _limit(default: int, help: str, minimum: int):
    return field(default=default, metadata={"help": help, "minimum": minimum})


# Prompt tokens per engine step when --max_num_batched_tokens is not given. On a CPU a 2048-token chunk
# beside a 16,000-token prompt took seconds, so short requests waited longer than for the unchunked prefill;
# 512 halved their median and p99 (docs/serve.md, "Long prompts").
GPU_PREFILL_BUDGET, CPU_PREFILL_BUDGET = 2048, 512

# The judge names harness tasks send whatever judge they are pointed at, read in their source (VLMEvalKit's
# build_judge maps --judge gpt-4o to gpt-4o-2024-05-13; lmms-eval's hallusion_bench always asks for gpt-4): the
# names --harness_names answers to beside --served_model_name's, each with who sends it. docs/harnesses.md's
# table of them is checked against this one (tests/serve/test_names.py).
HARNESS_NAMES = {
    "gpt-4o": "lmms-eval wildvision_0617/0630 and live_bench (fixed in the task); VLMEvalKit with LOCAL_LLM=gpt-4o",
    "gpt-4o-mini": "lmms-eval live_bench's second score (fixed in the task)",
    "gpt-4": "lmms-eval hallusion_bench (fixed in its evaluate_by_chatgpt, MODEL_VERSION not read)",
    "gpt-4o-2024-05-13": "VLMEvalKit --judge gpt-4o (build_judge's map); lmms-eval charxiv's default",
    "gpt-4o-2024-08-06": "VLMEvalKit --judge gpt-4o-0806",
    "gpt-4o-2024-11-20": "VLMEvalKit --judge gpt-4o-1120; lmms-eval's MODEL_VERSION default (mathvista, egothink's own, llava_in_the_wild, ...)",
    "gpt-4o-mini-2024-07-18": "VLMEvalKit --judge gpt-4o-mini (POPE's and other datasets' default judge)",
    "gpt-4-1106-preview": "VLMEvalKit --judge gpt-4-turbo (MMVet's default judge)",
    "gpt-4-0125-preview": "VLMEvalKit --judge gpt-4-0125",
    "gpt-4-turbo-2024-04-09": "VLMEvalKit --judge gpt-4-0409",
    "gpt-4-0613": "VLMEvalKit --judge gpt-4-0613",
    "gpt-3.5-turbo-1106": "VLMEvalKit --judge chatgpt-1106",
    "gpt-3.5-turbo-0125": "VLMEvalKit --judge chatgpt-0125",
}


def prefill_budget(given: int | None, device: str) -> int:
    if given is not None:
        return given
    return GPU_PREFILL_BUDGET if device.startswith("cuda") else CPU_PREFILL_BUDGET


@dataclass(frozen=True)
class ServeOptions:
    served_model_name: list[str] | None = field(default=None, metadata={
        "help": "the names requests may give as their `model` (vLLM's flag: several names, the first the one /v1/models lists first and an "
                "answer gives where the request names none); any other name is answered 404 model_not_found; none: --model_path as given"})
    harness_names: bool = field(default=False, metadata={
        "help": f"also answer to the judge names harness tasks send whatever they are told (docs/harnesses.md): {', '.join(HARNESS_NAMES)}"})
    batch_wait_ms: int = _limit(20, "how long the first request of a batch waits for others to join it, in ms", 0)
    max_request_bytes: int = _limit(64 * 2**20, "largest request body in bytes (images travel base64 inside it)", 1)
    max_samples: int = _limit(256, "samples per /v1/score request", 1)
    max_images: int = _limit(64, "images per sample or per chat request", 0)
    max_image_pixels: int = _limit(40_000_000, "width x height of an image, read from its header before it is decoded", 1)
    max_grammar_chars: int = _limit(65_536, "size of a request's structured output in characters (a JSON schema as JSON text, a regex, a "
                                    "grammar, the choices as a JSON list), refused (400) past it before it is compiled", 1)
    max_grammar_seconds: int = _limit(10, "how long a request's structured output may take to compile (in a thread of its own, which the "
                                      "server does not wait for), refused (400) past it", 1)
    max_num_batched_tokens: int | None = field(default=None, metadata={
        "help": "prompt tokens prefilled per engine step at most (vLLM's name): a longer chat prompt is prefilled in chunks between the "
                "decoding steps of the answers being written, and stops at the next chunk when its client leaves; none: "
                f"{GPU_PREFILL_BUDGET} on a GPU (vLLM's), {CPU_PREFILL_BUDGET} on a CPU, where a chunk of {GPU_PREFILL_BUDGET} takes seconds "
                "that every short answer beside it waits", "minimum": 1})
    max_model_len: int | None = field(default=None, metadata={
        "help": "tokens a request's prompt and answer hold together at most (vLLM's name): a longer prompt is refused (400) before it "
                "reaches the model, an answer is cut there; none: the model's context", "minimum": 2})
    replicas: int | None = field(default=None, metadata={
        "help": "judge replicas on Ray Serve behind this one address (--host, --port), each a judge-serve of these flags, a request "
                "sent to the replica that last judged its question and images unless that one is overloaded, else to the least loaded "
                "(docs/past-one-machine.md); joins the Ray cluster `ray start` made on this machine, or starts one; needs the ray extra; "
                "none: one process, no Ray", "minimum": 1})
    reward: str | None = field(default=None, metadata={
        "help": "what the reward endpoints (/classify, /get_reward, /v1/score/evaluation, /v1/decisions) answer, KIND:CATEGORY "
                "(docs/rewards.md): score:CATEGORY, a pointwise rubric's expected score mapped to [0, 1] (score:CATEGORY:CALIBRATOR.json "
                "through a judge-calibrate map); preference:CATEGORY, the probability that the response beats the reference answer "
                "under a pairwise rubric, both orders averaged; verdict:CATEGORY, 1 where a judge being trained writes the labelled "
                "verdict; none: the reward endpoints refuse"})
    reward_mode: Literal["auto", "logits", "generate"] = field(default="auto", metadata={
        "help": "how the reward endpoints judge - logits: one prefill per response, the score (or verdict) distribution read after the "
                "rubric's forced heading, nothing written; generate: the judge writes its feedback and score; auto: logits where the "
                "reward's rubric has each score (each verdict) one token of this judge's tokenizer, generate elsewhere. Every answer "
                "names the mode that ran (docs/rewards.md)"})

    def __post_init__(self):
        if problems := setting_problems(ServeOptions, asdict(self)):
            raise UsageError("invalid server options:\n  " + "\n  ".join(problems))

    def served_names(self, model_path: str) -> tuple[str, ...]:
        """Each name the judge is served under, once, the default first."""
        return tuple(dict.fromkeys([*(self.served_model_name or [model_path]), *(HARNESS_NAMES if self.harness_names else ())]))
