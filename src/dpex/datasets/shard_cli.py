"""``dpex shard``: write a map-style dataset as tar or Parquet shards.

The dataset is named by an import spec, ``MODULE:NAME``, where MODULE is a dotted module name
(``mypkg.data``) or a path to a ``.py`` file (``./data.py``), and NAME is an attribute of it:
either a dataset object or a callable that returns one (called with ``--kwargs``, a JSON
object). Examples::

    dpex shard mypkg.data:train_set /data/shards --format tar --samples-per-shard 1000
    dpex shard ./data.py:make_dataset s3://bucket/train --format parquet \\
        --kwargs '{"split": "train"}' --storage-option endpoint_override=http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from typing import Any

from dpex.datasets._fs import coerce_option
from dpex.datasets.shard import FORMATS, write_shards

_EPILOG = """\
DATASET is MODULE:NAME. MODULE is a dotted module name or a path to a .py file;
NAME is a dataset object in it, or a callable returning one (called with --kwargs).
With --distribute, Ray workers must be able to import MODULE.

examples:
  dpex shard mypkg.data:train_set /data/shards --format tar --samples-per-shard 1000
  dpex shard ./data.py:make_dataset s3://bucket/train --format parquet \\
      --kwargs '{"split": "train"}' --storage-option region=eu-west-1
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``dpex shard`` arguments to ``parser``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = "Write a map-style dataset as tar (WebDataset) or Parquet shards."
    parser.epilog = _EPILOG
    parser.add_argument("dataset", metavar="DATASET", help="import spec MODULE:NAME")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="output directory, path or URI")
    parser.add_argument("--format", choices=FORMATS, default="tar", help="default: tar")
    parser.add_argument("--samples-per-shard", type=int, default=10_000)
    parser.add_argument("--max-shard-bytes", type=int, default=None, help="tar only")
    parser.add_argument("--row-group-size", type=int, default=1024, help="parquet only")
    parser.add_argument("--prefix", default="shard", help="shard name prefix (default: shard)")
    parser.add_argument("--index-column", default=None, help="parquet: store sample indices")
    parser.add_argument("--kwargs", default="{}", help="JSON object: arguments of a factory")
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="filesystem option for a s3:// or hdfs:// OUT_DIR (repeatable)",
    )
    parser.add_argument("--num-workers", type=int, default=0, help="DataLoader workers")
    parser.add_argument(
        "--distribute", action="store_true", help="read samples through Ray workers"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace existing shards")


def run(args: argparse.Namespace) -> int:
    """Run ``dpex shard``; return the exit status (0 on success, 1 on a user error)."""
    try:
        dataset = load_dataset(args.dataset, json.loads(args.kwargs))
        paths = write_shards(
            dataset,
            args.out_dir,
            args.format,
            samples_per_shard=args.samples_per_shard,
            max_shard_bytes=args.max_shard_bytes,
            row_group_size=args.row_group_size,
            prefix=args.prefix,
            index_column=args.index_column,
            overwrite=args.overwrite,
            num_workers=args.num_workers,
            distribute_mode=args.distribute,
            storage_options=_storage_options(args.storage_option) or None,
        )
    except (ImportError, AttributeError, ValueError, TypeError, OSError) as exc:
        print(f"dpex shard: error: {exc}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    print(f"wrote {len(dataset)} samples into {len(paths)} {args.format} shard(s)", file=sys.stderr)
    return 0


def load_dataset(spec: str, kwargs: dict[str, Any] | None = None) -> Any:
    """The dataset named by ``MODULE:NAME`` (see the module docstring).

    Raises:
        ValueError: ``spec`` is not ``MODULE:NAME``, or ``--kwargs`` is not a JSON object.
        ImportError: the module cannot be imported.
        AttributeError: the module has no ``NAME``.
        TypeError: the result has no ``__len__``/``__getitem__``.
    """
    module_name, sep, name = spec.rpartition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"DATASET should look like 'module:name' or 'file.py:name', got {spec!r}")
    if not isinstance(kwargs, dict):
        raise ValueError(f"--kwargs should be a JSON object, got {kwargs!r}")
    module = _import(module_name)
    obj = getattr(module, name)
    if callable(obj) and not hasattr(obj, "__getitem__"):
        obj = obj(**kwargs)
    elif kwargs:
        raise ValueError(f"{spec} is not a callable, so --kwargs cannot be applied")
    if not (hasattr(obj, "__len__") and hasattr(obj, "__getitem__")):
        raise TypeError(f"{spec} is not a map-style dataset (needs __len__ and __getitem__)")
    return obj


def _import(module_name: str) -> Any:
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise ImportError(f"no such file: {module_name!r}")
        name = os.path.splitext(os.path.basename(path))[0]
        # Its directory joins sys.path so that Ray workers, which inherit the driver's path,
        # can unpickle classes defined in the file (distribute mode).
        sys.path.insert(0, os.path.dirname(path))
        module = importlib.import_module(name)
        if os.path.abspath(getattr(module, "__file__", "") or "") != path:
            raise ImportError(
                f"{module_name!r} is shadowed by the module {name!r} already imported from "
                f"{getattr(module, '__file__', None)}; rename the file"
            )
        return module
    return importlib.import_module(module_name)


def _storage_options(pairs: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--storage-option should be KEY=VALUE, got {pair!r}")
        options[key] = coerce_option(value)
    return options
