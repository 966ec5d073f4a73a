"""An ms-swift GRPO reward plugin over judge-serve: `swift rlhf --rlhf_type grpo --external_plugins
docs/rewards/ms_swift_plugin.py --reward_funcs mmjudge ...` with MMJUDGE_URL set. Each batch's completions, its
conversations' user turns (the question) and its `images` column go to the judge at once (mmjudge.rewards.TRLReward);
a failed judgement is None, which ms-swift skips as TRL does."""

import os

from swift.rewards import AsyncORM, orms

from mmjudge.rewards import ServerRewards, TRLReward


class MMJudgeReward(AsyncORM):
    def __init__(self, args=None, **kwargs):
        super().__init__(args, **kwargs)
        self.reward = TRLReward(ServerRewards(os.environ["MMJUDGE_URL"]))

    async def __call__(self, completions, messages=None, images=None, **kwargs):
        questions = [[turn for turn in conversation if turn["role"] == "user"] for conversation in messages]
        return await self.reward(prompts=questions, completions=completions, images=images, **kwargs)


orms["mmjudge"] = MMJudgeReward
