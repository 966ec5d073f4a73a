"""judge-serve's Service loaded from its flags (serve/cli.py reads and checks them): the judge, its rubrics and reward,
and the model thread, in judge-serve's own process or in each of its replicas on Ray Serve (mmjudge/ray/serve.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from mmjudge.infer.options import ScoreOptions
from mmjudge.judge.data import UsageError
from mmjudge.judge.formats import FORMATS
from mmjudge.judge.prompts import load_rubrics
from mmjudge.judge.rewards import parse_reward
from mmjudge.serve.options import ServeOptions, prefill_budget


def judged_by(args, limits: ServeOptions) -> tuple[dict, object]:
    """The rubrics and the reward (None: none asked), every flag of them checked before the model loads."""
    rubrics = load_rubrics(args.rubric or FORMATS["pairs"].default_rubrics)
    reward = parse_reward(limits.reward, rubrics) if limits.reward else None
    from mmjudge.infer.reward_model import is_reward_checkpoint

    if reward and (reward.kind == "preference" or reward.calibrator) and is_reward_checkpoint(Path(args.model_path)):
        raise UsageError(f"--reward {limits.reward}: {args.model_path} is a reward model, whose reward is its head's own, of each answer "
                         "alone: give score:CATEGORY (a pointwise rubric's category, uncalibrated)")
    return rubrics, reward


def load_service(args, options: ScoreOptions, limits: ServeOptions, api_key: str | None):
    """The judge loaded and its model thread started: what judge-serve's endpoints answer from, in this process or in
    each of Ray Serve's replicas."""
    from mmjudge.infer.engine import judge_vocabulary
    from mmjudge.infer.grammar import GrammarError
    from mmjudge.infer.loaded import LoadedJudge, find_checkpoint
    from mmjudge.judge.model import judge_tokenizer, with_max_tiles
    from mmjudge.judge.rope import context_length
    from mmjudge.serve.metrics import Metrics
    from mmjudge.serve.rewards import reward_options, with_prefix_cache
    from mmjudge.serve.service import Service
    from mmjudge.serve.worker import Worker

    rubrics, reward = judged_by(args, limits)
    rewarding = None  # the reward endpoints' options, from the judge's tokenizer before its weights load (--reward_mode)
    if reward is not None:
        tokenizer = judge_tokenizer(find_checkpoint(args.model_path, args.revision).path)
        rewarding = reward_options(reward, rubrics, tokenizer, options, limits.reward_mode)

    # the judge judge-score and the Python API load; refused there where --deterministic's kernels cannot run
    loaded = LoadedJudge.load(args.model_path, args.device, args.dtype, args.revision, options.deterministic)
    judge, device = loaded.model, loaded.device
    judge.settings = with_max_tiles(judge.settings, options.max_tiles)
    if rewarding is not None:  # its prefix cache is sized from the judge in memory
        rewarding = with_prefix_cache(rewarding, judge, device)
    context = context_length(judge.model.config.get_text_config())
    if limits.max_model_len is not None and limits.max_model_len > context:
        raise UsageError(f"--max_model_len {limits.max_model_len} is more than {args.model_path}'s context of {context} tokens")
    worker = Worker(judge, rubrics, options, device, limits.batch_wait_ms / 1000, prefill_budget(limits.max_num_batched_tokens, device),
                    limits.max_model_len, None if rewarding is None else (rewarding, rubrics[reward.category]))
    names = limits.served_names(args.model_path)
    try:
        vocabulary = judge_vocabulary(judge)
    except GrammarError as err:  # requests for structured outputs are refused, saying why
        vocabulary = str(err)
        print(f"judge-serve: no structured outputs: {err}", file=sys.stderr, flush=True)
    return Service(names, judge, rubrics, options, limits, Path(args.image_root) if args.image_root else None, api_key,
                   worker, int(time.time()), worker.context, Metrics(names[0]), vocabulary, loaded.fingerprint, reward, rewarding)
