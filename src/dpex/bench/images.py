"""Synthetic JPEGs and the per-sample image pipeline of the benchmarks (Pillow + numpy only).

``make_jpeg`` draws a smooth, photo-like picture (gradients, blobs and a little noise) so it
compresses and decodes like a real photo rather than like white noise. ``train_transform`` is
the usual ImageNet training recipe: decode, random-resized-crop, horizontal flip, normalise,
returning a ``3 x S x S`` float32 array. Random draws come from Python's ``random`` module,
which torch and dpex both seed per worker.
"""

from __future__ import annotations

import io
import math
import random

import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def make_jpeg(seed: int, width: int, height: int, quality: int = 90) -> bytes:
    """A deterministic photo-like JPEG of ``width x height`` pixels.

    Smooth content is drawn at a quarter of the size and upscaled (fast), then fine noise is
    added at full size so the JPEG carries real high-frequency detail.
    """
    rng = np.random.default_rng(seed)
    sw, sh = max(8, width // 4), max(8, height // 4)
    ys, xs = np.mgrid[0:sh, 0:sw].astype(np.float32)
    channels = []
    for _ in range(3):
        fx, fy = rng.uniform(0.5, 4.0, size=2) * 2 * math.pi
        phase = rng.uniform(0, 2 * math.pi)
        plane = 0.5 + 0.25 * np.sin(fx * xs / sw + phase) * np.cos(fy * ys / sh)
        for _ in range(4):  # a few soft blobs
            cx, cy = rng.uniform(0, sw), rng.uniform(0, sh)
            r = rng.uniform(0.05, 0.3) * min(sw, sh)
            plane += rng.uniform(-0.3, 0.3) * np.exp(-((xs - cx) ** 2 + (ys - cy) ** 2) / (2 * r * r))
        channels.append(plane)
    small = (np.clip(np.stack(channels, axis=-1), 0, 1) * 255).astype(np.uint8)
    big = np.asarray(Image.fromarray(small).resize((width, height), Image.BICUBIC), np.int16)
    noise = rng.integers(-8, 9, size=big.shape, dtype=np.int16)
    pixels = np.clip(big + noise, 0, 255).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=quality)
    return out.getvalue()


def random_resized_box(
    width: int, height: int, scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """A random crop box ``(left, top, right, bottom)`` covering ``scale`` of the area."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * random.uniform(*scale)
        aspect = math.exp(random.uniform(*log_ratio))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            left = random.randint(0, width - w)
            top = random.randint(0, height - h)
            return left, top, left + w, top + h
    side = min(width, height)  # fallback: the central square
    left, top = (width - side) // 2, (height - side) // 2
    return left, top, left + side, top + side


def normalise(img: Image.Image) -> np.ndarray:
    """RGB image -> ``3 x H x W`` float32, scaled to [0, 1] and normalised per channel."""
    arr = np.asarray(img, dtype=np.float32) * (1 / 255)
    arr -= MEAN
    arr /= STD
    return np.ascontiguousarray(arr.transpose(2, 0, 1))


def train_transform(data: bytes, size: int) -> np.ndarray:
    """JPEG bytes -> random-resized-crop to ``size``, random horizontal flip, normalised."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    box = random_resized_box(*img.size)
    img = img.resize((size, size), Image.BILINEAR, box=box)
    if random.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return normalise(img)


def centre_transform(data: bytes, size: int) -> np.ndarray:
    """JPEG bytes -> centre square resized to ``size``, random flip, normalised (cheaper)."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    side = min(w, h)
    box = ((w - side) // 2, (h - side) // 2, (w + side) // 2, (h + side) // 2)
    img = img.resize((size, size), Image.BILINEAR, box=box)
    if random.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return normalise(img)
