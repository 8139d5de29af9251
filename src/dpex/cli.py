"""The ``dpex`` command. Each subcommand lives in its own module, imported on use."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with ``add_arguments(parser)`` and ``run(args) -> int``, help)
SUBCOMMANDS = {
    "run": ("dpex.integrations.run_cli", "run a training script unchanged, its DataLoaders' workers on Ray"),
    "bench": ("dpex.bench.cli", "benchmark dpex against torch's DataLoader and Ray Data"),
    "shard": ("dpex.datasets.shard_cli", "write a map-style dataset as tar or Parquet shards"),
    "cache": ("dpex.cache.cli", "list or remove the caches of dpex.cached stages"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dpex", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # optional extra not installed
            sub_parser.set_defaults(_missing=str(exc))
            continue
        module.add_arguments(sub_parser)
        modules[name] = module
    args = parser.parse_args(argv)
    if getattr(args, "_missing", None):
        parser.error(f"'dpex {args.command}' needs an optional dependency: {args._missing}")
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
