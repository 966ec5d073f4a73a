"""Qwen-VL's image processing (Qwen2.5-VL, Qwen3-VL), bit for bit as its processor does it (transformers'
`Qwen2VLImageProcessor`; its PIL backend, since the default fast one needs torchvision):

    image --RGB (transparency composited onto white)-->
          --smart resize: each side rounded to a multiple of patch x merge (28 px, Qwen3-VL 32 px); if that makes
            more than max_pixels, both sides scaled by sqrt(pixels / max_pixels) and floored to the multiple; if
            fewer than min_pixels, scaled up by sqrt(min_pixels / pixels) and ceiled; PIL BICUBIC on 8-bit RGB-->
          --x 1/255 (in double, then float32), (x - mean) / std (float32)-->
          --cut into patch x patch patches, merge x merge neighbours together, each patch repeated over the
            temporal patch (2 frames of one still image), flattened: (h/patch x w/patch, 3 x 2 x patch x patch)

One image is one tile here (it is never cut); its tokens are (h/patch x w/patch) / merge^2, and its grid
(1, h/patch, w/patch) goes to the model with the pixels. An image-token budget lowers max_pixels step by step
(each step a tenth less) down to min_pixels. The settings come from the checkpoint's preprocessor_config.json
(`min_pixels`/`max_pixels`, or `size`'s `shortest_edge`/`longest_edge`; patch, merge and temporal patch sizes;
mean and std).
"""

from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from mmjudge.judge.vision import Pixels, restored_over, rgb

QWEN_IMAGE_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
# The least image Qwen's processor allows: a side more than 200 times the other is refused.
MAX_ASPECT = 200


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) of the resized image (module docstring)."""
    if max(height, width) / min(height, width) > MAX_ASPECT:
        raise ValueError(f"an image of {width}x{height} pixels: its aspect ratio is above the {MAX_ASPECT} Qwen-VL's processor takes")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class SmartResize:
    """Qwen-VL's `ImageProcessing` (judge/vision.py)."""

    min_pixels: int
    max_pixels: int
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    mean: tuple[float, float, float] = (0.48145466, 0.4578275, 0.40821073)
    std: tuple[float, float, float] = (0.26862954, 0.26130258, 0.27577711)
    exif_transpose: bool = False
    image_tokens: tuple[str, str, str] = QWEN_IMAGE_TOKENS

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) the image is resized to."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return w, h

    def plan(self, width: int, height: int) -> tuple[int, int]:
        w, h = self.size(width, height)
        return 1, (h // self.patch_size) * (w // self.patch_size) // self.merge_size**2

    def reduced(self) -> SmartResize | None:
        if self.max_pixels <= self.min_pixels:
            return None
        return replace(self, max_pixels=max(self.min_pixels, self.max_pixels * 9 // 10))

    def limit(self) -> tuple[str, int]:
        return "pixels", self.max_pixels

    def most_tokens(self) -> int:
        return self.max_pixels // self.factor**2  # smart_resize keeps an image's rounded size within max_pixels

    def stored(self) -> dict:
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels}

    def restored(self, fields: dict) -> SmartResize:
        return restored_over(self, fields, "Qwen-VL resizes images whole", "min_pixels", "max_pixels")

    def with_max_tiles(self, max_tiles: int) -> SmartResize:
        return self  # every image is one tile, resized whole: a tile limit has nothing to cut

    def processor_config(self) -> dict:
        return {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "patch_size": self.patch_size, "merge_size": self.merge_size,
                "temporal_patch_size": self.temporal_patch_size, "image_mean": list(self.mean), "image_std": list(self.std),
                "image_processor_type": "Qwen2VLImageProcessor"}

    def pixels(self, image: Image.Image) -> Pixels:
        import torch  # here: commands import this before torch's threads are chosen (judge/cpu.py)

        upright = rgb(image, on_white=True)
        w, h = self.size(*upright.size)
        resized = np.asarray(upright.resize((w, h), Image.Resampling.BICUBIC), dtype=np.uint8).transpose(2, 0, 1)  # (3, h, w)
        scaled = (resized.astype(np.float64) * (1 / 255)).astype(np.float32)
        normalized = ((scaled.T - np.array(self.mean, dtype=np.float32)) / np.array(self.std, dtype=np.float32)).T
        p, m, t = self.patch_size, self.merge_size, self.temporal_patch_size
        grid_h, grid_w = h // p, w // p
        patches = normalized.reshape(3, grid_h // m, m, p, grid_w // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
        patches = np.broadcast_to(patches[:, :, :, :, :, None], (*patches.shape[:5], t, p, p))
        values = torch.from_numpy(np.ascontiguousarray(patches).reshape(grid_h * grid_w, 3 * t * p * p))
        return Pixels(values, grid_h * grid_w // m**2, torch.tensor([[1, grid_h, grid_w]]))


def _channels(config: dict, name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """image_mean or image_std: one number per colour channel (or one for all three, as the processor takes it);
    anything else is a ValueError naming the field (a string's characters were read as numbers)."""
    value = config.get(name, default)
    if type(value) in (int, float):
        value = [value] * 3
    if not (isinstance(value, (list, tuple)) and len(value) == 3 and all(type(v) in (int, float) and math.isfinite(v) for v in value)
            and (name != "image_std" or 0 not in value)):
        raise ValueError(f"{name} {reprlib.repr(value)}: three finite numbers, one per colour channel (red, green, blue)"
                         + (", none of them 0 (each divides its channel)" if name == "image_std" else ""))
    return tuple(float(v) for v in value)


def from_processor_config(config: dict, patch_size: int, merge_size: int, temporal_patch_size: int) -> SmartResize:
    """The rule a checkpoint's preprocessor_config.json gives (module docstring); sizes it leaves out are the model's."""
    size = config.get("size") or {}
    rule = SmartResize(
        min_pixels=config.get("min_pixels") or size.get("shortest_edge") or 56 * 56,
        max_pixels=config.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280,
        patch_size=config.get("patch_size", patch_size), merge_size=config.get("merge_size", merge_size),
        temporal_patch_size=config.get("temporal_patch_size", temporal_patch_size),
        mean=_channels(config, "image_mean", SmartResize.mean), std=_channels(config, "image_std", SmartResize.std),
    )
    # A patch size of 0 divided by zero at the first image; the judge's context bounds max_pixels (judge/model.py).
    for name in ("min_pixels", "max_pixels", "patch_size", "merge_size", "temporal_patch_size"):
        if type(value := getattr(rule, name)) is not int or value < 1:
            raise ValueError(f"{name} {value!r}: a positive whole number")
    if rule.min_pixels > rule.max_pixels:
        raise ValueError(f"min_pixels {rule.min_pixels} is above max_pixels {rule.max_pixels}")
    return rule
