"""Decode once, augment every epoch: a ``@dpex.cached`` decode beside torch's DataLoader.

    python examples/cached_decode.py [--images 512] [--epochs 4] [--head-address embedded]

Makes ``--images`` JPEG files in a temporary folder, then runs the same epochs with
torch's DataLoader and with dpex's (Ray-actor workers, the cache on), checks that every
batch is bitwise the same, and prints each epoch's seconds and dpex's hit rate. The cache's
disk tier goes to the same temporary folder, so nothing is left behind.
"""

from __future__ import annotations

import argparse
import io
import os
import random
import tempfile
import time

import numpy as np
import torch
from PIL import Image

import dpex


class Photos(torch.utils.data.Dataset):
    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    @dpex.cached
    def decode(self, i: int) -> np.ndarray:  # deterministic: kept across epochs and jobs
        with open(self.paths[i], "rb") as f:
            return np.array(Image.open(io.BytesIO(f.read())).convert("RGB"))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:  # random: every epoch
        image = torch.from_numpy(self.decode(i)).permute(2, 0, 1)
        top, left = random.randint(0, 32), random.randint(0, 32)
        image = image[:, top:top + 224, left:left + 224]
        if random.random() < 0.5:
            image = image.flip(-1)
        return image.float().div(255), i % 10


def make_images(folder: str, count: int) -> list[str]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        pixels = rng.integers(0, 255, (256, 256, 3), dtype=np.uint8)
        pixels = (pixels // 32 * 32).astype(np.uint8)  # flat areas: compresses like a photo
        path = os.path.join(folder, f"{i:05d}.jpg")
        Image.fromarray(pixels).save(path, quality=90)
        paths.append(path)
    return paths


def epochs(loader, count: int) -> tuple[list[list], list[float]]:
    batches, seconds = [], []
    for _ in range(count):
        started = time.perf_counter()
        batches.append(list(loader))
        seconds.append(time.perf_counter() - started)
    return batches, seconds


def arguments(argv: list[str] | None, doc: str, images: int,
              epochs: int) -> tuple[argparse.Namespace, str | None]:
    """The examples' options, and the loader's ``head_address`` they name."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--images", type=int, default=images)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--head-address", default="auto",
                        help='"auto" (default), "embedded" (always a local Ray), or host:port')
    args = parser.parse_args(argv)
    return args, None if args.head_address == "embedded" else args.head_address


def main(argv: list[str] | None = None) -> int:
    args, head = arguments(argv, __doc__, images=512, epochs=4)
    with tempfile.TemporaryDirectory(prefix="dpex-example-") as folder:
        dataset = Photos(make_images(folder, args.images))
        torch.manual_seed(0)
        expected, torch_s = epochs(torch.utils.data.DataLoader(
            dataset, batch_size=32, shuffle=True, num_workers=2), args.epochs)
        torch.manual_seed(0)
        loader = dpex.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2,
                                 distribute_mode=True, head_address=head,
                                 cache=dpex.Cache(disk_dir=os.path.join(folder, "cache")))
        got, dpex_s = [], []
        for epoch in range(args.epochs):
            before = loader.stats().cache
            batches, seconds = epochs(loader, 1)
            got += batches
            dpex_s += seconds
            after = loader.stats().cache
            hits = sum(s.hits for s in after) - sum(s.hits for s in before)
            lookups = sum(s.hits + s.misses for s in after) - sum(s.hits + s.misses for s in before)
            print(f"epoch {epoch}: torch {torch_s[epoch]:.2f} s, dpex {dpex_s[epoch]:.2f} s, "
                  f"{hits / max(lookups, 1):.0%} of the decodes read back", flush=True)
        same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
                   for e, f in zip(expected, got) for a, b in zip(e, f))
        print(f"bitwise equal to torch's batches: {same}")
        for stage in loader.stats().cache:
            print(stage.summary())
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
