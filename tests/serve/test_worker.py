"""The model thread of judge-serve, in process: a request that fails there fails alone."""

import pytest
import torch

from infer.options import ScoreOptions
from judge.model import load_judge
from judge.prompts import image_tokens, load_rubrics
from judge.templates import get_template
from judge.testing import write_original_checkpoint
from serve.generation import ChatPrompt
from serve.worker import Worker


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    return load_judge(write_original_checkpoint(tmp_path_factory.mktemp("ckpt"), seed=0))


def prompt(judge, text: str, tiles: int = 0, pixels: int = 0) -> ChatPrompt:
    query = (image_tokens(tiles, judge.settings.tokens_per_tile) + "\n" if tiles else "") + text
    ids = judge.tokenizer(get_template(judge.settings.template).render(query), return_tensors="pt").input_ids[0]
    size = judge.settings.tiling.image_size
    return ChatPrompt(ids, torch.zeros(pixels, 3, size, size) if pixels else None, max_new_tokens=3, top_logprobs=0)


def test_a_request_that_fails_in_the_model_thread_fails_alone_and_the_thread_goes_on(judge):
    worker = Worker(judge, load_rubrics(), ScoreOptions(max_new_tokens=3, max_tiles=2), "cpu", batch_wait_s=1.0)
    alone = worker.chat(prompt(judge, "Is this answer good?")).result(timeout=60)
    before = worker.counts["forward_batches"]
    # submitted within one batch wait: one round, in which the middle request's two tiles meet one tile's tokens
    futures = [worker.chat(prompt(judge, "Is this answer good?")), worker.chat(prompt(judge, "Broken.", tiles=1, pixels=2)),
               worker.chat(prompt(judge, "Another answer.", tiles=1, pixels=1))]
    good, bad, other = (f.exception(timeout=60) or f.result() for f in futures)
    assert isinstance(bad, Exception) and not isinstance(good, Exception) and not isinstance(other, Exception)
    assert good.tokens == alone.tokens and len(other.tokens) == 3
    # the round failed whole, then ran request by request: two batches completed, the broken request failed again alone
    assert worker.counts["failed_requests"] == 1 and worker.counts["forward_batches"] - before == 2
    assert worker.alive() and worker.chat(prompt(judge, "Still there?")).result(timeout=60).tokens
