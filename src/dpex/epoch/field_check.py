"""A plain state's fields checked one at a time, each error naming the field's path, the
value found and what was expected (``state_check.py`` applies them). Pure: no Ray.
"""

from __future__ import annotations

import binascii
from typing import Any, NoReturn

import numpy as np
import torch

from dpex.epoch import state_format as fmt

INT64 = 1 << 63
_TORCH_STATE_BYTES = torch.Generator().get_state().numel()  # 5056: one MT19937, CPU
_PYTHON_WORDS = 625  # random.getstate()'s 624 words and its index
_NUMPY_WORDS = 624


# ----------------------------------------------------------------- RNG states

def rng_state(plain: Any, path: str) -> None:
    """A worker's ``random``, numpy and torch states, as ``state_format.rng_to_plain``
    writes them (or lists of ints for the words, as a hand-made state may)."""
    if plain is None:
        return
    need_dict(plain, path)
    python = sequence(field(plain, "python", "a list", path), f"{path}.python", 3)
    one_value(python[0], f"{path}.python[0]", 3)
    words = _words(python[1], f"{path}.python[1]", _PYTHON_WORDS)
    if int(words[-1]) > _NUMPY_WORDS:
        out_of_range(f"{path}.python[1]", Said(f"index {int(words[-1])}"),
                     f"random's index at most {_NUMPY_WORDS}")
    if python[2] is not None:
        need_float(python[2], f"{path}.python[2]")
    numpy = sequence(field(plain, "numpy", "a list", path), f"{path}.numpy", 5)
    one_value(numpy[0], f"{path}.numpy[0]", "MT19937")
    _words(numpy[1], f"{path}.numpy[1]", _NUMPY_WORDS)
    need_int(numpy[2], f"{path}.numpy[2]", 0, _NUMPY_WORDS)
    need_int(numpy[3], f"{path}.numpy[3]", 0, 1)
    need_float(numpy[4], f"{path}.numpy[4]")
    torch_state(field(plain, "torch", "a torch RNG state", path), f"{path}.torch")


def _words(plain: Any, path: str, count: int) -> np.ndarray:
    if isinstance(plain, str):
        data = _decoded(plain, path)
        if len(data) != 4 * count:
            out_of_range(path, Said(f"{len(data)} bytes"), f"{count} 32-bit words ({4 * count} "
                         "bytes, base64)")
        return np.frombuffer(data, dtype="<u4")
    if not isinstance(plain, (list, tuple)) or len(plain) != count:
        wrong_type(path, plain, f"{count} 32-bit words (base64 text, or a list of ints)")
    for i, word in enumerate(plain):
        need_int(word, f"{path}[{i}]", 0, (1 << 32) - 1)
    return np.asarray(plain, dtype=np.uint32)


def torch_state(plain: Any, path: str) -> None:
    """A CPU generator's state: base64 text (or the ByteTensor of a version-1 state)."""
    if isinstance(plain, torch.Tensor):
        tensor = plain
    elif isinstance(plain, str):
        data = _decoded(plain, path)
        if len(data) != _TORCH_STATE_BYTES:
            out_of_range(path, Said(f"{len(data)} bytes"), f"a torch generator state of "
                         f"{_TORCH_STATE_BYTES} bytes (base64)")
        tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    else:
        wrong_type(path, plain, "a torch generator state (base64 text)")
    try:
        torch.Generator().set_state(tensor)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"the state's field {path} is not a torch generator state: "
                         f"{error}") from None


def torch_state_text(plain: Any, path: str) -> None:
    """A CPU generator's state of the right kind and size, not decoded: the reader decodes it
    once (``resume.py``: a ValueError naming the field where torch refuses its bytes)."""
    if isinstance(plain, torch.Tensor):
        size = plain.numel() if plain.dtype == torch.uint8 else -1
    elif isinstance(plain, str):
        size = len(plain) // 4 * 3 - plain[-2:].count("=") if len(plain) % 4 == 0 else -1
    else:
        wrong_type(path, plain, "a torch generator state (base64 text)")
    if size != _TORCH_STATE_BYTES:
        out_of_range(path, Said(f"a state of {size} bytes" if size >= 0 else "not base64"),
                     f"a torch generator state of {_TORCH_STATE_BYTES} bytes (base64)")


def _decoded(text: str, path: str) -> bytes:
    try:
        return fmt.text_to_bytes(text)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        out_of_range(path, text, "base64 text")


# ----------------------------------------------------------------- the pieces

def field(plain: dict, name: str, expected: str, parent: str = "") -> Any:
    if name not in plain:
        missing(f"{parent}.{name}" if parent else name, expected)
    return plain[name]


def optional(plain: dict, name: str, check_one) -> None:
    if plain.get(name) is not None:
        check_one(plain[name], name)


def optional_dict(plain: dict, name: str) -> dict | None:
    value = plain.get(name)
    if value is not None:
        need_dict(value, name)
    return value


def one_of(plain: dict, name: str, allowed: tuple) -> Any:
    if name not in plain:
        missing(name, " or ".join(map(repr, allowed)))
    value = plain[name]
    if not any(value == a and type(value) is type(a) for a in allowed):
        out_of_range(name, value, " or ".join(map(repr, allowed)))
    return value


def one_value(value: Any, path: str, expected: Any) -> None:
    if value != expected or type(value) is not type(expected):
        out_of_range(path, value, repr(expected))


def need_dict(value: Any, path: str) -> None:
    if not isinstance(value, dict):
        wrong_type(path, value, "a dict")


def sequence(value: Any, path: str, length: int) -> Any:
    if not isinstance(value, (list, tuple)) or len(value) != length:
        wrong_type(path, value, f"a list of {length}")
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def need_int(value: Any, path: str, low: int, high: int) -> int:
    if not is_int(value):
        wrong_type(path, value, f"an int in [{low}, {high}]")
    if not low <= value <= high:
        out_of_range(path, value, f"an int in [{low}, {high}]")
    return value


def need_bool(value: Any, path: str) -> None:
    if not isinstance(value, bool):
        wrong_type(path, value, "a bool")


def need_float(value: Any, path: str) -> None:
    if not isinstance(value, float):
        wrong_type(path, value, "a float")


def missing(path: str, expected: str) -> NoReturn:
    raise ValueError(f"the state has no field {path} (expected {expected}): a damaged or "
                     f"hand-edited state?")


def wrong_type(path: str, value: Any, expected: str) -> NoReturn:
    raise TypeError(f"the state's field {path} is {shown(value)}, expected {expected}")


def out_of_range(path: str, value: Any, expected: str) -> NoReturn:
    raise ValueError(f"the state's field {path} is {shown(value)}, expected {expected}")


class Said(str):
    """What was found, in words (``"5 bytes"``), shown as it is rather than quoted."""


def shown(value: Any) -> str:
    text = value if isinstance(value, Said) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
