"""The runtime half of a backbone that every family shares: InternVL's rules are its defaults, a family
overrides what it decides (judge/backbones/__init__.py). Here, one floor below the families, so that a family's
module and the package that picks one do not import each other."""

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
    # Its language model is Llama's shape, which judge/kernels.py's fused kernels compute: attention in every layer, a
    # whole-head rotary embedding, RMSNorm times its weight (Qwen3.5's linear-attention layers, quarter rotation and
    # 1 + weight norms are not).
    fused_kernels: bool = True
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
