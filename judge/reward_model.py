"""A Bradley-Terry reward judge: a head (`score`) on the language model's last hidden state at a prompt's last
token, one prefill per answer and no decoding (judge-train --objective bradley_terry trains it).

The model is transformers' sequence-classification layout, num_labels 1: the backbone's native model under
`model.` (as its ForConditionalGeneration holds it, less the output layer) and the head as `score.weight`
(linear) or `score.0.*`, `score.2.weight` (mlp: hidden -> SiLU -> 1). Its config.json is the backbone's,
with `architectures` [<Family>ForSequenceClassification], `num_labels` 1 and `reward_head`. That is what vLLM's
pooling runner loads for Qwen2.5-VL and Qwen3-VL (linear head). transformers 5.23 and 5.24 ship no such class
for a vision-language family, so this module registers one per family with AutoModelForSequenceClassification,
built as transformers builds its text models' (GenericForSequenceClassification over the family's
PreTrainedModel): training, scoring and the export run one forward, and AutoModelForSequenceClassification
reads the export once mmjudge.judge.reward_model is imported. InternVL's is the same layout under the name
InternVLForSequenceClassification, which neither transformers nor vLLM has (docs/reward-models.md).

The reward is read at the rightmost token that is not the pad token (transformers' rule), so the config's
text pad_token_id is the judge's pad, which no prompt ends with (a prompt ends in its template's assistant
opening).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, CONFIG_MAPPING, PreTrainedModel
from transformers.modeling_layers import GenericForSequenceClassification

from mmjudge.judge.checkpoint import CheckpointError, read_json_object

HEAD_KEY = "reward_head"  # config.json: the head's kind
# The PreTrainedModel of each family in transformers, by model_type: what the classifier is built over.
PRETRAINED = {"internvl": ("internvl", "InternVLPreTrainedModel", "InternVL"),
              "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLPreTrainedModel", "Qwen2_5_VL"),
              "qwen3_vl": ("qwen3_vl", "Qwen3VLPreTrainedModel", "Qwen3VL"),
              "qwen3_5": ("qwen3_5", "Qwen3_5PreTrainedModel", "Qwen3_5"),
              "qwen3_5_moe": ("qwen3_5_moe", "Qwen3_5MoePreTrainedModel", "Qwen3_5Moe")}


def reward_head(kind: str, hidden_size: int) -> torch.nn.Module:
    """A fresh head: linear (Skywork-VL-Reward's) or a two-layer SiLU MLP (BaseReward's)."""
    if kind == "linear":
        return torch.nn.Linear(hidden_size, 1, bias=False)
    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(hidden_size, hidden_size), torch.nn.SiLU(), torch.nn.Linear(hidden_size, 1, bias=False))
    raise ValueError(f"unknown reward head {kind!r}; the heads are linear, mlp")


def classifier_class(model_type: str) -> type[PreTrainedModel]:
    """The family's <Family>ForSequenceClassification (module docstring), registered with transformers' Auto class."""
    import importlib

    module, base_name, family = PRETRAINED[model_type]
    base = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), base_name)

    def __init__(self, config):
        super(cls, self).__init__(config)
        self.score = reward_head(getattr(config, HEAD_KEY, "linear"), config.get_text_config().hidden_size)
        self.post_init()

    cls = type(f"{family}ForSequenceClassification", (GenericForSequenceClassification, base), {"__init__": __init__})
    return cls


CLASSIFIERS = {model_type: classifier_class(model_type) for model_type in PRETRAINED}
for _type, _cls in CLASSIFIERS.items():
    AutoModelForSequenceClassification.register(CONFIG_MAPPING[_type], _cls, exist_ok=True)


def reward_classifier(vlm: PreTrainedModel, pad_id: int, kind: str) -> PreTrainedModel:
    """A reward model over a judge's own native model `vlm` (its weights shared, not copied) with a fresh head of
    `kind` on the same device and in the same dtype; its config says how to find the last token: the first
    token left of the judge's pad `pad_id`."""
    config = copy.deepcopy(vlm.config)
    config.architectures = [CLASSIFIERS[config.model_type].__name__]
    config.num_labels = 1
    setattr(config, HEAD_KEY, kind)
    config.get_text_config().pad_token_id = pad_id
    with torch.device("meta"):
        model = CLASSIFIERS[config.model_type](config)
    model.model = vlm.model
    model.score = reward_head(kind, config.get_text_config().hidden_size).to(vlm.dtype)
    return model.to(vlm.device)


def rewards(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One reward per row of a right-padded batch (the Collator's, without labels), in float32."""
    inputs = {name: value for name, value in batch.items() if name != "labels"}
    return model(**inputs, use_cache=False).logits[:, 0].float()


def load_reward_model(path: Path, dtype: torch.dtype) -> PreTrainedModel:
    """A reward checkpoint's model, refused where its weights do not fill it exactly (a head left at its random
    start would score at random)."""
    config = read_json_object(path / "config.json")
    if config.get("model_type") not in CLASSIFIERS:
        raise CheckpointError(f"{path}/config.json: model_type {config.get('model_type')!r} has no reward layout; "
                              f"the families are {', '.join(CLASSIFIERS)}")
    model, info = CLASSIFIERS[config["model_type"]].from_pretrained(path, dtype=dtype, output_loading_info=True)
    if info["missing_keys"] or info["unexpected_keys"] or info.get("mismatched_keys"):
        raise CheckpointError(f"{path}: the weights do not fit a {config['model_type']} reward model: missing "
                              f"{sorted(info['missing_keys'])[:5]}, unexpected {sorted(info['unexpected_keys'])[:5]}")
    return model


def is_reward_model(model: torch.nn.Module) -> bool:
    return type(model) in CLASSIFIERS.values()
