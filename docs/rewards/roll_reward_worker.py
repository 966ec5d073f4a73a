"""A ROLL reward worker over judge-serve: in a ROLL pipeline's `rewards` config, a domain whose `worker_cls` is
`roll_reward_worker.MMJudgeRewardWorker` (this folder on PYTHONPATH) and whose `judge_api_url` is the judge-serve's
address (or MMJUDGE_URL set). Each response, its prompt's user turn and `ground_truth` (the reference), and the
images ROLL's collator put in the request's `multi_modal_data` go to the judge at once (mmjudge.rewards.roll_rewards).
ROLL's rewards are tensors of numbers: a failed judgement is 0.0, and the batch's share of them the metric
`mmjudge/judge_failed`."""

import torch
from roll.distributed.executor.worker import Worker
from roll.distributed.scheduler.decorator import Dispatch, register
from roll.distributed.scheduler.protocol import DataProto
from roll.models.model_providers import default_tokenizer_provider

from mmjudge.rewards import roll_rewards


def user_turn(prompt: str) -> str:
    """The question in a prompt decoded without its special tokens, as ROLL's own judge worker takes it: what follows
    its last user turn's header, the assistant's header after it left out."""
    question = prompt.split("user\n")[-1]
    return question.removesuffix("\n").removesuffix("assistant").strip()


class MMJudgeRewardWorker(Worker):
    def __init__(self, worker_config):
        super().__init__(worker_config=worker_config)
        self.rank_info.dp_rank = self.rank_info.rank
        self.rank_info.dp_size = self.rank_info.world_size
        self.tokenizer = default_tokenizer_provider(model_args=self.worker_config.model_args)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def initialize(self, pipeline_config):
        pass

    @register(dispatch_mode=Dispatch.DP_MP_COMPUTE, clear_cache=False)
    def compute_rewards(self, data: DataProto) -> DataProto:
        prompts = self.tokenizer.batch_decode(data.batch["prompts"], skip_special_tokens=True)
        responses = self.tokenizer.batch_decode(data.batch["responses"], skip_special_tokens=True)
        batch = data.non_tensor_batch
        judged = roll_rewards([user_turn(p) for p in prompts], responses, batch["ground_truth"], batch.get("multi_modal_data"),
                              base_url=getattr(self.worker_config, "judge_api_url", None))
        scores = torch.tensor(judged["scores"], dtype=torch.float32)  # ROLL's rule workers' float16 holds 3 digits
        output = DataProto.from_dict(tensors={"token_level_rewards": torch.zeros_like(data.batch["responses"], dtype=torch.float32),
                                              "response_level_rewards": scores, "scores": scores})
        output.meta_info = {"metrics": {"mmjudge/judge_failed": sum(judged["judge_failed"]) / len(scores)}}
        return output
