"""The augmentation pipeline: a few milliseconds of real CPU work per sample.

Each training sample goes through what handwriting and clothing classifiers are commonly
trained with: a random affine warp (rotation, scale, shear, shift), an elastic distortion
(Simard et al., 2003), a mirror flip where the classes allow it, sensor noise, and
normalisation. The warps run on a 4x supersampled image, then the result is scaled back down
with an antialiasing filter, so thin strokes do not alias into jagged pixels. That costs
~2-4 ms per 28x28 sample on one core: a loader that preprocesses on the training node's few
cores becomes the bottleneck, which is the situation dpex is for.

Randomness comes from numpy's global generator. torch seeds it in each loader worker from
the loader's base seed and the worker id, and dpex seeds its Ray workers identically, so the
same seed gives the same augmented pixels in either mode.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image
from scipy import ndimage

from common.data import SIZE


class TrainAugment:
    """Random affine + elastic warp + flip + noise + normalisation; uint8 28x28 -> (1, 28, 28).

    Args:
        mean, std: normalisation constants of the training pixels in [0, 1].
        flip: mirror left-right with probability 1/2 (only for flip-invariant classes).
        supersample: scale at which the warps are done before the antialiased downscale.
        max_rotate_deg, scale_range, max_shear_deg, max_shift: the affine warp's ranges
            (``max_shift`` as a fraction of the image side).
        elastic_alpha, elastic_sigma: strength and smoothness (pixels at 28x28) of the
            elastic field; 34 and 4 are Simard et al.'s values for handwritten digits.
        noise_std: standard deviation of the additive Gaussian noise, in [0, 1] pixel units.
    """

    def __init__(
        self,
        mean: float,
        std: float,
        *,
        flip: bool = False,
        supersample: int = 4,
        max_rotate_deg: float = 12.0,
        scale_range: tuple[float, float] = (0.9, 1.1),
        max_shear_deg: float = 8.0,
        max_shift: float = 0.08,
        elastic_alpha: float = 34.0,
        elastic_sigma: float = 4.0,
        noise_std: float = 0.05,
    ) -> None:
        self.mean, self.std, self.flip = mean, std, flip
        self.supersample = supersample
        self.max_rotate_deg, self.scale_range = max_rotate_deg, scale_range
        self.max_shear_deg, self.max_shift = max_shear_deg, max_shift
        self.elastic_alpha, self.elastic_sigma = elastic_alpha, elastic_sigma
        self.noise_std = noise_std
        big = SIZE * supersample
        # Sampling grid of the elastic warp, built once (rows, cols).
        self._grid = np.mgrid[0:big, 0:big].astype(np.float32)

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        big = SIZE * self.supersample
        picture = Image.fromarray(image).resize((big, big), Image.BICUBIC)
        picture = self._random_affine(picture)
        pixels = self._elastic(np.asarray(picture, dtype=np.float32))
        picture = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        if self.flip and np.random.rand() < 0.5:
            picture = picture.transpose(Image.FLIP_LEFT_RIGHT)
        small = np.asarray(picture.resize((SIZE, SIZE), Image.LANCZOS), dtype=np.float32) / 255
        small = np.clip(small + np.random.normal(0.0, self.noise_std, small.shape), 0.0, 1.0)
        return torch.from_numpy(((small - self.mean) / self.std).astype(np.float32)[None])

    def _random_affine(self, picture: Image.Image) -> Image.Image:
        """Rotate, scale, shear and shift about the centre (bicubic)."""
        side = picture.size[0]
        angle = np.deg2rad(np.random.uniform(-self.max_rotate_deg, self.max_rotate_deg))
        scale = np.random.uniform(*self.scale_range)
        shear = np.deg2rad(np.random.uniform(-self.max_shear_deg, self.max_shear_deg))
        shift = np.random.uniform(-self.max_shift, self.max_shift, size=2) * side
        cos, sin = np.cos(angle), np.sin(angle)
        forward = scale * np.array([[cos, -sin + np.tan(shear)], [sin, cos]])
        # PIL wants the inverse map: for each output pixel, where to read in the input.
        inverse = np.linalg.inv(forward)
        centre = np.array([side / 2, side / 2])
        offset = centre - inverse @ (centre + shift)
        coeffs = (*inverse[0], offset[0], *inverse[1], offset[1])
        return picture.transform(picture.size, Image.AFFINE, coeffs, resample=Image.BICUBIC)

    def _elastic(self, pixels: np.ndarray) -> np.ndarray:
        """Displace every pixel along a smooth random field (bilinear resampling).

        The field is drawn and smoothed at 28x28 and scaled up: it is smooth anyway, and
        smoothing at full size would cost 16x more for the same warp.
        """
        s = self.supersample
        shifts = []
        for _ in range(2):
            noise = np.random.uniform(-1, 1, size=(SIZE, SIZE)).astype(np.float32)
            field = ndimage.gaussian_filter(noise, self.elastic_sigma, mode="constant")
            field = Image.fromarray(field * self.elastic_alpha * s, mode="F")
            shifts.append(np.asarray(field.resize(pixels.shape[::-1], Image.BILINEAR)))
        coords = self._grid + np.stack(shifts)
        return ndimage.map_coordinates(pixels, coords, order=1, mode="constant")


class EvalTransform:
    """uint8 28x28 -> normalised (1, 28, 28) float tensor; no randomness."""

    def __init__(self, mean: float, std: float) -> None:
        self.mean, self.std = mean, std

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        pixels = image.astype(np.float32) / 255
        return torch.from_numpy((pixels - self.mean) / self.std)[None]
