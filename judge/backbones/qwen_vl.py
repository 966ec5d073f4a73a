"""Qwen2.5-VL, Qwen3-VL and Qwen3.5 (dense and MoE): transformers' native classes, loaded as released (no remote code
exists or is needed). Qwen3.5 takes Qwen3-VL's vision tower without DeepStack and its rules here; its language model
is a hybrid (Gated DeltaNet layers, each with a recurrent state, between gated attention layers), which training
runs through transformers and the engine must cache per row (infer/).

    images      smart resize: each image whole, to multiples of patch x merge (28 px; Qwen3-VL 32 px) between the
                processor's least and most pixels, cut into patches, every merge x merge patches one image token
                (judge/smart_resize.py); spelled <|vision_start|><|image_pad|> x tokens<|vision_end|>
    template    the checkpoint's own Jinja chat template (chat_template.json / .jinja / tokenizer_config.json),
                read as data (judge/templates.py); Qwen2.5-VL's default system message is "You are a helpful
                assistant.", Qwen3-VL and Qwen3.5 have none; Qwen3.5's answer opens after an empty thinking
                block, and its messages' ends are stripped
    positions   3-D multimodal rotary positions (temporal, height, width), as their `get_rope_index` computes
                them, per row: text tokens count on one by one on all three axes; an image's tokens take its grid
                (temporal, row, column) from where the text stopped, and the text after it goes on from the start
                plus the grid's longer side. A token written later sits at its place plus the row's delta (its
                largest position + 1 - its length). Qwen3-VL's rotary module interleaves the three axes; the
                positions are the same.
    features    the image tokens' embeddings replaced by the vision tower's merged patches; Qwen3-VL also adds
                its DeepStack features (one per early layer) to the image tokens' hidden states after those layers
    answer      decoded with special tokens skipped, as their processor's batch_decode does, not stripped;
                generation stops at the generation config's end tokens, as their `generate` does
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from mmjudge.judge.backbones.base import Backbone
from mmjudge.judge.checkpoint import CheckpointError, JudgeSettings, chat_template_of, read_json_object
from mmjudge.judge.smart_resize import QWEN_IMAGE_TOKENS, from_processor_config
from mmjudge.judge.vision import Pixels

MODEL_TYPES = {"qwen2_5_vl": "Qwen2.5-VL", "qwen3_vl": "Qwen3-VL", "qwen3_5": "Qwen3.5", "qwen3_5_moe": "Qwen3.5 MoE"}
# Qwen-VL's image tokens: an image is <|vision_start|>, <|image_pad|> once per image token, <|vision_end|>.
IMAGE_TOKENS = QWEN_IMAGE_TOKENS


@dataclass(frozen=True)
class QwenVL(Backbone):
    merge_size: int = 2
    patch_values: int = 3 * 2 * 14 * 14  # each flattened patch: channels x temporal patch x patch x patch
    deepstack: bool = False

    @classmethod
    def of(cls, config) -> QwenVL:
        vision = config.vision_config
        deepstack = config.model_type == "qwen3_vl"
        # each DeepStack merger by itself: PEFT trains modules whole, not a ModuleList
        projector = ("visual.merger", *(f"visual.deepstack_merger_list.{i}" for i in range(len(getattr(vision, "deepstack_visual_indexes", ())))))
        return cls(MODEL_TYPES[config.model_type], config.image_token_id, mrope=True, strips_answer=False, generation_stops=True,
                   fused_kernels=config.model_type not in ("qwen3_5", "qwen3_5_moe"), vision_tower="visual", projector=projector, merge_size=vision.spatial_merge_size,
                   patch_values=vision.in_channels * vision.temporal_patch_size * vision.patch_size**2, deepstack=deepstack)

    def features(self, vlm: torch.nn.Module, pixels: Pixels) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        out = vlm.get_image_features(pixel_values=pixels.values, image_grid_thw=pixels.grids, return_dict=True)
        deepstack = [torch.cat(layer) for layer in out.deepstack_features] if self.deepstack else None
        return torch.cat(out.pooler_output), deepstack

    def positions(self, input_ids: torch.Tensor, grids: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        is_image = (input_ids == self.image_token_id).tolist()
        grid_rows = iter([] if grids is None else grids.tolist())
        pieces, start, i = [], 0, 0
        while i < len(is_image):
            j = i
            while j < len(is_image) and is_image[j] == is_image[i]:
                j += 1
            if not is_image[i]:
                pieces.append(torch.arange(start, start + j - i).expand(3, -1))
                start += j - i
            else:
                t, h, w = next(grid_rows)
                h, w = h // self.merge_size, w // self.merge_size
                if t * h * w != j - i:
                    raise ValueError(f"{j - i} image tokens where the image's grid makes {t * h * w}")
                axes = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
                pieces.append(torch.stack([axis.reshape(-1) for axis in axes]) + start)
                start += max(h, w)
            i = j
        positions = torch.cat(pieces, dim=1) if pieces else torch.zeros(3, 0, dtype=torch.long)
        return positions, int(positions.max()) + 1 - len(input_ids) if len(input_ids) else 0

    def model_inputs(self, pixels: Pixels) -> dict[str, torch.Tensor]:
        return {"pixel_values": pixels.values, "image_grid_thw": pixels.grids}

    def blank_pixels(self, config, dtype: torch.dtype, device) -> Pixels:
        m = self.merge_size
        grids = torch.tensor([[1, m, m]], device=device)
        return Pixels(torch.zeros(m * m, self.patch_values, dtype=dtype, device=device), 1, grids)


def native_settings(path: Path, config, tokenizer):
    """A released Qwen-VL checkpoint's settings before judge_config.json: its Jinja chat template and its
    preprocessor_config.json's smart resize (the processor's defaults where the file is missing)."""
    template = chat_template_of(path, tokenizer)
    if template is None:
        raise CheckpointError(f"{path}: no chat template (chat_template.json, chat_template.jinja or tokenizer_config.json's), and no "
                              "judge_config.json naming one; a Qwen-VL checkpoint ships its template")
    processor = path / "preprocessor_config.json"
    found = read_json_object(processor) if processor.is_file() else {}
    vision = config.vision_config
    try:
        images = from_processor_config(found, vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size)
    except ValueError as err:
        raise CheckpointError(f"{processor}: {err}") from None
    return JudgeSettings(template, None, images)
