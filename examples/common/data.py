"""The image-classification data of the examples: FashionMNIST if it is here, else digits.

FashionMNIST (what the Dpex README trains on) is used when torchvision is installed and its
files are already under ``--data-dir``: nothing is downloaded, so the examples run offline on
a fresh machine. Otherwise the data is scikit-learn's handwritten digits, which ship inside
the scikit-learn wheel: 1,797 real 8x8 scans of digits written by 43 people (UCI
"optdigits"), upscaled once to MNIST's layout (a 20x20 digit centred in 28x28).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

SIZE = 28  # both sources end up as 28x28 grayscale, so one model fits both


class ImageClassification(Dataset):
    """Map-style dataset of uint8 ``(28, 28)`` images; sample ``i`` is ``(transform(img), label)``.

    Args:
        images: ``(N, 28, 28)`` uint8 array.
        labels: ``(N,)`` integer class ids.
        transform: turns one uint8 image into the model's input tensor.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        transform: Callable[[np.ndarray], torch.Tensor],
    ) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels.astype(np.int64)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.images[index]), int(self.labels[index])


@dataclass(frozen=True)
class ImageData:
    """Train and test images of one source, with what the transforms need to know about it."""

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int
    mean: float  # of the training pixels in [0, 1], for normalisation
    std: float
    flip_invariant: bool  # a mirrored shirt is a shirt; a mirrored 7 is not a 7


def load_image_data(data_dir: str = "data", limit: int | None = None) -> ImageData:
    """FashionMNIST from ``data_dir`` if torchvision and its files are there, else digits.

    Args:
        data_dir: where torchvision keeps FashionMNIST (``<data_dir>/FashionMNIST/raw``).
        limit: keep only the first ``limit`` training and test samples (smoke tests).
    """
    found = _fashion_mnist(data_dir)
    if found is None:
        found = _digits()
    name, train_x, train_y, test_x, test_y, flip = found
    if limit is not None:
        train_x, train_y = train_x[:limit], train_y[:limit]
        test_x, test_y = test_x[:limit], test_y[:limit]
    pixels = train_x.astype(np.float64) / 255.0
    return ImageData(
        name=name,
        train_images=train_x,
        train_labels=train_y,
        test_images=test_x,
        test_labels=test_y,
        num_classes=int(max(train_y.max(), test_y.max())) + 1,
        mean=float(pixels.mean()),
        std=float(pixels.std()),
        flip_invariant=flip,
    )


def _fashion_mnist(data_dir: str):
    """FashionMNIST's arrays, or None when torchvision or the files are missing."""
    try:
        from torchvision.datasets import FashionMNIST
    except ImportError:
        return None
    try:
        train = FashionMNIST(data_dir, train=True, download=False)
        test = FashionMNIST(data_dir, train=False, download=False)
    except RuntimeError:  # "Dataset not found": we never download
        return None
    return ("FashionMNIST", train.data.numpy(), train.targets.numpy(),
            test.data.numpy(), test.targets.numpy(), True)


def _digits():
    """scikit-learn's digits, in MNIST's layout, split 80/20 stratified by class (fixed)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.stack([_to_mnist_layout(image) for image in digits.images])
    train_x, test_x, train_y, test_y = train_test_split(
        images, digits.target, test_size=0.2, stratify=digits.target, random_state=0
    )
    return "sklearn digits", train_x, train_y, test_x, test_y, False


def _to_mnist_layout(image: np.ndarray) -> np.ndarray:
    """An 8x8 image with values 0..16 -> 28x28 uint8 with the digit in the central 20x20."""
    small = Image.fromarray(np.round(image * (255 / 16)).astype(np.uint8))
    digit = np.asarray(small.resize((20, 20), Image.BICUBIC))
    return np.pad(digit, (SIZE - 20) // 2)
