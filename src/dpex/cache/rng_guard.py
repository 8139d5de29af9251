"""Whether a stage drew a random number: a cached stage must not (pure, no Ray).

A stage whose output depends on a random draw is not a function of its index: caching it
would freeze one draw for every epoch, and skipping it on a hit would leave the global
generators where the stage found them, so every later draw of the sample (its random
augmentation) would differ from torch's. So a miss runs the stage between two snapshots of
Python's, numpy's and torch's global generators, and any that moved is an error.
A stage that draws from a generator of its own (``torch.Generator``, ``np.random.default_rng``)
is not seen here: that generator's state is the stage's business.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


class CacheError(RuntimeError):
    """A ``dpex.cached`` stage cannot be cached as written: it drew a random number."""


@dataclass(frozen=True)
class RngSnapshot:
    python: Any
    numpy: Any
    torch: torch.Tensor

    @classmethod
    def take(cls) -> RngSnapshot:
        return cls(random.getstate(), np.random.get_state(), torch.random.get_rng_state())

    def moved_since(self, before: RngSnapshot) -> list[str]:
        """The generators that moved between ``before`` and this snapshot."""
        moved = []
        if self.python != before.python:
            moved.append("Python's random")
        if not _same_numpy_state(self.numpy, before.numpy):
            moved.append("numpy.random")
        if not torch.equal(self.torch, before.torch):
            moved.append("torch's default generator")
        return moved

    def check(self, label: str) -> None:
        """Raise ``CacheError`` if a generator moved since this snapshot, in stage ``label``."""
        moved = RngSnapshot.take().moved_since(self)
        if moved:
            raise CacheError(
                f"dpex.cached stage {label} drew from {', '.join(moved)}: its result is not a "
                f"function of its arguments, so it cannot be cached (a cached draw would "
                f"repeat every epoch). Mark only the deterministic part (loading, decoding) "
                f"with @dpex.cached and leave the random part outside it.")


def _same_numpy_state(a: Any, b: Any) -> bool:
    return (a[0] == b[0] and a[2:] == b[2:]) and np.array_equal(a[1], b[1])
