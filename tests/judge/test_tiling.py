"""mmjudge.judge.tiling against an independent implementation of InternVL's published preprocessing.

The reference below is written straight from the algorithm's description, in another style: an
exhaustive scan of every grid with the tie rule spelled out, PIL calls with the resample named, and the
normalisation in numpy float32 instead of torch. Equality is bitwise.
"""

import random

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from mmjudge.judge.tiling import TilingConfig, choose_grid, count_tiles, load_tiles

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def reference_grid(width, height, max_tiles, min_tiles=1, size=448):
    grids = [(c, r) for c in range(1, max_tiles + 1) for r in range(1, max_tiles + 1) if min_tiles <= c * r <= max_tiles]
    grids.sort(key=lambda g: (g[0] * g[1], g[0]))  # by area; within an area no tie can win (see test below)
    best = None
    for cols, rows in grids:
        diff = abs(width / height - cols / rows)
        if best is None or diff < best[0]:
            best = (diff, cols, rows)
        elif diff == best[0] and width * height > 0.5 * size * size * cols * rows:
            best = (diff, cols, rows)
    return best[1], best[2]


def reference_tiles(path, max_tiles, use_thumbnail=True, exif_transpose=False, size=448):
    image = Image.open(path)
    if exif_transpose:
        image = ImageOps.exif_transpose(image)
    image = image.convert("RGB")
    cols, rows = reference_grid(*image.size, max_tiles)
    big = image.resize((cols * size, rows * size), Image.Resampling.BICUBIC)
    crops = []
    for index in range(cols * rows):
        left, top = (index % cols) * size, (index // cols) * size
        crops.append(big.crop((left, top, left + size, top + size)))
    if use_thumbnail and len(crops) > 1:
        crops.append(image.resize((size, size), Image.Resampling.BICUBIC))
    arrays = []
    for crop in crops:
        x = np.asarray(crop.resize((size, size), Image.Resampling.BICUBIC), dtype=np.float32) / np.float32(255)
        arrays.append(((x - MEAN) / STD).transpose(2, 0, 1))
    return torch.from_numpy(np.stack(arrays))


def noisy(mode, size, seed=0):
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")
    if mode == "P":
        return rgb.quantize(colors=64)
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (size[1], size[0]), dtype=np.uint16))
    return rgb.convert(mode)


SIZES = [(1, 1), (5, 3), (448, 448), (449, 447), (1000, 700), (4000, 3000), (10000, 50), (50, 10000), (896, 448), (300, 900), (1344, 1344)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("max_tiles", [1, 6, 12])
def test_grid_choice_matches_reference(size, max_tiles):
    assert choose_grid(*size, TilingConfig(max_tiles=max_tiles)) == reference_grid(*size, max_tiles)


def test_grid_choice_matches_reference_on_many_random_sizes():
    rng = random.Random(0)
    for _ in range(3000):
        w, h = rng.randint(1, 6000), rng.randint(1, 6000)
        max_tiles = rng.choice([1, 2, 4, 6, 9, 12, 16])
        assert choose_grid(w, h, TilingConfig(max_tiles=max_tiles)) == reference_grid(w, h, max_tiles), (w, h, max_tiles)


@pytest.mark.parametrize(
    "size, expected",
    [
        # A square image ties every n x n grid; the larger grid wins only when the image has more than
        # half of its pixels: 0.5 * 448^2 * 4 = 401,408 for 2x2, 903,168 for 3x3.
        ((448, 448), (1, 1)),
        ((633, 633), (1, 1)),  # 400,689 px
        ((634, 634), (2, 2)),  # 401,956 px
        ((950, 950), (2, 2)),  # 902,500 px
        ((951, 951), (3, 3)),  # 904,401 px
    ],
)
def test_tie_rule_on_square_images(size, expected):
    assert choose_grid(*size, TilingConfig(max_tiles=12)) == expected == reference_grid(*size, 12)


@pytest.mark.parametrize("mode, fmt", [("RGB", "PNG"), ("P", "PNG"), ("RGBA", "PNG"), ("L", "PNG"), ("I;16", "PNG"), ("CMYK", "JPEG"), ("RGB", "JPEG")])
@pytest.mark.parametrize("size", [(5, 3), (448, 448), (1000, 700), (2000, 300), (30, 1500)])
def test_pixels_equal_reference_bit_for_bit(tmp_path, mode, fmt, size):
    path = tmp_path / f"img.{fmt.lower()}"
    noisy(mode, size).save(path, fmt)
    cfg = TilingConfig(max_tiles=6)
    ours = load_tiles(path, cfg)
    assert ours.dtype == torch.float32 and ours.shape[1:] == (3, 448, 448)
    assert torch.equal(ours, reference_tiles(path, 6))


@pytest.mark.slow
def test_huge_and_panorama_images(tmp_path):
    for size, name in (((4000, 3000), "huge.jpg"), ((10000, 50), "pano.png")):
        noisy("RGB", size).save(tmp_path / name)
        assert torch.equal(load_tiles(tmp_path / name, TilingConfig(max_tiles=12)), reference_tiles(tmp_path / name, 12))


@pytest.mark.parametrize("orientation", [6, 8])
def test_exif_rotation_is_ignored_by_default_and_applied_on_request(tmp_path, orientation):
    path = tmp_path / "phone.jpg"
    exif = Image.Exif()
    exif[0x0112] = orientation
    noisy("RGB", (1200, 400)).save(path, exif=exif)
    as_stored = load_tiles(path, TilingConfig(max_tiles=6))
    upright = load_tiles(path, TilingConfig(max_tiles=6, exif_transpose=True))
    assert torch.equal(as_stored, reference_tiles(path, 6))
    assert torch.equal(upright, reference_tiles(path, 6, exif_transpose=True))
    # stored 3:1 wide -> a 3x1 grid; upright 1:3 tall -> 1x3: the same tile count, other pixels
    assert choose_grid(1200, 400, TilingConfig(max_tiles=6)) == (3, 1)
    assert as_stored.shape == upright.shape and not torch.equal(as_stored, upright)


@pytest.mark.slow
@pytest.mark.parametrize("max_tiles", [1, 6, 12])
@pytest.mark.parametrize("use_thumbnail", [True, False])
def test_count_tiles_predicts_the_tiles_produced(tmp_path, max_tiles, use_thumbnail):
    cfg = TilingConfig(max_tiles=max_tiles, use_thumbnail=use_thumbnail)
    for i, size in enumerate([(5, 3), (448, 448), (1000, 700), (2000, 300), (300, 2000), (900, 900)]):
        path = tmp_path / f"{i}.png"
        noisy("RGB", size, seed=i).save(path)
        tiles = load_tiles(path, cfg)
        assert tiles.shape[0] == count_tiles(*size, cfg)
        cols, rows = choose_grid(*size, cfg)
        assert 1 <= cols * rows <= max_tiles
        assert tiles.shape[0] == cols * rows + (use_thumbnail and cols * rows > 1)


def test_min_tiles_forces_a_larger_grid():
    assert choose_grid(448, 448, TilingConfig(min_tiles=2, max_tiles=6)) == (2, 2)  # the only exact 1:1 grid left
    assert choose_grid(100, 100, TilingConfig(min_tiles=2, max_tiles=3)) == (1, 2)  # 0.5 off beats (2, 1)'s 1.0
    assert choose_grid(100, 100, TilingConfig(min_tiles=4, max_tiles=4)) == (2, 2)
