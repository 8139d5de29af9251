"""The command-line options every example shares."""

from __future__ import annotations

import argparse

EMBEDDED = "embedded"  # --head-address value for "always start the embedded local Ray"


def parse_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the examples' options; ``--head-address embedded`` becomes ``None``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--distribute-mode", action=argparse.BooleanOptionalAction, default=True,
        help="load with Ray-actor workers (default) or with torch's worker processes",
    )
    parser.add_argument("--epochs", type=int, default=3, help="training epochs (default 3)")
    parser.add_argument(
        "--workers", type=int, default=2,
        help="loader workers (per rank under DDP; default 2)",
    )
    parser.add_argument(
        "--batch-size", type=int, default=64,
        help="samples per optimiser step; under DDP the global batch, split over the ranks",
    )
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model, sampler, loader")
    parser.add_argument(
        "--head-address", default="auto",
        help="Ray cluster for distribute mode: 'auto' (join a running one, else start the "
        f"embedded Ray), '{EMBEDDED}' (always the embedded Ray), or 'host:port'",
    )
    parser.add_argument(
        "--data-dir", default="data",
        help="where torchvision's FashionMNIST files are, if you have them (never downloads)",
    )
    parser.add_argument(
        "--limit", type=int, default=None,
        help="use only the first N training and test samples (quick checks)",
    )
    parser.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show a progress bar (default: only on a terminal)",
    )
    parser.add_argument("--results-json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    for name in ("epochs", "workers", "batch_size"):
        minimum = 0 if name == "workers" else 1
        if getattr(args, name) < minimum:
            parser.error(f"--{name.replace('_', '-')} should be at least {minimum}")
    if args.head_address == EMBEDDED:
        args.head_address = None
    return args
