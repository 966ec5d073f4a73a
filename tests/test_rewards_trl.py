"""TRL's own GRPOTrainer calling mmjudge.rewards.TRLReward, as a user's run does: a tiny text policy, one step,
each completion rewarded by a judge-serve of the tiny judge. TRL decides by its own check whether a reward
function is async (asyncio's iscoroutinefunction in 0.29, inspect's in 1.0, is_async_callable later); a reward
it takes for a plain function it calls without awaiting, and the step fails on the coroutine it got back."""

import asyncio
import os

import httpx2
import pytest
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer

from mmjudge.judge.testing import HANG_S, write_original_checkpoint, write_tokenizer
from mmjudge.rewards import Asked, Judged, ServerRewards, TRLReward
from mmjudge.serve.process import free_port, start_server


class Recorded(ServerRewards):
    """The rewarder, keeping each call's responses and what the judge answered."""

    calls: list

    async def ask(self, asked: list[Asked]) -> Judged:
        judged = await super().ask(asked)
        self.calls.append((asked, judged))
        return judged


@pytest.mark.slow
def test_trls_grpo_trainer_awaits_trl_reward_and_trains_a_step_on_the_judges_rewards(tmp_path):
    judge = write_original_checkpoint(tmp_path / "judge", seed=0)
    port = free_port()
    server = start_server(["--model_path", str(judge), "--reward", "score:SA", "--mode", "logits", "--max_tiles", "1", "--workers", "1"],
                          port, tmp_path / "serve.log", env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        tokenizer = write_tokenizer(tmp_path / "policy")
        policy = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                              num_attention_heads=2, num_key_value_heads=1, bos_token_id=tokenizer.bos_token_id,
                                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
        rewarder = Recorded(f"http://127.0.0.1:{port}", timeout_s=HANG_S, retries=0)
        rewarder.calls = []
        config = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2, num_generations=2,
                            max_completion_length=6, learning_rate=1e-5, logging_steps=1, report_to="none", use_cpu=True, bf16=False,
                            save_strategy="no", dataloader_num_workers=0, seed=0)
        trainer = GRPOTrainer(model=policy, processing_class=tokenizer, reward_funcs=[TRLReward(rewarder)], args=config,
                              train_dataset=Dataset.from_dict({"prompt": ["What colour is the sky?", "How many legs has a cat?"]}))
        trainer.train()
    finally:
        server.terminate()
        server.wait(timeout=HANG_S)
    (asked, judged), = rewarder.calls  # one step: one prompt's two completions, judged in one request
    assert trainer.state.global_step == 1 and rewarder.failed == 0 and len(asked) == 2
    assert all(0 <= r <= 1 for r in judged.rewards)
    logged = trainer.state.log_history[0]
    assert logged["rewards/mmjudge/mean"] == pytest.approx(sum(judged.rewards) / 2, abs=1e-6) and logged["mmjudge/failed"] == 0
