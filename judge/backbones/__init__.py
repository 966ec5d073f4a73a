"""Backbones: each family a small adapter over transformers' native class, the engine generic over them.

    family        checkpoints                                     native class (transformers)
    InternVL      InternVL2 1B-8B, InternVL2.5, InternVL3:        InternVLForConditionalGeneration, its language
                  original InternVLChatModel and -hf layouts      model Phi-3, Qwen2, Llama (InternLM2 mapped onto it)
    Qwen2.5-VL    Qwen/Qwen2.5-VL-*                               Qwen2_5_VLForConditionalGeneration
    Qwen3-VL      Qwen/Qwen3-VL-*                                 Qwen3VLForConditionalGeneration

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

from dataclasses import dataclass

import torch

from mmjudge.judge.vision import Pixels


@dataclass(frozen=True)
class Backbone:
    """The runtime rules of a family (module docstring); InternVL's are the defaults."""

    name: str
    image_token_id: int
    mrope: bool = False  # its rotary embedding takes (3, batch, length) positions: temporal, height, width
    strips_answer: bool = True  # its reference cuts the answer at a spelled separator and strips it (InternVL's chat())
    generation_stops: bool = False  # its reference stops at the generation config's end tokens too (transformers' generate)
    # Submodules of the native model (its `.model`): the vision tower, and the projector onto the language model.
    vision_tower: str = "vision_tower"
    projector: tuple[str, ...] = ("multi_modal_projector",)

    def features(self, vlm: torch.nn.Module, pixels: Pixels) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The image tokens' embeddings, in prompt order, and the DeepStack features (one per early layer of the
        language model, added to the image tokens' hidden states after it) where the family has them."""
        return vlm.get_image_features(pixel_values=pixels.values, return_dict=True).pooler_output, None

    def positions(self, input_ids: torch.Tensor, grids: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        """A prompt's rotary positions, (1 or 3, length), and what a token written after it adds to its place
        in the sequence to get its position (0 where positions are places)."""
        return torch.arange(len(input_ids))[None], 0

    def model_inputs(self, pixels: Pixels) -> dict[str, torch.Tensor]:
        """The native forward's image arguments (training)."""
        return {"pixel_values": pixels.values}

    def blank_pixels(self, config, dtype: torch.dtype, device) -> Pixels:
        """The least image the vision tower takes: one blank tile (train/recipe.py runs it where a batch has none)."""
        size = config.vision_config.image_size
        return Pixels(torch.zeros(1, 3, *size, dtype=dtype, device=device), 0)


def backbone_of(config) -> Backbone:
    """The runtime rules of a native model, by its config's model_type."""
    from mmjudge.judge.backbones import qwen_vl

    if config.model_type in qwen_vl.MODEL_TYPES:
        return qwen_vl.QwenVL.of(config)
    if config.model_type == "internvl":
        return Backbone("InternVL", config.image_token_id)
    raise ValueError(f"no backbone for model_type {config.model_type!r}")
