"""The loader's state as a checkpoint holds it: plain JSON types, versioned. Pure: no Ray.

A state lives beside the model's weights for months, in JSON, a DCP checkpoint or
``torch.save``. So it holds only numbers, strings, booleans, None, lists and dicts: RNG
states are lists of ints or base64 strings, never tensors. ``json.dumps`` takes it as it
is, and ``torch.load(..., weights_only=True)`` loads it. What a user's own dataset,
iterator or sampler returns from its ``state_dict()`` is kept as the user made it.

A state of version 1 (the previous release: tensors, no epoch status, no fingerprint) is
read into version 2's shape by ``upgrade``.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from dpex.epoch.seeding import RngState

T = TypeVar("T")

STATE_VERSION = 2

# Where an epoch stands in a state: no epoch began yet in the loader that saved it; an
# epoch is under way (``batches_delivered`` of it handed out: all of them at its last
# batch, when the rest of it is empty); the loop saw its end (StopIteration), so the next
# ``iter(loader)`` starts a new one. torchdata's StatefulDataLoader has the same three.
BEFORE, IN_PROGRESS, ENDED = "before", "in_progress", "ended"


def bytes_to_text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def text_to_bytes(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def generator_state_to_plain(state: torch.Tensor | None) -> str | None:
    """A ``torch.Generator`` state (a ByteTensor) as base64 text."""
    return None if state is None else bytes_to_text(state.numpy().tobytes())


def generator_state_from_plain(plain: Any) -> torch.Tensor | None:
    """The ByteTensor again; a version-1 state holds the tensor itself."""
    if plain is None or isinstance(plain, torch.Tensor):
        return plain
    return torch.frombuffer(bytearray(text_to_bytes(plain)), dtype=torch.uint8).clone()


def words_to_text(words: Any) -> str:
    """32-bit words (a Mersenne Twister's state) as base64 text: 3.3 KB where a JSON list
    of the same 624 numbers takes 7."""
    return bytes_to_text(np.asarray(words, dtype="<u4").tobytes())


def text_to_words(plain: Any) -> np.ndarray:
    """The words again; a list of ints, as a version-1 state or a hand-made one holds."""
    if isinstance(plain, str):
        return np.frombuffer(text_to_bytes(plain), dtype="<u4").astype(np.uint32)
    if isinstance(plain, torch.Tensor):
        plain = plain.numpy()
    return np.asarray(plain, dtype=np.int64).astype(np.uint32)


def rng_to_plain(rng: RngState | None) -> dict | None:
    """A worker's ``random``, numpy and torch states in JSON types."""
    if rng is None:
        return None
    version, words, gauss = rng.python
    algorithm, keys, pos, has_gauss, cached = rng.numpy
    return {
        "python": [int(version), words_to_text(words), gauss],
        "numpy": [str(algorithm), words_to_text(keys), int(pos), int(has_gauss),
                  float(cached)],
        "torch": bytes_to_text(bytes(rng.torch)),
    }


def rng_from_plain(plain: dict | None) -> RngState | None:
    if plain is None:
        return None
    version, words, gauss = plain["python"]
    algorithm, keys, pos, has_gauss, cached = plain["numpy"]
    torch_state = plain["torch"]
    torch_bytes = (torch_state.numpy().tobytes() if isinstance(torch_state, torch.Tensor)
                   else text_to_bytes(torch_state))
    numpy_state = (algorithm, text_to_words(keys), int(pos), int(has_gauss), float(cached))
    python_words = tuple(int(w) for w in text_to_words(words))
    return RngState((version, python_words, gauss), numpy_state, torch_bytes)


def upgrade(state: Any) -> dict[str, Any]:
    """``state`` in version 2's shape; ValueError for what is not a dpex loader state, or
    one of a version this dpex does not read (saying which)."""
    version = state.get("version") if isinstance(state, dict) else None
    known = isinstance(version, int) and not isinstance(version, bool)
    if known and version > STATE_VERSION:
        raise ValueError(f"the state was saved by a newer dpex: state version {version}, "
                         f"this dpex reads 1 and {STATE_VERSION}. Load it with that dpex "
                         f"or a newer one")
    if not known or version not in (1, STATE_VERSION):
        raise ValueError(f"not a dpex DataLoader state (version 1 or {STATE_VERSION}): "
                         f"{state!r:.200}")
    if state["version"] == STATE_VERSION:
        return state
    try:
        return _upgrade_version_1(state)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError,
            RuntimeError) as error:
        raise ValueError(f"a version-1 state with a missing or bad field: {error!r:.200}"
                         ) from None


def _upgrade_version_1(state: dict[str, Any]) -> dict[str, Any]:
    # Version 1: one generator state (the loader's), the epoch under way when batches were
    # handed out or its base seed drawn, else the next one; no fingerprint to check.
    delivered = state["batches_delivered"]
    in_progress = delivered > 0 or bool(state["base_seed_drawn"])
    return {
        "version": STATE_VERSION,
        "epoch": IN_PROGRESS if in_progress else ENDED,
        "generator": "loader" if state["generator_state"] is not None else None,
        "generator_state": generator_state_to_plain(state["generator_state"]),
        "base_seed": state["base_seed"],
        "base_seed_drawn": bool(state["base_seed_drawn"]),
        "batches_delivered": delivered,
        "delivered_after": [],
        "next_worker": None,
        "workers": [{"rng": rng_to_plain(rng_from_plain(w["rng"])),
                     "dataset_state": w["dataset_state"]} for w in state["workers"]],
        "main": None,
        "sampler": None,
        "loader": None,
    }


def read_versioned(plain: Any, version: int, what: str, build: Callable[[dict], T]) -> T:
    """``build(plain)`` for a dict of ``version`` (a position another module wrote); a
    ValueError naming what is wrong otherwise."""
    if not isinstance(plain, dict) or plain.get("version") != version:
        raise ValueError(f"{what} of version {version} is a dict with 'version': {version}, "
                         f"got {plain!r:.200}")
    try:
        return build(plain)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError,
            OverflowError) as error:
        raise ValueError(f"{what} with a missing or bad field: {error!r}") from None
