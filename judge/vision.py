"""How a backbone sees an image: the pixels its vision tower takes, and the tokens that stand for the image in
the prompt.

Each backbone has its own rule, an `ImageProcessing`: InternVL cuts an image into 448 px tiles and a thumbnail
(judge/tiling.py, `TilingConfig`), Qwen-VL resizes it whole to a multiple of its patch grid between a least and a
most number of pixels (judge/smart_resize.py, `SmartResize`). Everything else is generic over the rule:

    prompt builder  plan(width, height) -> (tiles, tokens) from the image's size alone; `reduced()` is one step
                    down when a sample's images exceed an image-token budget
    prompt text     placeholder(tokens): start + context token x tokens + end, in the backbone's own spelling
    engine          load(path) -> Pixels: the values the vision tower takes, and (Qwen) each image's patch grid

`Pixels` of several images (or several prompts of a batch) concatenate in prompt order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from PIL import Image, ImageOps

if TYPE_CHECKING:
    import torch  # loaded where pixels become tensors: commands import this before torch's threads are chosen (judge/cpu.py)


@dataclass(frozen=True)
class Pixels:
    """Some images as a vision tower takes them."""

    values: torch.Tensor  # InternVL: tiles (n, 3, size, size); Qwen-VL: flattened patches (n, channels x patch volume)
    tokens: int  # the image tokens they become in the prompt
    grids: torch.Tensor | None = None  # Qwen-VL: (images, 3) each image's (t, h, w) in patches; None for tiles
    # The prefix cache's digest of the pixels of the images before the prompt's first answer (infer/prefix_cache.py's
    # pixel_digest), made where they were loaded, off the model thread; None where no prefix cache reads it.
    shared_digest: bytes | None = None

    @property
    def tiles(self) -> int:
        """What the toolkit reports as tiles (n_tiles): InternVL's tiles, or one per whole-resized image."""
        return int(self.values.shape[0]) if self.grids is None else int(self.grids.shape[0])

    def to(self, device, dtype: torch.dtype, non_blocking: bool = False) -> Pixels:
        grids = None if self.grids is None else self.grids.to(device)
        return Pixels(self.values.to(device, dtype, non_blocking=non_blocking), self.tokens, grids)

    def pin_memory(self) -> Pixels:
        return Pixels(self.values.pin_memory(), self.tokens, self.grids)

    def split(self, tokens: int) -> tuple[Pixels | None, Pixels | None]:
        """The pixels of the images whose `tokens` image tokens come first, and of the rest (None for none); the
        cut falls between whole images (a tile or a patch holds the same share of tokens in every image)."""
        rows = self.values.shape[0] * tokens // self.tokens
        images = 0 if self.grids is None else int((self.grids.prod(-1).cumsum(0) <= rows).sum())
        head = Pixels(self.values[:rows], tokens, None if self.grids is None else self.grids[:images])
        tail = Pixels(self.values[rows:], self.tokens - tokens, None if self.grids is None else self.grids[images:])
        return head if tokens else None, tail if tokens < self.tokens else None

    @staticmethod
    def cat(parts: list[Pixels]) -> Pixels | None:
        """The pixels of several images (or prompts) in order; None for none."""
        if not parts:
            return None
        import torch

        grids = None if parts[0].grids is None else torch.cat([p.grids for p in parts])
        return Pixels(torch.cat([p.values for p in parts]), sum(p.tokens for p in parts), grids)


class ImageProcessing(Protocol):
    """A backbone's image rule (module docstring). Frozen dataclasses: they travel to data-loader workers."""

    exif_transpose: bool
    image_tokens: tuple[str, str, str]  # the image's start, context (one per image token) and end tokens

    def plan(self, width: int, height: int) -> tuple[int, int]:
        """(tiles, image tokens) of an image of this size."""

    def reduced(self) -> ImageProcessing | None:
        """One step smaller for an image-token budget (fewer tiles, fewer pixels); None at the least."""

    def limit(self) -> tuple[str, int]:
        """The limit `reduced` lowers, for the record of a cut: ("tiles", 6), ("pixels", 802816)."""

    def most_tokens(self) -> int:
        """The image tokens of an image at that limit: the most one image takes."""

    def stored(self) -> dict:
        """Its settings as judge_config.json stores them (judge/checkpoint.py, SettingsFile)."""

    def restored(self, fields: dict) -> ImageProcessing:
        """The rule with stored settings over its own; a ValueError for settings of another rule."""

    def with_max_tiles(self, max_tiles: int) -> ImageProcessing:
        """The rule with a user's tile limit (--max_tiles); refused by rules without tiles."""

    def pixels(self, image: Image.Image) -> Pixels:
        """An image's pixels (turned upright first where configured)."""

    def processor_config(self) -> dict | None:
        """The preprocessor_config.json a natively saved judge carries, for transformers' processor (None: the
        backbone's native layout has none, as a checkpoint converted from InternVL's original has not)."""


def restored_over(rule, fields: dict, what: str, low: str, high: str):
    """`rule` (a frozen dataclass) with stored settings over its own, for `ImageProcessing.restored`: a
    ValueError names another rule's settings (`what` says what this one does) or a range whose `low` field is
    above its `high` one."""
    if foreign := sorted(set(fields) - set(rule.stored())):
        raise ValueError(f"{', '.join(foreign)}: settings of another backbone's image processing; {what} ({', '.join(rule.stored())})")
    new = replace(rule, **fields)
    if getattr(new, low) > getattr(new, high):
        raise ValueError(f"{low} {getattr(new, low)} is above {high} {getattr(new, high)}")
    return new


def placeholder(processing: ImageProcessing, tokens: int) -> str:
    """The text an image of `tokens` image tokens takes in the prompt."""
    start, context, end = processing.image_tokens
    return start + context * tokens + end


def rgb(image: Image.Image, on_white: bool) -> Image.Image:
    """The image in RGB: transparency composited onto white, as transformers' image processors convert it (the
    references of Qwen-VL and of InternVL's -hf checkpoints), or dropped, as PIL's convert('RGB') does in InternVL's
    own code."""
    if on_white and ("A" in image.getbands() or image.info.get("transparency") is not None):
        image = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", image.size, (255, 255, 255, 255)), image).convert("RGB")
    return image.convert("RGB")


# The modes an image file holds (PNG's, and TIFF's for the rest), which the judge reads: PIL makes others in
# memory (HSV; La and RGBa, premultiplied by alpha) that no file holds and some of which it cannot convert.
FILE_MODES = {"1", "L", "LA", "I", "I;16", "F", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "LAB"}


def image_problem(image: Image.Image) -> str | None:
    """What keeps the judge from seeing `image` (a PIL image given in memory, or a file's, decoded), in words;
    None if nothing. A closed image, one of no pixels or one of a mode no file holds failed deep in the
    writing or tiling with PIL's own errors."""
    try:
        image.load()
    except ValueError as err:  # PIL's "Operation on closed image"
        return f"the image cannot be read ({err}); give it open"
    if 0 in image.size:
        return f"the image is {image.width} x {image.height} pixels; an image has at least one pixel each way"
    if image.mode not in FILE_MODES:
        return f"an image of mode {image.mode!r}, which no image file holds; convert it first, e.g. image.convert('RGB')"
    return None


def load_pixels(path: str | Path, processing: ImageProcessing) -> Pixels:
    with Image.open(path) as image:
        if processing.exif_transpose:
            image = ImageOps.exif_transpose(image)
        return processing.pixels(image)


def image_size(path: Path, exif_transpose: bool) -> tuple[int, int]:
    """(width, height) as the rule sees the image: from its header, turned upright where asked."""
    with Image.open(path) as image:
        width, height = image.size
        if exif_transpose and image.getexif().get(0x0112) in (5, 6, 7, 8):  # orientations that swap axes
            width, height = height, width
    return width, height
