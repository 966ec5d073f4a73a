"""Backbones: each family a small adapter over transformers' native class, the engine generic over them.

    family        checkpoints                                     native class (transformers)
    InternVL      InternVL2 1B-8B, InternVL2.5, InternVL3:        InternVLForConditionalGeneration, its language
                  original InternVLChatModel and -hf layouts      model Phi-3, Qwen2, Llama (InternLM2 mapped onto it)
    Qwen2.5-VL    Qwen/Qwen2.5-VL-*                               Qwen2_5_VLForConditionalGeneration
    Qwen3-VL      Qwen/Qwen3-VL-*                                 Qwen3VLForConditionalGeneration
    Qwen3.5       Qwen/Qwen3.5-* (dense; MoE: -A3B ... -A17B)     Qwen3_5ForConditionalGeneration,
                                                                  Qwen3_5MoeForConditionalGeneration

What a family decides, and nothing else (everything else is generic: judge/model.py loads, infer/ scores,
train/ trains, serve/ serves):

    loading       its checkpoints' layouts onto the native class, and back (`judge-train merge`)
    images        its `ImageProcessing` (judge/vision.py): InternVL's tiles, Qwen-VL's smart resize
    template      its chat template and system message, read as data from the checkpoint (judge/templates.py)
    positions     its rotary-position rule per row (`positions`): 1-D for InternVL, 3-D M-RoPE for Qwen-VL
    features      how its vision tower's features enter the language model (`features`): InternVL's replace
                  the image tokens' embeddings, Qwen3-VL's also add DeepStack features to early layers
    answer        how its reference finishes the decoded answer (`answer`) and which tokens stop it

A `Backbone` instance is the runtime half, built from a loaded model's config (`backbone_of`): frozen and small,
so that data-loader workers can take it.
"""

from __future__ import annotations

from mmjudge.judge.backbones import qwen_vl
from mmjudge.judge.backbones.base import Backbone


def backbone_of(config) -> Backbone:
    """The runtime rules of a native model, by its config's model_type."""
    if config.model_type in qwen_vl.MODEL_TYPES:
        return qwen_vl.QwenVL.of(config)
    if config.model_type == "internvl":
        return Backbone("InternVL", config.image_token_id)
    raise ValueError(f"no backbone for model_type {config.model_type!r}")
