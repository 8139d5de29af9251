"""Turning one sample of a map-style dataset into a tar record or a Parquet row.

A sample becomes named fields: a mapping keeps its (string) keys, a tuple or list is numbered
``"0"``, ``"1"``, ..., anything else is the single field ``"data"``.

* Tar (WebDataset): field ``name`` is stored as the member ``<key>.<name>.<ext>``, the
  extension chosen from the value's type so that ``webdataset``'s ``.decode()`` restores it
  (tensor -> ``pth``, ndarray -> ``npy``, int -> ``cls``, str -> ``txt``, bytes -> ``bin``,
  float/None/JSON-able containers -> ``json``, PIL image -> ``png``, else ``pyd`` pickle).
  Read a field back with ``.to_tuple("x.pth", "y.cls")``.
* Parquet: field ``name`` is column ``name``; tensors and arrays become (nested) lists,
  numpy scalars Python scalars; Arrow infers the column types from the first row group.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch


def sample_fields(sample: Any) -> dict[str, Any]:
    """The sample as ``{field name: value}`` (see the module docstring)."""
    if isinstance(sample, Mapping):
        fields = dict(sample)
        for name in fields:
            if not isinstance(name, str) or not name:
                raise TypeError(f"sample keys should be non-empty strings, but got {name!r}")
        return fields
    if isinstance(sample, (tuple, list)):
        return {str(i): value for i, value in enumerate(sample)}
    return {"data": sample}


def tar_extension(value: Any) -> str:
    """The WebDataset extension that stores ``value`` so ``.decode()`` gives it back."""
    if isinstance(value, torch.Tensor):
        return "pth"
    if isinstance(value, np.ndarray):
        return "npy"
    if isinstance(value, (bool, np.bool_)):
        return "json"  # "cls" would come back as an int
    if isinstance(value, (int, np.integer)):
        return "cls"
    if isinstance(value, str):
        return "txt"
    if isinstance(value, (bytes, bytearray)):
        return "bin"
    if type(value).__module__.startswith("PIL."):
        return "png"
    if _json_round_trips(value):
        return "json"
    return "pyd"


def tar_record(key: str, sample: Any) -> dict[str, Any]:
    """The default tar encoding of one sample: ``{"__key__": key, "<field>.<ext>": value}``."""
    record: dict[str, Any] = {"__key__": key}
    for name, value in sample_fields(sample).items():
        if "." in name or "/" in name:
            raise ValueError(
                f"field {name!r} cannot be a tar member name part (no '.' or '/'); "
                "pass encode= to name the fields"
            )
        ext = tar_extension(value)
        if isinstance(value, (np.integer, np.bool_)):
            value = value.item()
        if ext == "json":
            value = json.dumps(value)  # webdataset stores str as is; decode() parses it
        record[f"{name}.{ext}"] = bytes(value) if isinstance(value, bytearray) else value
    return record


def parquet_row(sample: Any) -> dict[str, Any]:
    """The default Parquet encoding of one sample: ``{column: Arrow-friendly value}``."""
    return {name: arrow_value(value) for name, value in sample_fields(sample).items()}


def arrow_value(value: Any) -> Any:
    """``value`` as something ``pyarrow`` can infer a type for."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _json_round_trips(value: Any) -> bool:
    if value is None or isinstance(value, float):
        return True
    if isinstance(value, (list, dict)):
        try:
            return json.loads(json.dumps(value)) == value
        except (TypeError, ValueError):
            return False
    return False
