"""InternVL's dynamic tiling, bit for bit as its reference `load_image` does it.

    image --convert('RGB')--> choose a grid (cols x rows) close to the image's aspect ratio
          --resize to (448*cols, 448*rows), PIL's default resample (BICUBIC for RGB)-->
          crop cols*rows tiles row by row, + a 448x448 thumbnail of the whole image if more than one
          --each tile: BICUBIC resize to 448 (a no-op copy here), /255, (x - ImageNet mean) / std-->

Grid choice: the candidates are every (cols, rows) with min_tiles <= cols*rows <= max_tiles, ordered by
cols*rows; the winner is the one whose cols/rows is closest to width/height, and on an exact tie a later
(larger) grid replaces the earlier one only if the image's area exceeds half of the grid's area in
pixels (0.5 * 448^2 * cols * rows), so small images are not blown up.

Rotation: the reference opens images with PIL and never applies the EXIF orientation tag, so a phone
photo is tiled as stored, sideways. To reproduce MMIE-Eval's scores that is the default here too;
`exif_transpose=True` turns the image upright first (judge/vision.py, `load_pixels`).

`TilingConfig` is InternVL's `ImageProcessing` (judge/vision.py): each tile becomes `tokens_per_tile` image
tokens (256 for 448 px tiles of 14 px patches, pixel-shuffled by 0.5), spelled `<img>`, `<IMG_CONTEXT>` x
tokens, `</img>`; an image-token budget lowers the tile limit one tile at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from mmjudge.judge.vision import Pixels, load_pixels, restored_over, rgb

if TYPE_CHECKING:
    import torch  # loaded where tiles become tensors: commands import this before torch's threads are chosen (judge/cpu.py)

# InternVL's image tokens: an image is IMG_START, IMG_CONTEXT once per image token of its tiles, IMG_END.
IMG_START, IMG_CONTEXT, IMG_END = "<img>", "<IMG_CONTEXT>", "</img>"
IMAGE_TOKENS = (IMG_START, IMG_CONTEXT, IMG_END)

# ImageNet statistics, which InternViT was trained with.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class TilingConfig:
    image_size: int = 448
    min_tiles: int = 1
    max_tiles: int = 12
    use_thumbnail: bool = True
    exif_transpose: bool = False
    tokens_per_tile: int = 256
    image_tokens: tuple[str, str, str] = IMAGE_TOKENS
    # Transparency composited onto white, as transformers' processor of a -hf checkpoint converts to RGB (GotOcr2's);
    # InternVL's own code drops it (PIL's convert("RGB")).
    on_white: bool = False

    def plan(self, width: int, height: int) -> tuple[int, int]:
        tiles = count_tiles(width, height, self)
        return tiles, tiles * self.tokens_per_tile

    def reduced(self) -> TilingConfig | None:
        return self.with_max_tiles(self.max_tiles - 1) if self.max_tiles > 1 else None

    def limit(self) -> tuple[str, int]:
        return "tiles", self.max_tiles

    def most_tokens(self) -> int:
        return (self.max_tiles + (self.use_thumbnail and self.max_tiles > 1)) * self.tokens_per_tile

    def stored(self) -> dict:
        return {"image_size": self.image_size, "min_tiles": self.min_tiles, "max_tiles": self.max_tiles, "use_thumbnail": self.use_thumbnail}

    def restored(self, fields: dict) -> TilingConfig:
        return restored_over(self, fields, "InternVL tiles images", "min_tiles", "max_tiles")

    def with_max_tiles(self, max_tiles: int) -> TilingConfig:
        return replace(self, max_tiles=max_tiles, min_tiles=min(self.min_tiles, max_tiles))

    def processor_config(self) -> dict | None:
        if not self.on_white:
            return None
        return {"crop_to_patches": True, "min_patches": self.min_tiles, "max_patches": self.max_tiles, "size": {"height": self.image_size, "width": self.image_size},
                "image_mean": list(IMAGENET_MEAN), "image_std": list(IMAGENET_STD), "resample": 3, "do_convert_rgb": True, "do_normalize": True,
                "do_rescale": True, "do_resize": True, "rescale_factor": 1 / 255, "image_processor_type": "GotOcr2ImageProcessorFast",
                "processor_class": "InternVLProcessor"}

    def pixels(self, image: Image.Image) -> Pixels:
        tiles = normalize_tiles(tile_image(image, self), self.image_size)
        return Pixels(tiles, tiles.shape[0] * self.tokens_per_tile)


def candidate_grids(cfg: TilingConfig) -> list[tuple[int, int]]:
    # Built as a set and sorted stably by area, as the reference does: equal-area grids keep the set's
    # iteration order, which decides ties between them.
    grids = {
        (i, j)
        for n in range(cfg.min_tiles, cfg.max_tiles + 1)
        for i in range(1, n + 1)
        for j in range(1, n + 1)
        if cfg.min_tiles <= i * j <= cfg.max_tiles
    }
    return sorted(grids, key=lambda g: g[0] * g[1])


def choose_grid(width: int, height: int, cfg: TilingConfig) -> tuple[int, int]:
    """(cols, rows) of the tile grid for an image of this size."""
    aspect = width / height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in candidate_grids(cfg):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and width * height > 0.5 * cfg.image_size**2 * cols * rows:
            best = (cols, rows)
    return best


def count_tiles(width: int, height: int, cfg: TilingConfig) -> int:
    """Tiles an image of this size becomes, thumbnail included: from the size alone, for planning."""
    cols, rows = choose_grid(width, height, cfg)
    return cols * rows + (1 if cfg.use_thumbnail and cols * rows > 1 else 0)


def tile_image(image: Image.Image, cfg: TilingConfig) -> list[Image.Image]:
    """The RGB tiles of an image (and its thumbnail), in the order the model sees them."""
    image = rgb(image, cfg.on_white)
    cols, rows = choose_grid(*image.size, cfg)
    size = cfg.image_size
    resized = image.resize((size * cols, size * rows))
    tiles = [resized.crop((c * size, r * size, (c + 1) * size, (r + 1) * size)) for r in range(rows) for c in range(cols)]
    if cfg.use_thumbnail and len(tiles) > 1:
        tiles.append(image.resize((size, size)))
    return tiles


def normalize_tiles(tiles: list[Image.Image], image_size: int) -> torch.Tensor:
    """(n, 3, size, size) float32: each tile BICUBIC-resized to size, scaled to [0, 1], ImageNet-normalised."""
    import torch

    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float32)[:, None, None]
    std = torch.tensor(IMAGENET_STD, dtype=torch.float32)[:, None, None]
    out = []
    for tile in tiles:
        tile = tile.resize((image_size, image_size), Image.Resampling.BICUBIC)
        pixels = torch.from_numpy(np.asarray(tile, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255)
        out.append(pixels.sub(mean).div(std))
    return torch.stack(out)


def load_tiles(path: str | Path, cfg: TilingConfig) -> torch.Tensor:
    return load_pixels(path, cfg).values
